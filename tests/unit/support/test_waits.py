"""wait_event: woken, timed out, and cancelled even when the event is set in the same step,
on an asyncio.Event and on a Wake; Wake: one waiter, no deque; InFlight: a bounded wait
for some work to be under way no more."""

import asyncio
import sys

import pytest

from lbagent.support.waits import InFlight, Wake, wait_event

EVENTS = pytest.mark.parametrize("make", [asyncio.Event, Wake], ids=["Event", "Wake"])


@EVENTS
async def test_set_event_wakes_and_time_limit_ends_the_wait(make):
    event = make()
    assert await wait_event(event, 0.01) is False
    event.set()
    assert await wait_event(event, 5) is True


@EVENTS
async def test_a_cancel_that_meets_the_event_is_not_swallowed(make):
    """asyncio.wait_for returned True here (Python 3.11), and the cancel was lost."""
    event = make()
    waiter = asyncio.ensure_future(wait_event(event, 3600))
    await asyncio.sleep(0)  # waiting now
    event.set()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter


async def test_a_wake_set_while_waited_for_wakes_its_waiter_and_stays_set():
    wake = Wake()
    waiter = asyncio.ensure_future(wait_event(wake, 5))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):  # one waiter at a time
        await wake.wait()
    wake.set()
    assert await waiter is True and wake.is_set()
    assert await wait_event(wake, 0) is True  # still set: no wait
    wake.clear()
    assert not wake.is_set() and await wait_event(wake, 0.01) is False


async def test_a_cancelled_wait_leaves_the_wake_free_for_the_next():
    wake = Wake()
    waiter = asyncio.ensure_future(wake.wait())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    wake.set()  # nobody waits: nothing to wake, and no error
    await asyncio.wait_for(wake.wait(), 1)


def test_a_wake_is_a_fraction_of_an_event():
    assert not hasattr(Wake(), "__dict__")
    assert sys.getsizeof(Wake()) < 100 < sys.getsizeof(asyncio.Event()._waiters)


async def test_in_flight_wait_ends_when_the_last_leaves_or_at_the_limit():
    work = InFlight()
    assert await work.none_within(0) is True  # nothing under way: no wait at all
    first, second = work.entered(), work.entered()
    first.__enter__()
    second.__enter__()
    waiter = asyncio.ensure_future(work.none_within(5))
    assert await work.none_within(0.01) is False and work.count == 2
    first.__exit__(None, None, None)
    await asyncio.sleep(0)
    assert not waiter.done()  # one is still under way
    second.__exit__(None, None, None)
    assert await waiter is True and work.count == 0


async def test_in_flight_work_that_fails_is_no_longer_under_way():
    work = InFlight()
    with pytest.raises(RuntimeError):
        with work.entered():
            raise RuntimeError("the pass failed")
    assert work.count == 0 and await work.none_within(0) is True
