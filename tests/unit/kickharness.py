"""A sibling controller on a served work queue, with the load balancers it kicks recorded."""

from __future__ import annotations

from lbagent.workers.dispatch import Dispatcher, kind_of
from lbagent.workers.queue import WorkQueue
from test_queue import drained


class KickHarness:
    def __init__(self, kind: str, make):
        """`make(queue, kick)` builds the controller; its `reconcile` handles the keys of `kind`."""
        self.kicks: list[str] = []
        self.queue = WorkQueue(f"t-{kind}", backoff_start=0.01, backoff_max=0.02, kind_of=kind_of)
        self.ctl = make(self.queue, self.kicks.append)
        self.queue.start(Dispatcher({kind: self.ctl.reconcile}))

    async def refresh(self, *desired) -> list[str]:
        """`ctl.update(*desired)`, then the queue handles what it queued; the load balancers kicked, sorted."""
        self.kicks.clear()
        self.ctl.update(*desired)
        await drained(self.queue)
        return sorted(self.kicks)

    async def stop(self) -> None:
        await self.queue.shutdown(timeout=5)
