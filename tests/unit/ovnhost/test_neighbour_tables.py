"""Neighbour table limits under a fake /proc/sys/net: raised, never lowered, errors typed."""

import pytest

from lbagent.ovnhost.neighbour_tables import Limits, NeighbourTableError, raise_limits, read_limits


def proc(tmp_path, family="ipv4", soft=512, hard=1024):
    directory = tmp_path / family / "neigh" / "default"
    directory.mkdir(parents=True)
    (directory / "gc_thresh2").write_text(f"{soft}\n")
    (directory / "gc_thresh3").write_text(f"{hard}\n")
    return directory


def test_limits_below_the_wanted_ones_are_raised(tmp_path):
    directory = proc(tmp_path)
    assert raise_limits("ipv4", Limits(soft=3_000, hard=6_000), tmp_path) == Limits(3_000, 6_000)
    assert (directory / "gc_thresh3").read_text() == "6000\n"
    assert read_limits("ipv4", tmp_path) == Limits(3_000, 6_000)


def test_a_higher_limit_is_never_lowered(tmp_path):
    directory = proc(tmp_path, soft=100, hard=50_000)
    before = (directory / "gc_thresh3").stat().st_mtime_ns
    assert raise_limits("ipv4", Limits(soft=2_000, hard=4_000), tmp_path) == Limits(2_000, 50_000)
    assert (directory / "gc_thresh3").stat().st_mtime_ns == before


def test_a_missing_table_is_a_typed_error(tmp_path):
    with pytest.raises(NeighbourTableError, match="cannot read .*ipv6/neigh/default/gc_thresh2"):
        raise_limits("ipv6", Limits(1, 2), tmp_path)


def test_a_limit_that_cannot_be_written_is_a_typed_error(tmp_path):
    directory = proc(tmp_path)
    (directory / "gc_thresh3").unlink()
    (directory / "gc_thresh3").mkdir()  # reads and writes fail like a read-only /proc
    with pytest.raises(NeighbourTableError, match="gc_thresh3"):
        raise_limits("ipv4", Limits(2_000, 4_000), tmp_path)
