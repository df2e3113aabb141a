"""rtnetlink requests sent together: one write, every request acknowledged on its own.

For building what is known not to exist yet (a load balancer's new
namespace, the host ends of its new veths), where there is nothing to read
first. pyroute2's `IPRoute` spends about 0.3 ms of Python on every request
(its argument processors and an asyncio loop run per call, even in
`IPBatch`). Its message classes did the same in a fraction of that, but each
left objects in reference cycles behind for the collector: thousands of
them in a cold start, collected with the interpreter lock held while the
event loop waited. The requests are now encoded here with struct, the same
bytes (the tests compare them with pyroute2's), and the kernel answers the
whole batch to one socket.

Every request asks for an acknowledgement; a failed one becomes the same
typed `NetlinkError` as in `iplib`, naming the request. The kernel goes on
with the requests after a failed one, so `send` reads every answer and
raises the first failure once all are in.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NLMSG_ERROR
from pyroute2.netlink.rtnl import RTM_GETROUTE, RTM_NEWADDR, RTM_NEWLINK, RTM_NEWROUTE, RTM_NEWRULE
from pyroute2.netlink.rtnl.fibmsg import FR_ACT_GOTO, FR_ACT_NOP, FR_ACT_TO_TBL

from lbagent.metrics import count_write
from lbagent.ovnhost import rtnl_requests, rtnl_socket
from lbagent.ovnhost.errors import NetlinkError, netlink_error
from lbagent.ovnhost.families import family_of, host_prefixlen
from lbagent.ovnhost.iplib import (
    FIB_RULE_INVERT,
    IFA_F_NODAD,
    IFA_F_NOPREFIXROUTE,
    IFF_UP,
    MAIN_TABLE,
    RT_SCOPE_LINK,
    RTN_UNICAST,
    UNREACHABLE,
    KernelRoute,
)
from lbagent.ovnhost.rtnl_messages import ROUTE, decoder
from lbagent.ovnhost.rtnl_requests import (
    IFADDRMSG,
    IFINFOMSG,
    IFLA_IFNAME,
    RT_TABLE_COMPAT,
    RTA_DST,
    RTA_OIF,
    RTA_TABLE,
    RTMSG,
    U32,
    attribute,
    text,
)
from lbagent.ovnhost.rtnl_requests import address as address_bytes
from lbagent.ovnhost.rtnl_socket import ERRNO, HEADER

RTPROT_STATIC = 4  # what pyroute2 (and so the agent's other route writes) marks its routes with
IFLA_ADDRESS, IFLA_MTU, IFLA_LINKINFO, IFLA_IFALIAS, IFLA_AF_SPEC, IFLA_NET_NS_FD = 1, 4, 18, 20, 26, 28
IFLA_INET_CONF = 1
# enum IPV4_DEVCONF_*: a link's own copy of net/ipv4/conf/<link>/<setting>.
IPV4_DEVCONF_FORWARDING, IPV4_DEVCONF_ACCEPT_REDIRECTS = 1, 4
NLA_F_NESTED = 1 << 15
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL, IFA_FLAGS = 1, 2, 8
RTA_GATEWAY, RTA_PREFSRC = 5, 7
FRA_SRC, FRA_GOTO, FRA_PRIORITY, FRA_TABLE = 2, 4, 6, 15
_CREATE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
_REPLACE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
_SET = NLM_F_REQUEST | NLM_F_ACK


@dataclass(frozen=True)
class _Request:
    op: str
    target: str
    data: bytes
    exists_ok: bool  # an EEXIST answer means "already there", as wanted


class RtnlBatch:
    """Requests collected in order, then sent with `send` on a socket of the
    namespace they are meant for (`open_socket` on a thread inside it)."""

    def __init__(self) -> None:
        self._requests: list[_Request] = []

    def __len__(self) -> int:
        return len(self._requests)

    def _add(self, op: str, target: str, body: bytes, kind: int, flags: int, exists_ok: bool = False) -> None:
        header = HEADER.pack(HEADER.size + len(body), kind, flags, len(self._requests) + 1, 0)
        self._requests.append(_Request(op, target, header + body, exists_ok))

    def add_veth(
        self,
        name: str,
        peer: str,
        peer_netns_fd: int,
        *,
        mtu: int | None = None,
        mac: str | None = None,
        peer_mtu: int | None = None,
        peer_mac: str | None = None,
        index: int = 0,
        peer_index: int = 0,
    ) -> None:
        """A veth pair, `name` up, `peer` made directly in the namespace of
        `peer_netns_fd` (and down: the kernel cannot open a peer before the
        pair is complete, so it is set up by a later request). Index 0 lets
        the kernel choose; a chosen one lets the same batch name the link."""
        peer_msg = (
            IFINFOMSG.pack(0, 0, peer_index, 0, 0)
            + attribute(IFLA_IFNAME, text(peer))
            + attribute(IFLA_NET_NS_FD, U32.pack(peer_netns_fd))
            + _link_options(peer_mtu, peer_mac)
        )
        info = attribute(IFLA_INFO_KIND, text("veth")) + attribute(IFLA_INFO_DATA, attribute(VETH_INFO_PEER, peer_msg))
        attributes = attribute(IFLA_IFNAME, text(name)) + _link_options(mtu, mac) + attribute(IFLA_LINKINFO, info)
        self._add("add veth", name, _link_msg(index, attributes), RTM_NEWLINK, _CREATE)

    def set_up(self, index: int, name: str, alias: str = "") -> None:
        """The link up and, if given, its `ifalias` set in the same request
        (the kernel ignores an alias in the request that creates a link)."""
        attributes = attribute(IFLA_IFALIAS, text(alias)) if alias else b""
        self._add("set link", name, _link_msg(index, attributes), RTM_NEWLINK, _SET)

    def forward_ipv4(self, index: int, name: str) -> None:
        """IPv4 forwarding on for packets that come in on the link, and ICMP
        redirects refused there, as they are once `net.ipv4.ip_forward=1`: a
        namespace just built forwards without a file under /proc/sys/net
        opened (see `devconf`)."""
        on, off = U32.pack(1), U32.pack(0)
        settings = attribute(IPV4_DEVCONF_FORWARDING, on) + attribute(IPV4_DEVCONF_ACCEPT_REDIRECTS, off)
        inet = attribute(socket.AF_INET | NLA_F_NESTED, attribute(IFLA_INET_CONF | NLA_F_NESTED, settings))
        body = IFINFOMSG.pack(0, 0, index, 0, 0) + attribute(IFLA_AF_SPEC | NLA_F_NESTED, inet)
        self._add("forward ipv4", name, body, RTM_NEWLINK, _SET)

    def add_address(self, index: int, name: str, address: str, prefixlen: int, noprefixroute: bool = False) -> None:
        """An address of either family; an IPv6 one skips duplicate address detection (see iplib.Address)."""
        family = family_of(address)
        value = (IFA_F_NOPREFIXROUTE if noprefixroute else 0) | (IFA_F_NODAD if family == socket.AF_INET6 else 0)
        raw = address_bytes(address)
        body = (
            IFADDRMSG.pack(family, prefixlen, 0, 0, index)
            + attribute(IFA_ADDRESS, raw)
            + (attribute(IFA_FLAGS, U32.pack(value)) if value else b"")
            + attribute(IFA_LOCAL, raw)
        )
        self._add("add address", f"{address}/{prefixlen} {name}", body, RTM_NEWADDR, _CREATE)

    def replace_route(self, route: KernelRoute) -> None:
        destination, _, length = route.dst.partition("/")
        table = route.table if route.table <= 255 else MAIN_TABLE
        scope = 0 if route.gateway else RT_SCOPE_LINK
        body = RTMSG.pack(family_of(destination), int(length), 0, 0, table, RTPROT_STATIC, scope, RTN_UNICAST, 0)
        if int(length):
            body += attribute(RTA_DST, address_bytes(destination))
        if route.gateway:
            body += attribute(RTA_GATEWAY, address_bytes(route.gateway))
        if route.oif:
            body += attribute(RTA_OIF, U32.pack(route.oif))
        if route.prefsrc:
            body += attribute(RTA_PREFSRC, address_bytes(route.prefsrc))
        body += attribute(RTA_TABLE, U32.pack(route.table))
        self._add("replace route", route.dst, body, RTM_NEWROUTE, _REPLACE)

    def add_source_rule(self, src: str, table: int, priority: int) -> None:
        """`from src/32` (`/128`) `lookup table`; an identical rule already there is fine."""
        family = family_of(src)
        body = _rule_msg(FR_ACT_TO_TBL, family, src_len=host_prefixlen(family), table=table) + (
            attribute(FRA_SRC, address_bytes(src))
            + attribute(FRA_TABLE, U32.pack(table))
            + attribute(FRA_PRIORITY, U32.pack(priority))
        )
        self._add("add rule", f"from {src} lookup {table}", body, RTM_NEWRULE, _CREATE, exists_ok=True)

    def add_skip_rules(self, src: str, src_len: int, first: int, target: int) -> None:
        """The pair `iplib.Netlink.add_skip_rules` makes; either one already there is fine."""
        family = family_of(src)
        nop = _rule_msg(FR_ACT_NOP, family) + attribute(FRA_PRIORITY, U32.pack(target))
        self._add("add rule", f"nop at {target}", nop, RTM_NEWRULE, _CREATE, exists_ok=True)
        skip = _rule_msg(FR_ACT_GOTO, family, src_len=src_len, flags=FIB_RULE_INVERT) + (
            attribute(FRA_PRIORITY, U32.pack(first))
            + attribute(FRA_SRC, address_bytes(src))
            + attribute(FRA_GOTO, U32.pack(target))
        )
        self._add("add rule", f"not from {src}/{src_len} goto {target}", skip, RTM_NEWRULE, _CREATE, exists_ok=True)

    def send(self, sock: socket.socket) -> None:
        """Send every request in one write, read every answer, count what was
        applied; raise the first failure (as a typed NetlinkError) after all."""
        if not self._requests:
            return
        requests, self._requests = self._requests, []
        try:
            sock.send(b"".join(r.data for r in requests))
            codes = _read_acks(sock, len(requests))
        except OSError as exc:
            raise NetlinkError("send batch", exc.errno or errno.EIO, requests[0].target) from exc
        failure = None
        for request, code in zip(requests, codes):
            if code == 0:
                count_write("netlink", what=f"{request.op} {request.target}")
            elif not (code == errno.EEXIST and request.exists_ok) and failure is None:
                failure = netlink_error(request.op, code, request.target)
        if failure is not None:
            raise failure


def route_via(sock: socket.socket, dst: str, src: str) -> tuple[str | None, int | None] | None:
    """(gateway, output interface) of the route the kernel would use from `src`
    to `dst`, policy rules included; None if it has none. One request on the
    batch's socket (the probe after a build), not an IPRoute of its own."""
    try:
        body = rtnl_requests.get_route(dst, src)
        answers = rtnl_socket.request(sock, "get route", dst, body, RTM_GETROUTE, decoder(ROUTE))
    except NetlinkError as exc:
        if exc.code in UNREACHABLE:
            return None
        raise
    return answers[0].get("RTA_GATEWAY"), answers[0].get("RTA_OIF")


def _read_acks(sock: socket.socket, count: int) -> list[int]:
    """The errno (0: done) answered to each of requests 1..count."""
    codes: dict[int, int] = {}
    while len(codes) < count:
        buf = sock.recv(1 << 16)
        offset = 0
        while offset + HEADER.size <= len(buf):
            length, kind, _, seq, _ = HEADER.unpack_from(buf, offset)
            if kind == NLMSG_ERROR and 1 <= seq <= count:
                codes[seq] = -ERRNO.unpack_from(buf, offset + HEADER.size)[0]
            offset += max((length + 3) & ~3, HEADER.size)
    return [codes[seq] for seq in range(1, count + 1)]


def _link_options(mtu: int | None, mac: str | None) -> bytes:
    return (attribute(IFLA_MTU, U32.pack(mtu)) if mtu is not None else b"") + (
        attribute(IFLA_ADDRESS, bytes.fromhex(mac.replace(":", ""))) if mac is not None else b""
    )


def _link_msg(index: int, attributes: bytes) -> bytes:
    return IFINFOMSG.pack(0, 0, index, IFF_UP, IFF_UP) + attributes


def _rule_msg(action: int, family: int, *, src_len: int = 0, flags: int = 0, table: int = 0) -> bytes:
    """struct fib_rule_hdr (rtmsg's layout: family, dst_len, src_len, tos, table, two spare bytes, action, flags)."""
    return RTMSG.pack(family, 0, src_len, 0, table if table <= 255 else RT_TABLE_COMPAT, 0, 0, action, flags)
