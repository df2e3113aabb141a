"""The kernel's neighbour tables' limits: `gc_thresh2` and `gc_thresh3` of ARP and NDP.

The kernel keeps one neighbour table per family for the whole machine, every
network namespace's entries in it, and its limits are set in the initial
namespace only (`/proc/sys/net/ipv{4,6}/neigh/default/`). Past `gc_thresh3`
(1,024 by default) it refuses new entries ("neighbour table overflow"): a load
balancer's namespace then cannot resolve its gateway, a member or a client,
and its VIP stops answering though everything the agent built is in place.

This module reads those two limits and raises them; it never lowers one that
an operator set higher.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lbagent.ovnhost.errors import HostError

FAMILIES = ("ipv4", "ipv6")
PROC_SYS_NET = Path("/proc/sys/net")


class NeighbourTableError(HostError):
    """A neighbour table limit could not be read or written."""


@dataclass(frozen=True)
class Limits:
    """`soft` (gc_thresh2): entries above it are collected within 5 s; `hard` (gc_thresh3): no more."""

    soft: int
    hard: int


def _path(family: str, name: str, root: Path) -> Path:
    return root / family / "neigh" / "default" / name


def _read(path: Path) -> int:
    try:
        return int(path.read_text(encoding="ascii"))
    except (OSError, ValueError) as exc:
        raise NeighbourTableError(f"cannot read {path}: {exc}") from None


def _write(path: Path, value: int) -> None:
    try:
        path.write_text(f"{value}\n", encoding="ascii")
    except OSError as exc:
        raise NeighbourTableError(f"cannot raise {path} to {value}: {exc}") from None


def read_limits(family: str, root: Path = PROC_SYS_NET) -> Limits:
    return Limits(soft=_read(_path(family, "gc_thresh2", root)), hard=_read(_path(family, "gc_thresh3", root)))


def raise_limits(family: str, wanted: Limits, root: Path = PROC_SYS_NET) -> Limits:
    """Raise `family`'s limits to at least `wanted`, never lowering either; the limits now in force."""
    current = read_limits(family, root)
    # The hard limit first: at no moment is the soft one above it.
    if current.hard < wanted.hard:
        _write(_path(family, "gc_thresh3", root), wanted.hard)
    if current.soft < wanted.soft:
        _write(_path(family, "gc_thresh2", root), wanted.soft)
    return read_limits(family, root)
