"""UDP listeners are balanced by the kernel in the load balancer's namespace:
flows spread over the members by weight, and a member whose health check
fails gets no new flows until it recovers."""

from __future__ import annotations

import collections

import pytest

from agentproc import wait_until
from helpers import MAC, UDP_PORT, VIP, UdpServers, udp_backends_of
from lbstate import backend, desired, loadbalancer

PORT = UDP_PORT


@pytest.fixture
def udp_servers():
    with UdpServers(PORT) as servers:
        yield servers


def ask(client, count: int) -> collections.Counter:
    return udp_backends_of(client, VIP, PORT, count)


def udp_lb(lb_id: str) -> dict:
    listener = {
        "id": "dns",
        "listener_type": "udp",
        "listener_port": PORT,
        "backend_group_id": "bg-1",
        "health_check": {
            "type": "udp",
            "udp_request": "ping",
            "udp_expect": "ping",
            "rise": 1,
            "fall": 1,
            "interval": 1,
            "timeout": 1,
        },
    }
    return loadbalancer(
        lb_id,
        VIP,
        MAC,
        [listener],
        {"bg-1": [backend("be-a", "198.18.0.21", PORT), backend("be-b", "198.18.0.22", PORT)]},
    )


def test_udp_flows_spread_and_avoid_a_dead_member(agent_factory, vpc, prefix, udp_servers):
    a = vpc.add_host("a", "198.18.0.21")
    b = vpc.add_host("b", "198.18.0.22")
    client = vpc.add_host("client", "198.18.0.31")
    udp_servers.start(a, "udp-a")
    udp_servers.start(b, "udp-b")
    lb_id = f"{prefix}-dns"
    vpc.add_lb_port(lb_id, MAC, VIP)
    agent = agent_factory()
    assert agent.refresh(desired(1, udp_lb(lb_id)))[0] == 200
    wait_until(lambda: agent.lb(lb_id)["ovn_installed"], 30, "the port bound")
    wait_until(lambda: {b["health"] for b in agent.lb(lb_id)["backends"]} == {"up"}, 15, "both members up")
    seen = wait_until(
        lambda: (c := ask(client, 24)) and {"udp-a", "udp-b"} <= set(c) and c, 30, "flows on both members"
    )
    assert set(seen) == {"udp-a", "udp-b"}, seen

    udp_servers.stop("udp-b")
    wait_until(
        lambda: {b["id"]: b["health"] for b in agent.lb(lb_id)["backends"]}["be-b"] == "down",
        15,
        "the health check to take be-b out",
    )
    # The status changes as the check fails; the pass that takes be-b out of the NAT rules follows it.
    wait_until(lambda: ask(client, 12) == {"udp-a": 12}, 15, "new flows to avoid be-b")
    assert ask(client, 12) == {"udp-a": 12}  # and they go on avoiding it

    udp_servers.start(b, "udp-b")
    wait_until(lambda: {b["id"]: b["health"] for b in agent.lb(lb_id)["backends"]}["be-b"] == "up", 15, "be-b back")
    wait_until(lambda: "udp-b" in ask(client, 12), 15, "new flows on be-b again")
