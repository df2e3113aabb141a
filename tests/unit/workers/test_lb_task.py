"""LbTask's schedule: a stop that meets a kick still stops."""

import asyncio

from lbagent.workers.lb_task import LbTask


async def test_stop_wins_over_a_kick_in_the_same_step():
    """Python 3.11's asyncio.wait_for swallows a cancel that arrives while the
    awaited event is set: the loop then ran another pass and waited again,
    and stop() never returned."""
    passes = []

    async def reconcile(lb_id):
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
