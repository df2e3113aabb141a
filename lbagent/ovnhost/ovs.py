"""The agent's view of Open vSwitch: integration-bridge ports of load balancers.

One ovsdbapp IDL connection (its own thread) per agent. Reads are served from
the IDL's in-memory replica; writes are single transactions. Every call here
is blocking and is run off the event loop by the caller; each transaction is
started with `nested=False` because ovsdbapp keys nesting by thread id.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ovsdbapp.backend.ovs_idl import command, connection, idlutils
from ovsdbapp.schema.open_vswitch import impl_idl

from lbagent.counters import count_write
from lbagent.ovnhost.errors import OvsdbError

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


class _ObservePort(command.ReadOnlyCommand):
    def __init__(self, api, name: str):
        super().__init__(api)
        self.name = name

    def run_idl(self, txn):
        port = idlutils.row_by_value(self.api.idl, "Port", "name", self.name, None)
        if port is None:
            self.result = None
            return
        bridge = next((br.name for br in self.api.tables["Bridge"].rows.values() if port in br.ports), None)
        iface = next((i for i in port.interfaces if i.name == self.name), None)
        ofport = iface.ofport[0] if iface is not None and iface.ofport else None
        self.result = PortState(bridge, dict(iface.external_ids) if iface is not None else {}, ofport)


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


class _BridgeDatapath(command.ReadOnlyCommand):
    def __init__(self, api, bridge: str):
        super().__init__(api)
        self.bridge = bridge

    def run_idl(self, txn):
        br = idlutils.row_by_value(self.api.idl, "Bridge", "name", self.bridge, None)
        self.result = None if br is None else (br.datapath_type or "system")


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
            idl = connection.OvsdbIdl.from_server(self.db, "Open_vSwitch")
            conn = connection.Connection(idl=idl, timeout=self._timeout)
            self._api = impl_idl.OvsdbIdl(conn, start=True)
        except Exception as exc:  # ovsdbapp raises bare Exceptions on connect failures
            raise OvsdbError(f"cannot connect to OVSDB at {self.db}: {exc}") from exc

    def stop(self) -> None:
        if self._api is not None:
            self._api.ovsdb_connection.stop()
            self._api = None

    @property
    def api(self) -> impl_idl.OvsdbIdl:
        if self._api is None:
            raise OvsdbError("not connected to OVSDB")
        return self._api

    def _execute(self, cmd):
        try:
            return cmd.execute(check_error=True, log_errors=False)
        except Exception as exc:
            raise OvsdbError(f"OVSDB {type(cmd).__name__}: {exc}") from exc

    def datapath_type(self) -> str | None:
        return self._execute(_BridgeDatapath(self.api, self.bridge))

    def observe_port(self, name: str) -> PortState | None:
        return self._execute(_ObservePort(self.api, name))

    def owned_ports(self) -> dict[str, str]:
        """Interface name -> load balancer id of every port marked as ours."""
        return self._execute(_OwnedPorts(self.api, self.owner))

    def ensure_port(self, name: str, external_ids: dict[str, str], observed: PortState | None,
                    reattach: bool = False) -> bool:
        """Make `name` a port of the integration bridge with these external_ids.

        Creation and external_ids go in one transaction (add_port's attrs apply
        only on creation, so external_ids is a separate db_set within it).
        With `reattach`, an existing port is removed first, in a transaction of
        its own, so that ovs-vswitchd opens the device anew.
        Returns True if anything was written.
        """
        if reattach and observed is not None:
            self.delete_port(name)
            observed = None
        wanted = {**external_ids, OWNER_KEY: self.owner}
        on_bridge = observed.on_bridge if observed else None
        ids_ok = observed is not None and all(observed.external_ids.get(k) == v for k, v in wanted.items())
        if on_bridge == self.bridge and ids_ok:
            return False
        try:
            with self.api.transaction(check_error=True, log_errors=False, nested=False) as txn:
                if on_bridge is not None and on_bridge != self.bridge:
                    txn.add(self.api.del_port(name, bridge=on_bridge, if_exists=True))
                if on_bridge != self.bridge:
                    txn.add(self.api.add_port(self.bridge, name, may_exist=True))
                txn.add(self.api.db_set("Interface", name, ("external_ids", wanted)))
        except Exception as exc:
            raise OvsdbError(f"OVSDB add port {name}: {exc}") from exc
        count_write("ovsdb")
        return True

    def delete_port(self, name: str) -> bool:
        if self.observe_port(name) is None:
            return False
        try:
            with self.api.transaction(check_error=True, log_errors=False, nested=False) as txn:
                txn.add(self.api.del_port(name, if_exists=True))
        except Exception as exc:
            raise OvsdbError(f"OVSDB delete port {name}: {exc}") from exc
        count_write("ovsdb")
        return True
