"""The rtnetlink writes the agent makes, encoded with struct: one `Write` each.

A write is a netlink request that asks for an acknowledgement: its type, its
flags and its body (what follows the header). `rtnl_batch` sends many in one
datagram (a new load balancer's namespace and veths); `iplib.Netlink` sends
them one at a time (repairs, provider bridges, policy rules). They used to
go through pyroute2's `IPRoute`, whose import alone (93 modules, with its
request filters and a mock netlink engine that brings `unittest`) cost every
agent 2.8 MB; the bytes here are those pyroute2 sends for the same
arguments (the tests compare them), attributes in the order given below.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from lbagent.ovnhost.families import family_of, host_prefixlen
from lbagent.ovnhost.rtnl_requests import (
    IFADDRMSG,
    IFINFOMSG,
    IFLA_IFNAME,
    RT_TABLE_COMPAT,
    RTMSG,
    U32,
    attribute,
    text,
)
from lbagent.ovnhost.rtnl_requests import address as address_bytes

NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x100, 0x200, 0x400
RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR, RTM_DELADDR = 16, 17, 20, 21
RTM_NEWROUTE, RTM_DELROUTE, RTM_NEWRULE, RTM_DELRULE = 24, 25, 32, 33
CREATE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
REPLACE = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
SET = NLM_F_REQUEST | NLM_F_ACK

IFF_UP = 0x1
IFA_F_NODAD = 0x02
IFA_F_NOPREFIXROUTE = 0x200
MAIN_TABLE = 254
RTN_UNICAST = 1
RT_SCOPE_LINK = 253
RTPROT_STATIC = 4  # what the agent marks its own routes with (pyroute2's default before)
FIB_RULE_INVERT = 0x2
FR_ACT_TO_TBL, FR_ACT_GOTO, FR_ACT_NOP = 1, 2, 3

IFLA_ADDRESS, IFLA_MTU, IFLA_LINKINFO, IFLA_IFALIAS, IFLA_AF_SPEC, IFLA_NET_NS_FD = 1, 4, 18, 20, 26, 28
IFLA_INET_CONF = 1
# enum IPV4_DEVCONF_*: a link's own copy of net/ipv4/conf/<link>/<setting>.
IPV4_DEVCONF_FORWARDING, IPV4_DEVCONF_ACCEPT_REDIRECTS = 1, 4
NLA_F_NESTED = 1 << 15
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST, IFA_FLAGS = 1, 2, 4, 8
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_TABLE = 1, 4, 5, 6, 7, 15
FRA_SRC, FRA_GOTO, FRA_PRIORITY, FRA_TABLE = 2, 4, 6, 15


@dataclass(frozen=True, slots=True)
class Write:
    op: str  # what the agent calls it, for errors and the write counter: "add veth"
    target: str
    kind: int  # RTM_*
    flags: int
    body: bytes
    exists_ok: bool = False  # in a batch, EEXIST means "already there", as wanted


# --- links ---------------------------------------------------------------------


def add_veth(
    name: str,
    peer: str,
    peer_netns_fd: int | None = None,
    *,
    up: bool = False,
    mtu: int | None = None,
    mac: str | None = None,
    peer_mtu: int | None = None,
    peer_mac: str | None = None,
    index: int = 0,
    peer_index: int = 0,
) -> Write:
    """A veth pair, `peer` made directly in the namespace of `peer_netns_fd`
    (if given) and down: the kernel cannot open a peer before the pair is
    complete. Index 0 lets the kernel choose; a chosen one lets a batch name the link."""
    peer_msg = (
        IFINFOMSG.pack(0, 0, peer_index, 0, 0)
        + attribute(IFLA_IFNAME, text(peer))
        + (attribute(IFLA_NET_NS_FD, U32.pack(peer_netns_fd)) if peer_netns_fd is not None else b"")
        + _link_options(peer_mtu, peer_mac)
    )
    info = attribute(IFLA_INFO_KIND, text("veth")) + attribute(IFLA_INFO_DATA, attribute(VETH_INFO_PEER, peer_msg))
    state = IFF_UP if up else 0
    body = (
        IFINFOMSG.pack(0, 0, index, state, state)
        + attribute(IFLA_IFNAME, text(name))
        + _link_options(mtu, mac)
        + attribute(IFLA_LINKINFO, info)
    )
    return Write("add veth", name, RTM_NEWLINK, CREATE, body)


def delete_link(name: str) -> Write:
    return Write(
        "delete link", name, RTM_DELLINK, SET, IFINFOMSG.pack(0, 0, 0, 0, 0) + attribute(IFLA_IFNAME, text(name))
    )


def set_link(
    index: int,
    name: str,
    *,
    alias: str | None = None,
    mac: str | None = None,
    mtu: int | None = None,
    up: bool | None = None,
) -> Write:
    """Change what is given of the link; the rest stays."""
    flags, change = (0, 0) if up is None else (IFF_UP if up else 0, IFF_UP)
    body = (
        IFINFOMSG.pack(0, 0, index, flags, change)
        + (attribute(IFLA_IFALIAS, text(alias)) if alias is not None else b"")
        + (attribute(IFLA_ADDRESS, _mac(mac)) if mac is not None else b"")
        + (attribute(IFLA_MTU, U32.pack(mtu)) if mtu is not None else b"")
    )
    return Write("set link", name, RTM_NEWLINK, SET, body)


def forward_ipv4(index: int, name: str) -> Write:
    """IPv4 forwarding on for packets that come in on the link, and ICMP
    redirects refused there, as they are once `net.ipv4.ip_forward=1`: a
    namespace just built forwards without a file under /proc/sys/net
    opened (see `devconf`)."""
    on, off = U32.pack(1), U32.pack(0)
    settings = attribute(IPV4_DEVCONF_FORWARDING, on) + attribute(IPV4_DEVCONF_ACCEPT_REDIRECTS, off)
    inet = attribute(socket.AF_INET | NLA_F_NESTED, attribute(IFLA_INET_CONF | NLA_F_NESTED, settings))
    body = IFINFOMSG.pack(0, 0, index, 0, 0) + attribute(IFLA_AF_SPEC | NLA_F_NESTED, inet)
    return Write("forward ipv4", name, RTM_NEWLINK, SET, body)


def _link_options(mtu: int | None, mac: str | None) -> bytes:
    return (attribute(IFLA_MTU, U32.pack(mtu)) if mtu is not None else b"") + (
        attribute(IFLA_ADDRESS, _mac(mac)) if mac is not None else b""
    )


def _mac(mac: str) -> bytes:
    return bytes.fromhex(mac.replace(":", ""))


# --- addresses -------------------------------------------------------------------


def add_address(
    index: int, name: str, address: str, prefixlen: int, *, noprefixroute: bool = False, broadcast: str | None = None
) -> Write:
    """An address of either family; an IPv6 one skips duplicate address
    detection (see iplib.Address)."""
    family = family_of(address)
    flags = (IFA_F_NOPREFIXROUTE if noprefixroute else 0) | (IFA_F_NODAD if family == socket.AF_INET6 else 0)
    raw = address_bytes(address)
    body = (
        IFADDRMSG.pack(family, prefixlen, 0, 0, index)
        + attribute(IFA_ADDRESS, raw)
        + (attribute(IFA_BROADCAST, address_bytes(broadcast)) if broadcast else b"")
        + (attribute(IFA_FLAGS, U32.pack(flags)) if flags else b"")
        + attribute(IFA_LOCAL, raw)
    )
    return Write("add address", f"{address}/{prefixlen} {name}", RTM_NEWADDR, CREATE, body)


def delete_address(index: int, name: str, address: str, prefixlen: int) -> Write:
    """The address `address/prefixlen` of the link, whatever its broadcast and flags
    (IFA_LOCAL names an IPv4 address's own end; IPv6 has IFA_ADDRESS alone)."""
    family, raw = family_of(address), address_bytes(address)
    body = (
        IFADDRMSG.pack(family, prefixlen, 0, 0, index)
        + attribute(IFA_ADDRESS, raw)
        + (attribute(IFA_LOCAL, raw) if family == socket.AF_INET else b"")
    )
    return Write("delete address", f"{address}/{prefixlen} {name}", RTM_DELADDR, SET, body)


# --- routes ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Route:
    """A route to write: what is None is left out (scope None: link scope
    without a gateway, universe with one; proto None: static when added, any
    when deleted)."""

    dst: str  # "a.b.c.d/len"
    table: int
    oif: int | None = None
    gateway: str | None = None
    prefsrc: str | None = None
    metric: int | None = None
    scope: int | None = None
    proto: int | None = None


def replace_route(route: Route, target: str = "") -> Write:
    """Add the route, or replace the one with its key (destination, table, metric)."""
    body = _route_body(route, route.proto if route.proto is not None else RTPROT_STATIC, RTN_UNICAST)
    return Write("replace route", target or route.dst, RTM_NEWROUTE, REPLACE, body)


def delete_route(route: Route, target: str = "") -> Write:
    """Delete the route that matches what is given (protocol and type 0: any)."""
    body = _route_body(route, route.proto or 0, 0)
    return Write("delete route", target or route.dst, RTM_DELROUTE, SET, body)


def _route_body(route: Route, proto: int, kind: int) -> bytes:
    destination, _, length = route.dst.partition("/")
    scope = route.scope if route.scope is not None else (0 if route.gateway else RT_SCOPE_LINK)
    header_table = route.table if route.table <= 255 else MAIN_TABLE
    body = RTMSG.pack(family_of(destination), int(length), 0, 0, header_table, proto, scope, kind, 0)
    if int(length):
        body += attribute(RTA_DST, address_bytes(destination))
    if route.gateway:
        body += attribute(RTA_GATEWAY, address_bytes(route.gateway))
    if route.oif:
        body += attribute(RTA_OIF, U32.pack(route.oif))
    if route.prefsrc:
        body += attribute(RTA_PREFSRC, address_bytes(route.prefsrc))
    if route.metric is not None:
        body += attribute(RTA_PRIORITY, U32.pack(route.metric))
    return body + attribute(RTA_TABLE, U32.pack(route.table))


# --- policy rules ----------------------------------------------------------------


def source_rule(src: str, table: int, priority: int, *, delete: bool = False) -> Write:
    """`from src/32` (`/128`) `lookup table` at `priority`; added, or deleted with `delete`."""
    family = family_of(src)
    body = _rule_header(FR_ACT_TO_TBL, family, src_len=host_prefixlen(family), table=table) + (
        attribute(FRA_SRC, address_bytes(src))
        + attribute(FRA_TABLE, U32.pack(table))
        + attribute(FRA_PRIORITY, U32.pack(priority))
    )
    what = f"from {src} lookup {table}"
    if delete:
        return Write("delete rule", what, RTM_DELRULE, SET, body)
    return Write("add rule", what, RTM_NEWRULE, CREATE, body, exists_ok=True)


def skip_rules(src: str, src_len: int, first: int, target: int) -> tuple[Write, Write]:
    """`not from src/len goto target` at `first`, and a no-op rule at `target`
    for it to land on (the no-op first), in the family of `src`."""
    family = family_of(src)
    nop = _rule_header(FR_ACT_NOP, family) + attribute(FRA_PRIORITY, U32.pack(target))
    skip = _rule_header(FR_ACT_GOTO, family, src_len=src_len, flags=FIB_RULE_INVERT) + (
        attribute(FRA_PRIORITY, U32.pack(first))
        + attribute(FRA_SRC, address_bytes(src))
        + attribute(FRA_GOTO, U32.pack(target))
    )
    return (
        Write("add rule", f"nop at {target}", RTM_NEWRULE, CREATE, nop, exists_ok=True),
        Write("add rule", f"not from {src}/{src_len} goto {target}", RTM_NEWRULE, CREATE, skip, exists_ok=True),
    )


def delete_rule_at(priority: int, family: int) -> Write:
    """One rule, whichever, at `priority` (action 0: any)."""
    body = _rule_header(0, family) + attribute(FRA_PRIORITY, U32.pack(priority))
    return Write("delete rule", f"at {priority}", RTM_DELRULE, SET, body)


def _rule_header(action: int, family: int, *, src_len: int = 0, flags: int = 0, table: int = 0) -> bytes:
    """struct fib_rule_hdr (rtmsg's layout: family, dst_len, src_len, tos, table, two spare bytes, action, flags)."""
    return RTMSG.pack(family, 0, src_len, 0, table if table <= 255 else RT_TABLE_COMPAT, 0, 0, action, flags)
