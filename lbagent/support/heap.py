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

Memory that Python and the libraries free goes back to malloc, which keeps
it: after the first resyncs of 1,000 load balancers the agent's RSS had
grown from 122 to 140 MB for as many objects. `trim` hands malloc's free
pages back to the kernel (glibc's malloc_trim, which also releases pages in
the middle of its heaps): 6 to 16 MB each time in that run, in under 5 ms,
on a thread of its own, as the interpreter lock is not held meanwhile.
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
TRIM_INTERVAL = 10.0  # seconds between handing malloc's free pages back
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
    mallopt = _glibc("mallopt", libc)
    return mallopt is not None and bool(mallopt(M_ARENA_MAX, arenas))


def _glibc(function: str, libc: object | None = None) -> Callable[..., int] | None:
    """`function` of the C library the process runs on (or of `libc`); None if it has none such (not glibc)."""
    try:
        return getattr(libc or ctypes.CDLL(None), function)
    except (OSError, AttributeError):
        return None


class HeapKeeper:
    def __init__(
        self,
        quiet: Callable[[], bool],
        full_interval: float = FULL_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        malloc_trim: Callable[[int], int] | None = None,
    ):
        self._quiet = quiet  # nothing being converged: a pause now delays nobody
        self._full_interval = full_interval
        self._clock = clock
        self._last_full = clock()
        self._malloc_trim = malloc_trim or _glibc("malloc_trim")
        self.collections = {"young": 0, "full": 0}
        self.trims = 0

    def trim(self) -> bool:
        """Hand malloc's free pages back to the kernel (blocking: run it off the event loop);
        False without glibc."""
        if self._malloc_trim is None:
            return False
        self._malloc_trim(0)
        self.trims += 1
        return True

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
