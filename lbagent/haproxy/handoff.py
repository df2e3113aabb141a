"""`HaproxyHandoff`: a pass's haproxy change, prepared while the pass's host part
runs and handed to haproxy after it.

- `converge(lb_id, config, host_part)`: haproxy stages and checks the
  candidate (`HaproxyManager.prepare`) while `host_part()` runs: the check
  needs nothing of the host, and in a cold start it was the last step of a
  pass before its reload. The change is queued only once the host part has
  succeeded. If the host part fails, or the pass is cancelled, nothing of the
  change goes live: a check still running is cancelled with a cancelled pass
  (a stopping agent must not wait for it) and otherwise left to finish, and
  whatever it prepared is dropped, which releases the load balancer for its
  next change.
- `remove(lb_id)`: the load balancer's configuration goes.
- `coming()`: some pass has yet to hand its change over (haproxy's reload
  batcher waits its debounce while this, or a queued load balancer, says
  more is on its way).
- `stop()`: cancels the checks of abandoned changes and waits until
  everything they prepared is dropped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from lbagent.haproxy.render import HaproxyConfig
from lbagent.support.waits import InFlight

log = logging.getLogger(__name__)


class HaproxyHandoff:
    def __init__(self, haproxy):
        self._haproxy = haproxy  # HaproxyManager: prepare, queue, drop
        self._before = InFlight()  # passes between their start and the hand-over
        self._abandoned: set[asyncio.Future] = set()  # checks whose pass gave up on them
        self._drops: set[asyncio.Task] = set()

    def coming(self) -> bool:
        return self._before.count > 0

    async def converge(self, lb_id: str, config: HaproxyConfig, host_part: Callable[[], Awaitable[None]]) -> bool:
        """Returns True once haproxy runs the change (False: it ran it already)."""
        with self._before.entered():
            prepared = await self._prepare_during(lb_id, config, host_part)
        return await self._hand_over(prepared)

    async def remove(self, lb_id: str) -> bool:
        with self._before.entered():
            prepared = await self._haproxy.prepare(lb_id, None)
        return await self._hand_over(prepared)

    async def stop(self) -> None:
        """Once the passes have stopped: cancel the checks they abandoned and
        wait until whatever those prepared is dropped."""
        while self._abandoned or self._drops:
            for check in self._abandoned:
                check.cancel()
            # A check that ends starts its drop before this gather returns (its
            # callbacks come first): the loop waits for that drop too.
            await asyncio.gather(*self._abandoned, *self._drops, return_exceptions=True)

    async def _prepare_during(self, lb_id: str, config: HaproxyConfig, host_part: Callable[[], Awaitable[None]]):
        preparing = asyncio.ensure_future(self._haproxy.prepare(lb_id, config.text, config.files))
        try:
            await host_part()
            await asyncio.wait({preparing})  # neither cancels it nor raises its error
        except BaseException as exc:
            self._abandon(preparing, cancel=isinstance(exc, asyncio.CancelledError))
            raise
        return preparing.result()  # a refused candidate raises here

    async def _hand_over(self, prepared) -> bool:
        if prepared is None:
            return False
        # Shielded: a pass cancelled now leaves the change to its reload, and
        # the load balancer locked until that reload is over; its outcome is
        # then read by nobody else.
        done = self._haproxy.queue(prepared)
        done.add_done_callback(_retrieved)
        return await asyncio.shield(done)

    def _abandon(self, preparing: asyncio.Future, cancel: bool) -> None:
        self._abandoned.add(preparing)
        preparing.add_done_callback(self._abandoned.discard)
        preparing.add_done_callback(self._drop_result)
        if cancel:
            preparing.cancel()

    def _drop_result(self, done: asyncio.Future) -> None:
        if done.cancelled() or done.exception() is not None or done.result() is None:
            return  # nothing prepared, or prepare cleaned up after itself
        task = asyncio.ensure_future(self._haproxy.drop(done.result()))
        self._drops.add(task)
        task.add_done_callback(self._dropped)

    def _dropped(self, task: asyncio.Task) -> None:
        self._drops.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("object=haproxy action=drop result=error error=%r", str(task.exception()))


def _retrieved(done: asyncio.Future) -> None:
    """Marks an outcome as read: whoever awaits it reads it again."""
    if not done.cancelled():
        done.exception()
