"""One VPC, one agent and HTTP/TLS clients shared by the tests of one listener module.

Building a VPC with backends and clients and starting an agent takes several
seconds; the test_listeners_* modules each build one `ListenerEnv` (module
scope, on the session's sandbox) and put all their listeners on it. Every
object carries the env's unique prefix and is removed at the end, pass or
fail: the agent's with `lbagent cleanup`, the VPC's with `Vpc.cleanup`.

Backends answer their name on the first line of the body and, as JSON on the
second, what they saw (peer address, headers, PROXY line), and set a session
cookie of their own; see devtools.programs.HTTPD_CODE.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from devtools.sandbox import CommandError
from devtools.topology import Vpc, VpcHost

from agentproc import AgentProcess, wait_until
from lbstate import SUBNET

APP_COOKIE = "APPSESSION"
# Backend name -> VPC address. Clients: 198.18.0.31 and up.
BACKEND_ADDRESSES = {"a": "198.18.0.21", "b": "198.18.0.22", "c": "198.18.0.23"}
CURL = ("curl", "-sS", "--noproxy", "*", "--max-time", "5")


@dataclass
class Reply:
    status: int
    headers: dict[str, list[str]]  # lower-case name -> values
    body: str

    def header(self, name: str) -> str | None:
        values = self.headers.get(name.lower())
        return values[-1] if values else None

    @property
    def backend(self) -> str:
        return self.body.split("\n", 1)[0]

    @property
    def seen(self) -> dict:
        """What the backend saw (its echo line); header names in lower case, as haproxy sends them."""
        seen = json.loads(self.body.split("\n")[1])
        seen["headers"] = {name.lower(): value for name, value in seen["headers"].items()}
        return seen


def parse_reply(output: str) -> Reply:
    """curl -D - output (as text: line ends already "\\n"): the last header block and the body."""
    output = output.replace("\r\n", "\n")
    head, _, body = output.partition("\n\n")
    while head.startswith("HTTP/") and " 100 " in head.split("\n", 1)[0]:
        head, _, body = body.partition("\n\n")
    lines = head.split("\n")
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return Reply(int(lines[0].split()[1]), headers, body)


def request(client: VpcHost, url: str, *curl_args: str, host: str | None = None) -> Reply:
    """One request from `client`; CommandError when no HTTP answer comes (refused, reset, timeout)."""
    args = [*CURL, "-D", "-", *curl_args]
    if host:
        args += ["-H", f"Host: {host}"]
    return parse_reply(client.run(*args, url, timeout=10))


def refused(client: VpcHost, url: str) -> bool:
    """True when the connection gets no HTTP answer at all (the access list's reject)."""
    try:
        request(client, url)
    except CommandError:
        return True
    return False


def status_codes(client: VpcHost, url: str, count: int) -> list[int]:
    """`count` requests as fast as one curl sends them (one connection); their status codes."""
    out = client.run(*CURL, "-w", "%{http_code}\\n", *(["-o", "/dev/null", url] * count), timeout=30)
    return [int(code) for code in out.split()]


def backends_of(client: VpcHost, url: str, count: int, *curl_args: str, host: str | None = None) -> list[str]:
    return [request(client, url, *curl_args, host=host).backend for _ in range(count)]


@dataclass
class ListenerEnv:
    vpc: Vpc
    agent: AgentProcess
    backends: dict[str, VpcHost]
    clients: list[VpcHost]
    work: Path
    generation: int = 0
    _last: dict = field(default_factory=dict)

    @property
    def client(self) -> VpcHost:
        return self.clients[0]

    def push(self, *lbs: dict, wait: float = 60) -> dict:
        """A refresh with the next generation; the agent's ?wait answer (200: every load balancer settled)."""
        self.generation += 1
        body = {"generation": self.generation, "subnets": [SUBNET], "loadbalancers": list(lbs)}
        code, answer = self.agent.refresh(body, wait=wait)
        assert code == 200, answer
        return answer

    def apply(self, *lbs: dict, timeout: float = 60) -> None:
        """A refresh every load balancer of which must reach `ready` at its generation (a failed
        pass is retried by the agent), and be bound in OVN if it has a port."""
        self.push(*lbs, wait=timeout)
        ids = {lb["id"] for lb in lbs}

        def converged():
            states = {lb["id"]: lb for lb in self.agent.status()["loadbalancers"] if lb["id"] in ids}
            return len(states) == len(ids) and all(
                lb["state"] == "ready"
                and lb["generation"] == self.generation
                and (lb["id"] not in self.vpc.lb_ports or lb["ovn_installed"])
                for lb in states.values()
            )

        wait_until(converged, timeout, f"generation {self.generation} ready")

    def health(self, lb_id: str) -> dict[str, str]:
        return {b["id"]: b["health"] for b in self.agent.lb(lb_id)["backends"]}

    def wait_health(self, lb_id: str, expected: dict[str, str], timeout: float = 20) -> None:
        wait_until(
            lambda: all(self.health(lb_id).get(k) == v for k, v in expected.items()),
            timeout,
            f"health {expected} of {lb_id} (now {self.health(lb_id)})",
        )

    def restart_backend(self, name: str) -> None:
        """Start `name`'s HTTP server again with the env's options (after stop_http)."""
        start_backend(self.backends[name], name)


def start_backend(host: VpcHost, name: str, **options) -> None:
    """The env's backend server: its name, what it saw, its own cookie, HTTP/1.1 (haproxy
    compresses only HTTP/1.1 answers); `options` override (devtools.programs.HTTPD_CODE)."""
    host.start_http(f"backend-{name}", **{"echo": True, "set_cookie": APP_COOKIE, "http11": True, **options})


@contextmanager
def listener_env(
    sandbox,
    base: Path,
    backends=("a", "b"),
    clients: int = 1,
    lb_ports: dict | None = None,
    resync_interval: float = 30.0,
    extra_config: str = "",
):
    """A VPC with echoing backends, `clients` clients (198.18.0.31 up), the load balancer
    ports `lb_ports` (lb id suffix -> (mac, ip)), and a running agent (`extra_config`
    appended to its configuration). Yields the env;
    the load balancer ids are "<prefix>-<suffix>" (env.vpc.prefix)."""
    prefix = "l" + secrets.token_hex(3)[:5]
    vpc = Vpc(sandbox, prefix)
    agent = None
    try:
        hosts = {}
        for name in backends:
            hosts[name] = vpc.add_host(name, BACKEND_ADDRESSES[name])
            start_backend(hosts[name], name)
        client_hosts = [vpc.add_host(f"client{i}", f"198.18.0.{31 + i}") for i in range(clients)]
        for suffix, (mac, ip) in (lb_ports or {}).items():
            vpc.add_lb_port(f"{prefix}-{suffix}", mac, ip)
        agent = AgentProcess(
            base / "agent",
            sandbox.ovs_db,
            host=f"{prefix}-gw",
            resync_interval=resync_interval,
            extra_config=extra_config,
            env=sandbox.env,
        ).start()
        yield ListenerEnv(vpc, agent, hosts, client_hosts, base)
    finally:
        try:
            if agent is not None:
                agent.destroy()
        finally:
            vpc.cleanup()
            shutil.rmtree(base, ignore_errors=True)


def openssl(client: VpcHost, port_url: str, *args: str) -> subprocess.CompletedProcess:
    """`openssl s_client` from the client's namespace; the completed process (never raises on failure)."""
    command = ["ip", "netns", "exec", client.netns, "openssl", "s_client", "-connect", port_url, *args]
    return subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=15, check=False)
