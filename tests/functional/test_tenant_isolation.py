"""Tenants share one haproxy, not its connection slots: a client that holds every
connection one load balancer's listener may take leaves another load balancer
answering, through OVN, from a VPC client."""

from __future__ import annotations

import subprocess
import sys

from devtools.sandbox import CommandError
from lbagent.haproxy.sockets import send_command

from agentproc import wait_until
from helpers import wait_bound
from lbstate import backend, desired, loadbalancer, tcp_listener

LIMIT = 4  # [haproxy] default_listener_maxconn of this test's agent
TENANTS = {"a": ("198.18.0.12", "00:22:0a:00:00:12"), "b": ("198.18.0.13", "00:22:0a:00:00:13")}
PORT = 80

# argv: address, port, count. Opens `count` connections, says so, then holds
# them, sending nothing, until it is ended.
HOLDER = (
    "import socket, sys, time\n"
    "held = [socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) for _ in range(int(sys.argv[3]))]\n"
    "print('held', len(held), flush=True)\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)


def tenant(lb_id: str, vip: str, mac: str, listener: dict) -> dict:
    return loadbalancer(lb_id, vip, mac, [listener], {"bg-1": [backend("be-a", "198.18.0.21")]})


def current_connections(agent, frontend: str) -> int:
    """haproxy's own count of the frontend's open connections (`show stat` scur)."""
    text = send_command(agent.run_dir / "haproxy" / "stats.sock", "show stat")
    header, *rows = text.splitlines()
    names = header.lstrip("# ").split(",")
    for row in rows:
        values = dict(zip(names, row.split(","), strict=False))
        if values.get("pxname") == frontend and values.get("svname") == "FRONTEND":
            return int(values["scur"])
    raise AssertionError(f"no frontend {frontend} in show stat")


def served(client, url: str) -> bool:
    try:
        return client.curl(url, timeout=3).strip() == "backend-a"
    except CommandError:
        return False


def test_a_tenant_holding_its_connections_leaves_the_others_served(agent_factory, vpc, prefix):
    vpc.add_host("a", "198.18.0.21", http_text="backend-a")
    client = vpc.add_host("client", "198.18.0.31")
    ids = {name: f"{prefix}-{name}" for name in TENANTS}
    for name, (vip, mac) in TENANTS.items():
        vpc.add_lb_port(ids[name], mac, vip)
    agent = agent_factory(extra_config=f"[haproxy]\ndefault_listener_maxconn = {LIMIT}\n")
    lbs = [
        tenant(ids["a"], *TENANTS["a"], tcp_listener("raw", PORT)),
        tenant(ids["b"], *TENANTS["b"], {**tcp_listener("web", PORT), "listener_type": "http"}),
    ]
    code, body = agent.refresh(desired(1, *lbs))
    assert code == 200, body
    for lb_id in ids.values():
        wait_bound(agent, lb_id)
    url_a, url_b = (f"http://{TENANTS[name][0]}:{PORT}/" for name in ("a", "b"))
    assert served(client, url_a) and served(client, url_b)

    holder = subprocess.Popen(
        ["ip", "netns", "exec", client.netns, sys.executable, "-c", HOLDER, TENANTS["a"][0], str(PORT), str(LIMIT)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == f"held {LIMIT}", "the holder could not connect"
        frontend = f"fe:{ids['a']}:raw"
        wait_until(lambda: current_connections(agent, frontend) == LIMIT, 10, f"{LIMIT} connections held on A")

        # A's next connection waits for a slot of its own; B's are served as ever.
        assert not served(client, url_a)
        for _ in range(3):
            assert served(client, url_b)
        assert current_connections(agent, frontend) == LIMIT
    finally:
        holder.kill()  # `ip netns exec` execs the interpreter: this pid is the holder itself
        holder.wait(10)
        holder.stdout.close()
    wait_until(lambda: served(client, url_a), 15, "A served again once its clients let go")
