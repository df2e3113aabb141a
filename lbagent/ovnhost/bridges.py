"""Provider bridges on this host: one OVS bridge per provider network, kube-ovn style.

This module owns what one pass over one provider network does here, given
this host's uplink for it:
- `ensure`: an OVS bridge `br-<network>` with the integration bridge's
  datapath type, the uplink's MAC and MTU, and our marks; the uplink attached
  as a port; the uplink's IPv4 addresses and routes moved to the bridge;
  `<network>:br-<network>` in ovn-bridge-mappings.
- `remove`: the reverse, from whatever is left: the mapping entry removed,
  the uplink detached and given its addresses and routes back (skipped when
  the uplink is gone), the bridge deleted.

The OVSDB side of each step is an `OvsClient` method from provider_ovs.py.
Every call is blocking (netlink, OVSDB) and runs on a host-namespace thread.
Each pass observes first and writes only the difference. What was moved is
recorded in the bridge's external_ids *before* it is moved, so an agent that
stops halfway, or restarts, still knows exactly what to give back; nothing
of that lives in memory.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass

from lbagent.ovnhost.errors import HostError
from lbagent.ovnhost.inventory import OWNER_KEY
from lbagent.ovnhost.iplib import Address, Link, MovableRoute, Netlink
from lbagent.ovnhost.ovs import OvsClient
from lbagent.ovnhost.provider_ovs import BridgeState

log = logging.getLogger(__name__)

NETWORK_KEY = "lbagent-provider-network"  # on the bridge and on the uplink's Port
INTERFACE_KEY = "lbagent-provider-interface"  # the uplink whose addresses the bridge holds
MOVED_ADDRESSES_KEY = "lbagent-moved-addresses"
MOVED_ROUTES_KEY = "lbagent-moved-routes"
DEVICE_TIMEOUT = 5.0  # for ovs-vswitchd to create the bridge's host device
LINK_LOCAL = ipaddress.IPv4Network("169.254.0.0/16")


def bridge_name(network: str) -> str:
    return f"br-{network}"


class ProviderBridgeError(HostError):
    pass


@dataclass(frozen=True)
class BridgeReport:
    bridge: str
    interface: str
    mtu: int
    changed: bool


@dataclass(frozen=True)
class Moved:
    """The addresses and routes that belong to the uplink but live on the bridge."""

    addresses: frozenset[Address] = frozenset()
    routes: frozenset[MovableRoute] = frozenset()

    def __or__(self, other: Moved) -> Moved:
        return Moved(self.addresses | other.addresses, self.routes | other.routes)

    def external_ids(self) -> dict[str, str]:
        return {MOVED_ADDRESSES_KEY: _encode(self.addresses), MOVED_ROUTES_KEY: _encode(self.routes)}

    @classmethod
    def from_external_ids(cls, ids: dict[str, str]) -> Moved:
        try:
            addresses = json.loads(ids.get(MOVED_ADDRESSES_KEY) or "[]")
            routes = json.loads(ids.get(MOVED_ROUTES_KEY) or "[]")
            return cls(frozenset(Address(**a) for a in addresses), frozenset(MovableRoute(**r) for r in routes))
        except (ValueError, TypeError) as exc:
            raise ProviderBridgeError(f"unreadable record of moved addresses/routes: {exc}") from exc


def _encode(items) -> str:
    """A stable text for a set of dataclasses: equal sets give equal texts, so a pass rewrites nothing."""
    return "[" + ",".join(sorted(json.dumps(asdict(item), sort_keys=True) for item in items)) + "]"


def addresses_to_move(addresses: set[Address]) -> set[Address]:
    return {a for a in addresses if ipaddress.ip_address(a.address) not in LINK_LOCAL}


def routes_to_move(routes: set[MovableRoute]) -> set[MovableRoute]:
    return {r for r in routes if r.gateway or not ipaddress.IPv4Network(r.dst).subnet_of(LINK_LOCAL)}


def in_scope_order(routes) -> list[MovableRoute]:
    """Narrow scopes first (host, link, ..., universe): a gateway must be reachable before routes use it."""
    return sorted(routes, key=lambda r: (-r.scope, r.dst, r.metric or 0, r.gateway or ""))


def _same_address(addresses: set[Address], addr: Address) -> bool:
    return any((a.address, a.prefixlen) == (addr.address, addr.prefixlen) for a in addresses)


class ProviderBridges:
    def __init__(
        self,
        ovs: OvsClient,
        netlink: Callable[[], AbstractContextManager[Netlink]] = Netlink.open,
        device_timeout: float = DEVICE_TIMEOUT,
    ):
        self._ovs = ovs
        self._netlink = netlink
        self._device_timeout = device_timeout

    # --- reads ---------------------------------------------------------------------

    def owned_networks(self) -> set[str]:
        """Provider networks that have a bridge of ours on this host."""
        return {
            ids[NETWORK_KEY]
            for name, ids in self._ovs.owned_bridges().items()
            if ids.get(NETWORK_KEY) and name == bridge_name(ids[NETWORK_KEY])
        }

    def _observe_ours(self, bridge: str) -> BridgeState | None:
        observed = self._ovs.observe_bridge(bridge)
        if observed is not None and observed.external_ids.get(OWNER_KEY) != self._ovs.owner:
            raise ProviderBridgeError(f"bridge {bridge} exists and is not managed by this agent: leaving it alone")
        return observed

    # --- ensure --------------------------------------------------------------------

    def ensure(self, network: str, interface: str) -> BridgeReport:
        bridge = bridge_name(network)
        datapath_type = self._ovs.datapath_type()
        if datapath_type is None:
            raise ProviderBridgeError(f"integration bridge {self._ovs.bridge} not found")
        observed = self._observe_ours(bridge)
        with self._netlink() as nl:
            changed = False
            previous = observed.external_ids.get(INTERFACE_KEY) if observed else None
            if observed is not None and previous and previous != interface:
                # The uplink for this host changed: the old one gets its own back first.
                changed |= self._give_back(nl, bridge, observed, forget=True)
                observed = self._ovs.observe_bridge(bridge)
            uplink = nl.link(interface)
            if uplink is None:
                raise ProviderBridgeError(f"interface {interface} of provider network {network} not found")
            port = self._ovs.observe_port(interface)
            if port is not None and port.on_bridge not in (None, bridge):
                raise ProviderBridgeError(f"interface {interface} is already a port of bridge {port.on_bridge}")
            on_uplink = Moved(
                frozenset(addresses_to_move(nl.addresses(uplink.index))),
                frozenset(routes_to_move(nl.movable_routes(uplink.index))),
            )
            record = (Moved.from_external_ids(observed.external_ids) if observed else Moved()) | on_uplink
            ids = {OWNER_KEY: self._ovs.owner, NETWORK_KEY: network, INTERFACE_KEY: interface, **record.external_ids()}
            # Recorded before anything moves: a pass cut short still knows what to give back.
            changed |= self._ovs.ensure_bridge(bridge, datapath_type, ids, uplink.mac, uplink.mtu, observed)
            device = self._wait_for_device(nl, bridge)
            changed |= self._move(nl, uplink, device, record)
            changed |= self._ovs.attach_port(bridge, interface, {NETWORK_KEY: network}, port)
            changed |= self._ovs.set_bridge_mapping(network, bridge)
            mtu = (nl.link(bridge) or device).mtu
        return BridgeReport(bridge, interface, mtu, changed)

    def _wait_for_device(self, nl: Netlink, bridge: str) -> Link:
        deadline = time.monotonic() + self._device_timeout
        while (device := nl.link(bridge)) is None:
            if time.monotonic() >= deadline:
                raise ProviderBridgeError(
                    f"ovs-vswitchd did not create device {bridge} within {self._device_timeout:g}s"
                )
            time.sleep(0.02)  # ovs-vswitchd creates it asynchronously after the transaction
        return device

    def _move(self, nl: Netlink, uplink: Link, device: Link, record: Moved) -> bool:
        """Put the recorded addresses and routes on the bridge and off the uplink."""
        writes = 0
        if not device.up:
            nl.set_link(device, up=True)  # routes through a down device are refused
            writes += 1
        on_uplink, on_bridge = nl.addresses(uplink.index), nl.addresses(device.index)
        for addr in sorted(record.addresses, key=lambda a: a.cidr):
            if _same_address(on_uplink, addr):
                nl.delete_address(uplink, addr)
                writes += 1
            if not _same_address(on_bridge, addr):
                nl.add_address(device, addr)
                writes += 1
        routes_on_bridge = nl.movable_routes(device.index)
        for route in in_scope_order(record.routes - routes_on_bridge):
            nl.replace_movable_route(device, route)  # moves a same-key route off the uplink, too
            writes += 1
        for route in in_scope_order(record.routes & nl.movable_routes(uplink.index)):
            nl.delete_movable_route(uplink, route)
            writes += 1
        if not uplink.up:
            nl.set_link(uplink, up=True)
            writes += 1
        return writes > 0

    # --- remove --------------------------------------------------------------------

    def remove(self, network: str) -> bool:
        """Undo `ensure` for `network`, from whatever exists; True if anything was written.

        With no bridge of ours there is nothing to undo (a bridge of that name
        that is not ours is left alone, and so is a mapping entry without our
        bridge: ours is removed before the bridge is).
        """
        bridge = bridge_name(network)
        observed = self._ovs.observe_bridge(bridge)
        if observed is None or observed.external_ids.get(OWNER_KEY) != self._ovs.owner:
            return False
        self._ovs.set_bridge_mapping(network, bridge, present=False)
        with self._netlink() as nl:
            self._give_back(nl, bridge, observed, forget=False)
        self._ovs.delete_bridge(bridge)
        return True

    def _give_back(self, nl: Netlink, bridge: str, observed: BridgeState, forget: bool) -> bool:
        """Detach the recorded uplink, return its addresses and routes, and (with `forget`) drop the record.

        When the uplink has vanished there is nothing to return them to: they
        are only taken off the bridge, so that removal completes.
        """
        interface = observed.external_ids.get(INTERFACE_KEY)
        record = Moved.from_external_ids(observed.external_ids)
        writes = 0
        if interface:
            port = self._ovs.observe_port(interface)
            if port is not None and port.on_bridge == bridge:
                writes += self._ovs.delete_port(interface)
        uplink = nl.link(interface) if interface else None
        if uplink is not None:
            writes += self._return_to(nl, uplink, record)
        elif interface:
            log.warning(
                "object=provider_bridge bridge=%s action=give_back result=skipped reason=uplink_gone interface=%s",
                bridge,
                interface,
            )
        device = nl.link(bridge)
        if device is not None:
            writes += self._take_off(nl, device, record)
        if forget:
            writes += self._ovs.update_bridge_external_ids(
                bridge, {INTERFACE_KEY: None, MOVED_ADDRESSES_KEY: None, MOVED_ROUTES_KEY: None}
            )
        return writes > 0

    @staticmethod
    def _return_to(nl: Netlink, uplink: Link, record: Moved) -> int:
        writes = 0
        on_uplink = nl.addresses(uplink.index)
        for addr in sorted(record.addresses, key=lambda a: a.cidr):
            if not _same_address(on_uplink, addr):
                nl.add_address(uplink, addr)
                writes += 1
        if not uplink.up:
            nl.set_link(uplink, up=True)
            writes += 1
        for route in in_scope_order(record.routes - nl.movable_routes(uplink.index)):
            nl.replace_movable_route(uplink, route)  # moves it off the bridge when the keys match
            writes += 1
        return writes

    @staticmethod
    def _take_off(nl: Netlink, device: Link, record: Moved) -> int:
        writes = 0
        for route in in_scope_order(record.routes & nl.movable_routes(device.index))[::-1]:
            nl.delete_movable_route(device, route)
            writes += 1
        on_bridge = nl.addresses(device.index)
        for addr in sorted(record.addresses, key=lambda a: a.cidr):
            if _same_address(on_bridge, addr):
                nl.delete_address(device, addr)
                writes += 1
        return writes
