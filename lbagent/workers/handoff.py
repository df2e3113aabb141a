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
- `coming()`: some pass has yet to hand its change over. haproxy's reload
  batcher waits its debounce for them, and only for them.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from lbagent.haproxy.render import HaproxyConfig
from lbagent.waits import InFlight


class HaproxyHandoff:
    def __init__(self, haproxy):
        self._haproxy = haproxy  # HaproxyManager: prepare, queue, drop
        self._before = InFlight()  # passes between their start and the hand-over
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
        """Wait for the drops of abandoned changes (their passes have stopped)."""
        await asyncio.gather(*self._drops, return_exceptions=True)

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
        # the load balancer locked until that reload is over.
        return await asyncio.shield(self._haproxy.queue(prepared))

    def _abandon(self, preparing: asyncio.Future, cancel: bool) -> None:
        preparing.add_done_callback(self._drop_result)
        if cancel:
            preparing.cancel()

    def _drop_result(self, done: asyncio.Future) -> None:
        if done.cancelled() or done.exception() is not None or done.result() is None:
            return  # nothing prepared, or prepare cleaned up after itself
        task = asyncio.ensure_future(self._haproxy.drop(done.result()))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)
