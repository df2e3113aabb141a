"""The agent's OVSDB client, and the load balancers' ports on the integration bridge.

`OvsClient` also carries the provider-bridge methods (bridges, uplink ports,
`ovn-bridge-mappings`), which live in provider_ovs.py.

One ovsdbapp IDL connection (its own thread) per agent. Reads are served from
the IDL's in-memory replica; writes are single transactions. Every call here
is blocking and is run off the event loop by the caller; each transaction is
started with `nested=False` because ovsdbapp keys nesting by thread id.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from ovs.db import data as ovs_data
from ovs.db import types as ovs_types
from ovsdbapp import exceptions as ovsdbapp_exceptions
from ovsdbapp.backend.ovs_idl import command, connection, idlutils, transaction
from ovsdbapp.schema.open_vswitch import impl_idl

from lbagent.metrics import CURRENT_LB, count_write, note_ovsdb_session
from lbagent.ovnhost.errors import OvsdbError, OvsdbUnavailable
from lbagent.ovnhost.inventory import LB_KEY, OWNER_KEY, owner_value
from lbagent.ovnhost.provider_ovs import ProviderBridgeCommands

log = logging.getLogger(__name__)


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
    """Name of the bridge whose ports include this one."""
    bridge = _bridge_row_holding(api, port_uuid)
    return None if bridge is None else bridge.name


def _bridge_row_holding(api, port_uuid):
    """The Bridge row whose ports include this one, or None. Reading a bridge's
    `ports` builds a Row object per port, O(ports) for every lookup; its raw
    set of uuids answers in O(1) per bridge. Runs on the IDL thread."""
    wanted = ovs_data.Atom(ovs_types.UuidType, port_uuid)
    return next((b for b in api.tables["Bridge"].rows.values() if wanted in b._data["ports"].values), None)


class _DeletePorts(command.BaseCommand):
    """Delete the ports of these names that exist, from whichever bridge holds
    them. ovsdbapp's del_port without a bridge reads every bridge's `ports`,
    a Row object per port, twice for each port it deletes: at a thousand load
    balancers, a teardown spent most of its time there. Runs on the IDL thread."""

    def __init__(self, api, names: list[str]):
        super().__init__(api)
        self.names = names

    def run_idl(self, txn):
        for name in self.names:
            port = idlutils.row_by_value(self.api.idl, "Port", "name", name, None)
            if port is None:
                continue
            bridge = _bridge_row_holding(self.api, port.uuid)
            if bridge is not None:
                bridge.delvalue("ports", port)  # a mutation: the other ports are not sent
            for interface in port.interfaces:
                interface.delete()
            port.delete()


class _OwnedPorts(command.ReadOnlyCommand):
    def __init__(self, api, owner: str):
        super().__init__(api)
        self.owner = owner

    def run_idl(self, txn):
        self.result = {
            iface.name: iface.external_ids.get(LB_KEY, "")
            for iface in self.api.tables["Interface"].rows.values()
            if iface.external_ids.get(OWNER_KEY) == self.owner
        }


class _InstalledPorts(command.ReadOnlyCommand):
    """Our interfaces on which ovn-controller has installed its flows: of those named in `among`,
    each looked up by its name's index (the readiness watch asks four times a second), or of all."""

    def __init__(self, api, owner: str, among: Collection[str] | None):
        super().__init__(api)
        self.owner = owner
        self.among = among

    def run_idl(self, txn):
        if self.among is None:
            rows = list(self.api.tables["Interface"].rows.values())
        else:
            found = (idlutils.row_by_value(self.api.idl, "Interface", "name", name, None) for name in self.among)
            rows = [iface for iface in found if iface is not None]
        self.result = {
            iface.name
            for iface in rows
            if (ids := iface.external_ids).get(OWNER_KEY) == self.owner and ids.get("ovn-installed") == "true"
        }


class _BridgeDatapath(command.ReadOnlyCommand):
    def __init__(self, api, bridge: str):
        super().__init__(api)
        self.bridge = bridge

    def run_idl(self, txn):
        br = idlutils.row_by_value(self.api.idl, "Bridge", "name", self.bridge, None)
        self.result = None if br is None else (br.datapath_type or "system")


class _SystemId(command.ReadOnlyCommand):
    def run_idl(self, txn):
        rows = list(self.api.tables["Open_vSwitch"].rows.values())
        self.result = rows[0].external_ids.get("system-id", "") if rows else ""


# Columns ovs-vswitchd rewrites all the time (every few seconds per interface)
# and that nothing here reads: with a thousand ports, parsing their updates
# kept the IDL thread, which every OVSDB call waits on, busy.
CHURNING_COLUMNS = {
    "Bridge": {"status"},
    "Open_vSwitch": {"statistics"},
}
# The tables with a row per port replicate only what the agent and ovsdbapp's
# commands read or write: a row keeps every registered column, set or not,
# and the thirty-odd others of an Interface cost 6 MB at a thousand ports.
PORT_COLUMNS = {
    "Interface": {"name", "type", "external_ids", "ofport", "mtu_request"},
    "Port": {"name", "interfaces", "external_ids"},
}


def _replicated_schema(db: str):
    """The Open_vSwitch schema: every table, the port tables' needed columns, no churning ones."""
    helper = idlutils.get_schema_helper(db, "Open_vSwitch")
    for table, spec in helper.schema_json["tables"].items():
        if table in PORT_COLUMNS:
            helper.register_columns(table, sorted(PORT_COLUMNS[table]))
            continue
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


class OvsClient(ProviderBridgeCommands):
    def __init__(self, db: str, integration_bridge: str, host: str, timeout: float = 10.0):
        self.db = db
        self.owner = owner_value(host)
        self.bridge = integration_bridge
        self._timeout = timeout
        self._api: impl_idl.OvsdbIdl | None = None

    def start(self) -> None:
        """Connect; blocks until the first update arrives."""
        try:
            idl = _CountingIdl(self.db, _replicated_schema(self.db))
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

    def system_id(self) -> str:
        """This host's chassis name as ovn-controller registers it ("" if unset)."""
        return self._execute(_SystemId(self.api))

    def datapath_type(self) -> str | None:
        return self._execute(_BridgeDatapath(self.api, self.bridge))

    def observe_port(self, name: str) -> PortState | None:
        return self._execute(_ObservePort(self.api, name))

    def change_count(self) -> int:
        """A number that grows whenever a row of the local copy of the database
        changes: a port observed at one count is the same at the same count."""
        return self.api.idl.change_seqno

    def owned_ports(self) -> dict[str, str]:
        """Interface name -> load balancer id of every port marked as ours."""
        return self._execute(_OwnedPorts(self.api, self.owner))

    def installed_ports(self, among: Collection[str] | None = None) -> set[str]:
        """Our ports on which ovn-controller has installed its flows, now; only
        those named in `among` when given."""
        return self._execute(_InstalledPorts(self.api, self.owner, among))

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
            self._transact_for(
                [(wants[i], f"delete port {wants[i].name}") for i in stale],
                f"delete {len(stale)} ports",
                [_DeletePorts(self.api, [wants[i].name for i in stale])],
                wait_for_vswitchd=True,
            )
            for index in stale:
                observed[index] = None
        plans = [self._port_plan(want, seen) for want, seen in zip(wants, observed)]
        written = [(want, plan[0]) for want, plan in zip(wants, plans) if plan is not None]
        if written:
            self._transact_for(
                written, f"write {len(written)} ports", [cmd for plan in plans if plan is not None for cmd in plan[1]]
            )
        return [
            seen if plan is None else self.observe_port(want.name) for want, seen, plan in zip(wants, observed, plans)
        ]

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
        return self.delete_ports([name], wait_for_vswitchd)[0]

    def delete_ports(self, names: list[str], wait_for_vswitchd: bool = False) -> list[bool]:
        """Delete those of these ports that exist, in one transaction (each one
        is a reconfiguration of the whole bridge); True for each that did."""
        present = [self.observe_port(name) is not None for name in names]
        doomed = [name for name, there in zip(names, present) if there]
        if doomed:
            what = f"delete port {doomed[0]}" if len(doomed) == 1 else f"delete {len(doomed)} ports"
            self._transact(what, _DeletePorts(self.api, doomed), wait_for_vswitchd=wait_for_vswitchd)
        return present

    def _transact(self, what: str, *commands, wait_for_vswitchd: bool = False, count: bool = True) -> None:
        try:
            with self.api.transaction(
                check_error=True, log_errors=False, nested=False, wait_for_vswitchd=wait_for_vswitchd
            ) as txn:
                for cmd in commands:
                    txn.add(cmd)
        except ovsdbapp_exceptions.TimeoutException as exc:
            raise OvsdbUnavailable(f"OVSDB {what}: {exc}") from exc
        except Exception as exc:
            raise OvsdbError(f"OVSDB {what}: {exc}") from exc
        if count:
            count_write("ovsdb", what=what)

    def _transact_for(
        self, changes: list[tuple[PortWant, str]], many: str, commands: list, wait_for_vswitchd: bool = False
    ) -> None:
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
