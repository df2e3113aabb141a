"""`in_turns`: a long loop on the event loop that lets the others run between slices.

The API and the supervisor walk every load balancer in a few places (a status
document, the allocations and fingerprints of a refresh). At a thousand load
balancers each walk is a quarter of a second of Python, and in one piece it
is a quarter of a second in which no probe, pass or `/healthz` gets a turn.
Walked in slices, the same work costs the same CPU and the loop is never held
for more than a slice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import TypeVar

T = TypeVar("T")

SLICE = 50  # items between two turns of the loop: a few milliseconds of work each


async def in_turns(items: Iterable[T], size: int = SLICE) -> AsyncIterator[T]:
    """`items`, with a turn of the event loop after every `size` of them."""
    for index, item in enumerate(items):
        if index and index % size == 0:
            await asyncio.sleep(0)
        yield item
