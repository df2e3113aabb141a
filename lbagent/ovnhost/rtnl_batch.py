"""rtnetlink requests sent together: one write, every request acknowledged on its own.

For building what is known not to exist yet (a load balancer's new
namespace, the host ends of its new veths), where there is nothing to read
first. pyroute2's `IPRoute` spends about 0.3 ms of Python on every request
(its argument processors and an asyncio loop run per call, even in
`IPBatch`); its message classes, used here, encode the same bytes in a
fraction of that, and the kernel answers the whole batch to one socket.

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
from pyroute2.netlink.rtnl.fibmsg import FR_ACT_GOTO, FR_ACT_NOP, FR_ACT_TO_TBL, fibmsg
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

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
from lbagent.ovnhost.rtnl_requests import RT_TABLE_COMPAT
from lbagent.ovnhost.rtnl_socket import ERRNO, HEADER

RTPROT_STATIC = 4  # what pyroute2 (and so the agent's other route writes) marks its routes with
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

    def _add(self, op: str, target: str, msg, kind: int, flags: int, exists_ok: bool = False) -> None:
        msg["header"]["type"] = kind
        msg["header"]["flags"] = flags
        msg["header"]["sequence_number"] = len(self._requests) + 1
        msg.encode()
        self._requests.append(_Request(op, target, bytes(msg.data), exists_ok))

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
        peer_attrs: list = [
            ("IFLA_IFNAME", peer),
            ("IFLA_NET_NS_FD", peer_netns_fd),
            *_link_options(peer_mtu, peer_mac),
        ]
        peer_msg = {"attrs": peer_attrs, "family": 0, "index": peer_index, "flags": 0, "change": 0}
        attrs: list = [
            ("IFLA_IFNAME", name),
            *_link_options(mtu, mac),
            (
                "IFLA_LINKINFO",
                {"attrs": [("IFLA_INFO_KIND", "veth"), ("IFLA_INFO_DATA", {"attrs": [("VETH_INFO_PEER", peer_msg)]})]},
            ),
        ]
        self._add("add veth", name, _link_msg(index, attrs), RTM_NEWLINK, _CREATE)

    def set_up(self, index: int, name: str, alias: str = "") -> None:
        """The link up and, if given, its `ifalias` set in the same request
        (the kernel ignores an alias in the request that creates a link)."""
        attrs = [("IFLA_IFALIAS", alias)] if alias else []
        self._add("set link", name, _link_msg(index, attrs), RTM_NEWLINK, _SET)

    def add_address(self, index: int, name: str, address: str, prefixlen: int, noprefixroute: bool = False) -> None:
        """An address of either family; an IPv6 one skips duplicate address detection (see iplib.Address)."""
        family = family_of(address)
        msg = ifaddrmsg()
        msg["family"], msg["prefixlen"], msg["index"] = family, prefixlen, index
        value = (IFA_F_NOPREFIXROUTE if noprefixroute else 0) | (IFA_F_NODAD if family == socket.AF_INET6 else 0)
        flags = [("IFA_FLAGS", value)] if value else []
        msg["attrs"] = [("IFA_ADDRESS", address), *flags, ("IFA_LOCAL", address)]
        self._add("add address", f"{address}/{prefixlen} {name}", msg, RTM_NEWADDR, _CREATE)

    def replace_route(self, route: KernelRoute) -> None:
        msg = rtmsg()
        address, _, length = route.dst.partition("/")
        msg["family"], msg["dst_len"], msg["proto"], msg["type"] = (
            family_of(address),
            int(length),
            RTPROT_STATIC,
            RTN_UNICAST,
        )
        msg["table"] = route.table if route.table <= 255 else MAIN_TABLE
        msg["scope"] = 0 if route.gateway else RT_SCOPE_LINK
        attrs: list = [("RTA_DST", address)] if int(length) else []
        attrs += [
            (name, value)
            for name, value in (("RTA_GATEWAY", route.gateway), ("RTA_OIF", route.oif), ("RTA_PREFSRC", route.prefsrc))
            if value
        ]
        msg["attrs"] = attrs + [("RTA_TABLE", route.table)]
        self._add("replace route", route.dst, msg, RTM_NEWROUTE, _REPLACE)

    def add_source_rule(self, src: str, table: int, priority: int) -> None:
        """`from src/32` (`/128`) `lookup table`; an identical rule already there is fine."""
        attrs = [("FRA_SRC", src), ("FRA_TABLE", table), ("FRA_PRIORITY", priority)]
        msg = _rule_msg(FR_ACT_TO_TBL, attrs, family_of(src), src_len=host_prefixlen(family_of(src)))
        msg["table"] = table if table <= 255 else RT_TABLE_COMPAT
        self._add("add rule", f"from {src} lookup {table}", msg, RTM_NEWRULE, _CREATE, exists_ok=True)

    def add_skip_rules(self, src: str, src_len: int, first: int, target: int) -> None:
        """The pair `iplib.Netlink.add_skip_rules` makes; either one already there is fine."""
        self._add(
            "add rule",
            f"nop at {target}",
            _rule_msg(FR_ACT_NOP, [("FRA_PRIORITY", target)], family_of(src)),
            RTM_NEWRULE,
            _CREATE,
            exists_ok=True,
        )
        skip = _rule_msg(
            FR_ACT_GOTO,
            [("FRA_PRIORITY", first), ("FRA_SRC", src), ("FRA_GOTO", target)],
            family_of(src),
            src_len=src_len,
            flags=FIB_RULE_INVERT,
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


def _link_options(mtu: int | None, mac: str | None) -> list:
    return ([("IFLA_MTU", mtu)] if mtu is not None else []) + ([("IFLA_ADDRESS", mac)] if mac is not None else [])


def _link_msg(index: int, attrs: list):
    msg = ifinfmsg()
    msg["family"], msg["index"], msg["flags"], msg["change"] = 0, index, IFF_UP, IFF_UP
    msg["attrs"] = attrs
    return msg


def _rule_msg(action: int, attrs: list, family: int, *, src_len: int = 0, flags: int = 0):
    msg = fibmsg()
    msg["family"], msg["action"], msg["src_len"], msg["flags"] = family, action, src_len, flags
    msg["attrs"] = attrs
    return msg
