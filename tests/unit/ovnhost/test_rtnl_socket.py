"""One rtnetlink request over a raw socket: answers decoded, dumps across datagrams, refusals typed."""

import errno
import struct
from socket import AF_INET

import pytest
from pyroute2.netlink.rtnl import RTM_GETADDR, RTM_GETLINK, RTM_NEWADDR, RTM_NEWLINK
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from lbagent.ovnhost.errors import LinkNotFound, NetlinkError
from lbagent.ovnhost.iplib import Address, Netlink
from lbagent.ovnhost.rtnl_messages import ADDRESS, LINK, decoder
from lbagent.ovnhost.rtnl_requests import dump_addresses, get_link
from lbagent.ovnhost.rtnl_socket import request

DONE, ERROR = 3, 2


class Kernel:
    """A socket answering the request sent with `datagrams`, each a list of messages (bytes)
    whose sequence number is set to the request's unless `stray`."""

    def __init__(self, *datagrams: list[bytes], stray: bytes = b""):
        self.datagrams, self.stray, self.sent = list(datagrams), stray, []

    def send(self, data):
        self.sent.append(data)
        return len(data)

    def recv(self, size):
        sequence = self.sent[-1][8:12]
        messages = self.datagrams.pop(0)
        return self.stray + b"".join(m[:8] + sequence + m[12:] for m in messages)


def done(code: int = 0) -> bytes:
    return struct.pack("=IHHIIi", 20, DONE, 2, 0, 0, -code)


def refusal(code: int) -> bytes:
    return struct.pack("=IHHIIi", 36, ERROR, 0, 0, 0, -code) + bytes(16)


def address(addr: str, index: int = 7) -> bytes:
    msg = ifaddrmsg()
    msg["family"], msg["prefixlen"], msg["index"] = 2, 24, index
    msg["attrs"] = [("IFA_ADDRESS", addr), ("IFA_LOCAL", addr)]
    msg["header"]["type"] = RTM_NEWADDR
    msg.encode()
    return bytes(msg.data)


def link(name: str, index: int = 7) -> bytes:
    msg = ifinfmsg()
    msg["index"], msg["flags"] = index, 1
    msg["attrs"] = [("IFLA_IFNAME", name), ("IFLA_MTU", 1442), ("IFLA_ADDRESS", "00:22:0a:00:00:12")]
    msg["header"]["type"] = RTM_NEWLINK
    msg.encode()
    return bytes(msg.data)


def test_a_dump_is_read_across_datagrams_until_done():
    kernel = Kernel([address("198.18.0.12")], [address("198.18.0.13"), done()])
    answers = request(
        kernel, "dump addresses", "7", dump_addresses(7, AF_INET), RTM_GETADDR, decoder(ADDRESS), dump=True
    )
    assert [a.get("IFA_LOCAL") for a in answers] == ["198.18.0.12", "198.18.0.13"]
    sent = ifaddrmsg(kernel.sent[0])
    sent.decode()
    assert sent["header"]["type"] == RTM_GETADDR and sent["header"]["flags"] & 0x300  # NLM_F_DUMP


def test_answers_to_other_requests_are_skipped():
    stray = struct.pack("=IHHIIi", 20, DONE, 2, 7, 0, 0)
    kernel = Kernel([link("v0")], stray=stray)
    answers = request(kernel, "get link", "v0", get_link("v0"), RTM_GETLINK, decoder(LINK))
    assert [a.get("IFLA_IFNAME") for a in answers] == ["v0"]


def test_a_refusal_is_the_typed_error_of_the_operation():
    with pytest.raises(NetlinkError, match="dump routes table 9: ENOENT"):
        request(
            Kernel([refusal(errno.ENOENT)]),
            "dump routes",
            "table 9",
            dump_addresses(7, AF_INET),
            RTM_GETADDR,
            decoder(ADDRESS),
            True,
        )
    with pytest.raises(NetlinkError, match="dump addresses 7: EPERM"):
        request(
            Kernel([done(errno.EPERM)]),
            "dump addresses",
            "7",
            dump_addresses(7, AF_INET),
            RTM_GETADDR,
            decoder(ADDRESS),
            True,
        )


def test_a_socket_failure_is_a_netlink_error():
    class Broken(Kernel):
        def send(self, data):
            raise OSError(errno.ENOBUFS, "no buffer space")

    with pytest.raises(NetlinkError, match="get link v0: ENOBUFS"):
        request(Broken(), "get link", "v0", get_link("v0"), RTM_GETLINK, decoder(LINK))


def test_netlink_reads_links_and_addresses_over_its_socket():
    nl = Netlink(sock=Kernel([link("v0")], [refusal(errno.ENODEV)], [address("198.18.0.12"), done()]))
    found = nl.link("v0")
    assert found is not None and (found.index, found.name, found.mtu, found.up) == (7, "v0", 1442, True)
    assert nl.link("gone") is None
    assert nl.addresses(7) == {Address("198.18.0.12", 24)}


def test_a_missing_link_is_its_own_error():
    with pytest.raises(LinkNotFound):
        request(Kernel([refusal(errno.ENODEV)]), "get link", "x", get_link("x"), RTM_GETLINK, decoder(LINK))
