"""Converge the links, addresses and routes of one load balancer.

Two pure-ish functions, each run on a namespace thread with a netlink socket
of that namespace: `converge_namespace` inside `lb-<id>`, `converge_host`
in the host namespace. Both observe first and write only the difference.

A namespace that a pass has just made holds nothing to observe: for it
`build_namespace` and `build_host` make the same objects in three batches of
requests without reading first (about thirty requests, each a round trip
through pyroute2, otherwise). Whatever they cannot do is left to the two
converge functions, which find and finish a partial build like any drift.

A dual-stack load balancer (`LinkSpec.ipv6`) gets the same in IPv6: its VIP
and default route on the OVN-side veth, an inner/outer pair from the agent's
IPv6 prefix on the haproxy-side one, the route to INNER6 and the reply path
from OUTER6, in the same batches as their IPv4 twins. Every other
load balancer has IPv6 off on its namespace ends and its haproxy-side host
end, which also takes away any IPv6 address a dual-stack past left there.

The host ends carry the agent's ownership mark as their `ifalias`
(`LinkSpec.mark`): garbage collection and `lbagent cleanup` touch only links
that carry it. The build sets it in the requests that bring the host ends up;
`converge_host` reads it with the link lookups it makes anyway and sets it
only when missing (the host ends of a load balancer made by an agent without
marks: the state file's record of it is proof enough, and it is adopted).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import threading
import time
from contextlib import closing
from dataclasses import dataclass, replace
from typing import NamedTuple

from lbagent.naming import INTERFACE_RE, InterfaceNames
from lbagent.ovnhost import devconf, ethtool
from lbagent.ovnhost.errors import LinkNotFound, NetlinkError
from lbagent.ovnhost.iplib import Address, KernelRoute, Link, Netlink, SourceRule, family_of, host_prefixlen
from lbagent.ovnhost.rtnl_batch import RtnlBatch, route_via
from lbagent.ovnhost.rtnl_socket import open_socket
from lbagent.support.readfile import read_small

LINK_LOCAL_PREFIX = 16
# The IPv6 pair's prefix length on its veth: INNER6 and OUTER6 differ in their
# last bit only, so one /64 holds both whatever [agent] inner_prefix6 is.
PAIR6_PREFIX = 64
LOOPBACK_INDEX = 1  # in every namespace
DEFAULT_ROUTE = "0.0.0.0/0"
DEFAULT_ROUTE6 = "::/0"
# haproxy sees real client addresses, so its replies (from OUTER, to anyone)
# must go back through the load balancer's own veth: one policy rule and one
# small table per load balancer. The table id comes from OUTER's low 16 bits,
# which are unique per load balancer: nothing to allocate or persist.
RULE_PRIORITY = 31000
TABLE_BASE = 0x4C420000
# Rules are walked one by one for every route lookup: with a thousand load
# balancers that is ~12 us per packet for all the host's traffic (see
# docs/design-notes.md). Sources outside 169.254/16 jump past the block.
SKIP_PRIORITY = RULE_PRIORITY - 1
SKIP_TARGET = RULE_PRIORITY + 999
LINK_LOCAL_NET = ("169.254.0.0", 16)
# Any address outside 169.254/16: where the reply path is checked to lead.
REPLY_PROBE = "198.18.255.254"
# The same for IPv6: sources outside the unique local block (where
# [agent] inner_prefix6 must lie) skip the reply rules; the probe is a
# documentation address (a route lookup sends nothing).
UNIQUE_LOCAL_NET = ("fc00::", 7)
REPLY_PROBE6 = "2001:db8:ffff:ffff::fffe"


class _Family(NamedTuple):
    default_route: str
    pair_block: tuple[str, int]  # where the pair addresses the reply rules are for lie
    reply_probe: str  # where a reply is checked to lead


FAMILIES: dict[int, _Family] = {
    socket.AF_INET: _Family(DEFAULT_ROUTE, LINK_LOCAL_NET, REPLY_PROBE),
    socket.AF_INET6: _Family(DEFAULT_ROUTE6, UNIQUE_LOCAL_NET, REPLY_PROBE6),
}


def reply_table(outer: str) -> int:
    return TABLE_BASE | (int(ipaddress.IPv4Address(outer)) & 0xFFFF)


def is_reply_table(table: int) -> bool:
    return table & ~0xFFFF == TABLE_BASE


@dataclass(frozen=True)
class Ipv6Spec:
    """The IPv6 half of a dual-stack load balancer."""

    vip: str
    prefixlen: int
    gateway: str
    inner: str  # the pair from [agent] inner_prefix6
    outer: str


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """What the kernel must hold for one load balancer."""

    names: InterfaceNames
    mac: str
    vip: str
    prefixlen: int
    gateway: str
    mtu: int
    routes: tuple[tuple[str, str], ...]  # extra (cidr, nexthop) routes of the subnet, of either family
    inner: str
    outer: str
    tx_checksum_off: bool  # integration bridge on the userspace (netdev) datapath
    mark: str = ""  # ifalias of the host ends: the agent's ownership mark ("": left alone)
    ipv6: Ipv6Spec | None = None  # None: IPv4 only


def converge_namespace(spec: LinkSpec, host_netns_fd: int) -> set[str]:
    """Returns the namespace ends of the veth pairs this pass had to create."""
    names = spec.names
    created = set()
    with Netlink.open() as nl:
        # Three lookups by name: pyroute2 decodes every attribute of every
        # link in a dump, which cost more than the rest of a converged pass.
        links = {name: nl.link(name) for name in ("lo", names.ovn_ns, names.haproxy_ns)}
        for ns_end, host_end in ((names.ovn_ns, names.ovn_host), (names.haproxy_ns, names.haproxy_host)):
            if links[ns_end] is None:
                nl.add_veth(ns_end, host_end, host_netns_fd)
                created.add(ns_end)
                links[ns_end] = nl.link(ns_end)
        lo, ovn, haproxy = links["lo"], links[names.ovn_ns], links[names.haproxy_ns]
        if lo is None or ovn is None or haproxy is None:
            raise LinkNotFound("find link", errno.ENODEV, ", ".join(n for n, link in links.items() if link is None))
        _ensure_link(nl, lo, up=True)
        ovn = _ensure_link(nl, ovn, up=True, mtu=spec.mtu, mac=spec.mac)
        haproxy = _ensure_link(nl, haproxy, up=True)
        # Before IPv6 addresses: a link with IPv6 off takes none.
        _set_ipv6_of_namespace_ends(spec, (ovn, haproxy))
        _ensure_addresses(nl, ovn, {Address(spec.vip, spec.prefixlen)})
        _ensure_addresses(nl, haproxy, {Address(spec.inner, LINK_LOCAL_PREFIX)})
        _ensure_gateway_routes(nl, set(_gateway_routes(spec, ovn.index, socket.AF_INET)))
        if spec.ipv6 is not None:
            _converge_namespace_ipv6(nl, spec, spec.ipv6, ovn, haproxy)
    _finish_namespace(spec, (ovn, haproxy))
    return created


def _converge_namespace_ipv6(nl: Netlink, spec: LinkSpec, ipv6: Ipv6Spec, ovn: Link, haproxy: Link) -> None:
    _ensure_addresses(nl, ovn, {Address(ipv6.vip, ipv6.prefixlen)}, socket.AF_INET6)
    _ensure_addresses(nl, haproxy, {Address(ipv6.inner, PAIR6_PREFIX)}, socket.AF_INET6)
    _ensure_gateway_routes(nl, set(_gateway_routes(spec, ovn.index, socket.AF_INET6)), socket.AF_INET6)


def build_namespace(spec: LinkSpec, host_netns_fd: int) -> set[str]:
    """`converge_namespace` for a namespace that holds only its loopback: both
    veth pairs made with their final MTU, MAC and state (the host ends made
    directly on the host), then addresses and routes; two batches, no reads.
    Returns the namespace ends it created, like `converge_namespace`."""
    names = spec.names
    # The veth ends made next come up with it set: they need no look.
    devconf.set_ipv6("default", spec.ipv6 is not None, fresh=True)
    batch = RtnlBatch()
    with closing(open_socket()) as sock:
        batch.set_up(LOOPBACK_INDEX, "lo")
        batch.add_veth(names.ovn_ns, names.ovn_host, host_netns_fd, mtu=spec.mtu, mac=spec.mac, peer_mtu=spec.mtu)
        batch.add_veth(names.haproxy_ns, names.haproxy_host, host_netns_fd)
        batch.send(sock)
        ovn, haproxy = _index_of(names.ovn_ns), _index_of(names.haproxy_ns)
        # Addresses first: a route's gateway must be on a prefix of the link.
        batch.add_address(ovn, names.ovn_ns, spec.vip, spec.prefixlen)
        batch.add_address(haproxy, names.haproxy_ns, spec.inner, LINK_LOCAL_PREFIX)
        if spec.ipv6 is not None:
            batch.add_address(ovn, names.ovn_ns, spec.ipv6.vip, spec.ipv6.prefixlen)
            batch.add_address(haproxy, names.haproxy_ns, spec.ipv6.inner, PAIR6_PREFIX)
        for pair in pairs(spec):
            for route in _gateway_routes(spec, ovn, pair.family):
                batch.replace_route(route)
        # Both directions route through the namespace (a new one forwards only if the host does).
        batch.forward_ipv4(ovn, names.ovn_ns)
        batch.forward_ipv4(haproxy, names.haproxy_ns)
        batch.send(sock)
    _finish_namespace(spec)
    return {names.ovn_ns, names.haproxy_ns}


def _gateway_routes(spec: LinkSpec, oif: int, family: int) -> list[KernelRoute]:
    """The namespace's routes of `family` via a gateway, the default route first
    (the subnet's other routes may need it to reach their next hop). A subnet
    route to 0.0.0.0/0 (::/0) is the default route: it takes the gateway's place
    (both would make each pass replace the other)."""
    routes = {cidr: nexthop for cidr, nexthop in spec.routes if family_of(cidr) == family}
    if family == socket.AF_INET:
        gateway = spec.gateway
    else:
        assert spec.ipv6 is not None
        gateway = spec.ipv6.gateway
    default_route = FAMILIES[family].default_route
    default = KernelRoute(default_route, routes.pop(default_route, gateway), oif, None)
    return [default] + [KernelRoute(cidr, nexthop, oif, None) for cidr, nexthop in sorted(routes.items())]


def _set_ipv6_of_namespace_ends(spec: LinkSpec, ends: tuple[Link, Link]) -> None:
    """`ends`: the lookups of the OVN-side and haproxy-side ends."""
    names = (spec.names.ovn_ns, spec.names.haproxy_ns)
    for interface, link in zip(names, ends, strict=True):
        devconf.set_ipv6(interface, spec.ipv6 is not None, link)


def _finish_namespace(spec: LinkSpec, ends: tuple[Link, Link] | None = None) -> None:
    """`ends`: the lookups of the OVN-side and haproxy-side ends, when the pass
    made them; without, the namespace was just built, IPv4 forwarding with it."""
    if spec.tx_checksum_off:
        ethtool.ensure_tx_checksum_off(spec.names.ovn_ns)
    if ends is not None:
        devconf.ensure_forwarding(spec.ipv6 is not None, ends)
    elif spec.ipv6 is not None:
        devconf.ensure_ipv6_forwarding()


def _index_of(name: str) -> int:
    """A link's index by name: one ioctl in the calling thread's namespace."""
    try:
        return socket.if_nametoindex(name)
    except OSError as exc:
        raise LinkNotFound("find link", exc.errno or errno.ENODEV, name) from exc


def converge_host(spec: LinkSpec) -> None:
    """Host side of one load balancer. Looks links up by name and checks the
    routes with two route lookups, so a converged pass costs a handful of small
    requests however many load balancers the host carries."""
    names = spec.names
    with Netlink.open() as nl:
        ovn, haproxy = nl.link(names.ovn_host), nl.link(names.haproxy_host)
        if ovn is None or haproxy is None:
            missing = [n for n, link in ((names.ovn_host, ovn), (names.haproxy_host, haproxy)) if link is None]
            raise LinkNotFound("find link", errno.ENODEV, ", ".join(missing))
        mark = spec.mark or None
        _ensure_link(nl, ovn, up=True, mtu=spec.mtu, alias=mark)
        _ensure_link(nl, haproxy, up=True, alias=mark)
        devconf.set_ipv6(names.haproxy_host, spec.ipv6 is not None, haproxy)
        for pair in pairs(spec):
            _converge_host_pair(nl, pair, reply_table(spec.outer), haproxy)


def _converge_host_pair(nl: Netlink, pair: Pair, table: int, haproxy: Link) -> None:
    """OUTER on the host end, the route to INNER and the reply path, of one family."""
    # noprefixroute: every load balancer's OUTER lives in the same block on the
    # host; only the route towards its own INNER may route there.
    _ensure_addresses(nl, haproxy, {Address(pair.outer, pair.prefixlen, noprefixroute=True)}, pair.family)
    route = KernelRoute(f"{pair.inner}/{host_prefixlen(pair.family)}", None, haproxy.index, pair.outer)
    used = nl.route_to(pair.inner)
    if used is None or (used.dst, used.oif, used.prefsrc) != (route.dst, route.oif, route.prefsrc):
        nl.replace_route(route)
    # A reply from OUTER to any client must leave through this load balancer.
    if not _reply_path_ok(nl, pair, haproxy.index):
        _ensure_reply_path(nl, pair, table, haproxy.index)


@dataclass(frozen=True)
class Pair:
    """One family's inner/outer pair and its prefix length on the veth."""

    inner: str
    outer: str
    prefixlen: int

    @property
    def family(self) -> int:
        return family_of(self.outer)


def pairs(spec: LinkSpec) -> list[Pair]:
    pairs = [Pair(spec.inner, spec.outer, LINK_LOCAL_PREFIX)]
    if spec.ipv6 is not None:
        pairs.append(Pair(spec.ipv6.inner, spec.ipv6.outer, PAIR6_PREFIX))
    return pairs


def build_host(spec: LinkSpec) -> None:
    """`converge_host` for host ends that `build_namespace` has just made (with
    their MTU): both up, OUTER, the route to INNER, the reply table and its
    rule in one batch. The reply path is then checked as `converge_host` checks
    it: a stale rule from OUTER left by an earlier life would come first."""
    names = spec.names
    ovn, haproxy = _index_of(names.ovn_host), _index_of(names.haproxy_host)
    table = reply_table(spec.outer)
    # Before OUTER6: a link with IPv6 off takes no IPv6 address.
    devconf.set_ipv6(names.haproxy_host, spec.ipv6 is not None, fresh=True)
    both = pairs(spec)
    batch = RtnlBatch()
    batch.set_up(ovn, names.ovn_host, spec.mark)
    batch.set_up(haproxy, names.haproxy_host, spec.mark)
    for pair in both:
        batch.add_address(haproxy, names.haproxy_host, pair.outer, pair.prefixlen, noprefixroute=True)
        batch.replace_route(KernelRoute(f"{pair.inner}/{host_prefixlen(pair.family)}", None, haproxy, pair.outer))
        for route in _reply_routes(pair, haproxy, table):
            batch.replace_route(route)
    with closing(open_socket()) as sock:
        with _RULES_LOCK:
            for pair in both:
                batch.add_skip_rules(*FAMILIES[pair.family].pair_block, SKIP_PRIORITY, SKIP_TARGET)
                batch.add_source_rule(pair.outer, table, RULE_PRIORITY)
            batch.send(sock)
        wrong = [p for p in both if route_via(sock, FAMILIES[p.family].reply_probe, p.outer) != (p.inner, haproxy)]
    if wrong:
        with Netlink.open() as nl:
            for pair in wrong:
                _ensure_reply_path(nl, pair, table, haproxy)


def _reply_routes(pair: Pair, oif: int, table: int) -> list[KernelRoute]:
    """The reply table: INNER on the link, then the default route via INNER."""
    return [
        KernelRoute(f"{pair.inner}/{host_prefixlen(pair.family)}", None, oif, pair.outer, table),
        KernelRoute(FAMILIES[pair.family].default_route, pair.inner, oif, None, table),
    ]


def _reply_path_ok(nl: Netlink, pair: Pair, haproxy: int) -> bool:
    """Does a reply from OUTER to a client leave via INNER on this load balancer's veth?
    Only its own table routes anything via INNER (pyroute2 reports the table
    of a `get` as the one its request named, so the table cannot be compared)."""
    reply = nl.route_to(FAMILIES[pair.family].reply_probe, src=pair.outer)
    return reply is not None and (reply.gateway, reply.oif) == (pair.inner, haproxy)


# Policy rules are host-wide and the shared skip rules belong to all load
# balancers: passes on different namespace threads change them one at a time,
# so the last load balancer to go reliably sees that it is the last.
_RULES_LOCK = threading.Lock()


def _ensure_reply_path(nl: Netlink, pair: Pair, table: int, haproxy: int) -> None:
    """`haproxy`: the index of the host end of the haproxy-side veth; `table`: the
    load balancer's reply table (one number, a table in each family)."""
    ordered = _reply_routes(pair, haproxy, table)
    observed = nl.routes(table, pair.family)
    for route in observed - set(ordered):
        nl.delete_route(route)
    for route in ordered:
        if route not in observed:
            nl.replace_route(route)
    rule = SourceRule(pair.outer, table, RULE_PRIORITY)
    with _RULES_LOCK:
        # Adds that the kernel refuses as duplicates: no dump of the host's
        # rules, which grow with the number of load balancers.
        nl.add_skip_rules(*FAMILIES[pair.family].pair_block, SKIP_PRIORITY, SKIP_TARGET)
        nl.add_source_rule(rule)
        if not _reply_path_ok(nl, pair, haproxy):
            # Still wrong: another rule from OUTER comes first. Only now are
            # all rules read, to remove the stale ones.
            for stale in {r for r in nl.source_rules(RULE_PRIORITY, pair.family) if r.src == pair.outer} - {rule}:
                nl.delete_source_rule(stale)


def delete_reply_rules(outers: set[str]) -> list[str]:
    """Remove our policy rules for these OUTER addresses, of either family
    (their tables' routes went with the links). Only the families of `outers`
    are read: removing IPv4-only load balancers dumps no IPv6 rules."""
    deleted = []
    with _RULES_LOCK, Netlink.open() as nl:
        for family in {family_of(outer) for outer in outers}:
            remaining, deleted_here = 0, 0
            for rule in nl.source_rules(RULE_PRIORITY, family):
                if rule.src in outers and is_reply_table(rule.table):
                    nl.delete_source_rule(rule)
                    deleted.append(rule.src)
                    deleted_here += 1
                elif is_reply_table(rule.table):
                    remaining += 1
            if deleted_here and not remaining:
                # The shared skip rules go with the family's last load balancer's rule.
                nl.delete_rules_at(SKIP_PRIORITY, family)
                nl.delete_rules_at(SKIP_TARGET, family)
    return deleted


def reply_rule_sources() -> set[str]:
    """The OUTER addresses, of either family, that have a reply rule."""
    with Netlink.open() as nl:
        return {r.src for family in FAMILIES for r in nl.source_rules(RULE_PRIORITY, family) if is_reply_table(r.table)}


SYS_CLASS_NET = "/sys/class/net"


def marked_host_links(mark: str) -> set[str]:
    """The veths on the host named like ours whose ifalias is `mark`. Names
    from if_nameindex (names only, parsed in C), the alias from sysfs and the
    driver by ioctl, only for names like ours: a pyroute2 dump of a host with
    two thousand veths took two seconds."""
    if not mark:
        return set()
    return {
        name
        for _, name in socket.if_nameindex()
        if INTERFACE_RE.match(name) and _alias(name) == mark and _is_veth(name)
    }


def _alias(name: str) -> str | None:
    try:
        return read_small(os.path.join(SYS_CLASS_NET, name, "ifalias")).rstrip("\n")
    except OSError:  # gone meanwhile
        return None


def _is_veth(name: str) -> bool:
    try:
        return ethtool.driver(name) == "veth"
    except NetlinkError:  # gone meanwhile
        return False


def link_exists(name: str) -> bool:
    """Whether this namespace has a link of that name (sysfs: no netlink socket)."""
    return os.path.exists(os.path.join(SYS_CLASS_NET, name))


def wait_gone(names: set[str], timeout: float, interval: float = 0.2) -> set[str]:
    """Wait until none of these links exists (the kernel frees the links of a
    deleted namespace in the background), at most `timeout` seconds; returns
    those still there."""
    deadline = time.monotonic() + timeout
    while True:
        left = names.intersection(name for _, name in socket.if_nameindex())
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(interval)


def delete_link(name: str) -> bool:
    """Delete one link if it is there; True if it was."""
    with Netlink.open() as nl:
        if nl.link(name) is None:
            return False
        nl.delete_link(name)
        return True


def delete_host_links(names: InterfaceNames) -> list[str]:
    """Delete the host ends (and so the pairs); returns what was deleted."""
    deleted = []
    with Netlink.open() as nl:
        for name in names.host_ends:
            if nl.link(name) is not None:
                nl.delete_link(name)
                deleted.append(name)
    return deleted


def _ensure_link(
    nl: Netlink, link: Link, *, up: bool, mtu: int | None = None, mac: str | None = None, alias: str | None = None
) -> Link:
    changes: dict = {}
    if alias is not None and link.alias != alias:
        changes["alias"] = alias
    if mac is not None and link.mac.lower() != mac.lower():
        changes["mac"] = mac
    if mtu is not None and link.mtu != mtu:
        changes["mtu"] = mtu
    if link.up != up:
        changes["up"] = up
    if changes:
        nl.set_link(link, **changes)
    return link


def _ensure_addresses(nl: Netlink, link: Link, wanted: set[Address], family: int = socket.AF_INET) -> None:
    # Compared without broadcast: the agent gives its links none, and an
    # address someone gave one is still the address wanted. IPv6 link-local
    # addresses are the kernel's.
    observed = {
        replace(a, broadcast=None)
        for a in nl.addresses(link.index, family)
        if not ipaddress.ip_address(a.address).is_link_local or family == socket.AF_INET
    }
    for addr in observed - wanted:
        nl.delete_address(link, addr)
    for addr in wanted - observed:
        nl.add_address(link, addr)


def _ensure_gateway_routes(nl: Netlink, wanted: set[KernelRoute], family: int = socket.AF_INET) -> None:
    # Connected routes belong to the kernel; we own the routes via a gateway.
    observed = {r for r in nl.routes(family=family) if r.gateway is not None}
    for route in observed - wanted:
        nl.delete_route(route)
    for route in sorted(wanted - observed, key=lambda r: r.dst not in (DEFAULT_ROUTE, DEFAULT_ROUTE6)):
        nl.replace_route(route)


def ipv6_address(name: str) -> str:
    """The first IPv6 address of link `name`, link-local ones aside, in the calling
    thread's namespace; "" if it has none (or there is no such link)."""
    with Netlink.open() as nl:
        link = nl.link(name)
        addresses = nl.addresses(link.index, socket.AF_INET6) if link is not None else set()
    found = sorted(a.address for a in addresses if not ipaddress.ip_address(a.address).is_link_local)
    return found[0] if found else ""


def read_namespace_links() -> dict[str, str]:
    """Inside a load balancer's namespace: our link names -> their IPv4 address."""
    found = {}
    with Netlink.open() as nl:
        for name, link in nl.links().items():
            if INTERFACE_RE.match(name):
                addresses = sorted(a.address for a in nl.addresses(link.index))
                found[name] = addresses[0] if addresses else ""
    return found
