"""The schedule of one load balancer: when its reconcile runs, and what came of it.

Kept apart from what a pass does (`OvnWorker.reconcile`): this module only
decides *when* — on a kick (the first one, which starts the task, comes
from the shared work queue; later ones on a refresh or a dependency change), on a
jittered periodic resync that repairs drift, or after an exponential backoff
following a failure — and records the outcome for status.

`ready` means the load balancer carries traffic, not only that its last pass
succeeded: after a successful pass `readiness(lb_id)` (given by the
supervisor) names what still keeps it from serving (its OVS port not yet
installed by ovn-controller, haproxy not running), and the task stays
`pending` with that `reason` until `set_waiting(None)` clears it, which the
supervisor's readiness watch does without another pass. `passed` says
whether the last pass succeeded, whatever the state says.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from lbagent.metrics import CURRENT_LB, RECONCILE_ERRORS, RECONCILE_SECONDS
from lbagent.support.waits import Wake, wait_event

log = logging.getLogger(__name__)

BACKOFF_START = 1.0
BACKOFF_MAX = 300.0
JITTER = 0.2
DONE = -1  # what reconcile returns once the load balancer is gone for good


def backoff_delay(retries: int, start: float = BACKOFF_START, cap: float = BACKOFF_MAX) -> float:
    return min(cap, start * 2 ** max(0, retries - 1))


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class LbTask:
    def __init__(
        self,
        lb_id: str,
        reconcile: Callable[[str, bool], Awaitable[int]],
        on_pass: Callable[[LbTask], None],
        resync_interval: Callable[[], float],
        readiness: Callable[[str], str | None] | None = None,
    ):
        self.lb_id = lb_id
        self._reconcile = reconcile
        self._on_pass = on_pass
        self._resync = resync_interval
        self._readiness = readiness
        self._wake = Wake()  # not set: the first pass waits for the first kick, which is queued
        self.state = "pending"
        self.deleting = False
        self.generation: int | None = None  # generation of the last successful pass
        self.attempted_generation: int | None = None  # of the last pass, success or not
        self.last_error: str | None = None
        self.passed = False  # the last pass succeeded
        self.waiting: str | None = None  # after a successful pass: what keeps it from serving yet
        self.retries = 0
        self.passes = 0
        self.last_reconciled_at: str | None = None
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._loop(), name=f"lb-{self.lb_id}")

    def kick(self) -> None:
        self._wake.set()
        if self.task is None:
            # Started by its first kick, which the work queue paces: a refresh
            # that makes a thousand tasks no longer runs their first steps in
            # one turn of the event loop (190 ms).
            self.start()

    @property
    def reason(self) -> str | None:
        """Why the load balancer is not `ready` (None when it is)."""
        if self.state == "ready":
            return None
        if self.state == "error":
            return self.last_error
        if self.state == "deleting":
            return "being deleted"
        if self.waiting is not None and self.passed:
            return self.waiting
        return "not reconciled yet at the accepted generation"

    def set_waiting(self, waiting: str | None) -> bool:
        """Record what keeps the load balancer from serving (None: nothing). A task
        whose last pass succeeded turns `pending` or `ready` with it; True if its
        state changed."""
        self.waiting = waiting
        if not self.passed or self.deleting or self.state not in ("ready", "pending"):
            return False
        state = "pending" if waiting is not None else "ready"
        changed, self.state = state != self.state, state
        return changed

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass

    def _next_delay(self) -> float:
        if self.last_error is not None:
            return backoff_delay(self.retries)
        return self._resync() * random.uniform(1 - JITTER, 1 + JITTER)

    async def _loop(self) -> None:
        while True:
            # A kick, or time for a resync; a kick in the very turn the timer
            # ran out is still a kick (it may be the only word of a change).
            kicked = await wait_event(self._wake, self._next_delay()) or self._wake.is_set()
            self._wake.clear()
            if await self._pass(resync=not kicked and self.passed) == DONE:
                return

    async def _pass(self, resync: bool) -> int | None:
        """`resync`: nobody asked for this pass, and the last one succeeded."""
        started = time.monotonic()
        CURRENT_LB.set(self.lb_id)  # this task's own context
        try:
            generation = await self._reconcile(self.lb_id, resync)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure is this load balancer's alone
            self.retries += 1
            self.last_error = str(exc) or type(exc).__name__
            self.state = "error"
            self.passed = False
            self.attempted_generation = getattr(exc, "generation", self.attempted_generation)
            RECONCILE_ERRORS.inc()
            log.warning(
                "lb=%s action=reconcile result=error retries=%d error=%r",
                self.lb_id,
                self.retries,
                self.last_error,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            self._finish(started)
            return None
        if generation != DONE:
            # A refresh may have moved this (unchanged) load balancer to a newer
            # generation while this pass, started earlier, was running.
            generation = max(generation, self.generation or generation)
            self.generation = self.attempted_generation = generation
            self.last_error = None
            self.retries = 0
            self.passed = True
            if not self.deleting:  # a deletion queued meanwhile keeps its state
                self.state = "pending"  # set_waiting makes it ready when nothing else is missing
            self.set_waiting(self._readiness(self.lb_id) if self._readiness is not None else None)
        self._finish(started)
        return generation

    def _finish(self, started: float) -> None:
        self.passes += 1
        self.last_reconciled_at = now_iso()
        RECONCILE_SECONDS.observe(time.monotonic() - started)
        self._on_pass(self)
