"""lbagent.ovnhost.iplib over a stand-in for the kernel's rtnetlink socket."""

from __future__ import annotations

import errno
import socket
import struct

import pytest
from pyroute2.netlink.rtnl import RTM_NEWADDR
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg

from lbagent.metrics import write_counts
from lbagent.ovnhost import rtnl_writes
from lbagent.ovnhost.errors import AlreadyExists, LinkNotFound, NetlinkError
from lbagent.ovnhost.iplib import Address, KernelRoute, Link, MovableRoute, Netlink, SourceRule
from lbagent.ovnhost.rtnl_socket import HEADER

NLMSG_ERROR, NLMSG_DONE = 2, 3


class Kernel:
    """Answers each request in turn: a list of messages (bytes, given the request's
    sequence number) or an errno, which it answers as an acknowledgement."""

    def __init__(self, *answers: list[bytes] | int):
        self.answers, self.sent = list(answers), []

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)

    def recv(self, size: int) -> bytes:
        sequence = self.sent[-1][8:12]
        answer = self.answers.pop(0)
        if isinstance(answer, int):
            answer = [struct.pack("=IHHIIi", 36, NLMSG_ERROR, 0, 0, 0, -answer) + bytes(16)]
        return b"".join(m[:8] + sequence + m[12:] for m in answer)


def address(addr: str, family: int, prefixlen: int) -> bytes:
    msg = ifaddrmsg()
    msg["family"], msg["prefixlen"], msg["index"] = family, prefixlen, 7
    msg["attrs"] = [("IFA_ADDRESS", addr)] + ([("IFA_LOCAL", addr)] if family == socket.AF_INET else [])
    msg["header"]["type"] = RTM_NEWADDR
    msg.encode()
    return bytes(msg.data)


def done() -> bytes:
    return struct.pack("=IHHIIi", 20, NLMSG_DONE, 2, 0, 0, 0)


def body(data: bytes) -> bytes:
    return data[HEADER.size :]


LINK = Link(index=5, name="a0", kind="veth", mac="", mtu=1442, up=True, peer_index=0)


def test_all_addresses_are_those_of_both_families_on_every_link():
    kernel = Kernel(
        [address("198.18.0.1", socket.AF_INET, 24), done()],
        [address("fd4c:4241::2", socket.AF_INET6, 64), address("fe80::1", socket.AF_INET6, 64), done()],
    )
    assert Netlink(kernel).all_addresses() == {"198.18.0.1", "fd4c:4241::2", "fe80::1"}  # type: ignore[arg-type]
    assert [body(sent)[:1] for sent in kernel.sent] == [bytes([socket.AF_INET]), bytes([socket.AF_INET6])]
    assert all(body(sent)[4:8] == bytes(4) for sent in kernel.sent)  # index 0: every link


@pytest.mark.parametrize(
    "call, write",
    [
        (lambda nl: nl.add_veth("a0", "a1", 9), rtnl_writes.add_veth("a0", "a1", 9)),
        (lambda nl: nl.delete_link("a0"), rtnl_writes.delete_link("a0")),
        (lambda nl: nl.set_link(LINK, mtu=1400, up=False), rtnl_writes.set_link(5, "a0", mtu=1400, up=False)),
        (
            lambda nl: nl.add_address(LINK, Address("198.18.0.5", 24, "198.18.0.255")),
            rtnl_writes.add_address(5, "a0", "198.18.0.5", 24, broadcast="198.18.0.255"),
        ),
        (
            lambda nl: nl.delete_address(LINK, Address("198.18.0.5", 24)),
            rtnl_writes.delete_address(5, "a0", "198.18.0.5", 24),
        ),
        (
            lambda nl: nl.replace_route(KernelRoute("0.0.0.0/0", "169.254.0.100", 5, None, 1000)),
            rtnl_writes.replace_route(rtnl_writes.Route("0.0.0.0/0", 1000, oif=5, gateway="169.254.0.100")),
        ),
        (
            lambda nl: nl.delete_route(KernelRoute("169.254.0.100/32", None, 5, "169.254.0.101", 1000)),
            rtnl_writes.delete_route(rtnl_writes.Route("169.254.0.100/32", 1000, oif=5, prefsrc="169.254.0.101")),
        ),
        (
            lambda nl: nl.replace_movable_route(LINK, MovableRoute("198.18.0.0/16", "198.18.0.1", metric=10)),
            rtnl_writes.replace_route(
                rtnl_writes.Route("198.18.0.0/16", 254, oif=5, gateway="198.18.0.1", metric=10, scope=0, proto=3)
            ),
        ),
        (
            lambda nl: nl.delete_movable_route(LINK, MovableRoute("198.18.0.0/16", scope=253)),
            rtnl_writes.delete_route(rtnl_writes.Route("198.18.0.0/16", 254, oif=5, scope=253, proto=3)),
        ),
        (
            lambda nl: nl.delete_source_rule(SourceRule("169.254.0.101", 1000, 31000)),
            rtnl_writes.source_rule("169.254.0.101", 1000, 31000, delete=True),
        ),
    ],
)
def test_each_write_is_sent_acknowledged_and_counted(call, write):
    kernel = Kernel(0)
    before = write_counts().get("netlink", 0)
    call(Netlink(kernel))  # type: ignore[arg-type]
    assert [body(sent) for sent in kernel.sent] == [write.body]
    flags = struct.unpack_from("=H", kernel.sent[0], 6)[0]
    assert flags == write.flags
    assert write_counts()["netlink"] == before + 1


def test_a_rule_already_there_is_left_alone_and_other_refusals_are_typed():
    kernel = Kernel(errno.EEXIST, 0)
    nl = Netlink(kernel)  # type: ignore[arg-type]
    assert nl.add_source_rule(SourceRule("169.254.0.101", 1000, 31000)) is False
    assert nl.add_source_rule(SourceRule("169.254.0.102", 1000, 31000)) is True
    nl = Netlink(Kernel(errno.EEXIST, errno.EEXIST))  # type: ignore[arg-type]
    nl.add_skip_rules("169.254.0.0", 16, 30999, 31999)  # both there already: fine
    with pytest.raises(AlreadyExists, match="add veth a0"):
        Netlink(Kernel(errno.EEXIST)).add_veth("a0", "a1")  # type: ignore[arg-type]
    with pytest.raises(LinkNotFound, match="delete link a0"):
        Netlink(Kernel(errno.ENODEV)).delete_link("a0")  # type: ignore[arg-type]
    with pytest.raises(NetlinkError, match="replace route 198.18.0.0/16 a0: EINVAL"):
        Netlink(Kernel(errno.EINVAL)).replace_movable_route(LINK, MovableRoute("198.18.0.0/16"))  # type: ignore[arg-type]
