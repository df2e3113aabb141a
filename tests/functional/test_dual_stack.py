"""Dual-stack load balancers over HTTP, with real traffic through OVN: an IPv6 client reaches IPv4
and IPv6 backends over http (X-Forwarded-For names the IPv6 client), tcp, https and udp; an IPv4
client reaches an IPv6 backend; black and white lists of an IPv6 client (http and udp) hold on
IPv6 and not on IPv4; per-source rates hold an IPv6 client; haproxy's checks and the udp checker
find the IPv6 members up; a backend in the agent's own IPv6 prefix is refused; a restart keeps the
IPv6 pair and the mapped ports, also when the state file is lost; drift of an IPv6 address or rule
is repaired; deleting the load balancer leaves no IPv6 address, route, rule or policy rule behind."""

from __future__ import annotations

import collections
import json
import subprocess

import pytest

from devtools.topology import Vpc, self_signed_certificate
from lbagent.naming import netns_name

from agentproc import wait_until
from helpers import UdpServers, udp_backends_of, wait_bound
from lbstate import backend, desired, loadbalancer, tcp_listener

CIDR6, GATEWAY6 = "2001:db8:0:1::/64", "2001:db8:0:1::1"
SUBNET = {
    "id": "net-1",
    "cidr": "198.18.0.0/24",
    "gateway": "198.18.0.1",
    "mtu": 1442,
    "cidr6": CIDR6,
    "gateway6": GATEWAY6,
}
VIP, VIP6, MAC = "198.18.0.12", "2001:db8:0:1::12", "00:22:0a:00:00:12"
MEMBER, MEMBER6 = "198.18.0.21", "2001:db8:0:1::21"
CLIENT, CLIENT6 = "198.18.0.31", "2001:db8:0:1::31"
UDP_PORT, UDP_LISTED = 5353, 5354
FAST_CHECK = {"rise": 1, "fall": 1, "interval": 1, "timeout": 1}


@pytest.fixture
def vpc6(sandbox, prefix):
    """A dual-stack VPC: 198.18.0.0/24 and 2001:db8:0:1::/64 on one switch and router."""
    v = Vpc(sandbox, prefix, cidr6=CIDR6, gateway6=GATEWAY6)
    try:
        yield v
    finally:
        v.cleanup()


@pytest.fixture
def hosts(vpc6, prefix):
    """The member (an echoing HTTP server on both families), a client, and the load balancer's port."""
    member = vpc6.add_host("a", MEMBER, ip6=MEMBER6)
    member.start_http("backend-a", echo=True)
    client = vpc6.add_host("client", CLIENT, ip6=CLIENT6)
    lb_id = f"{prefix}-ds"
    vpc6.add_lb_port(lb_id, MAC, VIP, ip6=VIP6)
    return lb_id, member, client


def udp_listener(listener_id: str, port: int, group: str, **fields) -> dict:
    return {"id": listener_id, "listener_type": "udp", "listener_port": port, "backend_group_id": group, **fields}


def http(listener_id: str, port: int, group: str, **fields) -> dict:
    return {"id": listener_id, "listener_type": "http", "listener_port": port, "backend_group_id": group, **fields}


def dual_stack(lb_id: str, listeners: list[dict], groups: dict[str, list[dict]]) -> dict:
    lb = loadbalancer(lb_id, VIP, MAC, listeners, groups)
    lb["network"]["ip6"] = VIP6
    return lb


def refresh(agent, generation: int, *lbs: dict) -> None:
    code, body = agent.refresh(desired(generation, *lbs, subnets=[SUBNET]))
    assert code == 200, body


def get(client, url: str) -> tuple[str, dict]:
    """The first line of the answer and what the echoing backend saw ({} if it said nothing more)."""
    lines = client.curl(url).split("\n")
    seen = json.loads(lines[1]) if len(lines) > 1 and lines[1] else {"headers": {}}
    seen["headers"] = {name.lower(): value for name, value in seen["headers"].items()}
    return lines[0], seen


def http_statuses(client, url: str, count: int) -> collections.Counter:
    """The status codes of `count` requests sent back to back, each on a connection of its own."""
    one = f"curl -sg -o /dev/null -w '%{{http_code}}\\n' --max-time 5 '{url}'"
    out = client.run("sh", "-c", f"for i in $(seq {count}); do {one}; done")
    return collections.Counter(out.split())


def refused(client, url: str) -> bool:
    result = subprocess.run(
        ["ip", "netns", "exec", client.netns, "curl", "-sS", "-g", "--noproxy", "*", "--max-time", "5", url],
        capture_output=True,
        text=True,
        timeout=15,
    )
    return result.returncode != 0


def test_clients_of_either_family_reach_backends_of_either_family(agent_factory, hosts):
    lb_id, member, client = hosts
    cert, key = self_signed_certificate("dual.example.com")
    v4, v6 = [backend("be-4", MEMBER)], [backend("be-6", MEMBER6)]
    udp_members = [backend("u-4", MEMBER, UDP_PORT), backend("u-6", MEMBER6, UDP_PORT)]
    listed_members = [backend("l-4", MEMBER, UDP_LISTED), backend("l-6", MEMBER6, UDP_LISTED)]
    black6 = {"type": "black", "cidrs": [f"{CLIENT6}/128"]}
    listeners = [
        http("h4", 80, "bg-v4"),
        http("h6", 81, "bg-v6", x_forwarded_for=True, health_check={"type": "http", "uri": "/", **FAST_CHECK}),
        tcp_listener("t6", 82, "bg-v6"),
        {
            "id": "s6",
            "listener_type": "https",
            "listener_port": 443,
            "backend_group_id": "bg-v6",
            "certificates": [{"id": "dual", "certificate": cert, "private_key": key}],
        },
        udp_listener(
            "u",
            UDP_PORT,
            "bg-udp",
            health_check={"type": "udp", "udp_request": "ping", "udp_expect": "ping", **FAST_CHECK},
        ),
        http("rate6", 86, "bg-v4", http_request_rate_per_src=2),
        http("black6", 84, "bg-v4", acl=black6),
        http("white6", 85, "bg-v4", acl={"type": "white", "cidrs": [f"{CLIENT6}/128"]}),
        udp_listener("u-black6", UDP_LISTED, "bg-listed", acl=black6),
    ]
    groups = {"bg-v4": v4, "bg-v6": v6, "bg-udp": udp_members, "bg-listed": listed_members}
    with UdpServers(UDP_PORT) as udp, UdpServers(UDP_LISTED) as listed:
        udp.start(member, "udp-a")
        listed.start(member, "udp-a")
        agent = agent_factory()
        # A backend in the agent's own IPv6 prefix would be another load balancer's OUTER6.
        inside = dual_stack(lb_id, listeners[:1], {"bg-v4": [backend("be-4", "fd4c:4241::7")]})
        code, body = agent.refresh(desired(1, inside, subnets=[SUBNET]))
        assert code == 400, body
        assert [d["path"] for d in body["details"]] == ["/loadbalancers/0/backend_groups/0/backends/0/address"], body
        refresh(agent, 1, dual_stack(lb_id, listeners, groups))
        status = wait_bound(agent, lb_id)
        assert status["vip6"] == VIP6 and status["inner6"] and status["outer6"], status
        code, metrics = agent.request("GET", "/metrics")
        assert code == 200 and 'lbagent_vips{family="ipv6"} 1.0' in metrics, metrics
        assert f"{VIP} {VIP6}" in agent.cli("status").stdout
        detail = agent.cli("status", lb_id).stdout
        assert f"ipv6: vip {VIP6}  inner/outer {status['inner6']}/{status['outer6']}" in detail
        assert f"[{status['outer6']}]:80" in detail  # the IPv6 NAT rules and their counters

        assert get(client, f"http://[{VIP6}]:80/")[0] == "backend-a"  # IPv6 client, IPv4 backend
        first, seen = get(client, f"http://[{VIP6}]:81/")  # IPv6 client, IPv6 backend
        assert first == "backend-a" and seen["headers"]["x-forwarded-for"] == CLIENT6, seen
        assert seen["peer"] == VIP6, seen  # the backend sees the load balancer's IPv6 VIP
        first, seen = get(client, f"http://{VIP}:81/")  # IPv4 client, IPv6 backend
        assert first == "backend-a" and seen["headers"]["x-forwarded-for"] == CLIENT, seen
        assert get(client, f"http://[{VIP6}]:82/")[0] == "backend-a"  # tcp
        assert client.run("curl", "-sS", "-k", "-g", "--noproxy", "*", "--max-time", "5", f"https://[{VIP6}]:443/")
        assert udp_backends_of(client, VIP6, UDP_PORT, 4) == {"udp-a": 4}
        assert udp_backends_of(client, VIP, UDP_PORT, 4) == {"udp-a": 4}

        assert refused(client, f"http://[{VIP6}]:84/")  # the black-listed IPv6 client
        assert get(client, f"http://{VIP}:84/")[0] == "backend-a"  # the same client over IPv4
        assert get(client, f"http://[{VIP6}]:85/")[0] == "backend-a"  # the white-listed IPv6 client
        assert refused(client, f"http://{VIP}:85/")  # and over IPv4, not listed
        assert udp_backends_of(client, VIP6, UDP_LISTED, 2) == {"error": 2}
        assert udp_backends_of(client, VIP, UDP_LISTED, 2) == {"udp-a": 2}

        # Per-source rates hold IPv6 clients: past 2 requests a second, the same client gets 429s.
        statuses = http_statuses(client, f"http://[{VIP6}]:86/", 8)
        assert statuses["200"] >= 2 and statuses["429"] >= 1, statuses
        # haproxy's checks and the udp checker reach the IPv6 members over IPv6.
        health = wait_until(
            lambda: (h := {b["id"]: b["health"] for b in agent.lb(lb_id)["backends"]})["be-6"] == "up" and h,
            30,
            "the IPv6 members checked up",
        )
        assert health["u-6"] == "up" and health["u-4"] == "up", health


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def test_restart_drift_and_deletion_of_a_dual_stack_load_balancer(agent_factory, hosts):
    lb_id, _, client = hosts
    lb = dual_stack(lb_id, [http("h6", 81, "bg-v6")], {"bg-v6": [backend("be-6", MEMBER6)]})
    agent = agent_factory(resync_interval=2)
    refresh(agent, 1, lb)
    before = wait_bound(agent, lb_id)
    assert get(client, f"http://[{VIP6}]:81/")[0] == "backend-a"

    # A restart, then one that lost the state file: the pair and the ports are read back from the host.
    for lose_state, generation in ((False, 2), (True, 3)):
        agent.stop()
        if lose_state:
            (agent.state_dir / "state.json").unlink()
        agent.start()
        refresh(agent, generation, lb)
        after = wait_bound(agent, lb_id)
        assert (after["inner6"], after["outer6"]) == (before["inner6"], before["outer6"]), lose_state
        assert [b["mapped_port"] for b in after["backends"]] == [b["mapped_port"] for b in before["backends"]]
        assert get(client, f"http://[{VIP6}]:81/")[0] == "backend-a"

    # Resyncs of the converged load balancer stop after their look: the IPv6 routes,
    # addresses and settings read the same from one resync to the next.
    checks = agent.resync_checks()
    wait_until(lambda: agent.resync_checks()["unchanged"] >= checks["unchanged"] + 2, 20, "resyncs that only look")
    netns, ovn_ns = netns_name(lb_id), after["interfaces"]["ovn"][0]
    subprocess.run(["ip", "-n", netns, "-6", "addr", "del", f"{VIP6}/64", "dev", ovn_ns], check=True)
    subprocess.run(["ip", "netns", "exec", netns, "ip6tables-legacy", "-t", "nat", "-F", "LBAGENT-PRE"], check=True)
    assert refused(client, f"http://[{VIP6}]:81/")
    wait_until(lambda: not refused(client, f"http://[{VIP6}]:81/"), 30, "the IPv6 VIP and its rules repaired")

    refresh(agent, 4)
    wait_until(lambda: netns not in ip("netns", "list"), 30, "the namespace removed")
    assert f"from {after['outer6']} " not in ip("-6", "rule")
    assert after["outer6"] not in ip("-6", "addr") and after["inner6"] not in ip("-6", "route")
