"""Subnets and pods drive load balancers: a subnet change reshapes the
namespaces on it, and pod changes move traffic within one reconcile."""

from __future__ import annotations

import subprocess

from agentproc import wait_until
from helpers import MAC, VIP, answers, wait_bound, web_lb
from lbstate import SUBNET, desired, loadbalancer, tcp_listener

URL = f"http://{VIP}:80/"


def ns(netns: str, *cmd: str) -> str:
    return subprocess.run(["ip", "netns", "exec", netns, *cmd], capture_output=True, text=True, check=True).stdout


def test_subnet_change_reshapes_the_namespace_while_traffic_flows(agent_factory, vpc, web):
    lb_id, client = web
    agent = agent_factory()
    assert agent.refresh(desired(1, web_lb(lb_id)))[0] == 200
    status = wait_bound(agent, lb_id)
    netns, ovn_ns = status["netns"], status["interfaces"]["ovn"][0]
    changed = {**SUBNET, "gateway": "198.18.0.254", "mtu": 1400,
               "routes": [{"cidr": "198.19.0.0/16", "nexthop": "198.18.0.253"}]}
    code, body = agent.refresh(desired(2, web_lb(lb_id), subnets=[changed]))
    assert code == 200 and body["loadbalancers"][0]["state"] == "ready", body
    routes = ns(netns, "ip", "route")
    assert "default via 198.18.0.254" in routes and "198.19.0.0/16 via 198.18.0.253" in routes
    assert "mtu 1400" in ns(netns, "ip", "link", "show", ovn_ns)
    assert set(answers(client, URL, 4)) <= {"backend-a", "backend-b"}
    subnet = agent.status()["subnets"][0]
    assert subnet == {"id": "net-1", "state": "ready", "loadbalancers": 1}


def pod(pod_id: str, ip: str, port: int = 8000, ready: bool = True, app: str = "web") -> dict:
    return {"id": pod_id, "namespace": "shop", "name": pod_id, "ip": ip, "ready": ready, "labels": {"app": app},
            "ports": [{"name": "http", "port": port, "protocol": "tcp"}]}


def pod_lb(lb_id: str) -> dict:
    lb = loadbalancer(lb_id, VIP, MAC, [tcp_listener("lsn-80", 80)], {})
    lb["backend_groups"] = [{"id": "bg-1", "pod_selector": {"namespace": "shop", "labels": {"app": "web"},
                                                            "port": "http"}}]
    return lb


def test_pods_scale_and_readiness_move_traffic(agent_factory, vpc, web):
    lb_id, client = web
    vpc.add_host("c", "198.18.0.23", http_text="backend-c", http_port=8001)  # its "http" port is 8001
    agent = agent_factory()
    pods = {"a": pod("pod-a", "198.18.0.21"), "b": pod("pod-b", "198.18.0.22"),
            "c": pod("pod-c", "198.18.0.23", port=8001), "db": pod("pod-db", "198.18.0.40", app="db")}

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
    assert agent.status()["pods"] == {"count": 3, "ready": 3}
