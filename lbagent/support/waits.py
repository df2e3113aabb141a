"""`wait_event`: wait for an asyncio event at most some seconds, cancellable;
`Wake`: an event for one waiter, small enough to give each of thousands of
tasks; `InFlight`: how much of some work is under way, and a bounded wait for
none.

Python 3.11's `asyncio.wait_for(event.wait(), t)` swallows a cancellation that
arrives in the loop step the event is set: the caller returns as if woken, a
loop around it goes on, and whoever cancelled it (LbTask.stop, a shutdown)
waits for ever. `asyncio.timeout` tells its own cancellation from anyone
else's, so every wait of that kind goes through here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager


class Wake:
    """What asyncio.Event offers one waiter at a time (`set`, `clear`,
    `is_set`, `wait`), without the deque of waiters an Event makes at once
    (624 bytes): every load balancer's task sleeps on one of these."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None  # only while someone waits

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> None:
        """Return once set (at once if it is)."""
        if self._set:
            return
        if self._waiter is not None:
            raise RuntimeError("a Wake has one waiter at a time")
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None


async def wait_event(event: asyncio.Event | Wake, timeout: float) -> bool:
    """True once `event` is set, False when `timeout` seconds pass first."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


class InFlight:
    """A count of some work under way (`entered`) that others can wait on,
    for at most some seconds, to drop to none (`none_within`)."""

    def __init__(self) -> None:
        self.count = 0
        self._none = asyncio.Event()  # bound to a loop on first use (Python 3.10+)
        self._none.set()

    @contextmanager
    def entered(self) -> Iterator[None]:
        self.count += 1
        self._none.clear()
        try:
            yield
        finally:
            self.count -= 1
            if not self.count:
                self._none.set()

    async def none_within(self, timeout: float) -> bool:
        """True once none is under way, False when `timeout` seconds pass first."""
        return await wait_event(self._none, timeout)
