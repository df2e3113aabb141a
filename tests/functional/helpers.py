"""Shared pieces of the functional tests: the web load balancer, traffic, host state."""

from __future__ import annotations

import collections
import subprocess

from agentproc import wait_until
from lbstate import backend, loadbalancer, tcp_listener

VIP, MAC = "198.18.0.12", "00:22:0a:00:00:12"


def answers(client, url: str, count: int) -> collections.Counter:
    return collections.Counter(client.curl(url).strip() for _ in range(count))


def wait_bound(agent, lb_id: str, timeout: float = 30) -> dict:
    """Until ovn-controller says the load balancer's port is installed."""
    return wait_until(
        lambda: (lb := agent.lb(lb_id))["ovn_installed"] and lb["state"] == "ready" and lb,
        timeout,
        f"{lb_id} ready with ovn-installed",
    )


def host_state() -> dict:
    def sh(*cmd):
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    return {
        "netns": sh("ip", "netns", "list"),
        "links": sh("ip", "-br", "link"),
        "addrs": sh("ip", "-br", "addr"),
        "routes": sh("ip", "route"),
        "rules": sh("ip", "rule"),
    }


def web_lb(lb_id, backends=("a", "b"), listeners=None):
    addresses = {"a": "198.18.0.21", "b": "198.18.0.22"}
    members = [backend(f"be-{name}", addresses[name]) for name in backends]
    return loadbalancer(lb_id, VIP, MAC, listeners or [tcp_listener("lsn-80", 80, scheduler="rr")], {"bg-1": members})
