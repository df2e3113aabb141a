"""UDP listeners are balanced by the kernel in the load balancer's namespace:
flows spread over the members by weight, and a member whose health check
fails gets no new flows until it recovers."""

from __future__ import annotations

import collections
import subprocess
import sys

import pytest

from agentproc import wait_until
from helpers import MAC, VIP
from lbstate import backend, desired, loadbalancer

PORT = 5353
UDP_SERVER = (
    "import socket, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "s.bind(('0.0.0.0', int(sys.argv[2])))\n"
    "while True:\n"
    "    data, peer = s.recvfrom(2048)\n"
    "    s.sendto(sys.argv[1].encode() + b' ' + data, peer)\n"
)
UDP_CLIENT = (
    "import socket, sys\n"
    "for _ in range(int(sys.argv[3])):\n"
    "    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # a new source port: a new flow\n"
    "    s.settimeout(2)\n"
    "    s.sendto(b'hello', (sys.argv[1], int(sys.argv[2])))\n"
    "    try:\n"
    "        print(s.recv(2048).split()[0].decode())\n"
    "    except OSError as exc:\n"
    "        print('error', type(exc).__name__)\n"
    "    s.close()\n"
)


class UdpServers:
    def __init__(self):
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, host, name: str) -> None:
        self.procs[name] = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, sys.executable, "-c", UDP_SERVER, name, str(PORT)]
        )

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def udp_servers():
    servers = UdpServers()
    yield servers
    for name in list(servers.procs):
        servers.stop(name)


def ask(client, count: int) -> collections.Counter:
    out = client.run(sys.executable, "-c", UDP_CLIENT, VIP, str(PORT), str(count), timeout=count * 3 + 10)
    return collections.Counter(out.split("\n")[i].split()[0] for i in range(count))


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
    assert ask(client, 12) == {"udp-a": 12}

    udp_servers.start(b, "udp-b")
    wait_until(lambda: {b["id"]: b["health"] for b in agent.lb(lb_id)["backends"]}["be-b"] == "up", 15, "be-b back")
    wait_until(lambda: "udp-b" in ask(client, 12), 15, "new flows on be-b again")
