"""`wait_event`: wait for an asyncio event at most some seconds, cancellable;
`InFlight`: how much of some work is under way, and a bounded wait for none.

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


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
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
