"""The walking skeleton end to end: the region controller's HTTP calls make a TCP
load balancer that a VPC client reaches through OVN, with real traffic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentproc import wait_until
from helpers import VIP, answers, host_state, wait_bound, web_lb
from lbstate import SUBNET, backend, desired, loadbalancer, tcp_listener


def test_tcp_load_balancer_through_ovn(agent_factory, vpc, web, sandbox):
    lb_id, client = web
    agent = agent_factory()
    code, body = agent.refresh(desired(1, web_lb(lb_id)))
    assert code == 200, body
    assert body["loadbalancers"][0]["state"] == "ready", body
    status = wait_bound(agent, lb_id)
    assert status["inner"].startswith("169.254.") and status["outer"].startswith("169.254.")
    assert {b["mapped_port"] for b in status["backends"]} == {1025, 1026}

    # Round robin over both backends, from a VPC client through OVN.
    seen = answers(client, f"http://{VIP}:80/", 6)
    assert seen == {"backend-a": 3, "backend-b": 3}, seen

    # The real kernel/OVS state behind it.
    port = status["ovs_port"]
    iface = json.loads(sandbox.vsctl("--format=json", "--columns=external_ids", "list", "Interface", port))
    assert f'"iface-id","iface/lb/{lb_id}"' in json.dumps(iface).replace(", ", ",")
    assert f"lb-{lb_id}" in subprocess.run(["ip", "netns"], capture_output=True, text=True).stdout

    # Remove a backend: only the other answers.
    code, body = agent.refresh(desired(2, web_lb(lb_id, backends=("b",))))
    assert code == 200 and body["loadbalancers"][0]["state"] == "ready", body
    assert answers(client, f"http://{VIP}:80/", 4) == {"backend-b": 4}
    assert [b["mapped_port"] for b in agent.lb(lb_id)["backends"]] == [1026]  # unchanged for be-b

    # Add a second listener: it answers too.
    listeners = [tcp_listener("lsn-80", 80), tcp_listener("lsn-8080", 8080)]
    code, body = agent.refresh(desired(3, web_lb(lb_id, backends=("a", "b"), listeners=listeners)))
    assert code == 200, body
    assert set(answers(client, f"http://{VIP}:8080/", 4)) == {"backend-a", "backend-b"}
    assert set(answers(client, f"http://{VIP}:80/", 4)) == {"backend-a", "backend-b"}

    # lbagent status shows it.
    table = agent.cli("status").stdout
    assert lb_id in table and "ready" in table and "198.18.0.21:8000→" in table
    assert json.loads(agent.cli("status", "--json").stdout)["loadbalancers"][0]["id"] == lb_id


def test_converged_pass_writes_nothing(agent_factory, vpc, web):
    lb_id, client = web
    agent = agent_factory(resync_interval=0.3)
    assert agent.refresh(desired(1, web_lb(lb_id)))[0] == 200
    wait_bound(agent, lb_id)
    client.curl(f"http://{VIP}:80/")
    # Let the resync run until two passes have happened since convergence was reached.
    first = agent.status()
    passes = agent.lb(lb_id)["passes"]
    wait_until(lambda: agent.lb(lb_id)["passes"] >= passes + 2, 10, "two more resync passes")
    second = agent.status()
    assert second["agent"]["writes"] == first["agent"]["writes"]
    assert second["agent"]["haproxy"]["reloads"] == first["agent"]["haproxy"]["reloads"]
    assert second["agent"]["haproxy"]["pid"] == first["agent"]["haproxy"]["pid"]
    # And a pass after drift does write: the counters can move.
    subprocess.run(
        ["ip", "netns", "exec", f"lb-{lb_id}", "iptables-legacy", "-t", "nat", "-F", "LBAGENT-POST"], check=True
    )
    wait_until(
        lambda: agent.status()["agent"]["writes"]["iptables"] > second["agent"]["writes"]["iptables"],
        10,
        "the resync to repair the flushed chain",
    )
    assert client.curl(f"http://{VIP}:80/").strip() in {"backend-a", "backend-b"}


def test_delete_leaves_nothing_behind(agent_factory, vpc, web, sandbox):
    lb_id, client = web
    agent = agent_factory()
    before = host_state()
    assert agent.refresh(desired(1, web_lb(lb_id)))[0] == 200
    status = wait_bound(agent, lb_id)
    names = status["interfaces"]["ovn"] + status["interfaces"]["haproxy"]
    conf = Path(agent.run_dir) / "haproxy" / "conf.d" / f"{lb_id}.cfg"
    assert conf.exists()

    code, body = agent.refresh(desired(2))
    assert code == 200, body
    assert agent.status()["loadbalancers"] == []
    after = host_state()
    assert f"lb-{lb_id}" not in after["netns"]
    for name in names:
        assert name not in after["links"]
    assert status["outer"] not in after["addrs"] and status["inner"] not in after["routes"]
    assert status["ovs_port"] not in sandbox.vsctl("list-ports", "br-int").split()
    assert not conf.exists()
    assert after == before


def test_ids_sharing_a_long_prefix_get_distinct_interfaces(agent_factory, vpc, prefix):
    vpc.add_host("a", "198.18.0.21", http_text="backend-a")
    client = vpc.add_host("client", "198.18.0.31")
    common = f"{prefix}-{'x' * 20}"
    ids = [f"{common}-one", f"{common}-two"]
    lbs = []
    for index, lb_id in enumerate(ids):
        ip, mac = f"198.18.0.{40 + index}", f"00:22:0a:00:00:{40 + index:02x}"
        vpc.add_lb_port(lb_id, mac, ip)
        lbs.append(loadbalancer(lb_id, ip, mac, [tcp_listener("l", 80)], {"bg-1": [backend("be-a", "198.18.0.21")]}))
    agent = agent_factory()
    assert agent.refresh(desired(1, *lbs))[0] == 200
    statuses = [wait_bound(agent, lb_id) for lb_id in ids]
    assert statuses[0]["interfaces"] != statuses[1]["interfaces"]
    assert statuses[0]["ovs_port"] != statuses[1]["ovs_port"]
    for index in range(2):
        assert client.curl(f"http://198.18.0.{40 + index}:80/").strip() == "backend-a"


def stable(lbs: list[dict]) -> list[dict]:
    volatile = {"last_reconciled_at", "passes"}
    return [{k: v for k, v in lb.items() if k not in volatile} for lb in lbs]


INVALID = [
    ("/loadbalancers/0/network/ip", lambda s: s["loadbalancers"][0]["network"].update(ip="198.18.0.300")),
    (
        "/loadbalancers/0/listeners/0/listener_port",
        lambda s: s["loadbalancers"][0]["listeners"][0].update(listener_port=0),
    ),
    (
        "/loadbalancers/0/listeners/1/listener_port",
        lambda s: s["loadbalancers"][0]["listeners"].append(tcp_listener("dup", 80)),
    ),
    (
        "/loadbalancers/0/listeners/0/backend_group_id",
        lambda s: s["loadbalancers"][0]["listeners"][0].update(backend_group_id="nope"),
    ),
    ("/loadbalancers/0/id", lambda s: s["loadbalancers"][0].update(id="a/b")),
    ("/loadbalancers/0/id", lambda s: s["loadbalancers"][0].update(id="a b")),
]


def test_invalid_bodies_change_nothing(agent_factory, vpc, web):
    lb_id, client = web
    agent = agent_factory()
    good = desired(1, web_lb(lb_id))
    assert agent.refresh(good)[0] == 200
    wait_bound(agent, lb_id)
    # Until haproxy reports every backend: a health turning from unknown into its word changes the document.
    wait_until(
        lambda: "unknown" not in (h := {b["health"] for b in agent.lb(lb_id)["backends"]}) and h, 30, "backends checked"
    )
    before = agent.status()
    for path, breaks in INVALID:
        body = json.loads(json.dumps(good))
        body["generation"] = 2
        breaks(body)
        code, answer = agent.refresh(body)
        assert code == 400, (path, answer)
        assert answer["error"] == "invalid_body"
        assert path in [d["path"] for d in answer["details"]], (path, answer)
    after = agent.status()
    assert after["agent"]["generation"] == 1
    assert stable(after["loadbalancers"]) == stable(before["loadbalancers"])
    assert after["agent"]["writes"] == before["agent"]["writes"]
    assert set(answers(client, f"http://{VIP}:80/", 2)) <= {"backend-a", "backend-b"}
    # Not JSON, wrong type, no token, wrong token.
    assert agent.request("POST", "/v1/refresh", raw=b"{", content_type="application/json")[0] == 400
    assert agent.request("POST", "/v1/refresh", raw=b"{}", content_type="text/plain")[0] == 415
    assert agent.request("POST", "/v1/refresh", good, token=None)[0] == 401
    assert agent.request("GET", "/v1/status", token="wrong")[0] == 401
    assert agent.request("POST", "/v1/refresh", desired(0, web_lb(lb_id)))[0] == 409


HOLD_CONNECTION = (
    "import socket, sys\n"
    "s = socket.create_connection((sys.argv[1], 80), timeout=10)\n"
    "print('connected', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_haproxy_sees_the_real_client_address(agent_factory, vpc, web):
    lb_id, client = web
    agent = agent_factory()
    assert agent.refresh(desired(1, web_lb(lb_id)))[0] == 200
    status = wait_bound(agent, lb_id)
    holder = subprocess.Popen(
        ["ip", "netns", "exec", client.netns, sys.executable, "-c", HOLD_CONNECTION, VIP],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "connected"
        sessions = wait_until(
            lambda: (
                subprocess.run(
                    ["ss", "-Htn", "state", "established", "src", f"{status['outer']}:80"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
            ),
            10,
            "haproxy's side of the connection",
        )
        assert f"{client.ip}:" in sessions, sessions
    finally:
        holder.stdin.close()
        holder.wait(10)
    # And the answers still come back through the load balancer.
    assert set(answers(client, f"http://{VIP}:80/", 2)) <= {"backend-a", "backend-b"}


def test_a_subnet_route_to_0_0_0_0_replaces_the_gateway_and_stays_put(agent_factory, vpc, web):
    """A subnet route to 0.0.0.0/0 is the namespace's default route. (It used to
    fight the gateway's: each resync replaced the other's, writing every pass.)"""
    lb_id, client = web
    agent = agent_factory(resync_interval=0.3)
    subnet = {**SUBNET, "routes": [{"cidr": "0.0.0.0/0", "nexthop": "198.18.0.254"}]}
    code, body = agent.refresh(desired(1, web_lb(lb_id), subnets=[subnet]))
    assert code == 200 and body["loadbalancers"][0]["state"] == "ready", body
    wait_bound(agent, lb_id)
    routes = subprocess.run(
        ["ip", "netns", "exec", f"lb-{lb_id}", "ip", "route"], capture_output=True, text=True, check=True
    ).stdout
    assert "default via 198.18.0.254" in routes and "default via 198.18.0.1 " not in routes, routes
    assert client.curl(f"http://{VIP}:80/").strip() in {"backend-a", "backend-b"}  # the VPC is on-link
    first, passes = agent.status(), agent.lb(lb_id)["passes"]
    wait_until(lambda: agent.lb(lb_id)["passes"] >= passes + 2, 10, "two more resync passes")
    assert agent.status()["agent"]["writes"] == first["agent"]["writes"]
