import ipaddress

import pytest

import lbagent.workers.allocator as allocator
from lbagent.workers.allocator import FIRST, AddressPair, ExhaustedError, PairAllocator, assign_ports


def test_first_pair_starts_at_0_100():
    assert PairAllocator().allocate("a", set()) == AddressPair("169.254.0.100", "169.254.0.101")


def test_pairs_are_stable_and_distinct():
    alloc = PairAllocator()
    a = alloc.allocate("a", set())
    b = alloc.allocate("b", set())
    assert a != b and alloc.allocate("a", set()) == a
    assert {a.inner, a.outer}.isdisjoint({b.inner, b.outer})


def test_skips_addresses_present_on_the_host():
    pair = PairAllocator().allocate("a", {"169.254.0.101", "169.254.0.102"})
    assert pair == AddressPair("169.254.0.104", "169.254.0.105")


def test_never_hands_out_the_metadata_address():
    alloc = PairAllocator()
    alloc._cursor = int(ipaddress.IPv4Address("169.254.169.252"))
    assert alloc.allocate("a", set()) == AddressPair("169.254.169.252", "169.254.169.253")
    # The next slot, .254/.255, holds the metadata address: skipped.
    assert alloc.allocate("b", set()) == AddressPair("169.254.170.0", "169.254.170.1")


def test_wraps_around_once_and_reports_exhaustion(monkeypatch):
    # A tiny range: three slots.
    monkeypatch.setattr(allocator, "LAST", FIRST + 5)
    alloc = PairAllocator()
    got = [alloc.allocate(k, set()) for k in "abc"]
    assert len({p.inner for p in got}) == 3
    alloc.release("b")
    assert alloc.allocate("d", set()) == got[1]  # wrapped around to the freed slot
    with pytest.raises(ExhaustedError):
        alloc.allocate("e", set())


def test_exhaustion_when_host_holds_everything(monkeypatch):
    monkeypatch.setattr(allocator, "LAST", FIRST + 3)
    taken = {"169.254.0.100", "169.254.0.103"}
    with pytest.raises(ExhaustedError):
        PairAllocator().allocate("a", taken)


def test_ports_are_stable_and_lowest_free():
    ports = assign_ports({}, ["a", "b", "c"])
    assert ports == {"a": 1025, "b": 1026, "c": 1027}
    ports = assign_ports(ports, ["a", "c", "d"])  # b removed, d new: takes b's freed port
    assert ports == {"a": 1025, "c": 1027, "d": 1026}


def test_port_exhaustion(monkeypatch):
    monkeypatch.setattr(allocator, "PORT_MAX", 1026)
    with pytest.raises(ExhaustedError):
        assign_ports({}, ["a", "b", "c"])
