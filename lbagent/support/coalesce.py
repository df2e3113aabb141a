"""`Coalescer`: calls that arrive while one is running go together in the next.

For work whose fixed cost dwarfs its cost per item: one `haproxy -c` for many
candidates, one OVSDB transaction for many ports. The first call runs at
once, and whatever arrives meanwhile forms the next batch (at most
`max_batch` items); only a `gather` hook, if given, may hold a batch back a
little while more items are on their way. If a batch fails with `split_on`,
its items are run one by one, so only the culprits fail and each hears its
own error; any other failure reaches every item of the batch. A caller that
stops waiting (cancelled) is skipped. The batches run in a context of their own,
not the first caller's: whose item it is must be read from the item.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from typing import Generic, TypeVar

I = TypeVar("I")  # noqa: E741 - an item
R = TypeVar("R")


class Coalescer(Generic[I, R]):
    def __init__(
        self,
        name: str,
        run_batch: Callable[[list[I]], Awaitable[list[R]]],
        run_one: Callable[[I], Awaitable[R]],
        split_on: type[Exception],
        max_batch: int,
        slots: asyncio.Semaphore | None = None,
        gather: Callable[[list[I]], Awaitable[None]] | None = None,
    ):
        self._name = name
        self._run_batch = run_batch  # returns one result per item, in order
        self._run_one = run_one
        self._split_on = split_on
        self._max_batch = max_batch
        self._slots = slots  # shared with other work of the same kind, if given
        self._gather = gather  # awaited with the waiting items before each batch is taken
        self._waiting: list[tuple[I, asyncio.Future]] = []
        self._runner: asyncio.Task | None = None

    async def submit(self, item: I) -> R:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._waiting.append((item, done))
        if self._runner is None or self._runner.done():
            self._runner = loop.create_task(self._run(), name=self._name, context=contextvars.Context())
        return await done

    async def _run(self) -> None:
        batch: list[tuple[I, asyncio.Future]] = []
        try:
            while self._waiting:
                if self._gather is not None and len(self._waiting) < self._max_batch:
                    await self._gather([item for item, done in self._waiting if not done.done()])
                async with self._slots or nullcontext():  # items keep arriving while this waits: the batch grows
                    batch = [(item, done) for item, done in self._waiting[: self._max_batch] if not done.done()]
                    del self._waiting[: self._max_batch]
                    if batch:
                        await self._run_together(batch)
        except BaseException as exc:  # cancelled, or worse: nobody may be left waiting for ever
            stranded, self._waiting = batch + self._waiting, []
            for _, done in stranded:
                resolve(done, error=exc if isinstance(exc, Exception) else RuntimeError(f"{self._name} stopped"))
            raise

    async def _run_together(self, batch: list[tuple[I, asyncio.Future]]) -> None:
        try:
            results = await self._run_batch([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{self._name}: {len(results)} results for {len(batch)} items")
        except self._split_on as exc:
            if len(batch) == 1:  # that was its own run: the error is its own
                resolve(batch[0][1], error=exc)
            else:
                await asyncio.gather(*(self._run_alone(item, done) for item, done in batch))
        except Exception as exc:  # the work could not run at all: every waiter hears it
            for _, done in batch:
                resolve(done, error=exc)
        else:
            for (_, done), result in zip(batch, results):
                resolve(done, result)

    async def _run_alone(self, item: I, done: asyncio.Future) -> None:
        try:
            result = await self._run_one(item)
        except Exception as exc:
            resolve(done, error=exc)
        else:
            resolve(done, result)


def resolve(done: asyncio.Future, result=None, error: BaseException | None = None) -> None:
    """Tell a waiter the outcome, unless it has stopped waiting (cancelled)."""
    if done.done():
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)
