"""Small netlink primitives over one pyroute2 socket, in the style of neutron's ip_lib.

A `Netlink` wraps an `IPRoute` already bound to the right namespace (see
`netns.py`). Reads return plain values; every write is counted and every
netlink failure becomes a typed `NetlinkError` naming the operation.
"""

from __future__ import annotations

import socket
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError as PyrouteNetlinkError

from lbagent.counters import count_write
from lbagent.ovnhost.errors import translate_netlink

IFA_F_NOPREFIXROUTE = 0x200
IFF_UP = 0x1
MAIN_TABLE = 254


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    kind: str
    mac: str
    mtu: int
    up: bool
    peer_index: int  # IFLA_LINK: the veth peer's index (in the peer's namespace)


@dataclass(frozen=True)
class Address:
    address: str
    prefixlen: int
    noprefixroute: bool


@dataclass(frozen=True)
class Route:
    dst: str  # "a.b.c.d/len"; "0.0.0.0/0" for the default route
    gateway: str | None
    oif: int | None
    prefsrc: str | None


class Netlink:
    def __init__(self, ipr: IPRoute):
        self._ipr = ipr

    @classmethod
    @contextmanager
    def open(cls) -> Iterator["Netlink"]:
        """A socket in the calling thread's current namespace, closed on exit."""
        ipr = IPRoute()
        try:
            yield cls(ipr)
        finally:
            ipr.close()

    def _call(self, op: str, target: str, fn, *args, write: bool = False, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except PyrouteNetlinkError as exc:
            raise translate_netlink(op, exc, target) from exc
        if write:
            count_write("netlink")
        return result

    # --- reads -----------------------------------------------------------

    def links(self) -> dict[str, Link]:
        msgs = self._call("dump links", "", self._ipr.get_links)
        return {link.name: link for link in map(_to_link, msgs)}

    def link(self, name: str) -> Link | None:
        return self.links().get(name)

    def addresses(self, index: int) -> set[Address]:
        msgs = self._call("dump addresses", str(index), self._ipr.get_addr, family=socket.AF_INET, index=index)
        return {
            Address(m.get("address"), m["prefixlen"], bool((m.get("flags") or 0) & IFA_F_NOPREFIXROUTE))
            for m in msgs
        }

    def all_addresses(self) -> set[str]:
        msgs = self._call("dump addresses", "", self._ipr.get_addr, family=socket.AF_INET)
        return {m.get("address") for m in msgs}

    def routes(self) -> set[Route]:
        msgs = self._call("dump routes", "", self._ipr.get_routes, family=socket.AF_INET, table=MAIN_TABLE)
        return {_to_route(m) for m in msgs if m.get("type") == 1}  # unicast only

    # --- writes ----------------------------------------------------------

    def add_veth(self, name: str, peer: str, peer_netns_fd: int | None = None) -> None:
        peer_spec: dict = {"ifname": peer}
        if peer_netns_fd is not None:
            peer_spec["net_ns_fd"] = peer_netns_fd
        self._call("add veth", name, self._ipr.link, "add", ifname=name, kind="veth", peer=peer_spec, write=True)

    def delete_link(self, name: str) -> None:
        self._call("delete link", name, self._ipr.link, "del", ifname=name, write=True)

    def set_link(self, link: Link, *, mac: str | None = None, mtu: int | None = None, up: bool | None = None) -> None:
        attrs: dict = {}
        if mac is not None:
            attrs["address"] = mac
        if mtu is not None:
            attrs["mtu"] = mtu
        if up is not None:
            attrs["state"] = "up" if up else "down"
        self._call("set link", link.name, self._ipr.link, "set", index=link.index, write=True, **attrs)

    def add_address(self, link: Link, addr: Address) -> None:
        extra = {"flags": IFA_F_NOPREFIXROUTE} if addr.noprefixroute else {}
        self._call(
            "add address", f"{addr.address}/{addr.prefixlen} {link.name}", self._ipr.addr, "add",
            index=link.index, address=addr.address, prefixlen=addr.prefixlen, write=True, **extra,
        )

    def delete_address(self, link: Link, addr: Address) -> None:
        self._call(
            "delete address", f"{addr.address}/{addr.prefixlen} {link.name}", self._ipr.addr, "del",
            index=link.index, address=addr.address, prefixlen=addr.prefixlen, write=True,
        )

    def replace_route(self, route: Route) -> None:
        self._call("replace route", route.dst, self._ipr.route, "replace", write=True, **_route_args(route))

    def delete_route(self, route: Route) -> None:
        self._call("delete route", route.dst, self._ipr.route, "del", write=True, **_route_args(route))


def _to_link(msg) -> Link:
    info = msg.get("IFLA_LINKINFO")
    return Link(
        index=msg["index"],
        name=msg.get("IFLA_IFNAME"),
        kind=(info.get("IFLA_INFO_KIND") if info else "") or "",
        mac=msg.get("IFLA_ADDRESS") or "",
        mtu=msg.get("IFLA_MTU") or 0,
        up=bool(msg["flags"] & IFF_UP),
        peer_index=msg.get("IFLA_LINK") or 0,
    )


def _to_route(msg) -> Route:
    dst = msg.get("RTA_DST") or "0.0.0.0"
    return Route(
        dst=f"{dst}/{msg['dst_len']}",
        gateway=msg.get("RTA_GATEWAY"),
        oif=msg.get("RTA_OIF"),
        prefsrc=msg.get("RTA_PREFSRC"),
    )


def _route_args(route: Route) -> dict:
    args: dict = {"dst": route.dst, "table": MAIN_TABLE}
    if route.gateway:
        args["gateway"] = route.gateway
    if route.oif:
        args["oif"] = route.oif
    if route.prefsrc:
        args["prefsrc"] = route.prefsrc
    return args
