"""Small netlink primitives over one pyroute2 socket, in the style of neutron's ip_lib.

A `Netlink` is opened on a thread inside the right namespace (see
`netns.py`). Its reads and writes go over one raw socket (`rtnl_socket`),
encoded with struct (`rtnl_requests`, `rtnl_writes`) and decoded by
`rtnl_messages`. Reads return plain values; every write is counted and
every netlink failure becomes a typed `NetlinkError` naming the operation.

Addresses, routes and policy rules are of either family: a write takes its
family from the address it names, a read of addresses, routes or rules
takes the family it wants (IPv4 unless told).

Routes come in two kinds, because they carry different data: a
`KernelRoute` is a route as the agent writes its own (a load balancer's), in
a table and out of a link, compared on just what the agent sets; a
`MovableRoute` is someone else's main-table route taken off its link with
everything needed to re-create it on another (a provider network's uplink
and its bridge).
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyroute2.netlink.rtnl import RTM_GETADDR, RTM_GETLINK, RTM_GETROUTE, RTM_GETRULE

from lbagent.metrics import count_write
from lbagent.ovnhost import rtnl_requests, rtnl_socket, rtnl_writes
from lbagent.ovnhost.errors import AlreadyExists, LinkNotFound, NetlinkError
from lbagent.ovnhost.families import family_of, host_prefixlen, unspecified
from lbagent.ovnhost.rtnl_messages import ADDRESS, LINK, ROUTE, RULE, Message, decoder
from lbagent.ovnhost.rtnl_writes import (
    IFA_F_NOPREFIXROUTE,
    IFF_UP,
    MAIN_TABLE,
    RTN_UNICAST,
    Write,
)


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    kind: str
    mac: str
    mtu: int
    up: bool
    peer_index: int  # IFLA_LINK: the veth peer's index (in the peer's namespace)
    alias: str = ""  # IFLA_IFALIAS: the agent's ownership mark on the host ends it made
    # IFLA_AF_SPEC: the link's net.ipv4.conf and net.ipv6.conf settings, in the kernel's order
    ipv4_conf: tuple[int, ...] = ()
    ipv6_conf: tuple[int, ...] = ()


@dataclass(frozen=True)
class Address:
    """An address of a link, with what re-creating it on another link needs.

    IPv6 addresses the agent adds skip duplicate address detection: they are
    its own (a VIP the region controller assigned, a pair from the agent's
    prefix), and a tentative address would hold readiness back for a second.
    """

    address: str
    prefixlen: int
    broadcast: str | None = None
    noprefixroute: bool = False

    @property
    def family(self) -> int:
        return family_of(self.address)

    @property
    def cidr(self) -> str:
        return f"{self.address}/{self.prefixlen}"


@dataclass(frozen=True)
class KernelRoute:
    """A route as the agent writes its own: in a table, out of a link, with no
    metric and a scope that follows from the gateway (`_route_args`); compared
    on these fields alone."""

    dst: str  # "a.b.c.d/len"; "0.0.0.0/0" for the default route
    gateway: str | None
    oif: int | None
    prefsrc: str | None
    table: int = MAIN_TABLE


@dataclass(frozen=True)
class SourceRule:
    """A policy rule `from <src>/32 (or /128) lookup <table>` at one priority."""

    src: str
    table: int
    priority: int


UNREACHABLE = (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EINVAL)  # a route lookup that found none


class Netlink:
    def __init__(self, sock: socket.socket | None = None):
        self._sock = sock

    @classmethod
    @contextmanager
    def open(cls) -> Iterator[Netlink]:
        """A socket in the calling thread's current namespace, closed on exit."""
        nl = cls(sock=rtnl_socket.open_socket(strict=True))
        try:
            yield nl
        finally:
            if nl._sock is not None:
                nl._sock.close()

    def _request(self, op: str, target: str, msg, kind: int, decoder, dump: bool = False, flags: int = 0) -> list:
        if self._sock is None:
            # strict: the kernel filters dumps (by index, table) instead of sending everything.
            self._sock = rtnl_socket.open_socket(strict=True)
        return rtnl_socket.request(self._sock, op, target, msg, kind, decoder, dump=dump, flags=flags)

    def _write(self, write: Write) -> None:
        """Send one write and wait for its acknowledgement; a refusal is a typed NetlinkError."""
        self._request(write.op, write.target, write.body, write.kind, bytes, flags=write.flags)
        count_write("netlink", what=f"{write.op} {write.target}".strip())

    # --- reads -----------------------------------------------------------

    def links(self) -> dict[str, Link]:
        msgs = self._request("dump links", "", rtnl_requests.dump_links(), RTM_GETLINK, decoder(LINK), dump=True)
        return {link.name: link for link in map(_to_link, msgs)}

    def link(self, name: str) -> Link | None:
        """One link by name: a single request, not a dump of the host's links."""
        try:
            msgs = self._request("get link", name, rtnl_requests.get_link(name), RTM_GETLINK, decoder(LINK))
        except LinkNotFound:
            return None
        return _to_link(msgs[0]) if msgs else None

    def route_to(self, dst: str, src: str | None = None) -> KernelRoute | None:
        """The route the kernel would use (policy rules included), or None."""
        try:
            msgs = self._request("get route", dst, rtnl_requests.get_route(dst, src), RTM_GETROUTE, decoder(ROUTE))
        except NetlinkError as exc:
            if exc.code in UNREACHABLE:
                return None
            raise
        return _to_route(msgs[0]) if msgs else None

    def _filtered_dump(self, op: str, target: str, body: bytes, msg_type: int):
        """A dump the kernel filters by the header fields and attributes set in
        `body` (strict checking). pyroute2's own get_addr/get_routes dump
        everything and filter in Python: with a thousand load balancers on the
        host that is a thousand messages decoded to find one or two."""
        kind = ADDRESS if msg_type == RTM_GETADDR else ROUTE
        return self._request(op, target, body, msg_type, decoder(kind), dump=True)

    def addresses(self, index: int, family: int = socket.AF_INET) -> set[Address]:
        """The link's addresses of `family` with their broadcast and noprefixroute flag."""
        return {_to_address(m) for m in self._address_dump(index, family)}

    def all_addresses(self) -> set[str]:
        """Every address of either family in this namespace (what an allocation must avoid)."""
        found: set[str] = set()
        for family in (socket.AF_INET, socket.AF_INET6):
            for msg in self._address_dump(0, family):  # index 0: every link's
                found.update(a for a in (msg.get("IFA_ADDRESS"), msg.get("IFA_LOCAL")) if a)
        return found

    def _address_dump(self, index: int, family: int):
        body = rtnl_requests.dump_addresses(index, family)
        return self._filtered_dump("dump addresses", str(index) if index else "", body, RTM_GETADDR)

    def routes(self, table: int = MAIN_TABLE, family: int = socket.AF_INET) -> set[KernelRoute]:
        """Unicast routes of one table."""
        return {_to_route(m) for m in self._route_dump(table, family=family) if m.get("type") == RTN_UNICAST}

    def _route_dump(self, table: int, oif: int | None = None, family: int = socket.AF_INET):
        """The routes of one table (out of `oif`, if given), filtered by the kernel."""
        body = rtnl_requests.dump_routes(table, oif, family)
        try:
            msgs = self._filtered_dump("dump routes", f"table {table}", body, RTM_GETROUTE)
        except NetlinkError as exc:
            if exc.code == errno.ENOENT:  # the kernel has no such table (yet): it holds no routes
                return ()
            raise
        return [m for m in msgs if m.get("RTA_TABLE", table) == table]

    def source_rules(self, priority: int, family: int = socket.AF_INET) -> set[SourceRule]:
        return {
            SourceRule(m.get("FRA_SRC"), m.get("FRA_TABLE") or m["table"], m.get("FRA_PRIORITY"))
            for m in self._rule_dump(family)
            if m.get("FRA_PRIORITY") == priority and m.get("FRA_SRC") and m["src_len"] == host_prefixlen(family)
        }

    def rule_priorities(self, family: int = socket.AF_INET) -> set[int]:
        return {m.get("FRA_PRIORITY") for m in self._rule_dump(family)}

    def _rule_dump(self, family: int) -> list:
        """One family's policy rules, a thousand and more with as many load
        balancers: decoded on demand (pyroute2 decoded each whole, 30 µs a rule)."""
        return self._request("dump rules", "", rtnl_requests.dump_rules(family), RTM_GETRULE, decoder(RULE), dump=True)

    def add_skip_rules(self, src: str, src_len: int, first: int, target: int) -> None:
        """`not from src/len goto target` at `first`, and a no-op rule at `target`
        for it to land on, in the family of `src`; either one already there is left alone."""
        for write in rtnl_writes.skip_rules(src, src_len, first, target):
            self._add_rule_once(write)

    def _add_rule_once(self, write: Write) -> bool:
        """Add a policy rule unless an identical one exists; True if it was added.
        The kernel compares (NLM_F_EXCL), so no dump of the host's rules is needed."""
        try:
            self._write(write)
        except AlreadyExists:
            return False
        return True

    def delete_rules_at(self, priority: int, family: int = socket.AF_INET) -> int:
        deleted = 0
        while priority in self.rule_priorities(family):
            self._write(rtnl_writes.delete_rule_at(priority, family))
            deleted += 1
        return deleted

    def add_source_rule(self, rule: SourceRule) -> bool:
        """Add `rule` unless it is there already; True if it was added."""
        return self._add_rule_once(rtnl_writes.source_rule(rule.src, rule.table, rule.priority))

    def delete_source_rule(self, rule: SourceRule) -> None:
        self._write(rtnl_writes.source_rule(rule.src, rule.table, rule.priority, delete=True))

    # --- writes ----------------------------------------------------------

    def add_veth(self, name: str, peer: str, peer_netns_fd: int | None = None) -> None:
        """A veth pair, both ends down, `peer` in the namespace of `peer_netns_fd` if given."""
        self._write(rtnl_writes.add_veth(name, peer, peer_netns_fd))

    def delete_link(self, name: str) -> None:
        self._write(rtnl_writes.delete_link(name))

    def set_link(
        self,
        link: Link,
        *,
        mac: str | None = None,
        mtu: int | None = None,
        up: bool | None = None,
        alias: str | None = None,
    ) -> None:
        self._write(rtnl_writes.set_link(link.index, link.name, alias=alias, mac=mac, mtu=mtu, up=up))

    def add_address(self, link: Link, addr: Address) -> None:
        self._write(
            rtnl_writes.add_address(
                link.index,
                link.name,
                addr.address,
                addr.prefixlen,
                noprefixroute=addr.noprefixroute,
                broadcast=addr.broadcast,
            )
        )

    def delete_address(self, link: Link, addr: Address) -> None:
        """Deletes the address `addr.cidr`, whatever its broadcast and flags."""
        self._write(rtnl_writes.delete_address(link.index, link.name, addr.address, addr.prefixlen))

    def replace_route(self, route: KernelRoute) -> None:
        self._write(rtnl_writes.replace_route(route_to_write(route)))

    def delete_route(self, route: KernelRoute) -> None:
        self._write(rtnl_writes.delete_route(route_to_write(route)))

    # --- routes that move between links (provider bridges) -----------------

    def movable_routes(self, index: int) -> set[MovableRoute]:
        """Main-table unicast routes out of this link, except those the kernel derives from addresses."""
        return {
            _to_movable_route(m)
            for m in self._route_dump(MAIN_TABLE, oif=index)
            if m.get("type") == RTN_UNICAST and m.get("RTA_OIF") == index and m["proto"] != RTPROT_KERNEL
        }

    def replace_movable_route(self, link: Link, route: MovableRoute) -> None:
        """Add `route` out of `link`; a route with the same key elsewhere is moved here."""
        self._write(rtnl_writes.replace_route(_movable_route(link, route), f"{route.dst} {link.name}"))

    def delete_movable_route(self, link: Link, route: MovableRoute) -> None:
        self._write(rtnl_writes.delete_route(_movable_route(link, route), f"{route.dst} {link.name}"))


def _to_link(msg) -> Link:
    info = msg.get("IFLA_LINKINFO")
    # Only our own decoder's answers carry it as arrays (not those of pyroute2's dump of every link).
    conf = (msg.get("IFLA_AF_SPEC") or {}) if isinstance(msg, Message) else {}
    return Link(
        index=msg["index"],
        name=msg.get("IFLA_IFNAME"),
        kind=(info.get("IFLA_INFO_KIND") if info else "") or "",
        mac=msg.get("IFLA_ADDRESS") or "",
        mtu=msg.get("IFLA_MTU") or 0,
        up=bool(msg["flags"] & IFF_UP),
        peer_index=msg.get("IFLA_LINK") or 0,
        alias=msg.get("IFLA_IFALIAS") or "",
        ipv4_conf=conf.get(socket.AF_INET, ()),
        ipv6_conf=conf.get(socket.AF_INET6, ()),
    )


def _to_address(msg) -> Address:
    # NOPREFIXROUTE (0x200) is only in IFA_FLAGS: the header's flags field has 8 bits.
    flags = msg.get("IFA_FLAGS") or msg["flags"]
    return Address(
        msg.get("IFA_LOCAL") or msg.get("IFA_ADDRESS"),
        msg["prefixlen"],
        msg.get("IFA_BROADCAST"),
        bool(flags & IFA_F_NOPREFIXROUTE),
    )


def _to_route(msg) -> KernelRoute:
    dst = msg.get("RTA_DST") or unspecified(msg["family"])
    return KernelRoute(
        dst=f"{dst}/{msg['dst_len']}",
        gateway=msg.get("RTA_GATEWAY"),
        oif=msg.get("RTA_OIF"),
        prefsrc=msg.get("RTA_PREFSRC"),
        table=msg.get("RTA_TABLE") or msg["table"],
    )


# --- routes that move between links -------------------------------------------------

RTPROT_KERNEL = 2
RTPROT_BOOT = 3  # what `ip route add` uses


@dataclass(frozen=True)
class MovableRoute:
    """A main-table route taken off its link, with what re-creating it on another link needs.

    No link index: the route is the same one on the uplink and on its bridge.
    """

    dst: str  # "a.b.c.d/len"; "0.0.0.0/0" for the default route
    gateway: str | None = None
    prefsrc: str | None = None
    metric: int | None = None
    scope: int = 0  # RT_SCOPE_UNIVERSE; RT_SCOPE_LINK (253) for routes without a gateway
    proto: int = RTPROT_BOOT


def _to_movable_route(msg) -> MovableRoute:
    return MovableRoute(
        dst=f"{msg.get('RTA_DST') or '0.0.0.0'}/{msg['dst_len']}",
        gateway=msg.get("RTA_GATEWAY"),
        prefsrc=msg.get("RTA_PREFSRC"),
        metric=msg.get("RTA_PRIORITY"),
        scope=msg["scope"],
        proto=msg["proto"],
    )


def route_to_write(route: KernelRoute) -> rtnl_writes.Route:
    """The agent's own route as a write (a device route has link scope: a gateway behind it must be reachable)."""
    return rtnl_writes.Route(route.dst, route.table, oif=route.oif, gateway=route.gateway, prefsrc=route.prefsrc)


def _movable_route(link: Link, route: MovableRoute) -> rtnl_writes.Route:
    return rtnl_writes.Route(
        route.dst,
        MAIN_TABLE,
        oif=link.index,
        gateway=route.gateway,
        prefsrc=route.prefsrc,
        metric=route.metric,
        scope=route.scope,
        proto=route.proto,
    )
