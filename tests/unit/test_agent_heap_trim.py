"""The agent's heap trim keeps running when one trim fails."""

import asyncio
import logging
from types import SimpleNamespace

from lbagent import agent as agent_module


class FailingOnce:
    def __init__(self):
        self.calls = 0
        self.done = asyncio.Event()

    def trim(self):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("no thread to run on")
        self.done.set()
        return True


async def test_a_failed_trim_is_logged_and_the_next_one_runs(monkeypatch, caplog):
    monkeypatch.setattr(agent_module, "TRIM_INTERVAL", 0.001)
    heap = FailingOnce()
    task = asyncio.create_task(agent_module.Agent._trim_heap(SimpleNamespace(heap=heap)))
    try:
        with caplog.at_level(logging.WARNING, logger="lbagent.agent"):
            await asyncio.wait_for(heap.done.wait(), 5)
    finally:
        task.cancel()
    assert heap.calls >= 2
    assert "action=trim result=error" in caplog.text and "no thread to run on" in caplog.text
