"""ReloadBatcher with a fake install-and-reload: failures reach every waiter of
their batch, and closing mid-batch leaves nobody waiting. (Pacing and
batching against a real haproxy: test_haproxy_manager.py.)"""

import asyncio

import pytest

from lbagent.haproxy import batching
from lbagent.haproxy.batching import ReloadBatcher


class FakeReloads:
    def __init__(self):
        self.batches: list[list[str]] = []
        self.fail_next: Exception | None = None
        self.release = asyncio.Event()
        self.release.set()

    async def commit(self, batch):
        self.batches.append(list(batch))
        await self.release.wait()
        if self.fail_next is not None:
            error, self.fail_next = self.fail_next, None
            raise error
        return 0.01


def batcher(reloads):
    return ReloadBatcher(reloads.commit, debounce=0.01, max_delay=0.5)


async def test_a_failed_reload_reaches_every_waiter_and_the_next_batch_still_goes():
    reloads = FakeReloads()
    reloads.fail_next = RuntimeError("reload failed")
    batches = batcher(reloads)
    failed = [batches.add("a"), batches.add("b")]
    for waiter in failed:
        with pytest.raises(RuntimeError, match="reload failed"):
            await asyncio.wait_for(waiter, 5)
    assert await asyncio.wait_for(batches.add("c"), 5) is True
    assert reloads.batches == [["a", "b"], ["c"]]
    await batches.close()


async def test_closing_mid_reload_cancels_its_waiters_and_hands_back_the_queued_changes():
    reloads = FakeReloads()
    reloads.release.clear()
    batches = batcher(reloads)
    committing = batches.add("a")
    while not reloads.batches:  # the batch of "a" is being committed
        await asyncio.sleep(0.01)
    queued = batches.add("b")
    assert await batches.close() == ["b"]
    assert committing.cancelled() and queued.cancelled()


async def test_a_change_being_checked_joins_the_batch_it_is_waited_for():
    reloads = FakeReloads()
    batches = batcher(reloads)
    with batches.checking():
        first = batches.add("a")
        await asyncio.sleep(0.1)  # longer than the debounce: only the check in flight holds the batch
        second = batches.add("b")
    assert await asyncio.wait_for(asyncio.gather(first, second), 5) == [True, True]
    assert reloads.batches == [["a", "b"]]
    await batches.close()


async def test_with_nothing_coming_the_batch_goes_without_the_debounce():
    reloads = FakeReloads()
    coming = [True]
    batches = ReloadBatcher(reloads.commit, debounce=30, max_delay=60, coming=lambda: coming[0])
    first = batches.add("a")
    await asyncio.sleep(0.05)
    assert reloads.batches == []  # a pass still on its way: the debounce (30 s) holds the batch
    coming[0] = False
    second = batches.add("b")  # the last change of the burst: nothing else to wait for
    assert await asyncio.wait_for(asyncio.gather(first, second), 5) == [True, True]
    assert reloads.batches == [["a", "b"]]
    await batches.close()


async def test_with_nothing_coming_a_change_during_a_reload_is_still_paced(monkeypatch):
    """A steady trickle looks like this at every reload: one change came
    meanwhile, nothing else is coming. Pacing is what keeps such reloads to a
    share of the time."""
    monkeypatch.setattr(batching, "PACE_QUIET", 5.0)  # no early end by quiet within the test
    reloads = FakeReloads()
    reloads.release.clear()
    batches = ReloadBatcher(reloads.commit, debounce=0.01, max_delay=60, reload_pace=3000, coming=lambda: False)
    first = batches.add("a")
    while not reloads.batches:
        await asyncio.sleep(0.01)
    batches.add("b")  # arrives during the reload: the next one waits 3000 x its 0.01 s
    reloads.release.set()
    assert await asyncio.wait_for(first, 5) is True
    await asyncio.sleep(0.3)
    assert reloads.batches == [["a"]]
    await batches.close()
