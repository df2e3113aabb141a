"""Never lose traffic, never leak: restart adoption, drift repair, faults,
garbage collection, shutdown and cleanup, on real OVS/OVN/haproxy/iptables."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import threading

import psutil
import pytest

from agentproc import wait_until
from helpers import VIP, host_state, netns_routes, wait_bound, web_lb
from lbstate import backend, desired, loadbalancer, tcp_listener

URL = f"http://{VIP}:80/"


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def serving(client) -> bool:
    try:
        return client.curl(URL, timeout=2).strip() in {"backend-a", "backend-b"}
    except Exception:
        return False


class TrafficLoop:
    """Requests against the VIP from the client in a loop, counting failures."""

    def __init__(self, client):
        self.client = client
        self.ok = self.failed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                assert self.client.curl(URL, timeout=5).strip() in {"backend-a", "backend-b"}
                self.ok += 1
            except Exception as exc:  # counted, reported by the test
                self.failed += 1
                self.errors.append(str(exc)[-200:])

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)


def converged_web(agent_factory, web, **kw):
    lb_id, client = web
    agent = agent_factory(**kw)
    assert agent.refresh(desired(1, web_lb(lb_id)))[0] == 200
    return lb_id, client, agent, wait_bound(agent, lb_id)


DRIFT = {
    "deleted veth": lambda s: sh("ip", "link", "del", s["interfaces"]["haproxy"][1]),
    "deleted OVN-side veth": lambda s: sh("ip", "link", "del", s["interfaces"]["ovn"][1]),
    "flushed rules": lambda s: sh(
        "ip", "netns", "exec", s["netns"], "iptables-legacy", "-t", "nat", "-F", "LBAGENT-PRE"
    ),
    "edited rule": lambda s: sh(
        "ip", "netns", "exec", s["netns"], "iptables-legacy", "-t", "nat", "-R", "LBAGENT-POST", "1", "-j", "ACCEPT"
    ),
    "removed address": lambda s: sh(
        "ip", "netns", "exec", s["netns"], "ip", "addr", "flush", "dev", s["interfaces"]["ovn"][0]
    ),
    "changed route": lambda s: sh(
        "ip", "netns", "exec", s["netns"], "ip", "route", "replace", "default", "via", "198.18.0.254"
    ),
    "deleted namespace": lambda s: sh("ip", "netns", "del", s["netns"]),
}
# Drift that traffic from an on-link client would not notice (a wrong default
# route): checked in the namespace itself too, besides the off-link client.
REPAIRED = {
    "changed route": lambda s: (
        "default via 198.18.0.1 " in (routes := netns_routes(s["netns"])) and "198.18.0.254" not in routes
    ),
}


def test_drift_is_repaired_within_an_interval(agent_factory, vpc, web, sandbox):
    lb_id, client, agent, status = converged_web(agent_factory, web, resync_interval=1.0)
    # A client off-link, behind the VPC's router: its answers need the
    # namespace's default route via the gateway, which an on-link client's don't.
    far = vpc.add_host("far", "198.18.1.31", subnet=vpc.add_subnet("198.18.1.0/24", "198.18.1.1"))
    assert serving(client)
    wait_until(lambda: serving(far), 10, "the off-link client served")
    port = status["ovs_port"]
    ovs_drift = {
        "removed OVS port": lambda s: sandbox.vsctl("del-port", "br-int", port),
        "removed iface-id": lambda s: sandbox.vsctl("remove", "Interface", port, "external_ids", "iface-id"),
    }
    for what, make_drift in {**DRIFT, **ovs_drift}.items():
        make_drift(status)
        # One interval is 1 s ± 20 %; allow for a pass already under way.
        wait_until(lambda: serving(client) and serving(far), 8, f"traffic back after: {what}")
        repaired = REPAIRED.get(what)
        if repaired is not None:
            wait_until(functools.partial(repaired, status), 8, f"repaired in the namespace: {what}")
        # Traffic may flow a moment before ovn-controller marks the port installed again.
        after = wait_until(lambda: (lb := agent.lb(lb_id))["state"] == "ready" and lb, 8, f"ready after: {what}")
        assert (after["inner"], after["outer"]) == (status["inner"], status["outer"]), what
    ids = json.loads(sandbox.vsctl("--format=json", "--columns=external_ids", "list", "Interface", port))
    assert f"iface/lb/{lb_id}" in json.dumps(ids)
    nat = sh("ip", "netns", "exec", status["netns"], "iptables-legacy-save", "-t", "nat")
    assert "-j ACCEPT" not in nat and f"--to-source {VIP}" in nat


def test_a_converged_resync_only_looks_and_still_sees_every_kind_of_drift(agent_factory, web):
    """A resync of a converged load balancer reads its data path at once and,
    finding it as a whole pass left it, writes and reloads nothing; drift the
    kernel does not announce (an address, a rule, a host end's MTU, the
    configuration on disk) still makes the whole pass that repairs it."""
    lb_id, client, agent, status = converged_web(agent_factory, web, resync_interval=1.0)
    checks = agent.resync_checks()
    wait_until(lambda: agent.resync_checks()["unchanged"] >= checks["unchanged"] + 3, 20, "resyncs that only look")
    quiet = agent.status()["agent"]
    passes = agent.lb(lb_id)["passes"]
    wait_until(lambda: agent.lb(lb_id)["passes"] >= passes + 3, 20, "three more resyncs")
    after = agent.status()["agent"]
    assert after["writes"] == quiet["writes"] and after["haproxy"]["reloads"] == quiet["haproxy"]["reloads"]

    conf = agent.run_dir / "haproxy" / "conf.d" / f"{lb_id}.cfg"
    wanted_conf = conf.read_text()
    host_end = status["interfaces"]["ovn"][1]
    drift = {
        "removed address": (DRIFT["removed address"], lambda: serving(client)),
        "edited rule": (DRIFT["edited rule"], lambda: "-j ACCEPT" not in nat_rules(status)),
        "host end MTU": (
            lambda s: sh("ip", "link", "set", host_end, "mtu", "1300"),
            lambda: " mtu 1300 " not in sh("ip", "link", "show", host_end),
        ),
        "configuration edited on disk": (
            lambda s: conf.write_text(wanted_conf + "# edited\n"),
            lambda: conf.read_text() == wanted_conf,
        ),
    }
    for what, (make_drift, repaired) in drift.items():
        changed = agent.resync_checks()["changed"]
        make_drift(status)
        wait_until(repaired, 10, f"repaired: {what}")
        assert agent.resync_checks()["changed"] > changed, what
        wait_until(lambda: serving(client), 10, f"serving after: {what}")


def nat_rules(status) -> str:
    return sh("ip", "netns", "exec", status["netns"], "iptables-legacy-save", "-t", "nat")


def test_a_deleted_veth_is_rebuilt_at_once_not_at_the_next_resync(agent_factory, web):
    """The host announces link deletions: the pass comes on that, with no resync due for an hour."""
    lb_id, client, agent, status = converged_web(agent_factory, web, resync_interval=3600.0)
    passes = agent.lb(lb_id)["passes"]
    for what in ("deleted veth", "deleted OVN-side veth"):
        DRIFT[what](status)
        wait_until(lambda: serving(client), 20, f"traffic back after: {what}")
        wait_until(lambda: agent.lb(lb_id)["state"] == "ready", 20, f"ready after: {what}")
    assert agent.lb(lb_id)["passes"] > passes
    assert "reason=link_deleted" in agent.log()


def test_restart_mid_refresh_adopts_everything_and_drops_nothing(agent_factory, vpc, web):
    lb_id, client, agent, status = converged_web(agent_factory, web)
    before = agent.lb(lb_id)
    many = []
    for index in range(50):
        many_id, ip, mac = f"{lb_id}-{index}", f"198.18.0.{100 + index}", f"00:22:0a:00:01:{index:02x}"
        vpc.add_lb_port(many_id, mac, ip)  # ready means ovn-installed: each needs its port
        many.append(loadbalancer(many_id, ip, mac, [tcp_listener("l", 80)], {"bg-1": [backend("be", "198.18.0.21")]}))
    with TrafficLoop(client) as loop:
        wait_until(lambda: loop.ok >= 5, 20, "traffic flowing")
        code, body = agent.refresh(desired(2, web_lb(lb_id), *many), wait=None)
        assert code == 202, body
        wait_until(
            lambda: sum(lb["state"] == "ready" for lb in agent.status()["loadbalancers"]) >= 5,
            60,
            "some of the new load balancers to converge",
        )
        agent.stop(signal.SIGKILL)
        ok_while_down = loop.ok
        wait_until(lambda: loop.ok >= ok_while_down + 5, 20, "traffic while the agent is down")
        agent.start()
        wait_until(
            lambda: (
                all(lb["state"] == "ready" for lb in agent.status()["loadbalancers"])
                and len(agent.status()["loadbalancers"]) == 51
            ),
            120,
            "all 51 load balancers ready",
        )
        wait_until(lambda: loop.ok >= ok_while_down + 20, 30, "traffic after the restart")
    assert loop.failed == 0, loop.errors[:5]
    after = agent.lb(lb_id)
    for key in ("inner", "outer", "interfaces", "ovs_port"):
        assert after[key] == before[key], key
    assert [b["mapped_port"] for b in after["backends"]] == [b["mapped_port"] for b in before["backends"]]
    pairs = {(lb["inner"], lb["outer"]) for lb in agent.status()["loadbalancers"]}
    assert len(pairs) == 51


def test_orphans_survive_until_the_desired_state_is_complete(agent_factory, vpc, prefix, sandbox):
    # A load balancer from a previous life: its namespace and an OVS port of ours.
    stale_ns = f"lb-{prefix}-old"
    tag = "0badc0de"
    host = f"{prefix}-gw0"  # the host name agent_factory gives the first agent
    sh("ip", "netns", "add", stale_ns)
    sh("ip", "link", "add", f"o{tag}1", "type", "veth", "peer", "name", f"o{tag}0", "netns", stale_ns)
    # The marks that life left: the host end's ifalias and the namespace's mark file.
    sh("ip", "link", "set", f"o{tag}1", "alias", f"lbagent/{host}")
    mark = f"/run/lbagent-netns/{host}/{stale_ns}"
    os.makedirs(os.path.dirname(mark), exist_ok=True)
    open(mark, "a").close()
    sandbox.vsctl(
        "add-port",
        "br-int",
        f"o{tag}1",
        "--",
        "set",
        "Interface",
        f"o{tag}1",
        f"external_ids:lbagent-owner=lbagent/{host}",
        f"external_ids:lbagent-lb={prefix}-old",
    )
    try:
        agent = agent_factory(resync_interval=0.5)
        code, body = agent.request("GET", "/readyz")
        assert code == 503 and "desired state" in body["reason"]
        wait_until(lambda: agent.status()["agent"]["gc"]["skipped"] >= 3, 10, "garbage collection to hold off")
        assert stale_ns in sh("ip", "netns") and f"o{tag}1" in sandbox.vsctl("list-ports", "br-int")
        assert agent.refresh(desired(1))[0] == 200
        assert agent.request("GET", "/readyz")[0] == 200
        wait_until(lambda: agent.status()["agent"]["gc"]["deleted"] >= 3, 10, "the orphans to be swept")
        assert agent.status()["agent"]["gc"]["passes"] >= 2  # marked on one pass, swept on the next
        assert stale_ns not in sh("ip", "netns")
        assert f"o{tag}1" not in sandbox.vsctl("list-ports", "br-int")
        assert f"o{tag}1" not in sh("ip", "-br", "link")
    finally:
        subprocess.run(["ip", "netns", "del", stale_ns], capture_output=True)
        subprocess.run(["ip", "link", "del", f"o{tag}1"], capture_output=True)
        if os.path.exists(mark):
            os.unlink(mark)
        sandbox.vsctl("--if-exists", "del-port", "br-int", f"o{tag}1")


def test_sigterm_leaves_the_data_path_serving_and_cleanup_removes_it(agent_factory, vpc, web, sandbox):
    before = host_state()
    lb_id, client, agent, status = converged_web(agent_factory, web)
    assert agent.stop() == 0
    assert serving(client)
    offline = agent.cli("status").stdout
    assert "not running" in offline and lb_id in offline
    report = agent.cli("cleanup", "--yes").stdout
    assert f"lb-{lb_id}" in report and "haproxy" in report
    assert not serving(client)
    assert host_state() == before
    assert status["ovs_port"] not in sandbox.vsctl("list-ports", "br-int").split()


@pytest.mark.parametrize("daemon", ["ovsdb-server", "ovs-vswitchd", "ovn-controller"])
def test_ovs_and_ovn_restarts_are_survived(agent_factory, vpc, web, sandbox, daemon, prefix):
    lb_id, client, agent, status = converged_web(agent_factory, web, resync_interval=1.0)
    sandbox.restart(daemon, crash=True)
    wait_until(lambda: serving(client), 30, f"traffic after {daemon} restarted")
    # The agent still writes to OVS: a second load balancer binds its port.
    vpc.add_lb_port(f"{lb_id}-2", "00:22:0a:00:00:13", "198.18.0.13")
    second = loadbalancer(
        f"{lb_id}-2",
        "198.18.0.13",
        "00:22:0a:00:00:13",
        [tcp_listener("l", 80)],
        {"bg-1": [backend("be", "198.18.0.21")]},
    )
    wait_until(
        lambda: (
            agent.refresh(desired(2, web_lb(lb_id), second))[0] == 200
            and all(lb["state"] == "ready" for lb in agent.status()["loadbalancers"])
        ),
        60,
        "both ready",
    )
    wait_bound(agent, f"{lb_id}-2", timeout=60)
    wait_until(
        lambda: client.curl("http://198.18.0.13:80/", timeout=2).strip() == "backend-a",
        30,
        "the second load balancer answering",
    )


def test_killed_haproxy_comes_back_within_two_seconds(agent_factory, vpc, web):
    lb_id, client, agent, status = converged_web(agent_factory, web)
    pid = agent.status()["agent"]["haproxy"]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: serving(client), 2.5, "haproxy serving again")
    assert agent.status()["agent"]["haproxy"]["pid"] != pid


def test_corrupt_state_file_is_reported_and_rebuilt_from_the_host(agent_factory, vpc, web):
    lb_id, client, agent, status = converged_web(agent_factory, web)
    agent.stop()
    (agent.state_dir / "state.json").write_text('{"format": "lbagent-state", "version": 1, "allocations": [')
    agent.start()
    assert serving(client)
    assert "corrupt" in agent.status()["agent"]["state_error"]
    assert agent.request("GET", "/readyz")[0] == 503
    assert agent.refresh(desired(1, web_lb(lb_id)))[0] == 200
    after = wait_bound(agent, lb_id)
    assert (after["inner"], after["outer"]) == (status["inner"], status["outer"])
    assert [b["mapped_port"] for b in after["backends"]] == [b["mapped_port"] for b in status["backends"]]
    assert agent.status()["agent"]["state_error"] is None
    assert list(agent.state_dir.glob("state.json.bad-*"))


def test_create_delete_cycles_leak_nothing(agent_factory, vpc, prefix):
    agent = agent_factory()
    before = host_state()

    def batch(round_no: int) -> list[dict]:
        """Ten load balancers, each with its logical switch port: ready means ovn-installed."""
        lbs = []
        for i in range(10):
            lb_id, ip, mac = f"{prefix}-c{round_no}-{i}", f"198.18.0.{100 + i}", f"00:22:0a:00:02:{i:02x}"
            vpc.add_lb_port(lb_id, mac, ip)
            lbs.append(loadbalancer(lb_id, ip, mac, [tcp_listener("l", 80)], {"bg-1": [backend("be", "198.18.0.21")]}))
        return lbs

    def retire(round_no: int) -> None:
        for i in range(10):
            vpc.del_lb_port(f"{prefix}-c{round_no}-{i}")

    assert agent.refresh(desired(1, *batch(0)))[0] == 200
    proc = psutil.Process(agent.proc.pid)
    fds = proc.num_fds()
    for round_no in range(1, 21):  # 200 load balancers created, 200 deleted
        retire(round_no - 1)  # first: the next round reuses their addresses
        code, body = agent.refresh(desired(round_no + 1, *batch(round_no)), wait=120)
        assert code == 200 and all(lb["state"] == "ready" for lb in body["loadbalancers"]), body
    assert agent.refresh(desired(30))[0] == 200
    assert agent.status()["loadbalancers"] == []
    assert host_state() == before
    assert not list((agent.run_dir / "haproxy" / "conf.d").glob("*.cfg"))
    assert proc.num_fds() <= fds + 2, (fds, proc.num_fds())
