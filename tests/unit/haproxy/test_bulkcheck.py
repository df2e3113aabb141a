"""BulkChecker with a fake `haproxy -c`: candidates waiting together share one
check; a refused batch is split so only the culprit hears its error."""

import asyncio
from pathlib import Path

import pytest

from lbagent.haproxy.bulkcheck import BulkChecker
from lbagent.haproxy.candidate import StagedChange
from lbagent.haproxy.errors import HaproxyCheckError


def staged(name: str) -> StagedChange:
    work = Path("/nonexistent") / name
    return StagedChange(name, work / "t.cfg", work / "certs", work, "text", False, None)


class FakeHaproxy:
    def __init__(self, bad=(), broken=False):
        self.calls: list[list[str]] = []
        self.bad = set(bad)
        self.broken = broken

    async def check(self, paths):
        await asyncio.sleep(0.01)
        names = [p.parent.name for p in paths[1:]]
        self.calls.append(names)
        if self.broken:
            raise OSError("haproxy: no such file")
        refused = self.bad & set(names)
        if refused:
            raise HaproxyCheckError(f"refused {sorted(refused)}", "candidate")


async def check_all(checker, names):
    return await asyncio.gather(*(checker.check(staged(n)) for n in names), return_exceptions=True)


async def test_candidates_waiting_together_share_one_check():
    haproxy = FakeHaproxy()
    checker = BulkChecker(haproxy.check, asyncio.Semaphore(1))
    results = await check_all(checker, ["a", "b", "c", "d"])
    assert results == [None] * 4
    # The first runs alone (nothing else waited yet); the rest waited for its slot together.
    assert sorted(n for call in haproxy.calls for n in call) == ["a", "b", "c", "d"]
    assert len(haproxy.calls) <= 2


async def test_a_refused_batch_is_checked_one_by_one_and_only_the_culprit_fails():
    haproxy = FakeHaproxy(bad={"c"})
    checker = BulkChecker(haproxy.check, asyncio.Semaphore(1))
    results = await check_all(checker, ["a", "b", "c", "d"])
    assert [type(r).__name__ for r in results] == ["NoneType", "NoneType", "HaproxyCheckError", "NoneType"]
    assert "refused ['c']" in str(results[2])
    assert ["c"] in haproxy.calls and ["a"] in haproxy.calls


async def test_haproxy_that_cannot_run_fails_every_waiter():
    checker = BulkChecker(FakeHaproxy(broken=True).check, asyncio.Semaphore(1))
    results = await check_all(checker, ["a", "b"])
    assert all(isinstance(r, OSError) for r in results)


async def test_a_cancelled_waiter_is_skipped():
    haproxy = FakeHaproxy()
    checker = BulkChecker(haproxy.check, asyncio.Semaphore(1))
    first = asyncio.create_task(checker.check(staged("a")))
    second = asyncio.create_task(checker.check(staged("b")))
    await asyncio.sleep(0)
    second.cancel()
    await first
    with pytest.raises(asyncio.CancelledError):
        await second
    assert all("b" not in call for call in haproxy.calls)
