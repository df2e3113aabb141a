"""The agent's view of Open vSwitch: integration-bridge ports of load balancers,
and the provider bridges with their entries in `ovn-bridge-mappings`.

One ovsdbapp IDL connection (its own thread) per agent. Reads are served from
the IDL's in-memory replica; writes are single transactions. Every call here
is blocking and is run off the event loop by the caller; each transaction is
started with `nested=False` because ovsdbapp keys nesting by thread id.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ovs.db import data as ovs_data
from ovs.db import types as ovs_types
from ovsdbapp import exceptions as ovsdbapp_exceptions
from ovsdbapp.backend.ovs_idl import command, connection, idlutils, transaction
from ovsdbapp.schema.open_vswitch import impl_idl

from lbagent.metrics import CURRENT_LB, count_write, note_ovsdb_session
from lbagent.ovnhost.errors import OvsdbError, OvsdbUnavailable

log = logging.getLogger(__name__)

OWNER_KEY = "lbagent-owner"  # value: "lbagent/<host>", so two agents never claim each other's ports
LB_KEY = "lbagent-lb"


def owner_value(host: str) -> str:
    return f"lbagent/{host}"


@dataclass(frozen=True)
class PortState:
    on_bridge: str | None  # name of the bridge holding the port, if any
    external_ids: dict = field(default_factory=dict)  # of the port's Interface
    ofport: int | None = None

    @property
    def ovn_installed(self) -> bool:
        return self.external_ids.get("ovn-installed") == "true"


@dataclass(frozen=True)
class PortWant:
    """One port as a pass wants it."""

    name: str
    external_ids: dict[str, str]
    reattach: bool = False  # the device behind it is new: an existing port must be added anew


class _ObservePort(command.ReadOnlyCommand):
    def __init__(self, api, name: str):
        super().__init__(api)
        self.name = name

    def run_idl(self, txn):
        port = idlutils.row_by_value(self.api.idl, "Port", "name", self.name, None)
        if port is None:
            self.result = None
            return
        bridge = _bridge_holding(self.api, port.uuid)
        iface = next((i for i in port.interfaces if i.name == self.name), None)
        ofport = iface.ofport[0] if iface is not None and iface.ofport else None
        self.result = PortState(bridge, dict(iface.external_ids) if iface is not None else {}, ofport)


def _bridge_holding(api, port_uuid) -> str | None:
    """Name of the bridge whose ports include this one. Reading a bridge's
    `ports` builds a Row object per port, O(ports) for every lookup; its raw
    set of uuids answers in O(1) per bridge. Runs on the IDL thread."""
    wanted = ovs_data.Atom(ovs_types.UuidType, port_uuid)
    for bridge in api.tables["Bridge"].rows.values():
        if wanted in bridge._data["ports"].values:
            return bridge.name
    return None


class _OwnedPorts(command.ReadOnlyCommand):
    def __init__(self, api, owner: str, installed_only: bool = False):
        super().__init__(api)
        self.owner = owner
        self.installed_only = installed_only

    def run_idl(self, txn):
        self.result = {
            iface.name: iface.external_ids.get(LB_KEY, "")
            for iface in self.api.tables["Interface"].rows.values()
            if iface.external_ids.get(OWNER_KEY) == self.owner
            and (not self.installed_only or iface.external_ids.get("ovn-installed") == "true")
        }


class _BridgeDatapath(command.ReadOnlyCommand):
    def __init__(self, api, bridge: str):
        super().__init__(api)
        self.bridge = bridge

    def run_idl(self, txn):
        br = idlutils.row_by_value(self.api.idl, "Bridge", "name", self.bridge, None)
        self.result = None if br is None else (br.datapath_type or "system")


# Columns ovs-vswitchd rewrites all the time (every few seconds per interface)
# and that nothing here reads: with a thousand ports, parsing their updates
# kept the IDL thread, which every OVSDB call waits on, busy.
CHURNING_COLUMNS = {
    "Interface": {"statistics", "status", "link_resets", "link_speed", "link_state", "duplex", "admin_state",
                  "lacp_current", "bfd_status", "cfm_fault", "cfm_fault_status", "cfm_health", "cfm_remote_mpids",
                  "cfm_remote_opstate", "cfm_flap_count"},
    "Port": {"statistics", "status"},
    "Bridge": {"status"},
    "Open_vSwitch": {"statistics"},
}


def _schema_without_counters(db: str):
    """The Open_vSwitch schema with every table, minus the churning columns."""
    helper = idlutils.get_schema_helper(db, "Open_vSwitch")
    for table, spec in helper.schema_json["tables"].items():
        skip = CHURNING_COLUMNS.get(table, set())
        helper.register_columns(table, [column for column in spec["columns"] if column not in skip])
    return helper


class _CountingIdl(connection.OvsdbIdl):
    def restart_fsm(self):  # runs once per newly established session: counts reconnects
        note_ovsdb_session()
        super().restart_fsm()


class _OvsApi(impl_idl.OvsdbIdl):
    """ovsdbapp's Open_vSwitch API whose transactions, like `ovs-vsctl --no-wait`,
    return once ovsdb-server has committed them. ovsdbapp's own wait for
    ovs-vswitchd to apply each one runs on the shared IDL thread: with a
    thousand ports every reconfiguration takes a second or more, and all OVSDB
    work would queue behind it. Readiness is `ovn-installed`, not that wait."""

    def create_transaction(self, check_error=False, log_errors=True, wait_for_vswitchd=False, **kwargs):
        cls = impl_idl.OvsVsctlTransaction if wait_for_vswitchd else _NoWaitTransaction
        return cls(self, self.ovsdb_connection, check_error=check_error, log_errors=log_errors)


class _NoWaitTransaction(impl_idl.OvsVsctlTransaction):
    def pre_commit(self, txn):
        txn.expected_ifaces = set()  # add_port records its interfaces here; nobody waits for them

    def post_commit(self, txn):
        transaction.Transaction.post_commit(self, txn)


class OvsClient:
    def __init__(self, db: str, integration_bridge: str, host: str, timeout: float = 10.0):
        self.db = db
        self.owner = owner_value(host)
        self.bridge = integration_bridge
        self._timeout = timeout
        self._api: impl_idl.OvsdbIdl | None = None

    def start(self) -> None:
        """Connect; blocks until the first update arrives."""
        try:
            idl = _CountingIdl(self.db, _schema_without_counters(self.db))
            conn = connection.Connection(idl=idl, timeout=self._timeout)
            self._api = _OvsApi(conn, start=True)
        except Exception as exc:  # ovsdbapp raises bare Exceptions on connect failures
            raise OvsdbError(f"cannot connect to OVSDB at {self.db}: {exc}") from exc

    def stop(self) -> None:
        if self._api is not None:
            self._api.ovsdb_connection.stop()
            self._api = None

    @property
    def api(self) -> _OvsApi:
        if self._api is None:
            raise OvsdbUnavailable("not connected to OVSDB")
        return self._api

    def _execute(self, cmd):
        try:
            return cmd.execute(check_error=True, log_errors=False)
        except ovsdbapp_exceptions.TimeoutException as exc:
            raise OvsdbUnavailable(f"OVSDB {type(cmd).__name__}: {exc}") from exc
        except Exception as exc:
            raise OvsdbError(f"OVSDB {type(cmd).__name__}: {exc}") from exc

    def datapath_type(self) -> str | None:
        return self._execute(_BridgeDatapath(self.api, self.bridge))

    def observe_port(self, name: str) -> PortState | None:
        return self._execute(_ObservePort(self.api, name))

    def owned_ports(self) -> dict[str, str]:
        """Interface name -> load balancer id of every port marked as ours."""
        return self._execute(_OwnedPorts(self.api, self.owner))

    def installed_ports(self) -> set[str]:
        """Our ports on which ovn-controller has installed its flows, now."""
        return set(self._execute(_OwnedPorts(self.api, self.owner, installed_only=True)))

    def converge_ports(self, wants: list[PortWant]) -> list[PortState | None]:
        """Make each port one of the integration bridge with its external_ids,
        writing only the difference; returns what each looks like afterwards.

        Every write goes in one transaction: each transaction that adds ports
        makes ovs-vswitchd reconfigure the whole bridge. Creation and
        external_ids go together (add_port's attrs apply only on creation, so
        external_ids is a separate db_set). The ports to re-attach that exist
        are first removed together, in a transaction that waits until
        ovs-vswitchd has closed their old devices.
        """
        observed = [self.observe_port(want.name) for want in wants]
        stale = [index for index, want in enumerate(wants) if want.reattach and observed[index] is not None]
        if stale:
            self._transact_for([(wants[i], f"delete port {wants[i].name}") for i in stale],
                               f"delete {len(stale)} ports",
                               [self.api.del_port(wants[i].name, if_exists=True) for i in stale],
                               wait_for_vswitchd=True)
            for index in stale:
                observed[index] = None
        plans = [self._port_plan(want, seen) for want, seen in zip(wants, observed)]
        written = [(want, plan[0]) for want, plan in zip(wants, plans) if plan is not None]
        if written:
            self._transact_for(written, f"write {len(written)} ports",
                               [cmd for plan in plans if plan is not None for cmd in plan[1]])
        return [seen if plan is None else self.observe_port(want.name)
                for want, seen, plan in zip(wants, observed, plans)]

    def _port_plan(self, want: PortWant, observed: PortState | None) -> tuple[str, list] | None:
        """What to write for one port, and the commands; None if it is as wanted."""
        name = want.name
        wanted = {**want.external_ids, OWNER_KEY: self.owner}
        on_bridge = observed.on_bridge if observed else None
        ids_ok = observed is not None and all(observed.external_ids.get(k) == v for k, v in wanted.items())
        if on_bridge == self.bridge and ids_ok:
            return None
        commands = []
        if on_bridge is not None and on_bridge != self.bridge:
            commands.append(self.api.del_port(name, bridge=on_bridge, if_exists=True))
        if on_bridge != self.bridge:
            commands.append(self.api.add_port(self.bridge, name, may_exist=True))
        commands.append(self.api.db_set("Interface", name, ("external_ids", wanted)))
        return (f"add port {name}" if on_bridge != self.bridge else f"set external_ids of {name}"), commands

    def delete_port(self, name: str, wait_for_vswitchd: bool = False) -> bool:
        if self.observe_port(name) is None:
            return False
        self._transact(f"delete port {name}", self.api.del_port(name, if_exists=True),
                       wait_for_vswitchd=wait_for_vswitchd)
        return True

    # --- provider bridges ------------------------------------------------------

    def observe_bridge(self, name: str) -> BridgeState | None:
        return self._execute(_ObserveBridge(self.api, name))

    def owned_bridges(self) -> dict[str, dict[str, str]]:
        """Bridge name -> external_ids of every bridge marked as ours."""
        return self._execute(_OwnedBridges(self.api, self.owner))

    def bridge_mappings(self) -> str:
        """The raw `ovn-bridge-mappings` of the Open_vSwitch row ("" when unset)."""
        return self._execute(_BridgeMappings(self.api))

    def ensure_bridge(self, name: str, datapath_type: str, external_ids: dict[str, str], hwaddr: str, mtu: int,
                      observed: BridgeState | None) -> bool:
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

    def _transact(self, what: str, *commands, wait_for_vswitchd: bool = False, count: bool = True) -> None:
        try:
            with self.api.transaction(check_error=True, log_errors=False, nested=False,
                                      wait_for_vswitchd=wait_for_vswitchd) as txn:
                for cmd in commands:
                    txn.add(cmd)
        except ovsdbapp_exceptions.TimeoutException as exc:
            raise OvsdbUnavailable(f"OVSDB {what}: {exc}") from exc
        except Exception as exc:
            raise OvsdbError(f"OVSDB {what}: {exc}") from exc
        if count:
            count_write("ovsdb", what=what)

    def _transact_for(self, changes: list[tuple[PortWant, str]], many: str, commands: list,
                      wait_for_vswitchd: bool = False) -> None:
        """One transaction for the port changes of several load balancers, each
        counted and logged as its own load balancer's change."""
        what = changes[0][1] if len(changes) == 1 else many
        self._transact(what, *commands, wait_for_vswitchd=wait_for_vswitchd, count=False)
        for want, change in changes:
            token = CURRENT_LB.set(want.external_ids.get(LB_KEY, "-"))
            try:
                count_write("ovsdb", what=change)
            finally:
                CURRENT_LB.reset(token)


# --- provider bridges ---------------------------------------------------------------

BRIDGE_MAPPINGS_KEY = "ovn-bridge-mappings"


class BridgeMappingConflict(OvsdbError):
    """The physical network is already mapped to another bridge, by someone else."""


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
            f"{BRIDGE_MAPPINGS_KEY} maps {physnet} to {other}, not {bridge}: not overwriting it")
    return _format_bridge_mappings([*pairs, (physnet, bridge)])


def _format_bridge_mappings(pairs: list[tuple[str, str]]) -> str:
    return ",".join(f"{physnet}:{bridge}" for physnet, bridge in pairs)


@dataclass(frozen=True)
class BridgeState:
    name: str
    datapath_type: str
    external_ids: dict = field(default_factory=dict)
    hwaddr: str | None = None  # other_config:hwaddr, the MAC of its local port
    mtu_request: int | None = None  # of its local port
    ports: frozenset = frozenset()  # names of its ports, its local port excepted

    def matches(self, datapath_type: str, external_ids: dict[str, str], hwaddr: str, mtu: int) -> bool:
        return (self.datapath_type == datapath_type and self.hwaddr == hwaddr and self.mtu_request == mtu
                and all(self.external_ids.get(k) == v for k, v in external_ids.items()))


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
            self.name, br.datapath_type or "system", dict(br.external_ids), br.other_config.get("hwaddr"),
            mtu_request, frozenset(p.name for p in br.ports if p.name != self.name),
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
