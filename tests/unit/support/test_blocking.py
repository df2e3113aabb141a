"""BlockingPool: work nobody waits on runs in order and reports its failures."""

import asyncio
import logging
import threading

from lbagent.support.blocking import BlockingPool


async def test_submitted_work_runs_after_what_is_queued_and_its_failure_is_logged(caplog):
    pool = BlockingPool("test-pool", 1)
    order, gate = [], threading.Event()

    def first():
        assert gate.wait(10)
        order.append("first")

    def broken():
        order.append("broken")
        raise OSError("disk gone")

    try:
        queued = asyncio.ensure_future(pool.run(first))
        await asyncio.sleep(0)  # the task's first step hands `first` to the pool
        with caplog.at_level(logging.WARNING, logger="lbagent.support.blocking"):
            pool.submit(broken)
            gate.set()
            await queued
            await pool.run(order.append, "last")
        assert order == ["first", "broken", "last"]
        assert "pool=test-pool action=broken result=error error='disk gone'" in caplog.text
    finally:
        pool.shutdown()
