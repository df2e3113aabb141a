"""OVSDB for provider bridges: the bridges, the uplinks attached to them as
ports, and our entries in the Open_vSwitch row's `ovn-bridge-mappings`.

`ProviderBridgeCommands` is mixed into `OvsClient` (ovs.py) and works over its
connection (`api`, `_execute`, `_transact`): one IDL connection per agent
serves the load balancers' ports and the provider bridges alike. Only the
OVSDB reads and writes live here, with the merge of one `physnet:bridge`
entry into the mappings; what a pass over a provider network does with them
is `bridges.py`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ovsdbapp.backend.ovs_idl import command, idlutils

from lbagent.ovnhost.errors import OvsdbError
from lbagent.ovnhost.inventory import OWNER_KEY

if TYPE_CHECKING:
    from lbagent.ovnhost.ovs import PortState

BRIDGE_MAPPINGS_KEY = "ovn-bridge-mappings"


class BridgeMappingConflict(OvsdbError):
    """The physical network is already mapped to another bridge, by someone else."""


@dataclass(frozen=True)
class BridgeState:
    """A bridge as OVSDB holds it."""

    name: str
    datapath_type: str
    external_ids: dict = field(default_factory=dict)
    hwaddr: str | None = None  # other_config:hwaddr, the MAC of its local port
    mtu_request: int | None = None  # of its local port
    ports: frozenset = frozenset()  # names of its ports, its local port excepted

    def matches(self, datapath_type: str, external_ids: dict[str, str], hwaddr: str, mtu: int) -> bool:
        return (
            self.datapath_type == datapath_type
            and self.hwaddr == hwaddr
            and self.mtu_request == mtu
            and all(self.external_ids.get(k) == v for k, v in external_ids.items())
        )


class ProviderBridgeCommands:
    """The provider-bridge methods of `OvsClient`."""

    # Provided by OvsClient, the class this is mixed into.
    owner: str
    api: Any
    _execute: Callable[..., Any]
    _transact: Callable[..., None]

    def observe_bridge(self, name: str) -> BridgeState | None:
        return self._execute(_ObserveBridge(self.api, name))

    def owned_bridges(self) -> dict[str, dict[str, str]]:
        """Bridge name -> external_ids of every bridge marked as ours."""
        return self._execute(_OwnedBridges(self.api, self.owner))

    def bridge_mappings(self) -> str:
        """The raw `ovn-bridge-mappings` of the Open_vSwitch row ("" when unset)."""
        return self._execute(_BridgeMappings(self.api))

    def ensure_bridge(
        self,
        name: str,
        datapath_type: str,
        external_ids: dict[str, str],
        hwaddr: str,
        mtu: int,
        observed: BridgeState | None,
    ) -> bool:
        """Make `name` a bridge of this datapath type whose local port has this MAC and MTU.

        external_ids are merged (other keys stay). Returns True if anything was written.
        """
        if observed is not None and observed.matches(datapath_type, external_ids, hwaddr, mtu):
            return False
        api = self.api
        self._transact(
            f"ensure bridge {name}",
            api.add_br(name, may_exist=True, datapath_type=datapath_type),
            api.db_set("Bridge", name, ("external_ids", external_ids), ("other_config", {"hwaddr": hwaddr})),
            api.db_set("Interface", name, ("mtu_request", mtu)),
            wait_for_vswitchd=True,  # the bridge device must exist before addresses move to it
        )
        return True

    def update_bridge_external_ids(self, name: str, changes: dict[str, str | None]) -> bool:
        """Set these external_ids of bridge `name`; a None value removes the key."""
        current = self.observe_bridge(name)
        if current is None:
            raise OvsdbError(f"bridge {name} does not exist")
        to_set = {k: v for k, v in changes.items() if v is not None and current.external_ids.get(k) != v}
        to_remove = [k for k, v in changes.items() if v is None and k in current.external_ids]
        if not to_set and not to_remove:
            return False
        commands = [self.api.db_set("Bridge", name, ("external_ids", to_set))] if to_set else []
        if to_remove:
            commands.append(self.api.db_remove("Bridge", name, "external_ids", *to_remove))
        self._transact(f"update bridge {name}", *commands)
        return True

    def attach_port(self, bridge: str, port: str, external_ids: dict[str, str], observed: PortState | None) -> bool:
        """Make the existing device `port` a port of `bridge`, with these Port external_ids.

        The marks go on the Port row: Interface rows with our owner key are
        load balancer ports, which garbage collection sweeps.
        """
        if observed is not None and observed.on_bridge == bridge and self._port_ids_match(port, external_ids):
            return False
        if observed is not None and observed.on_bridge not in (None, bridge):
            raise OvsdbError(f"{port} is already a port of bridge {observed.on_bridge}")
        self._transact(
            f"attach {port} to {bridge}",
            self.api.add_port(bridge, port, may_exist=True),
            self.api.db_set("Port", port, ("external_ids", external_ids)),
            wait_for_vswitchd=True,
        )
        return True

    def _port_ids_match(self, port: str, external_ids: dict[str, str]) -> bool:
        row = self._execute(_PortExternalIds(self.api, port)) or {}
        return all(row.get(k) == v for k, v in external_ids.items())

    def delete_bridge(self, name: str) -> bool:
        if self.observe_bridge(name) is None:
            return False
        self._transact(f"delete bridge {name}", self.api.del_br(name, if_exists=True), wait_for_vswitchd=True)
        return True

    def set_bridge_mapping(self, physnet: str, bridge: str, present: bool = True) -> bool:
        """Add (or with present=False remove) the entry `physnet:bridge` of ovn-bridge-mappings.

        Only that one entry changes; the read-modify-write is verified, so an
        entry a concurrent writer adds meanwhile is never lost (ovsdbapp
        re-runs the transaction on TRY_AGAIN). Returns True if it wrote.
        """
        current = self.bridge_mappings()
        if merge_bridge_mapping(current, physnet, bridge, present) == current:
            return False
        self._transact(f"update {BRIDGE_MAPPINGS_KEY}", _SetBridgeMapping(self.api, physnet, bridge, present))
        return True


def parse_bridge_mappings(text: str) -> list[tuple[str, str]]:
    """`"a:br-a,b:br-b"` -> `[("a", "br-a"), ("b", "br-b")]`, order kept, blanks skipped."""
    pairs = []
    for item in text.split(","):
        physnet, sep, bridge = item.strip().partition(":")
        if physnet and sep:
            pairs.append((physnet, bridge))
    return pairs


def merge_bridge_mapping(text: str, physnet: str, bridge: str, present: bool = True) -> str:
    """`text` with the entry `physnet:bridge` present, or absent with present=False.

    Every other entry is kept as it was, in its place. An entry mapping
    `physnet` to a different bridge is someone else's: adding ours raises
    BridgeMappingConflict rather than overwrite it, removing ours leaves it.
    """
    pairs = parse_bridge_mappings(text)
    if not present:
        kept = [(p, b) for p, b in pairs if (p, b) != (physnet, bridge)]
        return text if kept == pairs else _format_bridge_mappings(kept)
    other = dict(pairs).get(physnet)
    if other == bridge:
        return text
    if other is not None:
        raise BridgeMappingConflict(
            f"{BRIDGE_MAPPINGS_KEY} maps {physnet} to {other}, not {bridge}: not overwriting it"
        )
    return _format_bridge_mappings([*pairs, (physnet, bridge)])


def _format_bridge_mappings(pairs: list[tuple[str, str]]) -> str:
    return ",".join(f"{physnet}:{bridge}" for physnet, bridge in pairs)


def _ovs_row(api):
    """The single row of the Open_vSwitch table."""
    return next(iter(api.tables["Open_vSwitch"].rows.values()))


class _ObserveBridge(command.ReadOnlyCommand):
    def __init__(self, api, name: str):
        super().__init__(api)
        self.name = name

    def run_idl(self, txn):
        br = idlutils.row_by_value(self.api.idl, "Bridge", "name", self.name, None)
        if br is None:
            self.result = None
            return
        local = next((i for p in br.ports if p.name == self.name for i in p.interfaces if i.name == self.name), None)
        mtu_request = local.mtu_request[0] if local is not None and local.mtu_request else None
        self.result = BridgeState(
            self.name,
            br.datapath_type or "system",
            dict(br.external_ids),
            br.other_config.get("hwaddr"),
            mtu_request,
            frozenset(p.name for p in br.ports if p.name != self.name),
        )


class _OwnedBridges(command.ReadOnlyCommand):
    def __init__(self, api, owner: str):
        super().__init__(api)
        self.owner = owner

    def run_idl(self, txn):
        self.result = {
            br.name: dict(br.external_ids)
            for br in self.api.tables["Bridge"].rows.values()
            if br.external_ids.get(OWNER_KEY) == self.owner
        }


class _PortExternalIds(command.ReadOnlyCommand):
    def __init__(self, api, name: str):
        super().__init__(api)
        self.name = name

    def run_idl(self, txn):
        port = idlutils.row_by_value(self.api.idl, "Port", "name", self.name, None)
        self.result = None if port is None else dict(port.external_ids)


class _BridgeMappings(command.ReadOnlyCommand):
    def run_idl(self, txn):
        self.result = _ovs_row(self.api).external_ids.get(BRIDGE_MAPPINGS_KEY, "")


class _SetBridgeMapping(command.BaseCommand):
    """Read-modify-write of one ovn-bridge-mappings entry, verified against concurrent writers."""

    def __init__(self, api, physnet: str, bridge: str, present: bool):
        super().__init__(api)
        self.physnet = physnet
        self.bridge = bridge
        self.present = present

    def run_idl(self, txn):
        row = _ovs_row(self.api)
        current = row.external_ids.get(BRIDGE_MAPPINGS_KEY, "")
        wanted = merge_bridge_mapping(current, self.physnet, self.bridge, self.present)
        # Re-run by ovsdbapp with fresh data if external_ids changed since this read.
        row.verify("external_ids")
        if wanted:
            row.setkey("external_ids", BRIDGE_MAPPINGS_KEY, wanted)
        else:
            row.delkey("external_ids", BRIDGE_MAPPINGS_KEY)
