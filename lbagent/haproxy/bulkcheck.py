"""`BulkChecker`: candidate configs checked by one `haproxy -c` many at a time.

Each `haproxy -c` costs a process and a parse of the base file; in a cold
start of a thousand load balancers that was most of haproxy's CPU, on a
machine already short of it. Candidates without files of their own (no
certificates: the text is all that differs between them) that are waiting
together go to one `haproxy -c`: the base, then every candidate. If haproxy
accepts that, every one of them passes; if not, each is checked alone, so
only the culprits are refused and each hears its own error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from lbagent.haproxy.candidate import StagedChange
from lbagent.haproxy.errors import HaproxyCheckError
from lbagent.support.coalesce import Coalescer

MAX_BATCH = 250  # candidates in one haproxy -c: its error output stays readable


class BulkChecker:
    def __init__(self, check: Callable[[list[Path]], Awaitable[None]], slots: asyncio.Semaphore):
        self._check = check  # runs `haproxy -c` on these files (off the event loop)
        # slots: shared with every other haproxy -c
        self._checks = Coalescer(
            "haproxy-checks", self._check_together, self._check_alone, HaproxyCheckError, MAX_BATCH, slots
        )

    async def check(self, staged: StagedChange) -> None:
        """Return once haproxy accepts `staged` (with the base); HaproxyCheckError if it refuses it."""
        await self._checks.submit(staged)

    async def _check_together(self, batch: list[StagedChange]) -> list[None]:
        await self._check([batch[0].check_paths[0]] + [staged.staged_text for staged in batch])
        return [None] * len(batch)

    async def _check_alone(self, staged: StagedChange) -> None:
        await self._check(staged.check_paths)
