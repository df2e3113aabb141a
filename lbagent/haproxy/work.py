"""`HaproxyWork`: where the manager's blocking work runs, and what orders it.

Blocking work (files, subprocesses, sockets) runs in worker threads, in
separate pools for reloads (`process_work`), per-load-balancer checks and
files (`lb_work`) and the stats socket (`stats_work`): reloads and starts
never wait behind candidate checks, nor status behind either.

`process_lock` lets one start, stop, reload or live edit at a time at the
master; `check_slots` bounds the `haproxy -c` processes running at once. Both
are bound to the event loop, so `bind` creates them on first use.
"""

from __future__ import annotations

import asyncio

from lbagent.support.blocking import BlockingPool

# haproxy -c processes at once: each takes a core for tens of milliseconds.
MAX_PARALLEL_CHECKS = 4


class HaproxyWork:
    def __init__(self) -> None:
        self._bound = False
        self.process_lock: asyncio.Lock | None = None
        self.check_slots: asyncio.Semaphore | None = None
        # Reloads and starts never wait behind candidate checks, nor status behind either.
        self.process_work = BlockingPool("haproxy-process", 1)
        self.lb_work = BlockingPool("haproxy-files", MAX_PARALLEL_CHECKS)
        self.stats_work = BlockingPool("haproxy-stats", 1)

    def bind(self) -> None:
        # Created on first use, inside the running loop that will use them.
        if not self._bound:
            self._bound = True
            self.check_slots = asyncio.Semaphore(MAX_PARALLEL_CHECKS)
            self.process_lock = asyncio.Lock()

    async def tidied(self) -> None:
        """Returns once the staging directories of installed changes are gone.
        Their removal is queued on the reload thread by the job that installed
        them: the first turn lets a job still running there finish (and queue
        its removal), the second waits for that removal."""
        for _ in range(2):
            await self.process_work.run(_nothing)


def _nothing() -> None:
    pass
