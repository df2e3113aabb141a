"""Calls that arrive while a batch runs go together in the next one."""

import asyncio

import pytest

from lbagent.support.coalesce import Coalescer


class Refused(Exception):
    pass


class Work:
    """Doubles numbers; refuses negative ones (a batch holding one is refused whole)."""

    def __init__(self):
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.release.set()

    async def together(self, items):
        self.batches.append(list(items))
        await self.release.wait()
        if any(i < 0 for i in items):
            raise Refused(f"refused {[i for i in items if i < 0]}")
        return [2 * i for i in items]

    async def alone(self, item):
        return (await self.together([item]))[0]


def coalescer(work, max_batch=10, split_on=Refused):
    return Coalescer("t-work", work.together, work.alone, split_on, max_batch)


async def held_with_queued(*queued):
    """A coalescer whose first batch (item 1) has started and is held, with `queued` submitted behind it."""
    work = Work()
    work.release.clear()
    runs = coalescer(work)
    first = asyncio.ensure_future(runs.submit(1))
    await asyncio.sleep(0)
    later = [asyncio.ensure_future(runs.submit(i)) for i in queued]
    await asyncio.sleep(0)
    return work, runs, first, later


async def test_calls_arriving_during_a_batch_go_together_in_the_next():
    work, _, first, later = await held_with_queued(2, 3, 4)
    work.release.set()
    assert await first == 2 and await asyncio.gather(*later) == [4, 6, 8]
    assert work.batches == [[1], [2, 3, 4]]


async def test_batches_are_bounded():
    work = Work()
    runs = coalescer(work, max_batch=2)
    assert await asyncio.gather(*(runs.submit(i) for i in range(5))) == [0, 2, 4, 6, 8]
    assert work.batches == [[0, 1], [2, 3], [4]]


async def test_a_refused_batch_is_split_and_only_the_culprit_fails():
    work = Work()
    runs = coalescer(work)
    outcomes = await asyncio.gather(*(runs.submit(i) for i in (1, -2, 3)), return_exceptions=True)
    assert outcomes[0] == 2 and outcomes[2] == 6
    assert isinstance(outcomes[1], Refused) and str(outcomes[1]) == "refused [-2]"
    assert work.batches == [[1, -2, 3], [1], [-2], [3]]


async def test_a_failure_that_is_not_the_items_fault_reaches_every_waiter():
    work = Work()
    runs = coalescer(work, split_on=KeyError)  # Refused now means "the work could not run at all"
    outcomes = await asyncio.gather(*(runs.submit(i) for i in (1, -2, 3)), return_exceptions=True)
    assert all(isinstance(o, Refused) for o in outcomes)
    assert work.batches == [[1, -2, 3]]


async def test_a_caller_that_stopped_waiting_is_skipped():
    work, _, first, (gone, kept) = await held_with_queued(2, 3)
    gone.cancel()
    work.release.set()
    assert await first == 2 and await kept == 6
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert work.batches == [[1], [3]]


async def test_waiters_hear_it_when_the_runner_is_cancelled():
    _, runs, first, (queued,) = await held_with_queued(2)
    runs._runner.cancel()
    for waiter in (first, queued):
        with pytest.raises(RuntimeError, match="t-work stopped"):
            await asyncio.wait_for(waiter, 1)


async def test_a_batch_that_answers_for_fewer_items_fails_them_all():
    async def short(items):
        return [0]

    runs = Coalescer("t-short", short, short, Refused, 10)
    outcomes = await asyncio.gather(runs.submit(1), runs.submit(2), return_exceptions=True)
    assert all(isinstance(o, RuntimeError) and "1 results for 2 items" in str(o) for o in outcomes)


async def test_a_gather_hook_holds_the_batch_while_more_items_arrive():
    work, seen, more = Work(), [], asyncio.Event()

    async def gather(waiting):
        seen.append(list(waiting))
        await more.wait()

    runs = Coalescer("t-work", work.together, work.alone, Refused, 10, gather=gather)
    first = asyncio.ensure_future(runs.submit(1))
    await asyncio.sleep(0)
    later = [asyncio.ensure_future(runs.submit(i)) for i in (2, 3)]
    await asyncio.sleep(0)
    assert work.batches == [] and seen == [[1]]  # the first call waited for the hook
    more.set()
    assert await first == 2 and await asyncio.gather(*later) == [4, 6]
    assert work.batches == [[1, 2, 3]]


async def test_a_full_batch_does_not_wait_for_the_gather_hook():
    work, hooked = Work(), []

    async def gather(waiting):
        hooked.append(list(waiting))
        await asyncio.sleep(3600)  # would hold the batch for ever

    runs = Coalescer("t-work", work.together, work.alone, Refused, 2, gather=gather)
    both = [asyncio.ensure_future(runs.submit(i)) for i in (1, 2)]
    assert await asyncio.wait_for(asyncio.gather(*both), 5) == [2, 4]
    assert work.batches == [[1, 2]] and hooked == []
