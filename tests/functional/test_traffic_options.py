"""Traffic options with real traffic: X-Forwarded-Proto/-Port reach the backend,
backups serve only while their primary is down (over haproxy and in the
kernel for udp), health reasons name what the checks saw, a separate
health_check_port decides a member's health, and a member added with
slow_start ramps up to its share."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from agentproc import wait_until
from helpers import MAC, UDP_PORT, VIP, UdpServers, http_backends_of, udp_backends_of, wait_bound
from lbstate import backend, desired, loadbalancer, tcp_listener

PRIMARY, SPARE, OTHER = "198.18.0.21", "198.18.0.22", "198.18.0.23"
WAIT = 60  # seconds: the bound of every wait for the checks to see a change
FAST_CHECK = {"rise": 1, "fall": 1, "interval": 1, "timeout": 1}
# argv: name, port, status of /healthz. Answers every other path 200 with its name.
STATUS_SERVER = (
    "import http.server, sys\n"
    "NAME, PORT, HEALTH = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        code = HEALTH if self.path == '/healthz' else 200\n"
    "        body = (NAME + '\\n').encode()\n"
    "        self.send_response(code)\n"
    "        self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers()\n"
    "        self.wfile.write(body)\n"
    "    def log_message(self, *args):\n"
    "        pass\n"
    "http.server.ThreadingHTTPServer(('0.0.0.0', PORT), H).serve_forever()\n"
)


class StatusServers:
    """HTTP servers in VPC hosts whose /healthz answers a chosen status; stopped on exit."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def start(self, host, name: str, health_status: int, port: int = 8000) -> None:
        argv = ["ip", "netns", "exec", host.netns, sys.executable, "-c", STATUS_SERVER, name, str(port)]
        self.procs.append(subprocess.Popen([*argv, str(health_status)]))
        wait_until(lambda: host.run("curl", "-s", f"http://127.0.0.1:{port}/", check=False).strip() == name, 10, name)

    def __enter__(self) -> StatusServers:
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.terminate()
            proc.wait(10)


def group(backends: list[dict], **options) -> dict:
    return {"backends": backends, **options}


def lb_with_groups(lb_id: str, listeners: list[dict], groups: dict[str, dict]) -> dict:
    lb = loadbalancer(lb_id, VIP, MAC, listeners, {})
    lb["backend_groups"] = [{"id": gid, **g} for gid, g in groups.items()]
    return lb


def http_listener(listener_id: str, port: int, group_id: str = "bg-1", **extra) -> dict:
    return {**tcp_listener(listener_id, port, group_id, **extra), "listener_type": "http"}


def backends_by_id(agent, lb_id: str) -> dict[str, dict]:
    return {b["id"]: b for b in agent.lb(lb_id)["backends"]}


def wait_health(agent, lb_id: str, backend_id: str, health: str, reason: str | None = None) -> dict:
    def seen():
        entry = backends_by_id(agent, lb_id).get(backend_id, {})
        return entry.get("health") == health and (reason is None or entry.get("health_reason") == reason) and entry

    return wait_until(seen, WAIT, f"{backend_id} {health} ({reason})", interval=0.5)


def start_agent(agent_factory, vpc, lb_id: str, lb: dict):
    vpc.add_lb_port(lb_id, MAC, VIP)
    agent = agent_factory()
    code, body = agent.refresh(desired(1, lb))
    assert code == 200, body
    wait_bound(agent, lb_id)
    return agent


def test_the_backend_sees_x_forwarded_proto_and_port(agent_factory, vpc, prefix):
    host = vpc.add_host("a", PRIMARY)
    host.start_http("a", echo=True)
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-xfp"
    lb = loadbalancer(
        lb_id, VIP, MAC, [http_listener("web", 80, x_forwarded_proto=True)], {"bg-1": [backend("be-a", PRIMARY)]}
    )
    start_agent(agent_factory, vpc, lb_id, lb)
    seen = json.loads(client.curl(f"http://{VIP}:80/").split("\n")[1])
    headers = {name.lower(): value for name, value in seen["headers"].items()}
    assert (headers.get("x-forwarded-proto"), headers.get("x-forwarded-port")) == ("http", "80"), headers


def only(counts, name: str, total: int) -> bool:
    return counts.get(name, 0) == total


def only_udp(counts, name: str, total: int) -> bool:
    """Every datagram answered by `name`, but for one lost on a busy machine (UDP is
    not retried): an answer from any other backend still fails."""
    return set(counts) <= {name, "error"} and counts.get("error", 0) <= 1 and sum(counts.values()) == total


def test_a_backup_serves_only_while_the_primary_is_down_and_its_reason_shows(agent_factory, vpc, prefix):
    primary = vpc.add_host("a", PRIMARY, http_text="primary")
    vpc.add_host("b", SPARE, http_text="spare")
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-bak"
    check = {"type": "http", "uri": "/", **FAST_CHECK}
    backends = [backend("main", PRIMARY), backend("spare", SPARE, backup=True)]
    lb = loadbalancer(lb_id, VIP, MAC, [http_listener("web", 80, health_check=check)], {"bg-1": backends})
    agent = start_agent(agent_factory, vpc, lb_id, lb)
    url = f"http://{VIP}:80/"
    wait_health(agent, lb_id, "main", "up", "ok")
    assert only(http_backends_of(client, url, 30), "primary", 30)

    primary.stop_http()
    down = wait_health(agent, lb_id, "main", "down", "connect_refused")
    assert down["backup"] is False and down["health_since"]
    assert backends_by_id(agent, lb_id)["spare"]["backup"] is True
    assert only(http_backends_of(client, url, 30), "spare", 30)
    shown = agent.cli("status", lb_id).stdout
    assert "down: connect_refused" in shown and "backup" in shown, shown

    primary.start_http("primary")
    wait_health(agent, lb_id, "main", "up", "ok")
    assert only(http_backends_of(client, url, 30), "primary", 30)


def test_a_udp_backup_gets_new_flows_only_while_the_primary_is_down(agent_factory, vpc, prefix):
    primary = vpc.add_host("a", PRIMARY)
    spare = vpc.add_host("b", SPARE)
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-ubak"
    check = {"type": "udp", "udp_request": "ping", "udp_expect": "ping", **FAST_CHECK}
    listener = {
        "id": "dns",
        "listener_type": "udp",
        "listener_port": UDP_PORT,
        "backend_group_id": "bg-1",
        "health_check": check,
    }
    backends = [backend("main", PRIMARY, UDP_PORT), backend("spare", SPARE, UDP_PORT, backup=True)]
    with UdpServers() as servers:
        servers.start(primary, "primary")
        servers.start(spare, "spare")
        agent = start_agent(agent_factory, vpc, lb_id, loadbalancer(lb_id, VIP, MAC, [listener], {"bg-1": backends}))
        wait_health(agent, lb_id, "main", "up", "ok")
        wait_health(agent, lb_id, "spare", "up", "ok")
        # The first flows may wait for the namespace's neighbours: until one is answered.
        wait_until(lambda: udp_backends_of(client, VIP, UDP_PORT, 1).get("primary"), WAIT, "a first answer")
        assert only_udp(udp_backends_of(client, VIP, UDP_PORT, 30), "primary", 30)

        servers.stop("primary")
        down = wait_health(agent, lb_id, "main", "down", "connect_refused")
        assert down["health_since"]
        wait_until(lambda: only(udp_backends_of(client, VIP, UDP_PORT, 5), "spare", 5), WAIT, "flows on the backup")
        assert only_udp(udp_backends_of(client, VIP, UDP_PORT, 30), "spare", 30)

        servers.start(primary, "primary")
        wait_health(agent, lb_id, "main", "up", "ok")
        wait_until(lambda: only(udp_backends_of(client, VIP, UDP_PORT, 5), "primary", 5), WAIT, "flows on the primary")
        assert only_udp(udp_backends_of(client, VIP, UDP_PORT, 30), "primary", 30)


def test_health_reasons_name_a_bad_status_and_a_closed_health_check_port(agent_factory, vpc, prefix):
    healthy, failing, probed = (vpc.add_host(n, ip) for n, ip in (("a", PRIMARY), ("b", SPARE), ("c", OTHER)))
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-why"
    check = {"type": "http", "uri": "/healthz", "http_code": "http_2xx", **FAST_CHECK}
    listeners = [
        http_listener("web", 80, "bg-1", health_check=check),
        http_listener("alt", 81, "bg-2", health_check=check),
    ]
    groups = {
        "bg-1": group([backend("healthy", PRIMARY), backend("failing", SPARE)]),
        # c serves on 8000, but its checks go to 8001, where nothing listens.
        "bg-2": group([backend("probed", OTHER)], health_check_port=8001),
    }
    with StatusServers() as servers:
        servers.start(healthy, "healthy", 200)
        servers.start(failing, "failing", 503)
        servers.start(probed, "probed", 200)
        agent = start_agent(agent_factory, vpc, lb_id, lb_with_groups(lb_id, listeners, groups))
        wait_health(agent, lb_id, "healthy", "up", "ok")
        wait_health(agent, lb_id, "failing", "down", "bad_status:503")
        wait_health(agent, lb_id, "probed", "down", "connect_refused")
        assert only(http_backends_of(client, f"http://{VIP}:80/", 20), "healthy", 20)
        assert probed.run("curl", "-s", "http://127.0.0.1:8000/").strip() == "probed"  # it does serve
        assert http_backends_of(client, f"http://{VIP}:81/", 5).get("probed", 0) == 0


@pytest.mark.parametrize("slow_start", [15])
def test_a_member_added_with_slow_start_ramps_up_its_share(agent_factory, vpc, prefix, slow_start):
    vpc.add_host("a", PRIMARY, http_text="old")
    vpc.add_host("b", SPARE, http_text="new")
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-slow"
    check = {"type": "tcp", **FAST_CHECK}
    listener = http_listener("web", 80, scheduler="wrr", health_check=check)
    old = backend("old", PRIMARY, weight=100)
    lb = lb_with_groups(lb_id, [listener], {"bg-1": group([old], slow_start=slow_start)})
    agent = start_agent(agent_factory, vpc, lb_id, lb)
    before = agent.status()["agent"]["haproxy"]["live_updates"]

    lb = lb_with_groups(
        lb_id, [listener], {"bg-1": group([old, backend("new", SPARE, weight=100)], slow_start=slow_start)}
    )
    code, body = agent.refresh(desired(2, lb))
    assert code == 200, body
    assert agent.status()["agent"]["haproxy"]["live_updates"] > before  # added live, no reload
    wait_health(agent, lb_id, "new", "up")
    shares = []
    ramp_over = time.monotonic() + slow_start + 3
    while time.monotonic() < ramp_over:  # one sample of 40 requests after another, over the ramp
        counts = http_backends_of(client, f"http://{VIP}:80/", 40)
        assert sum(counts.values()) == 40 and counts.get("error", 0) == 0, counts
        shares.append(counts.get("new", 0) / 40)
    third = max(1, len(shares) // 3)
    early, late = sum(shares[:third]) / third, sum(shares[-third:]) / third
    # At full weight at once it would take half from the start; ramping, it starts well below.
    assert early < 0.35 and late > early + 0.15, shares
