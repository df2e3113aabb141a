"""`LockMap`: one change at a time per load balancer.

A change takes its load balancer's lock when it is prepared and gives it back
once its reload (or live edit) is over, or it is dropped; the load balancer's
next change waits meanwhile. A lock is forgotten when nobody holds or awaits
it. Read as a mapping, the map shows the locks in use: load balancer id ->
(the lock, how many hold or await it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping


class LockMap(Mapping[str, tuple[asyncio.Lock, int]]):
    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, lb_id: str) -> None:
        """One change at a time per load balancer; a lock is forgotten when nobody holds or awaits it."""
        lock, users = self._locks.get(lb_id, (asyncio.Lock(), 0))
        self._locks[lb_id] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._forget_user(lb_id)
            raise

    def release(self, lb_id: str) -> None:
        self._locks[lb_id][0].release()
        self._forget_user(lb_id)

    def _forget_user(self, lb_id: str) -> None:
        lock, users = self._locks[lb_id]
        if users == 1:
            del self._locks[lb_id]
        else:
            self._locks[lb_id] = (lock, users - 1)

    def __getitem__(self, lb_id: str) -> tuple[asyncio.Lock, int]:
        return self._locks[lb_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._locks)

    def __len__(self) -> int:
        return len(self._locks)
