"""Backend weights carry traffic: a `wrr` listener over haproxy and a UDP
listener balanced in the kernel split many fresh connections (datagrams, each
from a new source port) 1:3 between two members weighted 1 and 3."""

from __future__ import annotations

from helpers import MAC, UDP_PORT, VIP, UdpServers, http_backends_of, udp_backends_of, wait_bound
from lbstate import backend, desired, loadbalancer, tcp_listener

REQUESTS = 1000
WEIGHTS = {"a": 1, "b": 3}
ADDRESSES = {"a": "198.18.0.21", "b": "198.18.0.22"}


def expected(count: int) -> dict[str, float]:
    total = sum(WEIGHTS.values())
    return {name: count * weight / total for name, weight in WEIGHTS.items()}


def members(port: int) -> list[dict]:
    return [backend(f"be-{name}", ADDRESSES[name], port, weight=WEIGHTS[name]) for name in WEIGHTS]


def test_wrr_weights_split_http_requests_one_to_three(agent_factory, vpc, prefix):
    for name, address in ADDRESSES.items():
        vpc.add_host(name, address, http_text=name)
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-wrr"
    vpc.add_lb_port(lb_id, MAC, VIP)
    agent = agent_factory()
    lb = loadbalancer(lb_id, VIP, MAC, [tcp_listener("lsn-80", 80, scheduler="wrr")], {"bg-1": members(8000)})
    assert agent.refresh(desired(1, lb))[0] == 200
    wait_bound(agent, lb_id)

    seen = http_backends_of(client, f"http://{VIP}:80/", REQUESTS)
    assert sum(seen.values()) == REQUESTS, seen  # every request answered, by a or b
    # haproxy's weighted round robin is deterministic: ±10 % of each expected count.
    for name, share in expected(REQUESTS).items():
        assert abs(seen[name] - share) <= 0.1 * share, (seen, expected(REQUESTS))


def test_udp_weights_split_new_flows_one_to_three(agent_factory, vpc, prefix):
    hosts = {name: vpc.add_host(name, address) for name, address in ADDRESSES.items()}
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-udpw"
    vpc.add_lb_port(lb_id, MAC, VIP)
    with UdpServers() as servers:
        for name, host in hosts.items():
            servers.start(host, name)
        agent = agent_factory()
        listener = {"id": "dns", "listener_type": "udp", "listener_port": UDP_PORT, "backend_group_id": "bg-1"}
        lb = loadbalancer(lb_id, VIP, MAC, [listener], {"bg-1": members(UDP_PORT)})
        assert agent.refresh(desired(1, lb))[0] == 200
        wait_bound(agent, lb_id)

        seen = udp_backends_of(client, VIP, UDP_PORT, REQUESTS)
    assert seen["error"] == 0 and sum(seen.values()) == REQUESTS, seen
    # The kernel picks each new flow at random (statistic match): the split is within
    # ±10 % of all the datagrams of 250/750 (σ ≈ 14, so this never flakes, and an
    # even split, 500/500, is far outside it).
    for name, share in expected(REQUESTS).items():
        assert abs(seen[name] - share) <= 0.1 * REQUESTS, (seen, expected(REQUESTS))
    assert seen["b"] > 2 * seen["a"], seen
