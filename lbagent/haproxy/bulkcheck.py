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
from pathlib import Path
from typing import Awaitable, Callable

from lbagent.haproxy.candidate import StagedChange
from lbagent.haproxy.errors import HaproxyCheckError

MAX_BATCH = 250  # candidates in one haproxy -c: its error output stays readable


class BulkChecker:
    def __init__(self, check: Callable[[list[Path]], Awaitable[None]], slots: asyncio.Semaphore):
        self._check = check  # runs `haproxy -c` on these files (off the event loop)
        self._slots = slots  # shared with every other haproxy -c
        self._waiting: list[tuple[StagedChange, asyncio.Future]] = []
        self._runner: asyncio.Task | None = None

    async def check(self, staged: StagedChange) -> None:
        """Return once haproxy accepts `staged` (with the base); HaproxyCheckError if it refuses it."""
        done = asyncio.get_running_loop().create_future()
        self._waiting.append((staged, done))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.get_running_loop().create_task(self._run(), name="haproxy-checks")
        await done

    async def _run(self) -> None:
        while self._waiting:
            async with self._slots:  # candidates keep arriving while this waits: the batch grows
                batch = [(s, f) for s, f in self._waiting[:MAX_BATCH] if not f.done()]
                del self._waiting[:MAX_BATCH]
                if batch:
                    await self._check_batch(batch)

    async def _check_batch(self, batch: list[tuple[StagedChange, asyncio.Future]]) -> None:
        paths = [batch[0][0].check_paths[0]] + [staged.staged_text for staged, _ in batch]
        try:
            await self._check(paths)
        except HaproxyCheckError as exc:
            if len(batch) == 1:  # that was its own check: the error is its own
                _resolve(batch[0][1], exc)
            else:
                await asyncio.gather(*(self._check_alone(staged, done) for staged, done in batch))
        except Exception as exc:  # haproxy could not run at all: every waiter hears it
            for _, done in batch:
                _resolve(done, exc)
        else:
            for _, done in batch:
                _resolve(done)

    async def _check_alone(self, staged: StagedChange, done: asyncio.Future) -> None:
        try:
            await self._check(staged.check_paths)
        except Exception as exc:
            _resolve(done, exc)
        else:
            _resolve(done)


def _resolve(done: asyncio.Future, error: BaseException | None = None) -> None:
    """Tell a waiter the outcome, unless it has stopped waiting (cancelled)."""
    if done.done():
        return
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
