"""wait_event: woken, timed out, and cancelled even when the event is set in the same step."""

import asyncio

import pytest

from lbagent.waits import wait_event


async def test_set_event_wakes_and_time_limit_ends_the_wait():
    event = asyncio.Event()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 5) is True


async def test_a_cancel_that_meets_the_event_is_not_swallowed():
    """asyncio.wait_for returned True here (Python 3.11), and the cancel was lost."""
    event = asyncio.Event()
    waiter = asyncio.ensure_future(wait_event(event, 3600))
    await asyncio.sleep(0)  # waiting now
    event.set()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
