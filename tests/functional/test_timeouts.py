"""A listener's `timeouts` reach the traffic: `client_idle` closes a client
connection that sends nothing, `backend_connect` gives up on a backend whose
packets are dropped, each in about the seconds asked for."""

from __future__ import annotations

import sys

from helpers import MAC, VIP, wait_bound
from lbstate import backend, desired, loadbalancer, tcp_listener

# argv: host, port, send. Connects, sends `send` (may be empty), reads until the
# peer closes; prints "<seconds from connect to close> <bytes read>".
HOLD_OPEN = (
    "import socket, sys, time\n"
    "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)\n"
    "s.settimeout(15)\n"
    "started = time.monotonic()\n"
    "s.sendall(sys.argv[3].encode())\n"
    "got = 0\n"
    "try:\n"
    "    while chunk := s.recv(4096):\n"
    "        got += len(chunk)\n"
    "except socket.timeout:\n"
    "    got = -1\n"
    "except OSError:\n"
    "    pass\n"
    "print(round(time.monotonic() - started, 2), got)\n"
)


def hold_open(client, port: int, send: str = "") -> tuple[float, int]:
    """Seconds until the load balancer closed the connection, and bytes read (-1: never closed in 15 s)."""
    seconds, got = client.run(sys.executable, "-c", HOLD_OPEN, VIP, str(port), send, timeout=30).split()
    return float(seconds), int(got)


def test_client_idle_closes_an_idle_client_connection(agent_factory, vpc, prefix):
    vpc.add_host("a", "198.18.0.21", http_text="backend-a")
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-idle"
    vpc.add_lb_port(lb_id, MAC, VIP)
    agent = agent_factory()
    listener = tcp_listener("lsn-80", 80, timeouts={"client_idle": 2})
    lb = loadbalancer(lb_id, VIP, MAC, [listener], {"bg-1": [backend("be-a", "198.18.0.21")]})
    assert agent.refresh(desired(1, lb))[0] == 200
    wait_bound(agent, lb_id)
    assert client.curl(f"http://{VIP}:80/").strip() == "backend-a"  # the listener serves

    seconds, got = hold_open(client, 80)
    assert got == 0 and 1.5 <= seconds <= 4, (seconds, got)


def black_holed_request(agent_factory, vpc, prefix) -> tuple[str, float]:
    """A request through an http listener with `backend_connect: 2` to its one backend,
    in the VPC, whose packets are all dropped: (status code, seconds until the answer);
    status "000" when the connection closes without one."""
    hole = vpc.add_host("hole", "198.18.0.23")
    hole.run("iptables-legacy", "-A", "INPUT", "-p", "tcp", "--dport", "8000", "-j", "DROP")
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-conn"
    vpc.add_lb_port(lb_id, MAC, VIP)
    agent = agent_factory()
    listener = {
        "id": "lsn-80",
        "listener_type": "http",
        "listener_port": 80,
        "backend_group_id": "bg-1",
        "timeouts": {"backend_connect": 2},
    }
    lb = loadbalancer(lb_id, VIP, MAC, [listener], {"bg-1": [backend("be-hole", hole.ip)]})
    assert agent.refresh(desired(1, lb))[0] == 200
    wait_bound(agent, lb_id)
    out = client.run(
        "curl", "-sS", "--noproxy", "*", "--max-time", "15", "-o", "/dev/null",
        "-w", "%{http_code} %{time_total}", f"http://{VIP}:80/", timeout=30, check=False,
    )  # fmt: skip
    code, seconds = out.split()
    return code, float(seconds)


def test_backend_connect_bounds_each_attempt_on_a_black_holed_backend(agent_factory, vpc, prefix):
    code, seconds = black_holed_request(agent_factory, vpc, prefix)
    # backend_connect bounds each attempt, and haproxy makes four (`retries 3`,
    # docs/api.md): about 8 s here; with the default 5 s per attempt it would
    # still be waiting at curl's 15 s.
    assert code in {"502", "503"} and 6 <= seconds <= 11, (code, seconds)
