"""`ready` means the VIP carries traffic: a load balancer whose port ovn-controller
has not installed, or whose installed port forwards nothing (its gateway does not
answer through it), is `pending` with the reason, `?wait` answers 504 and /readyz
503 until it is; with haproxy unable to run, /readyz answers 503 with the reason
and the metrics say so. On real OVS/OVN and haproxy."""

from __future__ import annotations

import os
import shutil
import signal

from prometheus_client.parser import text_string_to_metric_families

from devtools.sandbox import INTEGRATION_BRIDGE, run
from lbagent.workers.readiness import WAITING_FOR_TRAFFIC

from agentproc import wait_until
from helpers import VIP, web_lb
from lbstate import desired

URL = f"http://{VIP}:80/"


def serving(client) -> bool:
    try:
        return client.curl(URL, timeout=2).strip() in {"backend-a", "backend-b"}
    except Exception:
        return False


def readyz(agent) -> tuple[int, dict]:
    return agent.request("GET", "/readyz", token=None)


def metric_values(agent) -> dict[str, float]:
    code, text = agent.request("GET", "/metrics")
    assert code == 200
    assert isinstance(text, str)
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples if not s.labels}


def port_installed(sandbox, port: str) -> bool:
    out = sandbox.vsctl("--if-exists", "get", "Interface", port, "external_ids:ovn-installed")
    return out.strip().strip('"') == "true"


def test_pending_until_ovn_controller_installs_the_port_then_ready_without_a_refresh(agent_factory, vpc, web, sandbox):
    lb_id, client = web
    # No resync during the test: what turns it ready is the readiness watch, not a pass.
    agent = agent_factory(resync_interval=300.0)
    controller = sandbox._controller
    sandbox._stop_daemon(controller)
    try:
        code, body = agent.refresh(desired(1, web_lb(lb_id)), wait=5)
        assert code == 504, body
        assert [(r["id"], r["state"], r["reason"]) for r in body["loadbalancers"]] == [
            (lb_id, "pending", "waiting for ovn-installed")
        ]
        lb = agent.lb(lb_id)
        assert (lb["state"], lb["reason"], lb["ovn_installed"]) == ("pending", "waiting for ovn-installed", False)
        assert lb["passes"] >= 1 and lb["last_error"] is None  # its pass succeeded: only the port is missing
        assert lb["listeners"][0]["state"] == "pending"
        assert not port_installed(sandbox, lb["ovs_port"])
        code, ready = readyz(agent)
        assert code == 503 and "waiting for ovn-installed" in ready["reason"], ready
        assert metric_values(agent)["lbagent_ready"] == 0
        passes = lb["passes"]
    finally:
        if not controller.running():
            sandbox._start_daemon(controller, sandbox.ovs_db)
    lb = wait_until(lambda: (lb := agent.lb(lb_id))["state"] == "ready" and lb, 30, f"{lb_id} ready by itself")
    assert lb["reason"] is None and lb["ovn_installed"] and port_installed(sandbox, lb["ovs_port"])
    assert lb["passes"] == passes  # no other pass, no refresh: the watch saw the port installed
    wait_until(lambda: serving(client), 30, "traffic through the VIP")
    assert readyz(agent)[0] == 200
    code, body = agent.refresh(desired(1, web_lb(lb_id)), wait=5)
    assert code == 200 and body["loadbalancers"][0]["state"] == "ready", body


def test_haproxy_unable_to_run_makes_the_agent_and_its_load_balancers_not_ready(agent_factory, vpc, web, tmp_path):
    lb_id, client = web
    real = shutil.which("haproxy")
    assert real is not None
    refuse = tmp_path / "haproxy-refuses"
    wrapper = tmp_path / "haproxy-wrapper"
    # haproxy itself, unless the flag file exists: then it fails to start, as a broken binary or config would.
    wrapper.write_text(
        f'#!/bin/sh\nif [ -e "{refuse}" ]; then echo "refusing to start (test)" >&2; exit 1; fi\nexec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    agent = agent_factory(extra_config=f'[haproxy]\nbinary = "{wrapper}"\n')
    code, body = agent.refresh(desired(1, web_lb(lb_id)), wait=60)
    assert code == 200, body
    wait_until(lambda: serving(client), 30, "traffic through the VIP")
    assert readyz(agent)[0] == 200
    pid = agent.status()["agent"]["haproxy"]["pid"]
    refuse.touch()
    try:
        os.kill(pid, signal.SIGKILL)
        # The supervisor tries to start it again within a second, and fails.
        code, ready = wait_until(
            lambda: (r := readyz(agent))[0] == 503 and "refusing to start" in (r[1].get("reason") or "") and r,
            15,
            "/readyz 503 saying haproxy does not run",
        )
        assert ready["reason"].startswith("haproxy not running"), ready
        found = metric_values(agent)
        assert found["lbagent_haproxy_up"] == 0
        assert found["lbagent_haproxy_reload_failing"] == 1
        assert found["lbagent_ready"] == 0
        lb = wait_until(lambda: (lb := agent.lb(lb_id))["state"] != "ready" and lb, 5, f"{lb_id} not ready")
        assert lb["state"] == "pending" and lb["reason"].startswith("haproxy not running"), lb
        assert agent.status()["agent"]["haproxy"]["running"] is False
        code, body = agent.refresh(desired(1, web_lb(lb_id)), wait=2)
        assert code == 504 and body["loadbalancers"][0]["state"] != "ready", body
    finally:
        refuse.unlink(missing_ok=True)
    wait_until(lambda: readyz(agent)[0] == 200, 15, "/readyz 200 once haproxy runs again")
    wait_until(lambda: agent.lb(lb_id)["state"] == "ready", 15, f"{lb_id} ready again")
    wait_until(lambda: serving(client), 30, "traffic through the VIP again")
    assert metric_values(agent)["lbagent_haproxy_up"] == 1


def cut_port_flows(sandbox, port: str) -> None:
    """Delete the OpenFlow flows that take packets from and to `port`: installed, it forwards nothing,
    as when ovs-vswitchd stalls behind ovn-controller. Only a new ovn-controller puts them back."""
    ofport = sandbox.vsctl("get", "Interface", port, "ofport").strip()
    for match in (f"in_port={ofport}", f"out_port={ofport}"):
        run("ovs-ofctl", "del-flows", INTEGRATION_BRIDGE, match, env=sandbox.env)


def test_an_installed_port_that_carries_no_traffic_is_not_ready(agent_factory, vpc, web, sandbox):
    lb_id, client = web
    # Resynced (and so probed again) every 2 s.
    agent = agent_factory(resync_interval=2.0)
    code, body = agent.refresh(desired(1, web_lb(lb_id)), wait=60)
    assert code == 200 and body["loadbalancers"][0]["state"] == "ready", body
    wait_until(lambda: serving(client), 30, "traffic through the VIP")
    port = agent.lb(lb_id)["ovs_port"]

    cut_port_flows(sandbox, port)
    lb = wait_until(lambda: (lb := agent.lb(lb_id))["state"] == "pending" and lb, 30, f"{lb_id} pending")
    assert lb["reason"] == WAITING_FOR_TRAFFIC and lb["ovn_installed"] and port_installed(sandbox, port), lb
    assert not serving(client)
    code, ready = readyz(agent)
    assert code == 503 and WAITING_FOR_TRAFFIC in ready["reason"], ready
    code, body = agent.refresh(desired(1, web_lb(lb_id)), wait=2)
    assert code == 504 and body["loadbalancers"][0]["reason"] == WAITING_FOR_TRAFFIC, body

    controller = sandbox._controller  # a new ovn-controller installs every flow again
    sandbox._stop_daemon(controller)
    sandbox._start_daemon(controller, sandbox.ovs_db)
    wait_until(lambda: agent.lb(lb_id)["state"] == "ready", 60, f"{lb_id} ready again")
    wait_until(lambda: serving(client), 30, "traffic through the VIP again")
    assert readyz(agent)[0] == 200
