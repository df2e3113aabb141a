"""NorthboundClient against a real, raft-clustered OVN Northbound ovsdb-server.

The server is this test's own (its files under tmp_path, stopped by pid);
it needs no OVS and no sandbox lock.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path

import pytest

from devtools.procs import pid_alive, run, stop_pid, wait_for
from lbagent.ovnhost.errors import OvsdbUnavailable
from lbagent.ovnhost.northbound import Guard, LeaseWrite, NorthboundClient

SCHEMA = "/usr/share/ovn/ovn-nb.ovsschema"
PORT = "iface/lb/nb-test"


class Northbound:
    def __init__(self, base: Path):
        self.base = base
        self.db = base / "nb.db"
        self.sock = base / "nb.sock"
        self.pidfile = base / "nb.pid"
        self.remote = f"unix:{self.sock}"

    def create(self) -> None:
        run("ovsdb-tool", "create-cluster", self.db, SCHEMA, f"unix:{self.base}/raft.sock")

    def start(self) -> None:
        run(
            "ovsdb-server",
            self.db,
            f"--remote=punix:{self.sock}",
            "--detach",
            "--no-chdir",
            f"--pidfile={self.pidfile}",
            f"--log-file={self.base}/nb.log",
            f"--unixctl={self.base}/nb.ctl",
        )
        wait_for(lambda: "leader" in self.cluster_status(), 10, "the one-member cluster to elect itself")

    def cluster_status(self) -> str:
        return run("ovs-appctl", "-t", self.base / "nb.ctl", "cluster/status", "OVN_Northbound", check=False)

    def stop(self) -> None:
        if self.pidfile.exists():
            pid = int(self.pidfile.read_text())
            if pid_alive(pid):
                stop_pid(pid, expect=str(self.pidfile), what="ovsdb-server")

    def nbctl(self, *args: str) -> str:
        return run("ovn-nbctl", f"--db={self.remote}", *args)


@pytest.fixture
def northbound(tmp_path):
    if not Path(SCHEMA).exists():
        pytest.fail(f"{SCHEMA} is missing: install ovn-central (make deps does)")
    nb = Northbound(tmp_path)
    nb.create()
    nb.start()
    nb.nbctl("ls-add", "nb-test", "--", "lsp-add", "nb-test", PORT)
    nb.nbctl("set", "Logical_Switch_Port", PORT, "external_ids:owner=region")
    clients: list[NorthboundClient] = []

    def client(*watched: str) -> NorthboundClient:
        made = NorthboundClient(nb.remote, timeout=3.0)
        made.watch(watched or [PORT])  # before connecting: the first copy holds them alone
        made.connect()
        clients.append(made)
        return made

    nb.client = client
    try:
        yield nb
    finally:
        for made in clients:
            made.close()
        nb.stop()


def external_ids(nb: Northbound) -> str:
    return nb.nbctl("get", "Logical_Switch_Port", PORT, "external_ids")


def test_a_write_touches_only_its_keys_and_requested_chassis(northbound):
    client = northbound.client()
    assert client.connected()
    assert client.ports([PORT, "iface/lb/none"])[PORT].keys == {}
    before = client.generation()
    assert client.commit([LeaseWrite(PORT, {}, {"lbagent:term": "1", "lbagent:holder": "gw-1"}, (), "ch-1")]) == [True]
    assert "owner=region" in external_ids(northbound)  # the region controller's key stays
    assert northbound.nbctl("get", "Logical_Switch_Port", PORT, "options:requested-chassis").strip() == "ch-1"
    wait_for(lambda: client.ports([PORT])[PORT].requested_chassis == "ch-1", 5, "the replica to catch up")
    assert client.generation() > before  # the replica changed, and says so
    keys = client.ports([PORT])[PORT].keys
    assert client.commit([LeaseWrite(PORT, keys, {}, ("lbagent:holder",))]) == [True]
    assert "lbagent:holder" not in external_ids(northbound)


def take_at_once(clients: dict[str, NorthboundClient], seen: dict[str, str], term: int) -> dict[str, list[bool]]:
    """Every client commits its take of the lease decided on `seen`, released together."""
    outcomes: dict[str, list[bool]] = {}
    start = threading.Barrier(len(clients))

    def take(name: str, client: NorthboundClient) -> None:
        start.wait()
        new = {"lbagent:term": str(term), "lbagent:holder": name}
        outcomes[name] = client.commit([LeaseWrite(PORT, dict(seen), new, (), f"ch-{name}")])

    threads = [threading.Thread(target=take, args=item) for item in clients.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return outcomes


def holder_in(client: NorthboundClient) -> str | None:
    return client.ports([PORT])[PORT].keys.get("lbagent:holder")


def test_of_two_hosts_taking_one_lease_at_once_exactly_one_wins(northbound):
    """Both decide on the same view; the server orders the two verified writes."""
    clients = {"gw-1": northbound.client(), "gw-2": northbound.client()}
    for term in range(1, 21):
        seen = clients["gw-1"].ports([PORT])[PORT].keys
        wait_for(lambda: clients["gw-2"].ports([PORT])[PORT].keys == seen, 5, "both replicas to agree")  # noqa: B023
        outcomes = take_at_once(clients, seen, term)
        assert sorted(outcomes.values()) == [[False], [True]], outcomes
        winner = next(name for name, won in outcomes.items() if won == [True])
        assert f"lbagent:holder={winner}" in external_ids(northbound).replace('"', "")
        wait_for(lambda: holder_in(clients["gw-1"]) == winner, 5, "the replica")  # noqa: B023


def test_a_lost_server_is_unavailable_and_a_restarted_one_reconnects(northbound):
    client = northbound.client()
    client.probe()  # answered: returns
    northbound.stop()
    wait_for(lambda: not client.connected(), 10, "the client to notice the server is gone")
    with pytest.raises(OvsdbUnavailable):
        client.commit([LeaseWrite(PORT, {}, {"lbagent:term": "1"})])
    with pytest.raises(OvsdbUnavailable):
        client.probe()
    northbound.start()
    wait_for(client.connected, 30, "the client to reconnect")
    client.probe()
    keys = client.ports([PORT])[PORT].keys
    assert client.commit([LeaseWrite(PORT, keys, {"lbagent:term": "9"})]) == [True]


def test_a_guarded_write_applies_only_while_the_other_port_still_has_the_beat_it_was_decided_on(northbound):
    """A takeover decided on silence checks the holder's beacon in the same transaction."""
    beacon = "iface/lb/nb-test-beacon"
    northbound.nbctl("lsp-add", "nb-test", beacon)
    holder, standby = northbound.client(PORT, beacon), northbound.client(PORT, beacon)
    assert holder.commit([LeaseWrite(PORT, {}, {"lbagent:term": "1", "lbagent:holder": "gw-1"})]) == [True]
    assert holder.commit([LeaseWrite(beacon, {}, {"lbagent:beat": "1"})]) == [True]
    wait_for(lambda: standby.ports([beacon]).get(beacon, None) is not None, 5, "the standby's replica")
    wait_for(lambda: standby.ports([beacon])[beacon].keys.get("lbagent:beat") == "1", 5, "the standby to see the beat")
    seen = standby.ports([PORT])[PORT].keys
    take = LeaseWrite(
        PORT, seen, {"lbagent:term": "2", "lbagent:holder": "gw-2"}, guards=(Guard(beacon, "lbagent:beat", "1"),)
    )
    # The holder beats after the standby decided: the takeover must not apply.
    assert holder.commit([LeaseWrite(beacon, {}, {"lbagent:beat": "2"}, unchecked=("lbagent:beat",))]) == [True]
    assert standby.commit([take]) == [False]
    assert "lbagent:holder=gw-1" in external_ids(northbound).replace('"', "")
    wait_for(lambda: standby.ports([beacon])[beacon].keys.get("lbagent:beat") == "2", 5, "the standby to see it")
    heard = (Guard(beacon, "lbagent:beat", "2"),)
    assert standby.commit([LeaseWrite(PORT, seen, {"lbagent:term": "2"}, guards=heard)]) == [True]
    assert standby.commit([LeaseWrite(PORT, seen, {}, guards=(Guard("iface/lb/none", "lbagent:beat", None),))]) == [
        False
    ]  # its keys moved, and a guard on a missing port never holds


def nb_ports(nb: Northbound, prefix: str) -> dict[str, dict[str, str]]:
    """The lbagent keys of the ports named `prefix*`, as the server has them."""
    listed = json.loads(nb.nbctl("--format=json", "--columns=name,external_ids", "list", "Logical_Switch_Port"))
    return {
        name: {k: v for k, v in ids[1] if k.startswith("lbagent:")}
        for name, ids in listed["data"]
        if name.startswith(prefix)
    }


def test_the_replica_follows_ports_made_changed_and_deleted_and_decodes_only_what_changed(northbound):
    prefix = "iface/lb/nb-follow-"
    names = [f"{prefix}{i:02d}" for i in range(40)]
    northbound.nbctl(*[arg for name in names for arg in ("--", "lsp-add", "nb-test", name)])
    other = "iface/lb/nb-other-added"
    client = northbound.client(*names, f"{prefix}new", other)

    def follows() -> bool:
        mine = {name: port.keys for name, port in client.ports([*names, f"{prefix}new"]).items()}
        return mine == nb_ports(northbound, prefix)

    wait_for(follows, 10, "the replica to have the new ports")
    decoded = client.decoded_rows()
    northbound.nbctl("set", "Logical_Switch_Port", names[3], 'external_ids:"lbagent:beat"="7"')
    wait_for(follows, 10, "the replica to follow a change")
    assert client.ports([names[3]])[names[3]].keys == {"lbagent:beat": "7"}
    assert client.decoded_rows() - decoded <= 2  # one row changed: one decoded, not forty
    # Made alone: the count changes, and still only it is decoded.
    decoded = client.decoded_rows()
    northbound.nbctl("lsp-add", "nb-test", other)
    wait_for(lambda: other in client.ports([other]), 10, "the replica to have a port made alone")
    assert client.decoded_rows() - decoded <= 2
    northbound.nbctl("lsp-del", names[4], "--", "lsp-add", "nb-test", f"{prefix}new")
    wait_for(follows, 10, "the replica to follow a port deleted and one made")
    assert names[4] not in client.ports(names)
    northbound.stop()
    wait_for(lambda: not client.connected(), 10, "the client to notice the server is gone")
    northbound.start()
    wait_for(client.connected, 30, "the client to reconnect")
    northbound.nbctl(
        "set", "Logical_Switch_Port", names[5], 'external_ids:"lbagent:term"="2"', "--", "lsp-del", names[6]
    )
    wait_for(follows, 10, "the replica to follow changes after a reconnection")
    assert client.ports([names[5]])[names[5]].keys == {"lbagent:term": "2"}


def test_an_unreachable_server_is_unavailable_at_connect(tmp_path):
    client = NorthboundClient(f"unix:{tmp_path}/nobody.sock", timeout=0.5)
    with pytest.raises(OvsdbUnavailable, match="cannot reach"):
        client.connect()
    assert not client.connected()
    with pytest.raises(OvsdbUnavailable):
        client.ports([PORT])
    client.close()


def test_the_replica_holds_the_watched_ports_alone(northbound):
    """A region's other ports (other hosts', tenants') cost this agent nothing."""
    others = [f"iface/lb/nb-region-{i:02d}" for i in range(30)]
    northbound.nbctl(*[arg for name in others for arg in ("--", "lsp-add", "nb-test", name)])
    client = northbound.client()

    read = client.read([PORT, others[0]])
    assert set(read.ports) == {PORT} and read.pending == {others[0]}  # unwatched: not known either way
    assert client.decoded_rows() == 1

    client.watch([PORT, others[0], "iface/lb/nb-none"])
    wait_for(lambda: others[0] in client.ports([others[0]]), 10, "the watched port's row")
    read = client.read([PORT, others[0], "iface/lb/nb-none", others[1]])
    assert set(read.ports) == {PORT, others[0]} and read.pending == {others[1]}  # nb-none: watched, absent
    assert client.decoded_rows() == 2

    client.watch([others[0]])
    wait_for(lambda: client.read([PORT]).pending == {PORT}, 10, "the unwatched port to go")
    northbound.stop()
    wait_for(lambda: not client.connected(), 10, "the client to notice the server is gone")
    northbound.start()
    wait_for(client.connected, 30, "the client to reconnect")
    wait_for(lambda: others[0] in client.ports([others[0]]), 10, "the watched port after the reconnection")
    assert client.read([PORT, others[1]]).pending == {PORT, others[1]}  # the watch outlived the session
    decoded = client.decoded_rows()
    northbound.nbctl("set", "Logical_Switch_Port", others[1], 'external_ids:"lbagent:beat"="1"')
    northbound.nbctl("set", "Logical_Switch_Port", others[0], 'external_ids:"lbagent:beat"="1"')
    wait_for(lambda: client.ports([others[0]])[others[0]].keys == {"lbagent:beat": "1"}, 10, "the change")
    assert client.decoded_rows() - decoded == 1  # the unwatched port's change never came


def test_a_probe_with_no_port_in_the_replica_still_asks_the_server(northbound):
    """A host whose watched ports do not exist yet has an empty replica: its probe
    must still reach the server, or a silent server would pass for one that answers."""
    client = northbound.client("iface/lb/nb-not-made-yet")
    assert client.ports(["iface/lb/nb-not-made-yet"]) == {}
    client.probe()
    pid = int(northbound.pidfile.read_text())
    os.kill(pid, signal.SIGSTOP)  # a partition the session has not noticed yet
    try:
        with pytest.raises(OvsdbUnavailable):
            client.probe()
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: client.connected() and client.probe() is None, 30, "the server to answer again")
