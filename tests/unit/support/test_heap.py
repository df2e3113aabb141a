"""HeapKeeper: freezes what survives a quiet moment, thaws it for a full collection
once per interval, and leaves the heap alone while the agent is busy."""

from __future__ import annotations

import gc
import os
import weakref

import pytest

from lbagent.support import heap
from lbagent.support.heap import YOUNG_THRESHOLD, HeapKeeper


@pytest.fixture(autouse=True)
def thawed():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()  # the test process goes on as it was
    gc.set_threshold(*thresholds)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_quiet_tick_collects_and_freezes_the_survivors():
    gc.unfreeze()
    keeper = HeapKeeper(lambda: True, clock=Clock())
    survivor = [object() for _ in range(100)]
    assert keeper.tick() == "young"
    assert gc.get_freeze_count() >= len(survivor)
    assert keeper.collections == {"young": 1, "full": 0}


def test_a_busy_agent_is_left_alone():
    gc.unfreeze()
    keeper = HeapKeeper(lambda: False, clock=Clock())
    assert keeper.tick() is None
    assert gc.get_freeze_count() == 0 and keeper.collections == {"young": 0, "full": 0}


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self):
        self.me = self


def test_frozen_cycles_are_reclaimed_by_the_full_collection_once_an_interval():
    gc.unfreeze()
    clock = Clock()
    keeper = HeapKeeper(lambda: True, full_interval=100, clock=clock)
    node = Node()
    alive = weakref.ref(node)
    keeper.tick()  # node survives, and is frozen
    del node  # garbage now, but frozen: only a full collection sees it
    clock.now = 50
    assert keeper.tick() == "young" and alive() is not None
    clock.now = 150
    assert keeper.tick() == "full" and alive() is None
    assert keeper.collections == {"young": 2, "full": 1}


def test_what_the_start_made_is_frozen_busy_or_not():
    gc.unfreeze()
    keeper = HeapKeeper(lambda: False, clock=Clock())
    made_at_start = Node()
    assert any(o is made_at_start for o in gc.get_objects())
    keeper.freeze_start()
    assert not any(o is made_at_start for o in gc.get_objects())  # frozen: no collection walks it
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD
    assert keeper.collections == {"young": 0, "full": 0}  # no tick: the interval's full collection stays due


class FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, parameter, value):
        self.calls.append((parameter, value))
        return 1


def test_the_process_gets_two_malloc_arenas_unless_the_operator_said_otherwise():
    libc = FakeLibc()
    assert heap.limit_malloc_arenas(libc=libc, environ={}) is True
    assert libc.calls == [(heap.M_ARENA_MAX, 2)]
    assert heap.limit_malloc_arenas(libc=libc, environ={"MALLOC_ARENA_MAX": "4"}) is False
    assert len(libc.calls) == 1
    assert heap.limit_malloc_arenas(libc=object(), environ={}) is False  # no mallopt: not glibc
    assert heap.limit_malloc_arenas(environ={}) is True  # this machine's glibc takes it


def test_a_trim_asks_malloc_to_hand_back_every_free_page():
    calls = []
    keeper = HeapKeeper(lambda: False, clock=Clock(), malloc_trim=lambda pad: calls.append(pad) or 1)
    assert keeper.trim() is True and keeper.trim() is True
    assert calls == [0, 0] and keeper.trims == 2


def test_without_glibc_nothing_is_trimmed(monkeypatch):
    def no_libc(name):
        raise OSError("not glibc")

    monkeypatch.setattr(heap.ctypes, "CDLL", no_libc)
    keeper = HeapKeeper(lambda: False, clock=Clock())
    assert keeper.trim() is False and keeper.trims == 0


def _rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_this_machines_malloc_hands_back_pages_freed_below_a_live_block():
    # Blocks past 512 bytes come from malloc, not from Python's own allocator;
    # the one kept after them stops malloc from trimming its heap's top by itself.
    blocks = [bytes(1000) + bytes([i % 256]) for i in range(64 * 1024)]
    kept = bytes(1000) + b"kept"
    del blocks
    before = _rss_mib()
    assert HeapKeeper(lambda: False, clock=Clock()).trim() is True
    assert before - _rss_mib() >= 32, "malloc_trim released less than half of 64 MiB freed"
    assert kept
