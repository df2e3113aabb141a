"""The agent's rtnetlink writes say what pyroute2's IPRoute said for the same arguments."""

import struct

import pytest
from pyroute2 import IPBatch

from lbagent.ovnhost import rtnl_writes
from lbagent.ovnhost.rtnl_socket import HEADER

TABLE = 0x4C420065


def _pyroute2(call) -> bytes:
    """The request pyroute2 encodes, its header's sequence number and port id zeroed."""
    compiler = IPBatch()
    try:
        call(compiler)
        data = bytes(compiler.batch)
    finally:
        compiler.close()
    return data[:8] + bytes(8) + data[16:]


def _ours(write: rtnl_writes.Write) -> bytes:
    return HEADER.pack(HEADER.size + len(write.body), write.kind, write.flags, 0, 0) + write.body


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (
            rtnl_writes.add_veth("a0", "a1"),
            lambda c: c.link("add", ifname="a0", kind="veth", peer={"ifname": "a1"}),
        ),
        (
            rtnl_writes.add_veth("a0", "a1", 7),
            lambda c: c.link("add", ifname="a0", kind="veth", peer={"ifname": "a1", "net_ns_fd": 7}),
        ),
        (rtnl_writes.delete_link("a0"), lambda c: c.link("del", ifname="a0")),
        (
            rtnl_writes.set_link(5, "a0", alias="lbagent/x", mac="00:22:0a:00:00:12", mtu=1442, up=True),
            lambda c: c.link("set", index=5, ifalias="lbagent/x", address="00:22:0a:00:00:12", mtu=1442, state="up"),
        ),
        (rtnl_writes.set_link(5, "a0", up=False), lambda c: c.link("set", index=5, state="down")),
        (rtnl_writes.set_link(5, "a0", mtu=1400), lambda c: c.link("set", index=5, mtu=1400)),
        (
            rtnl_writes.add_address(5, "a0", "198.18.0.1", 24),
            lambda c: c.addr("add", index=5, address="198.18.0.1", prefixlen=24),
        ),
        (
            rtnl_writes.add_address(5, "a0", "198.18.0.1", 24, broadcast="198.18.0.255"),
            lambda c: c.addr("add", index=5, address="198.18.0.1", prefixlen=24, broadcast="198.18.0.255"),
        ),
        (
            rtnl_writes.add_address(5, "a0", "169.254.0.101", 16, noprefixroute=True),
            lambda c: c.addr("add", index=5, address="169.254.0.101", prefixlen=16, flags=0x200, family=2),
        ),
        (
            rtnl_writes.delete_address(5, "a0", "198.18.0.1", 24),
            lambda c: c.addr("del", index=5, address="198.18.0.1", prefixlen=24),
        ),
        (
            rtnl_writes.delete_address(5, "a0", "2001:db8::1", 64),
            lambda c: c.addr("del", index=5, address="2001:db8::1", prefixlen=64),
        ),
        (
            rtnl_writes.replace_route(rtnl_writes.Route("198.18.0.0/24", 254, oif=5, prefsrc="198.18.0.1")),
            lambda c: c.route("replace", dst="198.18.0.0/24", oif=5, prefsrc="198.18.0.1", table=254, scope=253),
        ),
        (
            rtnl_writes.replace_route(rtnl_writes.Route("0.0.0.0/0", TABLE, oif=5, gateway="169.254.0.100")),
            lambda c: c.route("replace", dst="0.0.0.0/0", gateway="169.254.0.100", oif=5, table=TABLE),
        ),
        (
            rtnl_writes.delete_route(rtnl_writes.Route("198.18.0.0/24", 254, oif=5)),
            lambda c: c.route("del", dst="198.18.0.0/24", oif=5, table=254, scope=253),
        ),
        (
            rtnl_writes.delete_route(rtnl_writes.Route("::/0", TABLE, oif=5, gateway="fd4c:4241::2")),
            lambda c: c.route("del", dst="::/0", gateway="fd4c:4241::2", oif=5, table=TABLE),
        ),
        (  # a provider network's route, moved between its uplink and its bridge
            rtnl_writes.replace_route(
                rtnl_writes.Route(
                    "198.18.0.0/24",
                    254,
                    oif=5,
                    gateway="198.18.0.1",
                    prefsrc="198.18.0.2",
                    metric=100,
                    scope=0,
                    proto=3,
                )
            ),
            lambda c: c.route(
                "replace",
                dst="198.18.0.0/24",
                gateway="198.18.0.1",
                oif=5,
                prefsrc="198.18.0.2",
                priority=100,
                table=254,
                scope=0,
                proto=3,
            ),
        ),
        (
            rtnl_writes.delete_route(rtnl_writes.Route("198.18.0.0/24", 254, oif=5, metric=100, scope=253, proto=3)),
            lambda c: c.route("del", dst="198.18.0.0/24", oif=5, priority=100, table=254, scope=253, proto=3),
        ),
        (
            rtnl_writes.source_rule("169.254.0.101", TABLE, 31000),
            lambda c: c.rule("add", src="169.254.0.101", src_len=32, table=TABLE, priority=31000),
        ),
        (
            rtnl_writes.source_rule("fd4c:4241::3", TABLE, 31000, delete=True),
            lambda c: c.rule("del", family=10, src="fd4c:4241::3", src_len=128, table=TABLE, priority=31000),
        ),
        (rtnl_writes.delete_rule_at(30999, 2), lambda c: c.rule("del", priority=30999, family=2)),
        (rtnl_writes.delete_rule_at(30999, 10), lambda c: c.rule("del", priority=30999, family=10)),
    ],
)
def test_writes_are_encoded_as_pyroute2_encodes_them(ours, theirs):
    assert _ours(ours).hex() == _pyroute2(theirs).hex()


def test_an_ipv6_address_is_added_with_its_local_end_too():
    """As the batch adds every address (the kernel takes IFA_LOCAL, equal to IFA_ADDRESS, as the address)."""
    write = rtnl_writes.add_address(5, "a0", "2001:db8::5", 64)
    theirs = _pyroute2(lambda c: c.addr("add", index=5, address="2001:db8::5", prefixlen=64, flags=0x2, family=10))
    local = struct.pack("=HH", 20, rtnl_writes.IFA_LOCAL) + bytes.fromhex("20010db8000000000000000000000005")
    assert _ours(write)[:4] != theirs[:4] and _ours(write)[4:] == theirs[4:] + local
    assert (write.op, write.target) == ("add address", "2001:db8::5/64 a0")


def test_adds_ask_for_a_new_object_and_sets_and_deletes_only_for_an_answer():
    assert rtnl_writes.add_veth("a0", "a1").flags == rtnl_writes.CREATE
    assert (
        rtnl_writes.replace_route(rtnl_writes.Route("0.0.0.0/0", 254, gateway="198.18.0.1")).flags
        == rtnl_writes.REPLACE
    )
    for write in (
        rtnl_writes.delete_link("a0"),
        rtnl_writes.set_link(1, "lo", up=True),
        rtnl_writes.delete_rule_at(1, 2),
    ):
        assert write.flags == rtnl_writes.SET
    assert rtnl_writes.source_rule("198.18.0.1", 100, 31000).exists_ok
    assert not rtnl_writes.source_rule("198.18.0.1", 100, 31000, delete=True).exists_ok
