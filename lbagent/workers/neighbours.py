"""`NeighbourCapacity`: the kernel's neighbour tables sized for the load balancers accepted.

Every load balancer adds entries to the machine-wide neighbour tables (see
`lbagent.ovnhost.neighbour_tables`): in its namespace its gateway, its inner
peer, each member it forwards to and the on-link clients it answers, and in
the host's namespace its outer peer. At the kernel's default limit of 1,024
entries a host of a few hundred load balancers starts refusing new entries,
and VIPs fall silent one by one. When a desired state is accepted, this
raises each family's limits to what it needs; limits already higher (an
operator's) are left alone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from lbagent.desired.model import DesiredState
from lbagent.ovnhost.neighbour_tables import (
    FAMILIES,
    PROC_SYS_NET,
    Limits,
    NeighbourTableError,
    raise_limits,
    read_limits,
)
from lbagent.workers.pods import selections

log = logging.getLogger(__name__)

# Entries left to the host's own use: the kernel's default hard limit.
BASE_ENTRIES = 1_024
# Per load balancer beside one per member: its gateway, both ends of its
# address pair, and on-link clients answered at once (most reach it through
# the router, whose one entry serves them all).
PER_LOADBALANCER = 19
# The hard limit is twice the soft one: the kernel collects entries above the
# soft limit within seconds, and a burst of new clients still finds room.
HARD_PER_SOFT = 2

Run = Callable[..., Awaitable[Any]]


def entries_needed(desired: DesiredState) -> int:
    """Neighbour entries per family the load balancers of `desired` may hold at once."""
    members = sum(len(group.backends) for lb in desired.loadbalancers for group in lb.backend_groups)
    selected = sum(
        len(pairs) for by_lb in selections(desired.pods, desired.loadbalancers).values() for pairs in by_lb.values()
    )
    return BASE_ENTRIES + PER_LOADBALANCER * len(desired.loadbalancers) + members + selected


class NeighbourCapacity:
    """Raises (`enabled`) or only watches the neighbour tables' limits, and says what it found."""

    def __init__(self, enabled: bool, run: Run = asyncio.to_thread, root: Path = PROC_SYS_NET):
        self._enabled = enabled
        self._run = run  # the limits are files under /proc: read and written off the event loop
        self._root = root
        self._needed: int | None = None
        self._limits: dict[str, Limits] = {}
        self.last_error: str | None = None

    async def accommodate(self, desired: DesiredState) -> None:
        """Raise the limits for `desired`, writing only a limit below it; errors go to status."""
        # One hop to a thread for all of it: each hop waited for a thread and
        # then for the loop, and the answer to a refresh waited for three.
        needed, limits, errors = await self._run(self._size, desired)
        before = dict(self._limits)
        self._limits.update(limits)
        self._needed, self.last_error = needed, "; ".join(errors) or None
        short = sorted(family for family, limits in self._limits.items() if limits.hard < needed)
        if errors or short or self._limits != before:
            log.log(
                logging.WARNING if errors or short else logging.INFO,
                "object=neighbour_tables action=size needed=%d limits=%s short=%s error=%r",
                needed,
                ",".join(f"{family}:{lim.soft}/{lim.hard}" for family, lim in sorted(self._limits.items())),
                ",".join(short) or "none",
                self.last_error,
            )

    def _size(self, desired: DesiredState) -> tuple[int, dict[str, Limits], list[str]]:
        """(entries needed, each family's limits after raising them or only reading them, errors).
        Blocking: every pod against every selector, and files under /proc."""
        needed = entries_needed(desired)
        wanted = Limits(soft=needed, hard=HARD_PER_SOFT * needed)
        limits, errors = {}, []
        for family in FAMILIES:
            try:
                if self._enabled:
                    limits[family] = raise_limits(family, wanted, self._root)
                else:
                    limits[family] = read_limits(family, self._root)
            except NeighbourTableError as exc:
                errors.append(str(exc))
        return needed, limits, errors

    def status(self) -> dict:
        return {
            "sizing": self._enabled,
            "entries_needed": self._needed,
            "limits": {family: {"soft": lim.soft, "hard": lim.hard} for family, lim in sorted(self._limits.items())},
            "last_error": self.last_error,
        }
