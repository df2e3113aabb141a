"""`ReloadBatcher`: when the checked changes go to haproxy, and which together.

- Changes are queued (`add`) once checked. A single task collects them until
  the burst settles (no new change for `debounce` seconds and no candidate
  still being checked, or at most `max_delay`) and hands them to `commit`
  (install and reload) as one batch. Every waiter of the batch gets the
  outcome.
- Reloads inside a burst are paced by their own cost: when changes arrived
  while a reload ran, the next one starts no sooner than `reload_pace` times
  its duration after it ended (at most `MAX_RELOAD_PAUSE`), so reloading (a
  new worker parsing every load balancer) takes at most about a quarter of
  the time; when the passes of a large refresh arrive one by one, pacing is
  what keeps the batches large and the reloads few. Pacing ends early once no
  change has come for `PACE_QUIET`: the burst is over. A change that finds
  haproxy idle (nothing arrived during the last reload) goes out at once: one
  change after another, each waiting for the last, is no burst.
- A candidate still being checked (`checking`) will join the next batch: the
  batcher waits for it rather than reload without it.
- `coming` says whether more changes are on their way (passes that have not
  yet handed theirs over). When none are, the debounce has nothing to wait
  for and the batch goes at once (the last changes of a cold start waited
  0.05 s for nobody). Pacing stays: in a steady trickle each change may find
  nothing else coming, and pacing is what keeps reloads to a quarter of the
  time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from lbagent.support.coalesce import resolve
from lbagent.support.waits import wait_event

# After a reload that took t seconds the next one waits until t * RELOAD_PACE has passed,
# but never longer than MAX_RELOAD_PAUSE: on a busy host t swells with contention, and
# a change must not wait for that.
RELOAD_PACE = 3.0
MAX_RELOAD_PAUSE = 10.0
PACE_QUIET = 0.1  # seconds without a new change that end a burst's pacing early

S = TypeVar("S")  # a staged change


@dataclass
class _Change(Generic[S]):
    staged: S
    done: asyncio.Future = field(repr=False)


class ReloadBatcher(Generic[S]):
    def __init__(
        self,
        commit: Callable[[list[S]], Awaitable[float]],
        debounce: float,
        max_delay: float,
        reload_pace: float = RELOAD_PACE,
        coming: Callable[[], bool] = lambda: True,
    ):
        self._commit = commit  # installs and reloads a batch; returns the seconds the reload took
        self._debounce = debounce
        self._max_delay = max_delay  # a steady trickle of changes must not postpone every reload forever
        self.reload_pace = reload_pace
        self.coming = coming  # more changes may follow soon (unknown: assume so)
        self._pending: list[_Change[S]] = []
        self._in_flight = 0  # candidates between "differs from disk" and "queued or refused"
        self._next_reload_at = 0.0  # loop time before which no batch is committed (pacing)
        self._activity = asyncio.Event()  # bound to a loop on first use (Python 3.10+)
        self._task: asyncio.Task | None = None

    @contextmanager
    def checking(self) -> Iterator[None]:
        """Around the check of a candidate that may join the next batch."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            self._activity.set()

    def add(self, staged: S) -> asyncio.Future:
        """Queue a checked change; the future resolves with its batch's reload."""
        loop = asyncio.get_running_loop()
        change = _Change(staged, loop.create_future())
        self._pending.append(change)
        self._activity.set()
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="haproxy-reloads")
        return change.done

    async def close(self) -> list[S]:
        """Stop batching: waiters of an unfinished batch and of queued changes
        are cancelled; returns the queued changes, for their files to go."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        queued, self._pending = self._pending, []
        for change in queued:
            change.done.cancel()
        return [change.staged for change in queued]

    async def _run(self) -> None:
        while True:
            while not self._pending:
                self._activity.clear()
                await self._activity.wait()
            await self._pace()
            await self._settle()
            batch, self._pending = self._pending, []
            await self._commit_batch(batch)

    async def _pace(self) -> None:
        """Let the last reload's cost pass before the next while changes keep
        coming (they join the batch meanwhile). Once none has come for
        `PACE_QUIET` seconds the burst is over and waiting longer would only
        delay its last changes: the batch goes at once."""
        loop = asyncio.get_running_loop()
        while (delay := self._next_reload_at - loop.time()) > 0:
            self._activity.clear()
            quiet = not await wait_event(self._activity, min(delay, PACE_QUIET))
            if quiet and not self._in_flight and delay > PACE_QUIET:
                return

    async def _settle(self) -> None:
        """Wait for the burst to end: quiet for `debounce` (or nothing else
        coming), no check in flight, or `max_delay` reached."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_delay
        while (remaining := deadline - loop.time()) > 0 and not self._last_of_burst():
            self._activity.clear()
            # A candidate still being checked will join this batch: wait for it.
            wait = remaining if self._in_flight else min(self._debounce, remaining)
            if not await wait_event(self._activity, wait):
                return

    def _last_of_burst(self) -> bool:
        """Nothing is being checked and no other change is on its way."""
        return not self._in_flight and not self.coming()

    async def _commit_batch(self, batch: list[_Change[S]]) -> None:
        try:
            took = await self._commit([change.staged for change in batch])
        except asyncio.CancelledError:  # closed mid-batch: its waiters stop waiting too
            for change in batch:
                change.done.cancel()
            raise
        except Exception as exc:  # every waiter hears about it; the batcher carries on
            for change in batch:
                resolve(change.done, error=exc)
            return
        # Paced after successes only: a failed batch's fix should not wait for its cost.
        # Paced only inside a burst: changes that arrived while this reload ran
        # wait for its cost to pass (and join the next batch meanwhile); a change
        # that finds haproxy idle goes out at once, however recent the last reload.
        burst = bool(self._pending) or self._in_flight > 0
        pause = min(self.reload_pace * took, MAX_RELOAD_PAUSE) if burst else 0.0
        self._next_reload_at = asyncio.get_running_loop().time() + pause
        for change in batch:
            resolve(change.done, True)
