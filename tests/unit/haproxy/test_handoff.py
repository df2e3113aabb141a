"""HaproxyHandoff with a fake manager that counts who holds each load
balancer's lock (as HaproxyManager's prepare/queue/drop do): whatever happens
to a pass, the lock is released once and nothing of a failed pass goes live."""

import asyncio
import gc

import pytest

from lbagent.haproxy.handoff import HaproxyHandoff
from lbagent.haproxy.render import HaproxyConfig

CONFIG = HaproxyConfig("text")


class FakeManager:
    def __init__(self):
        self.locked: dict[str, int] = {}
        self.dropped: list[str] = []
        self.checked = asyncio.Event()
        self.reloads: list[asyncio.Future] = []

    async def prepare(self, lb_id, text, files=None):
        self.locked[lb_id] = self.locked.get(lb_id, 0) + 1
        self.checked.set()
        return lb_id

    def queue(self, lb_id):
        done = asyncio.get_running_loop().create_future()
        done.add_done_callback(lambda _: self._unlock(lb_id))  # reads no outcome, as the manager's
        self.reloads.append(done)
        return done

    async def drop(self, lb_id):
        self.dropped.append(lb_id)
        self._unlock(lb_id)

    def _unlock(self, lb_id):
        self.locked[lb_id] -= 1


async def test_a_cancel_right_after_the_host_part_still_drops_the_checked_change():
    manager = FakeManager()
    handoff = HaproxyHandoff(manager)

    async def host_part():
        await manager.checked.wait()
        asyncio.current_task().cancel()  # arrives at the hand-over's next await, the check being done

    with pytest.raises(asyncio.CancelledError):
        await handoff.converge("a", CONFIG, host_part)
    await asyncio.wait_for(handoff.stop(), 5)
    assert manager.dropped == ["a"] and manager.locked == {"a": 0} and manager.reloads == []  # never queued


async def test_a_pass_cancelled_during_its_reload_leaves_the_change_to_it():
    unhandled = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: unhandled.append(context))
    manager = FakeManager()
    handoff = HaproxyHandoff(manager)

    async def host_part():
        pass

    converging = asyncio.ensure_future(handoff.converge("a", CONFIG, host_part))
    while not manager.reloads:
        await asyncio.sleep(0)
    converging.cancel()
    with pytest.raises(asyncio.CancelledError):
        await converging
    reload = manager.reloads[0]
    assert not reload.cancelled() and manager.locked == {"a": 1}  # still in its batch, still locked
    reload.set_exception(RuntimeError("reload failed"))  # nobody awaits it any more
    await asyncio.sleep(0)
    assert manager.locked == {"a": 0}
    del reload, converging
    manager.reloads.clear()
    gc.collect()  # an outcome nobody read would be reported now
    assert unhandled == []
