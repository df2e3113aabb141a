"""`HaproxyWork`: where the manager's blocking work runs, and what orders it.

Blocking work (files, subprocesses, sockets) runs in worker threads, in
separate pools for reloads (`process_work`), per-load-balancer checks and
files (`lb_work`) and the stats socket (`stats_work`): reloads and starts
never wait behind candidate checks, nor status behind either.

`process_lock` lets one start, stop, reload or live edit at a time at the
master; `check_slots` bounds the `haproxy -c` processes running at once.
(asyncio's locks bind to the loop that first waits on them, not the one
running when they are made, so they are made here.)
"""

from __future__ import annotations

import asyncio

from lbagent.support.blocking import BlockingPool

# haproxy -c processes at once: each takes a core for tens of milliseconds.
MAX_PARALLEL_CHECKS = 4


class HaproxyWork:
    def __init__(self) -> None:
        self.process_lock = asyncio.Lock()
        self.check_slots = asyncio.Semaphore(MAX_PARALLEL_CHECKS)
        # Reloads and starts never wait behind candidate checks, nor status behind either.
        self.process_work = BlockingPool("haproxy-process", 1)
        self.lb_work = BlockingPool("haproxy-files", MAX_PARALLEL_CHECKS)
        self.stats_work = BlockingPool("haproxy-stats", 1)

    async def tidied(self) -> None:
        """Returns once the staging directories of installed changes are gone.
        Their removal is queued on the reload thread by the job that installed
        them: the first turn lets a job still running there finish (and queue
        its removal), the second waits for that removal."""
        for _ in range(2):
            await self.process_work.run(_nothing)


def _nothing() -> None:
    pass
