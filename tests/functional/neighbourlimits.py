"""The machine's neighbour table limits, kept and put back around a test that lets an agent raise them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lbagent.ovnhost.neighbour_tables import FAMILIES, PROC_SYS_NET, Limits, read_limits


def write_limits(family: str, limits: Limits) -> None:
    directory = PROC_SYS_NET / family / "neigh" / "default"
    # gc_thresh2 first when lowering, last when raising: never above gc_thresh3.
    (directory / "gc_thresh2").write_text(f"{min(limits.soft, read_limits(family).soft)}\n")
    (directory / "gc_thresh3").write_text(f"{limits.hard}\n")
    (directory / "gc_thresh2").write_text(f"{limits.soft}\n")


# The kernel's own defaults: what a test starts from, whatever an earlier agent (a demo) raised them to.
KERNEL_DEFAULTS = Limits(soft=512, hard=1024)


@contextmanager
def kept_limits() -> Iterator[dict[str, Limits]]:
    """The kernel's default limits for the test (yielded); the machine's limits as they were
    written back afterwards, whatever the test did to them."""
    before = {family: read_limits(family) for family in FAMILIES}
    try:
        for family in FAMILIES:
            write_limits(family, KERNEL_DEFAULTS)
        yield {family: read_limits(family) for family in FAMILIES}
    finally:
        for family, limits in before.items():
            write_limits(family, limits)
