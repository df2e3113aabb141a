"""`BlockingPool`: a named set of threads for one kind of blocking work.

asyncio.to_thread shares one small default pool among everything; with a
thousand load balancers converging, a haproxy reload or an OVSDB transaction
would wait behind hundreds of unrelated file reads and checks. Each kind of
work (OVSDB, haproxy checks and files, haproxy reloads) gets its own pool, so
one kind never queues behind another.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


class BlockingPool:
    def __init__(self, name: str, threads: int = 1):
        self.name = name
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        # Like asyncio.to_thread: the caller's context (which load balancer) goes along.
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def submit(self, fn: Callable[..., object], *args) -> None:
        """Run fn on this pool after what is queued, for clean-up nobody waits
        on; an exception it raises is logged."""
        self._pool.submit(fn, *args).add_done_callback(functools.partial(_log_failure, self.name, fn))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


def _log_failure(pool: str, fn: Callable, future: Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning(
            "pool=%s action=%s result=error error=%r", pool, getattr(fn, "__name__", fn), str(future.exception())
        )
