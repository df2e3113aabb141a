"""`wait_event`: wait for an asyncio event at most some seconds, cancellable.

Python 3.11's `asyncio.wait_for(event.wait(), t)` swallows a cancellation that
arrives in the loop step the event is set: the caller returns as if woken, a
loop around it goes on, and whoever cancelled it (LbTask.stop, a shutdown)
waits for ever. `asyncio.timeout` tells its own cancellation from anyone
else's, so every wait of that kind goes through here.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout: float) -> bool:
    """True once `event` is set, False when `timeout` seconds pass first."""
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True
