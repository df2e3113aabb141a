"""`HeapKeeper`: keeps Python's cyclic garbage collector from pausing the agent.

With a thousand load balancers the agent holds a few hundred thousand
long-lived objects (validated models, the OVSDB replica, tasks), and a
collection of the oldest generation walks all of them: 90-150 ms with the
event loop stopped, started by the interpreter whenever enough objects have
survived, in the middle of a refresh as often as not (it was the p99 of a
backend change at N=1000). Objects that survive a quiet moment are frozen
instead (`gc.freeze`: the collector no longer walks them; reference counting
still frees them), so the collections the interpreter starts stay small.
What was frozen and has since become cyclic garbage is reclaimed by a full
collection at most once per `full_interval`, again only when quiet.

What the agent made before its first pass (modules, schemas, the OVSDB
replica, the persisted state) is frozen at start: a cold start of 100 load
balancers otherwise walked it in full collections of 50-100 ms, every thread
stopped, while the passes were building. And young collections run every
`YOUNG_THRESHOLD` allocations rather than 700: the older generations are
collected after a count of young collections, and a cold start of 1,000 ran
ten full collections (0.6 s of CPU with the GIL held) where it now runs none;
the young collections take as long in all (a pass makes cyclic garbage
either way), a few milliseconds each instead of half of one.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

TICK_INTERVAL = 60.0  # seconds between looks
FULL_INTERVAL = 3600.0  # seconds between collections that include the frozen objects
YOUNG_THRESHOLD = 10_000  # allocations (less deallocations) between young collections; Python's default: 700
M_ARENA_MAX = -8  # glibc's mallopt parameter
MALLOC_ARENAS = 2


def limit_malloc_arenas(
    arenas: int = MALLOC_ARENAS, libc: object | None = None, environ: Mapping[str, str] = os.environ
) -> bool:
    """At most `arenas` malloc arenas for the whole process; True if set.

    glibc gives a thread that finds the arenas in use by others one of its
    own, up to eight per core, and memory freed in one arena serves only
    that one: the namespace, iptables, OVSDB and render threads each grew
    their own. With 1,000 load balancers the agent's RSS was 204 MB when they
    were ready and 210 MB after their first resyncs; with two arenas, 180 MB
    both times, for the same CPU. Called before the agent starts its threads.
    An operator's MALLOC_ARENA_MAX wins; without glibc nothing changes."""
    if "MALLOC_ARENA_MAX" in environ:
        return False
    try:
        mallopt = getattr(libc or ctypes.CDLL(None), "mallopt")  # noqa: B009 - absent without glibc
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(M_ARENA_MAX, arenas))


class HeapKeeper:
    def __init__(
        self,
        quiet: Callable[[], bool],
        full_interval: float = FULL_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._quiet = quiet  # nothing being converged: a pause now delays nobody
        self._full_interval = full_interval
        self._clock = clock
        self._last_full = clock()
        self.collections = {"young": 0, "full": 0}

    def freeze_start(self) -> None:
        """Freeze what the start made (it lives as long as the agent), and space out young collections."""
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        gc.set_threshold(YOUNG_THRESHOLD, *gc.get_threshold()[1:])
        log.debug(
            "object=heap action=freeze frozen=%d seconds=%.3f", gc.get_freeze_count(), time.perf_counter() - started
        )

    def tick(self) -> str | None:
        """Collect and freeze if the agent is quiet; which collection ran, or None."""
        if not self._quiet():
            return None
        full = self._clock() - self._last_full >= self._full_interval
        started = time.perf_counter()
        if full:
            gc.unfreeze()
            self._last_full = self._clock()
        unreachable = gc.collect()
        gc.freeze()
        kind = "full" if full else "young"
        self.collections[kind] += 1
        log.debug(
            "object=heap action=collect kind=%s unreachable=%d frozen=%d seconds=%.3f",
            kind,
            unreachable,
            gc.get_freeze_count(),
            time.perf_counter() - started,
        )
        return kind
