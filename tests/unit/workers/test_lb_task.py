"""LbTask's schedule: a stop that meets a kick still stops."""

import asyncio

from lbagent.workers.lb_task import LbTask


async def test_stop_wins_over_a_kick_in_the_same_step():
    """Python 3.11's asyncio.wait_for swallows a cancel that arrives while the
    awaited event is set: the loop then ran another pass and waited again,
    and stop() never returned."""
    passes = []

    async def reconcile(lb_id, resync):
        passes.append(lb_id)
        return 1

    task = LbTask("lb-1", reconcile, lambda t: None, lambda: 3600.0)
    task.start()
    task.kick()
    await asyncio.wait_for(_until(lambda: passes == ["lb-1"]), 5)
    await asyncio.sleep(0)  # back to waiting for the next kick
    task.kick()
    stopping = asyncio.ensure_future(task.stop())
    done, _ = await asyncio.wait({stopping}, timeout=5)  # asyncio.wait cancels nothing itself
    try:
        assert stopping in done
    finally:
        task.task.cancel()
        await asyncio.gather(stopping, return_exceptions=True)


async def _until(predicate):
    while not predicate():
        await asyncio.sleep(0.001)


async def test_a_passed_task_waits_for_what_it_lacks_and_says_why():
    lacks = ["waiting for ovn-installed"]
    done = []

    async def reconcile(lb_id, resync):
        return 3

    task = LbTask("lb-1", reconcile, done.append, lambda: 3600.0, readiness=lambda lb_id: lacks[0])
    assert (task.state, task.reason) == ("pending", "not reconciled yet at the accepted generation")
    task.start()
    task.kick()
    await asyncio.wait_for(_until(lambda: done), 5)
    assert (task.state, task.reason, task.passed, task.generation) == ("pending", lacks[0], True, 3)
    assert task.set_waiting(None) is True
    assert (task.state, task.reason) == ("ready", None)
    assert task.set_waiting(None) is False
    await task.stop()


async def test_a_failed_task_stays_in_error_whatever_it_waits_for():
    async def reconcile(lb_id, resync):
        raise RuntimeError("boom")

    done = []
    task = LbTask("lb-1", reconcile, done.append, lambda: 3600.0, readiness=lambda lb_id: None)
    task.start()
    task.kick()
    await asyncio.wait_for(_until(lambda: done), 5)
    assert task.set_waiting("haproxy not running") is False
    assert (task.state, task.reason, task.passed) == ("error", "boom", False)
    await task.stop()


async def test_only_a_pass_nobody_asked_for_after_a_success_is_a_resync():
    """Kicks, the first pass and retries after a failure are whole passes; the
    timer's pass after a success may stop after its first look."""
    seen = []
    outcomes = [1, RuntimeError("boom"), 2, 3]

    async def reconcile(lb_id, resync):
        seen.append(resync)
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    task = LbTask("lb-1", reconcile, lambda t: None, lambda: 0.01)
    task._next_delay = lambda: 0.01  # the retry after the failure comes as soon as a resync would
    task.start()
    task.kick()
    await asyncio.wait_for(_until(lambda: len(seen) == 4), 5)
    await task.stop()
    # kick: whole; timer after success: resync (fails); retry: whole; timer after success: resync
    assert seen == [False, True, False, True]


async def test_a_kick_in_the_turn_the_resync_timer_ran_out_is_still_a_kick(monkeypatch):
    """The kick may be the only word of a change (a UDP member's health): that pass is whole."""
    from lbagent.workers import lb_task as lb_task_mod

    seen = []

    async def reconcile(lb_id, resync):
        seen.append(resync)
        return 1

    task = LbTask("lb-1", reconcile, lambda t: None, lambda: 3600.0)

    async def timer_ran_out_as_a_kick_came(event, timeout):
        await asyncio.sleep(0)
        if len(seen) == 1:  # after the first pass: the timer's turn, with a kick in it
            task._wake.set()
            return False
        return await asyncio.wait_for(event.wait(), 5)

    monkeypatch.setattr(lb_task_mod, "wait_event", timer_ran_out_as_a_kick_came)
    task.start()
    task.kick()
    await asyncio.wait_for(_until(lambda: len(seen) >= 2), 5)
    await task.stop()
    assert seen[:2] == [False, False]
