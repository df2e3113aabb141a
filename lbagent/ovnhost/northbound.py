"""`NorthboundClient`: the agent's one link to the OVN Northbound database.

High availability keeps a lease per load balancer in the `external_ids` of
its logical switch port, and moves the port's binding by its
`options:requested-chassis`. This module owns the connection, reading those
two from the IDL's replica, and writing them as compare-and-swap
transactions. Nothing else of the Northbound database is read or written:
the region controller creates and owns the ports; the agent touches only its
own `lbagent:*` keys and `requested-chassis`, and only with `setkey`/`delkey`
(OVSDB mutations), so a key the region controller writes meanwhile is never
overwritten.

A write names the lease keys it was decided on (`LeaseWrite.expect`): it
applies only if the port still has exactly those (but the keys it says may
move meanwhile, `unchecked`), and, if it has `guards`, only if other ports'
keys still have the values it was decided on; it `verify`s the column of
every row it checked, so the server refuses the transaction when another agent changed it
after our replica saw it (on a clustered Northbound database the leader
orders them). ovsdbapp then runs the commands again on the newer replica,
where the stale write finds its expectation broken and drops out: of two
agents taking the same lease, one wins and the other learns it lost. All
the writes of one tick go in one transaction.

The IDL watches only `Logical_Switch_Port`'s name, options, external_ids and
up, and only the ports it is told to (`watch`: a monitor condition on their
names), not every port of the region: a region's other hosts and its
tenants' own ports would otherwise cost this agent a row each. A port
watched since less than a round trip is `pending` in a read: its row may be
on its way. The replica keeps every port decoded (`PortLease`) and decodes
again only the rows the server changed, as the IDL reports them: a tick
that reads a thousand ports after one heartbeat decodes one. A
reconnection, or a row count that does not match, decodes them all again.
Every call blocks; the caller runs it on its own thread (`BlockingPool`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ovs import poller
from ovs.db import idl as ovs_idl
from ovsdbapp import exceptions as ovsdbapp_exceptions
from ovsdbapp.backend import ovs_idl as ovsdbapp_backend
from ovsdbapp.backend.ovs_idl import command, connection, idlutils, transaction

from lbagent.ovnhost.errors import OvsdbError, OvsdbUnavailable

log = logging.getLogger(__name__)

PORT_TABLE = "Logical_Switch_Port"
# `up`: northd's word that a chassis has the port bound and installed.
WATCHED_COLUMNS = ["name", "options", "external_ids", "up"]
KEY_PREFIX = "lbagent:"
REQUESTED_CHASSIS = "requested-chassis"
# Debian ships the schema with ovn-common's tools; without it the client asks the server.
LOCAL_SCHEMA = "/usr/share/ovn/ovn-nb.ovsschema"


@dataclass(frozen=True)
class PortLease:
    """One logical switch port as the replica shows it: its `lbagent:*` keys and binding."""

    name: str
    keys: dict[str, str] = field(default_factory=dict)
    requested_chassis: str = ""
    up: bool | None = None  # None: northd has not said


@dataclass(frozen=True)
class PortsRead:
    """What a read found: the ports that exist, and those not known yet either way."""

    ports: dict[str, PortLease]
    pending: frozenset[str] = frozenset()  # watched, but the server has not answered the watch yet


@dataclass(frozen=True)
class Guard:
    """A condition on another port: its key `key` still has `value` (None: absent)."""

    port: str
    key: str
    value: str | None


@dataclass(frozen=True)
class LeaseWrite:
    """Set and delete `lbagent:*` keys of one port (and maybe its requested-chassis),
    only if its `lbagent:*` keys other than `unchecked` are still exactly `expect`
    and every guard still holds."""

    port: str
    expect: dict[str, str]
    set_keys: dict[str, str] = field(default_factory=dict)
    delete_keys: tuple[str, ...] = ()
    requested_chassis: str | None = None
    unchecked: tuple[str, ...] = ()
    guards: tuple[Guard, ...] = ()


def _own_keys(row) -> dict[str, str]:
    return {k: v for k, v in row.external_ids.items() if k.startswith(KEY_PREFIX)}


def _condition(names: frozenset[str]) -> list:
    """The monitor condition that matches these ports (python-ovs: [] matches none)."""
    return [["name", "==", name] for name in sorted(names)]


def _decode(row) -> PortLease:
    up = row.up[0] if row.up else None  # an optional boolean: a list of none or one
    return PortLease(row.name, _own_keys(row), row.options.get(REQUESTED_CHASSIS, ""), up)


class _PortIdl(connection.OvsdbIdl):
    """The IDL, keeping its ports decoded: the IDL tells it which rows changed
    (`notify`, on the connection's thread, where every command runs too)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._changed: set = set()  # uuids of rows changed since the last refresh
        self._decoded: dict = {}  # uuid -> PortLease
        self._uuids: dict[str, object] = {}  # port name -> uuid
        self._session_seqno: int | None = None
        self.decodes = 0  # rows decoded so far: what the cache saves shows here
        self._covered_by: object = None
        self._covered: frozenset[str] | None = None

    def notify(self, event, row, updates=None):
        if row._table.name == PORT_TABLE:
            self._changed.add(row.uuid)

    def ports(self) -> dict[str, object]:
        """Port name -> uuid, of every port, up to date with the replica."""
        rows = self.tables[PORT_TABLE].rows
        seqno = self._session.get_seqno()
        # A new session (a reconnection) starts over; so does a count that the
        # changes reported cannot explain (checked after applying them).
        if seqno != self._session_seqno:
            self._session_seqno, self._changed = seqno, set()
            self._decoded = {uuid: _decode(row) for uuid, row in rows.items()}
            self.decodes += len(rows)
        elif self._changed:
            changed, self._changed = self._changed, set()
            for uuid in changed:
                row = rows.get(uuid)
                if row is None:
                    self._decoded.pop(uuid, None)
                else:
                    self._decoded[uuid] = _decode(row)
                    self.decodes += 1
            if len(rows) != len(self._decoded):  # a change the IDL did not report: start over
                self._session_seqno = None
                return self.ports()
        else:
            return self._uuids
        self._uuids = {port.name: uuid for uuid, port in self._decoded.items()}
        return self._uuids

    def covered(self) -> frozenset[str] | None:
        """The names of the condition the server has answered (None: every port):
        their rows, those that exist, are in the replica."""
        acked = self.tables[PORT_TABLE].condition_state.acked
        if acked is not self._covered_by:
            self._covered_by = acked
            everything = acked == [True]
            self._covered = None if everything else frozenset(c[2] for c in acked if isinstance(c, list))
        return self._covered

    def port(self, name: str) -> PortLease | None:
        uuid = self.ports().get(name)
        return self._decoded.get(uuid) if uuid is not None else None

    def row(self, name: str):
        uuid = self.ports().get(name)
        return self.tables[PORT_TABLE].rows.get(uuid) if uuid is not None else None


class _ReadPorts(command.ReadOnlyCommand):
    def __init__(self, api, names: Iterable[str]):
        super().__init__(api)
        self.names = list(names)

    def run_idl(self, txn):
        idl = self.api.idl
        if idl.state != idl.IDL_S_MONITORING:
            # Reconnecting: the condition counts as answered before the server's
            # new copy of the rows is in, so no port can be told absent yet.
            self.result = PortsRead({}, frozenset(self.names))
            return
        covered = idl.covered()
        found, pending = {}, set()
        for name in self.names:
            if covered is not None and name not in covered:
                pending.add(name)
                continue
            port = idl.port(name)
            if port is not None:
                found[name] = port
        self.result = PortsRead(found, frozenset(pending))


class _Watch(command.BaseCommand):
    """Changes the monitor condition. A transaction (that writes nothing) and
    not a read: it runs on the IDL's thread, whose loop then sends the change."""

    def __init__(self, api, names: frozenset[str]):
        super().__init__(api)
        self.names = names

    def run_idl(self, txn):
        self.api.idl.cond_change(PORT_TABLE, _condition(self.names))


class _WriteLeases(command.BaseCommand):
    def __init__(self, api, writes: list[LeaseWrite]):
        super().__init__(api)
        self.writes = writes

    def run_idl(self, txn):
        # Run again on every TRY_AGAIN, on the newer replica: each write is decided anew.
        applied = []
        for write in self.writes:
            row = self._checked(write)
            if row is None:
                applied.append(False)
                continue
            for key, value in write.set_keys.items():
                row.setkey("external_ids", key, value)
            for key in write.delete_keys:
                row.delkey("external_ids", key)
            if write.requested_chassis is not None:
                row.setkey("options", REQUESTED_CHASSIS, write.requested_chassis)
            applied.append(True)
        self.result = applied

    def _checked(self, write: LeaseWrite):
        """The write's row if its expectation and guards hold, all rows involved verified."""
        idl = self.api.idl
        row = idl.row(write.port)
        if row is None:
            return None
        if {k: v for k, v in _own_keys(row).items() if k not in write.unchecked} != write.expect:
            return None
        guarded = []
        for guard in write.guards:
            other = idl.row(guard.port)
            if other is None or other.external_ids.get(guard.key) != guard.value:
                return None
            guarded.append(other)
        for checked in (row, *guarded):
            checked.verify("external_ids")
        return row


class _Probe(command.BaseCommand):
    """A `select` that matches no port (nothing is written, nothing read
    into the replica), to learn whether the server answers: sent even when
    the replica holds no row to fetch, which python-ovs would not send."""

    def run_idl(self, txn):
        txn.add_op({"op": "select", "table": PORT_TABLE, "where": [["name", "==", ""]], "columns": ["name"]})
        self.result = True


class _BoundedTransaction(transaction.Transaction):
    """ovsdbapp's transaction with every wait bounded by its timeout.

    ovsdbapp's own, when the server stops answering (a partition), waits in
    `commit_block` until the session is found dead, and then, its time being
    up, for a reconnection without any limit, all the while holding the
    connection's lock: every read of the replica, and so the host's answer
    that it is out of contact, waited for the Northbound database to come
    back. A transaction given up here may still commit on the server: the
    lease rules read the outcome back from the replica, never from here.
    """

    def do_commit(self):
        deadline = time.monotonic() + self.timeout
        idl = self.api.idl
        while True:
            seqno = idl.change_seqno
            txn = ovs_idl.Transaction(idl)
            for cmd in self.commands:
                try:
                    cmd.run_idl(txn)
                except Exception:
                    txn.abort()
                    raise
            status = _commit_until(txn, deadline)
            if status == txn.TRY_AGAIN:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"no answer within {self.timeout:g}s")
                idlutils.wait_for_change(idl, remaining, seqno)  # a TimeoutException when it runs out
                continue
            if status in (txn.ERROR, txn.NOT_LOCKED, txn.ABORTED):
                raise RuntimeError(f"OVSDB error: {txn.get_error() or status}")
            return [cmd.result for cmd in self.commands]


def _commit_until(txn: ovs_idl.Transaction, deadline: float) -> str:
    """`txn.commit_block()` that gives up (TRY_AGAIN, the transaction aborted) at `deadline`."""
    status = txn.commit()
    while status == txn.INCOMPLETE:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            txn.abort()
            return txn.TRY_AGAIN
        txn.idl.run()
        waiter = poller.Poller()
        txn.idl.wait(waiter)
        txn.wait(waiter)
        waiter.timer_wait(int(remaining * 1000) + 1)
        waiter.block()
        status = txn.commit()
    return status


class _NbApi(ovsdbapp_backend.Backend):
    """Transactions and lookups over one Northbound IDL. ovsdbapp keeps the
    connection in a class attribute; `_api_class` gives each client a class of
    its own, so two clients in one process (tests) do not share one."""

    def create_transaction(self, check_error=False, log_errors=True, **kwargs):
        return _BoundedTransaction(self, self.ovsdb_connection, self.ovsdb_connection.timeout, check_error, log_errors)


def _api_class() -> type[_NbApi]:
    return type("NbApi", (_NbApi,), {"_ovsdb_connection": None})


def _schema_helper(remote: str) -> ovs_idl.SchemaHelper:
    if os.path.exists(LOCAL_SCHEMA):
        helper = ovs_idl.SchemaHelper(location=LOCAL_SCHEMA)
    else:
        helper = idlutils.get_schema_helper(remote, "OVN_Northbound")
    helper.register_columns(PORT_TABLE, WATCHED_COLUMNS)
    return helper


class NorthboundClient:
    def __init__(self, remote: str, timeout: float):
        self.remote = remote
        self._timeout = timeout  # seconds one read or transaction may take
        self._api: _NbApi | None = None
        self._conn: connection.Connection | None = None
        self._watched: frozenset[str] = frozenset()

    def connect(self) -> None:
        """Connect and wait for the first copy of the ports; OvsdbUnavailable if
        the server does not answer within the timeout (call again to retry)."""
        if self._api is not None:
            return
        try:
            if self._conn is None:
                # Probes every two timeouts: a server that stopped answering is
                # noticed within four (python-ovs would wait 10 s).
                probe_ms = max(1000, int(self._timeout * 2000))
                idl = _PortIdl(self.remote, _schema_helper(self.remote), probe_interval=probe_ms)
                # Before the first monitor request, which then asks for these ports alone.
                idl.cond_change(PORT_TABLE, _condition(self._watched))
                self._conn = connection.Connection(idl=idl, timeout=self._timeout)
            self._api = _api_class()(self._conn, start=True)
        except Exception as exc:  # ovsdbapp raises bare Exceptions on connect failures
            raise OvsdbUnavailable(f"cannot reach the OVN Northbound database at {self.remote}: {exc}") from exc
        self.watch(self._watched)  # what was asked for while a first connect was under way

    def connected(self) -> bool:
        """Whether the IDL holds a live session now (its replica is then current)."""
        if self._conn is None or self._api is None:
            return False
        idl = self._conn.idl
        # python-ovs has no public accessor; the state says the monitor's reply is in.
        return idl._session.is_connected() and idl.state == idl.IDL_S_MONITORING

    def generation(self) -> tuple[int, int]:
        """Numbers that change whenever the replica or what it watches does
        ((-1, -1) before a connection): a read of the same ports at the same
        generation would find the same."""
        if self._conn is None:
            return (-1, -1)
        return (self._conn.idl.change_seqno, self._conn.idl.cond_seqno)

    def decoded_rows(self) -> int:
        """How many rows the replica has decoded since it was made (0 before a connection)."""
        return self._conn.idl.decodes if self._conn is not None else 0

    def close(self) -> None:
        if self._conn is not None:
            self._conn.stop(timeout=self._timeout)
        self._api = self._conn = None

    def _require(self) -> _NbApi:
        if self._api is None:
            raise OvsdbUnavailable(f"not connected to the OVN Northbound database at {self.remote}")
        return self._api

    def watch(self, names: Iterable[str]) -> None:
        """Replicate these logical switch ports, and no others, from now on
        (kept across reconnections; before a connection, for the first one)."""
        self._watched = frozenset(names)
        if self._api is not None:
            self._run(_Watch(self._api, self._watched))

    def read(self, names: Iterable[str]) -> PortsRead:
        """Those of these logical switch ports that exist, as the replica shows
        them now, and those whose watch the server has not answered yet."""
        return _ReadPorts(self._require(), names).execute(check_error=True, log_errors=False)

    def ports(self, names: Iterable[str]) -> dict[str, PortLease]:
        """Those of these logical switch ports that exist, as the replica shows them now."""
        return self.read(names).ports

    def commit(self, writes: list[LeaseWrite]) -> list[bool]:
        """Apply `writes` in one transaction; for each, whether it applied (False:
        its port changed or went away meanwhile)."""
        if not writes:
            return []
        return list(self._run(_WriteLeases(self._require(), writes)))

    def probe(self) -> None:
        """Returns once the server has answered a transaction that writes nothing;
        OvsdbUnavailable if it does not within the timeout."""
        self._run(_Probe(self._require()))

    def _run(self, cmd: command.BaseCommand):
        api = self._require()
        txn = api.create_transaction(check_error=True, log_errors=False)
        txn.add(cmd)
        try:
            txn.commit()
        except ovsdbapp_exceptions.TimeoutException as exc:
            raise OvsdbUnavailable(f"OVN Northbound lease transaction: {exc}") from exc
        except RuntimeError as exc:  # ovsdbapp's "OVS transaction timed out" after TRY_AGAINs
            raise OvsdbUnavailable(f"OVN Northbound lease transaction: {exc}") from exc
        except Exception as exc:
            raise OvsdbError(f"OVN Northbound lease transaction: {exc}") from exc
        return cmd.result
