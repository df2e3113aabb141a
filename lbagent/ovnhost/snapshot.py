"""One load balancer's kernel objects as they are now, read at once: what a resync compares.

A pass over a converged load balancer asks the kernel about each object it
owns, one request at a time, and finds nothing to do; with a thousand load
balancers each resynced every 30 s that cost most of the agent's CPU. A
resync first reads everything at once here and compares the result with
what it read the last time a whole pass found nothing to change
(`OvnWorker`): the same bytes mean the same objects, and the pass stops
there.

- `inside_namespace(links, nat)`, run inside the load balancer's namespace:
  every link, every address and the main routing table (one dump each), the
  digests of the NAT tables and, on the userspace datapath, the OVN-side
  end's TX checksum setting.
- `on_host(links, sock)`, in the host namespace: the two host ends, the
  addresses of the haproxy-side one, and for each family the route to
  INNER and the path a reply from OUTER takes.

Each answer is kept as the kernel gives it, but for what changes by itself
(counters, cache information, a route's last use), so a converged load
balancer reads the same twice, and anything someone changes shows. Anything the kernel refuses
(a link gone, no route) is kept as its error: a difference like any other.
"""

from __future__ import annotations

import hashlib
import socket
import struct
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing

from pyroute2.netlink.rtnl import RTM_GETADDR, RTM_GETLINK, RTM_GETROUTE

from lbagent.ovnhost import ethtool, rtnl_requests
from lbagent.ovnhost.errors import NetlinkError
from lbagent.ovnhost.iplib import MAIN_TABLE
from lbagent.ovnhost.iptables import WantedNat, nat_state
from lbagent.ovnhost.links import FAMILIES, LinkSpec, pairs
from lbagent.ovnhost.rtnl_socket import open_socket, request

_ATTRIBUTE = struct.Struct("=HH")
_I32 = struct.Struct("=i")  # a part's length in the digest; ifinfomsg's ifi_index
_NUMBER = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
NLMSG_HEADER = 16
IFINFOMSG_END = NLMSG_HEADER + 16
IFADDRMSG_END = NLMSG_HEADER + 8
RTMSG_END = NLMSG_HEADER + 12

IFLA_STATS, IFLA_STATS64 = 7, 23
_LINK_COUNTERS = frozenset((IFLA_STATS, IFLA_STATS64))
IFLA_AF_SPEC = 26
IFLA_INET6_CACHEINFO = 5
# RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_PREFSRC, RTA_TABLE: not
# RTA_CACHEINFO, whose last-use time a route lookup itself moves.
_ROUTE_KEPT = frozenset((1, 4, 5, 6, 7, 15))


def _attributes(data: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(number, start, end) of each attribute in data[start:end], its padding
    not included; a truncated attribute ends the list, as the kernel's own
    parser does."""
    unpack = _ATTRIBUTE.unpack_from
    while start + _ATTRIBUTE.size <= end:
        length, number = unpack(data, start)
        if length < _ATTRIBUTE.size or start + length > end:
            return
        yield number & _NUMBER, start, start + length
        start += (length + 3) & ~3


def _attribute_at(data: bytes, start: int, end: int, wanted: int) -> tuple[int, int] | None:
    """(start, end) of the first attribute numbered `wanted` in data[start:end]."""
    return next(((first, last) for number, first, last in _attributes(data, start, end) if number == wanted), None)


def _link(data: bytes) -> bytes:
    """A link as it is, but for what moves by itself: its counters (IFLA_STATS,
    IFLA_STATS64) and IPv6's cache information inside IFLA_AF_SPEC (its
    reachable time is drawn anew every few minutes). Header: type, index and
    flags (not `change`)."""
    parts = [data[NLMSG_HEADER + 2 : NLMSG_HEADER + 12]]
    kept_from = IFINFOMSG_END
    for number, first, last in _attributes(data, IFINFOMSG_END, len(data)):
        if number in _LINK_COUNTERS or number == IFLA_AF_SPEC:
            parts.append(data[kept_from:first])
            if number == IFLA_AF_SPEC:
                parts.append(_without_ipv6_cacheinfo(data, first, last))
            kept_from = (last + 3) & ~3  # and its padding (attributes start 4-aligned)
    parts.append(data[kept_from:])
    return b"".join(parts)


def _without_ipv6_cacheinfo(data: bytes, start: int, end: int) -> bytes:
    """IFLA_AF_SPEC at data[start:end], but IFLA_INET6_CACHEINFO."""
    inet6 = _attribute_at(data, start + _ATTRIBUTE.size, end, socket.AF_INET6)
    cacheinfo = inet6 and _attribute_at(data, inet6[0] + _ATTRIBUTE.size, inet6[1], IFLA_INET6_CACHEINFO)
    if not cacheinfo:
        return data[start:end]
    return data[start : cacheinfo[0]] + data[cacheinfo[1] : end]


def _address(data: bytes) -> bytes:
    """An address as it is (its lifetimes are those of a permanent address:
    they do not count down). Not the netlink header: it holds the request's
    sequence number."""
    return data[NLMSG_HEADER:]


def _route(data: bytes) -> bytes:
    attributes = _attributes(data, RTMSG_END, len(data))
    kept = (data[first:last] for number, first, last in attributes if number in _ROUTE_KEPT)
    return data[NLMSG_HEADER:RTMSG_END] + b"".join(kept)


def _ask(
    sock: socket.socket, op: str, body: bytes, kind: int, view: Callable[[bytes], bytes], dump: bool
) -> list[bytes]:
    try:
        return request(sock, op, "", body, kind, view, dump=dump)
    except NetlinkError as exc:
        return [f"{op}: errno {exc.code}".encode()]


def digest(parts: Iterable[bytes]) -> bytes:
    """The parts, in order, as one short value."""
    hashed = hashlib.blake2b(digest_size=16)
    for part in parts:
        hashed.update(_I32.pack(len(part)))
        hashed.update(part)
    return hashed.digest()


def inside_namespace(links: LinkSpec, nat: WantedNat) -> bytes:
    families = [socket.AF_INET] + ([socket.AF_INET6] if links.ipv6 is not None else [])
    with closing(open_socket(strict=True)) as sock:
        parts = _ask(sock, "dump links", rtnl_requests.dump_links(), RTM_GETLINK, _link, dump=True)
        body = rtnl_requests.dump_addresses(0, socket.AF_UNSPEC)
        parts += _ask(sock, "dump addresses", body, RTM_GETADDR, _address, dump=True)
        for family in families:
            body = rtnl_requests.dump_routes(MAIN_TABLE, None, family)
            parts += _ask(sock, "dump routes", body, RTM_GETROUTE, _route, dump=True)
        if links.tx_checksum_off:
            parts.append(b"tx checksum %d" % ethtool.tx_checksum_enabled(links.names.ovn_ns, sock))
    parts.append(nat_state(nat).encode())
    return digest(parts)


def _host_end(sock: socket.socket, name: str) -> tuple[int, bytes]:
    """A host end's index (0: gone) and what the look keeps of it."""
    try:
        (data,) = request(sock, "get link", name, rtnl_requests.get_link_settings(name), RTM_GETLINK, bytes)
    except NetlinkError as exc:
        return 0, f"get link {name}: errno {exc.code}".encode()
    return _I32.unpack_from(data, NLMSG_HEADER + 4)[0], _link(data)


def on_host(links: LinkSpec, sock: socket.socket) -> bytes:
    """`sock`: a strict rtnetlink socket of the host's namespace, which the looks of
    one job share (answers are told apart by their sequence numbers)."""
    names = links.names
    _, ovn_end = _host_end(sock, names.ovn_host)
    haproxy, haproxy_end = _host_end(sock, names.haproxy_host)
    parts = [ovn_end, haproxy_end]
    if haproxy:
        body = rtnl_requests.dump_addresses(haproxy, socket.AF_UNSPEC)
        parts += _ask(sock, "dump addresses", body, RTM_GETADDR, _address, dump=True)
    for pair in pairs(links):
        parts += _ask(sock, "get route", rtnl_requests.get_route(pair.inner), RTM_GETROUTE, _route, dump=False)
        probe = rtnl_requests.get_route(FAMILIES[pair.family].reply_probe, pair.outer)
        parts += _ask(sock, "get route", probe, RTM_GETROUTE, _route, dump=False)
    return digest(parts)
