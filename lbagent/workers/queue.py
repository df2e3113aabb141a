"""A rate-limited asyncio work queue, in the spirit of client-go's workqueue.

This module owns *when* a key is handled, never what handling means:
- a key waits at most once (adding a waiting key again is a no-op);
- one key is never handled by two workers at once, and a key added while it
  is being handled runs once more afterwards;
- a failed key comes back after a per-key exponential backoff (1 s doubling
  to 5 min) and its error is kept until it succeeds or is forgotten;
- handlers start no faster than an overall token bucket allows, whatever the
  keys, so a resync storm or many failing keys cannot hammer the host;
- `shutdown()` lets running handlers finish and drops everything else.

One queue may serve several kinds of keys (the agent's does: load balancers,
subnets, pods, provider networks); `kind_of` names a key's kind, and
`stats_by_kind()` and the retry counter report per kind.

The handler is an async callable given to `start()`; controllers keep their
reconcile functions apart from the queue and test them without one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Hashable, Iterable
from typing import Generic, TypeVar

from lbagent.metrics import count_queue_retry
from lbagent.support.waits import wait_event
from lbagent.workers.lb_task import BACKOFF_MAX, BACKOFF_START, backoff_delay

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

DEFAULT_RATE = 50.0  # handler starts per second, across all keys
DEFAULT_BURST = 100
STAT_FIELDS = ("depth", "delayed", "processing", "retrying")


class TokenBucket:
    """Tokens refill at `rate` per second up to `burst`; a token taken ahead of time is a debt.

    `reserve()` always takes a token and says how long its holder must wait,
    so waiters are served in the order they asked (like Go's rate.Limiter).
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        if rate <= 0 or burst < 1:
            raise ValueError("a token bucket needs rate > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()

    def reserve(self) -> float:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


class WorkQueue(Generic[K]):
    def __init__(
        self,
        name: str,
        *,
        backoff_start: float = BACKOFF_START,
        backoff_max: float = BACKOFF_MAX,
        rate: float = DEFAULT_RATE,
        burst: int = DEFAULT_BURST,
        clock: Callable[[], float] = time.monotonic,
        kind_of: Callable[[K], str] | None = None,
    ):
        self.name = name
        self._kind_of = kind_of or (lambda key: name)
        self._backoff = (backoff_start, backoff_max)
        self._bucket = TokenBucket(rate, burst, clock)
        self._ready: deque[K] = deque()
        self._dirty: set[K] = set()  # waiting to be handled (in _ready, or again after handling)
        self._processing: set[K] = set()
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}  # key -> (due, timer)
        self._failures: dict[K, int] = {}
        self._errors: dict[K, str] = {}
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        self._workers: list[asyncio.Task] = []

    # --- adding keys -------------------------------------------------------------

    def add(self, key: K) -> None:
        if self._stopping.is_set():
            return
        self._cancel_timer(key)  # running now supersedes a later run
        if key in self._dirty:
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # queued again by _done() once its handler returns
        self._ready.append(key)
        self._changed.set()

    def add_after(self, key: K, delay: float) -> None:
        """Add `key` once `delay` seconds have passed; an earlier pending add wins."""
        if self._stopping.is_set():
            return
        if delay <= 0:
            self.add(key)
            return
        if key in self._dirty and key not in self._processing:
            return  # it runs sooner than that anyway
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None and pending[0] <= due:
            return
        self._cancel_timer(key)
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def add_rate_limited(self, key: K) -> None:
        """Add `key` after its backoff, which doubles with every call until `forget`."""
        self._failures[key] = self._failures.get(key, 0) + 1
        self.add_after(key, backoff_delay(self._failures[key], *self._backoff))

    def forget(self, key: K) -> None:
        """Reset `key`'s backoff and error (on success, or when the key is gone for good)."""
        self._failures.pop(key, None)
        self._errors.pop(key, None)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _cancel_timer(self, key: K) -> None:
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()

    # --- what status shows --------------------------------------------------------

    def retries(self, key: K) -> int:
        return self._failures.get(key, 0)

    def last_error(self, key: K) -> str | None:
        return self._errors.get(key)

    @property
    def depth(self) -> int:
        """Keys ready to be handled now (not counting delayed or running ones)."""
        return len(self._ready)

    def is_pending(self, key: K) -> bool:
        """`key` waits (now or after a delay) or is being handled."""
        return key in self._dirty or key in self._timers or key in self._processing

    def _keys_by_stat(self) -> dict[str, Collection[K]]:
        """Each of STAT_FIELDS and the collection of keys it counts."""
        return dict(zip(STAT_FIELDS, (self._ready, self._timers, self._processing, self._failures)))

    def stats(self) -> dict[str, int]:
        return {field: len(keys) for field, keys in self._keys_by_stat().items()}

    def stats_by_kind(self, kinds: Iterable[str] = ()) -> dict[str, dict[str, int]]:
        """`stats()` per kind of key; the `kinds` given are listed even when they hold nothing."""
        found = {kind: dict.fromkeys(STAT_FIELDS, 0) for kind in kinds}
        for field, keys in self._keys_by_stat().items():
            for key in keys:
                found.setdefault(self._kind_of(key), dict.fromkeys(STAT_FIELDS, 0))[field] += 1
        return found

    def depth_of(self, kind: str) -> int:
        """Keys of `kind` ready to be handled now."""
        return sum(1 for key in self._ready if self._kind_of(key) == kind)

    def unfinished_of(self, kind: str) -> int:
        """Keys of `kind` ready, or taken and not yet handled (waiting for a token included)."""
        return self.depth_of(kind) + sum(1 for key in self._processing if self._kind_of(key) == kind)

    # --- running -----------------------------------------------------------------

    def start(self, handler: Callable[[K], Awaitable[object]], workers: int = 1) -> None:
        if self._workers:
            raise RuntimeError(f"queue {self.name} already started")
        self._workers = [
            asyncio.create_task(self._work(handler), name=f"{self.name}-worker-{i}") for i in range(workers)
        ]

    async def shutdown(self, timeout: float | None = None) -> None:
        """Stop taking keys, wait for running handlers (cancelled after `timeout`), drop the rest."""
        self._stopping.set()
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._ready.clear()
        self._dirty.clear()
        self._changed.set()
        workers, self._workers = self._workers, []
        if not workers:
            return
        _, late = await asyncio.wait(workers, timeout=timeout)
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)

    async def _next(self) -> K | None:
        while not self._ready:
            if self._stopping.is_set():
                return None
            self._changed.clear()
            await self._changed.wait()
        key = self._ready.popleft()
        self._dirty.discard(key)
        self._processing.add(key)
        return key

    async def _admitted(self) -> bool:
        """Wait for a token of the overall bucket; False if the queue stops meanwhile."""
        delay = self._bucket.reserve()
        if delay <= 0:
            return True
        return not await wait_event(self._stopping, delay)

    async def _work(self, handler: Callable[[K], Awaitable[object]]) -> None:
        while (key := await self._next()) is not None:
            try:
                if await self._admitted():
                    await self._handle(handler, key)
            finally:
                self._done(key)

    async def _handle(self, handler: Callable[[K], Awaitable[object]], key: K) -> None:
        try:
            await handler(key)
        except Exception as exc:  # any failure is this key's alone: retried with backoff
            self._errors[key] = str(exc) or type(exc).__name__
            self.add_rate_limited(key)
            count_queue_retry(self._kind_of(key))
            log.warning(
                "queue=%s key=%s action=handle result=error retries=%d error=%r",
                self.name,
                key,
                self.retries(key),
                self._errors[key],
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
        else:
            self.forget(key)

    def _done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty and not self._stopping.is_set():
            self._ready.append(key)
            self._changed.set()
