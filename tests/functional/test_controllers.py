"""Subnets and pods drive load balancers: a subnet change reshapes the
namespaces on it, pod changes move traffic within one reconcile and reach
exactly the load balancers that select the pod, and status shows the
subnets, the pods and the shared work queue."""

from __future__ import annotations

import subprocess

from openapi_schema_validator import OAS31Validator

from lbagent.api.openapi import document

from agentproc import wait_until
from helpers import MAC, VIP, answers, wait_bound, web_lb
from lbstate import SUBNET, desired, loadbalancer, tcp_listener

URL = f"http://{VIP}:80/"
QUEUE_KINDS = {"loadbalancer", "subnet", "pod", "provider_network"}
IDLE = {"depth": 0, "delayed": 0, "processing": 0, "retrying": 0}


def checked_status(agent) -> dict:
    """The agent's status, validated against the Status schema of its OpenAPI document."""
    status = agent.status()
    OAS31Validator({"$ref": "#/components/schemas/Status", "components": document()["components"]}).validate(status)
    return status


def ns(netns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, *cmd], capture_output=True, text=True, check=True).stdout


def test_subnet_change_reshapes_the_namespace_while_traffic_flows(agent_factory, vpc, web):
    lb_id, client = web
    agent = agent_factory()
    assert agent.refresh(desired(1, web_lb(lb_id)))[0] == 200
    status = wait_bound(agent, lb_id)
    netns, ovn_ns = status["netns"], status["interfaces"]["ovn"][0]
    changed = {
        **SUBNET,
        "gateway": "198.18.0.254",
        "mtu": 1400,
        "routes": [{"cidr": "198.19.0.0/16", "nexthop": "198.18.0.253"}],
    }
    code, body = agent.refresh(desired(2, web_lb(lb_id), subnets=[changed]))
    assert code == 200 and body["loadbalancers"][0]["state"] == "ready", body
    routes = ns(netns, "ip", "route")
    assert "default via 198.18.0.254" in routes and "198.19.0.0/16 via 198.18.0.253" in routes
    assert "mtu 1400" in ns(netns, "ip", "link", "show", ovn_ns)
    assert set(answers(client, URL, 4)) <= {"backend-a", "backend-b"}
    status = checked_status(agent)
    assert status["subnets"] == [
        {
            "id": "net-1",
            "state": "ready",
            "loadbalancers": 1,
            "cidr": "198.18.0.0/24",
            "gateway": "198.18.0.254",
            "mtu": 1400,
            "routes": changed["routes"],
            "retries": 0,
            "error": None,
        }
    ]
    assert status["agent"]["queues"] == {kind: IDLE for kind in QUEUE_KINDS}


def pod(pod_id: str, ip: str, port: int = 8000, ready: bool = True, app: str = "web") -> dict:
    return {
        "id": pod_id,
        "namespace": "shop",
        "name": pod_id,
        "ip": ip,
        "ready": ready,
        "labels": {"app": app},
        "ports": [{"name": "http", "port": port, "protocol": "tcp"}],
    }


def pod_lb(lb_id: str, vip: str = VIP, mac: str = MAC, app: str = "web") -> dict:
    lb = loadbalancer(lb_id, vip, mac, [tcp_listener("lsn-80", 80)], {})
    lb["backend_groups"] = [
        {"id": "bg-1", "pod_selector": {"namespace": "shop", "labels": {"app": app}, "port": "http"}}
    ]
    return lb


def test_pods_scale_and_readiness_move_traffic(agent_factory, vpc, web):
    lb_id, client = web
    vpc.add_host("c", "198.18.0.23", http_text="backend-c", http_port=8001)  # its "http" port is 8001
    agent = agent_factory()
    pods = {
        "a": pod("pod-a", "198.18.0.21"),
        "b": pod("pod-b", "198.18.0.22"),
        "c": pod("pod-c", "198.18.0.23", port=8001),
        "db": pod("pod-db", "198.18.0.40", app="db"),
    }

    def push(generation: int, *names: str, not_ready: tuple[str, ...] = ()):
        chosen = [{**pods[n], "ready": n not in not_ready} for n in names]
        body = {**desired(generation, pod_lb(lb_id)), "pods": chosen}
        code, answer = agent.refresh(body)
        assert code == 200 and answer["loadbalancers"][0]["state"] == "ready", answer

    push(1, "a", "db")
    wait_bound(agent, lb_id)
    assert set(answers(client, URL, 4)) == {"backend-a"}
    push(2, "a", "b", "c", "db")
    assert set(answers(client, URL, 6)) == {"backend-a", "backend-b", "backend-c"}
    backends = {b["id"]: b for b in agent.lb(lb_id)["backends"]}
    assert backends["bg-1/pod-c"]["port"] == 8001 and backends["bg-1/pod-a"]["port"] == 8000
    mapped = {k: b["mapped_port"] for k, b in backends.items()}
    push(3, "a", "b", "c", "db", not_ready=("b",))
    assert set(answers(client, URL, 6)) == {"backend-a", "backend-c"}
    push(4, "a", "db")
    assert set(answers(client, URL, 4)) == {"backend-a"}
    push(5, "a", "b", "db")
    after = {b["id"]: b["mapped_port"] for b in agent.lb(lb_id)["backends"]}
    assert after["bg-1/pod-a"] == mapped["bg-1/pod-a"]  # an unchanged member keeps its port
    wait_until(lambda: set(answers(client, URL, 4)) == {"backend-a", "backend-b"}, 10, "pod b back")
    pods = checked_status(agent)["pods"]
    assert pods["count"] == 3 and pods["ready"] == 3
    assert {p["id"]: p["loadbalancers"] for p in pods["items"]} == {"pod-a": 1, "pod-b": 1, "pod-db": 0}


def test_a_pod_change_reaches_exactly_the_load_balancer_selecting_it(agent_factory, vpc, web, prefix):
    lb_id, client = web
    db_id = f"{prefix}-db"
    vpc.add_lb_port(db_id, "00:22:0a:00:00:13", "198.18.0.13")
    agent = agent_factory(resync_interval=600)  # no periodic pass while the test counts passes
    lbs = (pod_lb(lb_id), pod_lb(db_id, "198.18.0.13", "00:22:0a:00:00:13", app="db"))

    def passes() -> dict[str, int]:
        return {i: agent.lb(i)["passes"] for i in (lb_id, db_id)}

    def push(generation: int, *pods: dict) -> dict[str, int]:
        """Refresh and wait; how many passes each load balancer made for it."""
        before = passes() if generation > 1 else dict.fromkeys((lb_id, db_id), 0)
        code, answer = agent.refresh({**desired(generation, *lbs), "pods": list(pods)})
        assert code == 200 and {r["state"] for r in answer["loadbalancers"]} == {"ready"}, answer
        assert {r["generation"] for r in answer["loadbalancers"]} == {generation}, answer
        return {i: n - before[i] for i, n in passes().items()}

    db = pod("pod-db", "198.18.0.40", app="db")
    assert push(1, pod("pod-a", "198.18.0.21"), db) == {lb_id: 1, db_id: 1}
    wait_bound(agent, lb_id)
    wait_bound(agent, db_id)
    assert set(answers(client, URL, 4)) == {"backend-a"}
    # pod-a moves to where backend-b answers: the same member (its port on INNER stays), so only the
    # pod controller wakes the web load balancer, and the waiting refresh waits for that pass.
    mapped = agent.lb(lb_id)["backends"][0]["mapped_port"]
    assert push(2, pod("pod-a", "198.18.0.22"), db) == {lb_id: 1, db_id: 0}
    assert set(answers(client, URL, 4)) == {"backend-b"}
    assert agent.lb(lb_id)["backends"][0]["mapped_port"] == mapped
    # The database scales up: the other way round.
    assert push(3, pod("pod-a", "198.18.0.22"), db, pod("pod-db2", "198.18.0.41", app="db")) == {lb_id: 0, db_id: 1}
    status = checked_status(agent)
    assert {p["id"]: (p["loadbalancers"], p["pending"]) for p in status["pods"]["items"]} == {
        "pod-a": (1, False),
        "pod-db": (1, False),
        "pod-db2": (1, False),
    }
    assert status["agent"]["queues"] == {kind: IDLE for kind in QUEUE_KINDS}
    assert status["subnets"][0]["loadbalancers"] == 2 and status["subnets"][0]["state"] == "ready"
