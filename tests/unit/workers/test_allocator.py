import ipaddress

import pytest

import lbagent.workers.allocator as allocator
from lbagent.desired.fields import MAX_BACKENDS_PER_LB
from lbagent.workers.allocator import (
    FIRST,
    AddressPair,
    ExhaustedError,
    PairAllocator,
    assign_ports,
    inner_prefix6_space,
)


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


def test_ipv6_pairs_start_after_the_subnet_router_anycast_address():
    alloc = PairAllocator(space=inner_prefix6_space("fd4c:4241::/48"))
    assert alloc.allocate("a", set()) == AddressPair("fd4c:4241::2", "fd4c:4241::3")
    assert alloc.allocate("b", set()) == AddressPair("fd4c:4241::4", "fd4c:4241::5")
    assert alloc.allocate("a", set()) == AddressPair("fd4c:4241::2", "fd4c:4241::3")


def test_ipv6_pairs_skip_host_addresses_and_allocated_pairs():
    taken = {"fd4c:4241::3", "fd4c:4241::4"}
    alloc = PairAllocator({"old": AddressPair("fd4c:4241::6", "fd4c:4241::7")}, inner_prefix6_space("fd4c:4241::/48"))
    assert alloc.allocate("a", taken) == AddressPair("fd4c:4241::8", "fd4c:4241::9")


def test_ipv6_pairs_stay_below_the_reserved_anycast_addresses():
    # A /120: 256 addresses, the lowest two and the highest 128 not handed out: 63 pairs.
    alloc = PairAllocator(space=inner_prefix6_space("fd00:0:0:1::100/120"))
    got = [alloc.allocate(f"lb-{i}", set()) for i in range(63)]
    assert got[-1] == AddressPair("fd00:0:0:1::17e", "fd00:0:0:1::17f")
    with pytest.raises(ExhaustedError, match="no free fd00:0:0:1::100/120 address pair"):
        alloc.allocate("one-more", set())


def test_ports_are_stable_and_lowest_free():
    ports = assign_ports({}, ["a", "b", "c"])
    assert ports == {"a": 1025, "b": 1026, "c": 1027}
    ports = assign_ports(ports, ["a", "c", "d"])  # b removed, d new: takes b's freed port
    assert ports == {"a": 1025, "c": 1027, "d": 1026}


def test_port_exhaustion(monkeypatch):
    monkeypatch.setattr(allocator, "PORT_MAX", 1026)
    with pytest.raises(ExhaustedError):
        assign_ports({}, ["a", "b", "c"])


def test_the_port_range_is_the_backend_limit_the_api_enforces():
    assert allocator.PORT_MAX - allocator.PORT_MIN + 1 == MAX_BACKENDS_PER_LB == 64511


def test_every_port_of_the_range_can_be_given_out():
    keys = [f"be-{i}" for i in range(MAX_BACKENDS_PER_LB)]
    ports = assign_ports({}, keys)
    assert sorted(ports.values()) == list(range(allocator.PORT_MIN, allocator.PORT_MAX + 1))


def test_more_members_than_ports_say_how_many_and_what_to_do():
    with pytest.raises(ExhaustedError) as caught:
        assign_ports({}, [f"be-{i}" for i in range(MAX_BACKENDS_PER_LB + 1)])
    assert str(caught.value) == (
        "64512 members (backends and selected pods) need a port on INNER each, more than the 64511 of "
        "1025-65535: remove backends or narrow the pod selectors"
    )
