"""in_turns: every item, in order, with the event loop's other tasks run between slices."""

import asyncio

from lbagent.support.turns import in_turns


async def test_other_tasks_run_between_slices_and_every_item_comes_in_order():
    seen: list = []

    async def other() -> None:
        seen.append("other")

    async def walk() -> None:
        async for item in in_turns(range(7), size=3):
            seen.append(item)

    await asyncio.gather(walk(), other())
    # The walk's first slice runs before the other task gets its turn; after that, one turn per slice.
    assert seen == [0, 1, 2, "other", 3, 4, 5, 6]


async def test_a_short_walk_gives_no_turn():
    seen: list = []

    async def other() -> None:
        seen.append("other")

    async def walk() -> None:
        async for item in in_turns(["a", "b"], size=2):
            seen.append(item)

    await asyncio.gather(walk(), other())
    assert seen == ["a", "b", "other"]
