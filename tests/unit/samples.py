"""Sample bodies and helpers the unit tests share.

The example state, load balancer bodies, golden files, haproxy checks and bounded waits.
"""

import asyncio
import copy
import functools
import json
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from devtools.topology import self_signed_certificate
from lbagent.desired.members import Member
from lbagent.desired.model import parse_desired_state
from lbagent.haproxy.render import HaproxyConfig, render_base, render_config

EXAMPLE = json.loads((Path(__file__).parent / "data" / "example_state.json").read_text())
TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def state(generation, lbs=None):
    body = copy.deepcopy(EXAMPLE)
    body["generation"] = generation
    if lbs is not None:
        body["loadbalancers"] = lbs
    return body


def lb_body(lb_id, ip="198.18.0.12", backends=("be-1",)):
    lb = copy.deepcopy(EXAMPLE["loadbalancers"][0])
    lb["id"] = lb_id
    lb["network"]["ip"] = ip
    lb["network"]["mac"] = f"00:22:0a:00:00:{int(ip.rsplit('.', 1)[1]):02x}"
    lb["listeners"] = [{"id": "lsn-1", "listener_type": "tcp", "listener_port": 80, "backend_group_id": "bg-1"}]
    lb["backend_groups"] = [
        {"id": "bg-1", "backends": [{"id": b, "address": "198.18.0.21", "port": 8000} for b in backends]}
    ]
    return lb


def pod_body(pod_id, ip, ready=True, app="web"):
    return {
        "id": pod_id,
        "namespace": "shop",
        "ip": ip,
        "ready": ready,
        "labels": {"app": app},
        "ports": [{"name": "http", "port": 8080, "protocol": "tcp"}],
    }


def selecting_lb(lb_id, ip, app):
    lb = lb_body(lb_id, ip=ip)
    lb["backend_groups"] = [
        {"id": "bg-1", "backends": [], "pod_selector": {"namespace": "shop", "labels": {"app": app}, "port": "http"}}
    ]
    return lb


def two_subnets(generation, lbs, mtu2=1442, pods=()):
    body = state(generation, lbs)
    body["subnets"] = [
        EXAMPLE["subnets"][0],
        {"id": "net-2", "cidr": "198.18.1.0/24", "gateway": "198.18.1.1", "mtu": mtu2},
    ]
    body["pods"] = list(pods)
    return body


def on_net2(lb):
    lb["network"]["subnet_id"] = "net-2"
    lb["network"]["ip"] = lb["network"]["ip"].replace("198.18.0.", "198.18.1.")
    return lb


GOLDEN = Path(__file__).parent / "golden"


HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


PORTS = {"be-1": 1025, "be-2": 1026, "be-3": 1027}


@functools.cache
def certificate(common_name: str) -> dict[str, str]:
    """A real self-signed certificate and key (haproxy -c loads them), made once per name."""
    cert, key = self_signed_certificate(common_name)
    return {"certificate": cert, "private_key": key}


def sample_members(lb):
    members = {
        group.id: [Member(b.id, b.address, b.port, b.weight, b.send_proxy, b.ssl, PORTS[b.id]) for b in group.backends]
        for group in lb.backend_groups
    }
    # A pod-selected member: its key carries a '/'.
    members["bg-web"].append(Member("bg-web/pod-9", "198.18.0.31", 8080, 2, "off", False, 1028))
    return members


def write_checkable(directory: Path, config: HaproxyConfig, lb_id: str, prometheus_listen: str = "") -> list[Path]:
    """Base file (crt-base under `directory`), the load balancer's file and its files: what haproxy -c reads."""
    certs = directory / "certs"
    for name, content in config.files.items():
        path = certs / lb_id / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    base = directory / "haproxy.cfg"
    base.write_text(render_base(directory, prometheus_listen=prometheus_listen, crt_base=certs))
    lb_file = directory / "lb.cfg"
    lb_file.write_text(config.text)
    return [base, lb_file]


def assert_golden(name: str, text: str) -> None:
    """`text` is the golden file `name`. Only `make golden` (LBAGENT_UPDATE_GOLDEN=1)
    rewrites golden files, and a test that rewrote one is skipped, never passed:
    a comparison with what it has just written could not fail."""
    path = GOLDEN / name
    if os.environ.get("LBAGENT_UPDATE_GOLDEN") == "1":
        path.write_text(text)
        pytest.skip(f"rewrote {path}: review the diff")
    assert text == path.read_text()


def haproxy_check(*paths: Path) -> subprocess.CompletedProcess:
    if not Path(HAPROXY).exists():
        if os.geteuid() == 0:  # as root `make deps` has run: a missing haproxy is a broken set-up
            pytest.fail(f"haproxy is not installed at {HAPROXY} (make deps installs it)")
        pytest.skip("haproxy is not installed (make deps installs it)")
    command = [HAPROXY, "-c"]
    for path in paths:
        command += ["-f", str(path)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


WAIT = 10.0  # seconds: the bound of every wait below


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def until(condition, what: str, timeout: float = WAIT):
    """Poll an async or plain condition until it holds; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def haproxy_pids_for(run_dir: Path) -> list[int]:
    """Processes whose command line loads this test's haproxy.cfg (its unique temporary path)."""
    marker = str(run_dir / "haproxy" / "haproxy.cfg")
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in (proc.info["cmdline"] or []):
            pids.append(proc.info["pid"])
    return pids


def only_loadbalancer(lb_id: str, listeners: list[dict], backend_groups: list[dict]):
    """The validated model of a state holding this one load balancer on 198.18.0.0/24."""
    state = parse_desired_state(
        {
            "generation": 1,
            "subnets": [{"id": "net-1", "cidr": "198.18.0.0/24", "gateway": "198.18.0.1"}],
            "loadbalancers": [
                {
                    "id": lb_id,
                    "network": {"subnet_id": "net-1", "ip": "198.18.0.12", "mac": "00:22:0a:00:00:12"},
                    "listeners": listeners,
                    "backend_groups": backend_groups,
                }
            ],
        }
    )
    return state.loadbalancers[0]


def lb_config(lb_id: str, listeners: list[dict], backend_port: int, outer: str = "127.0.0.1") -> HaproxyConfig:
    groups = [{"id": "g", "backends": [{"id": "be-1", "address": "198.18.0.21", "port": 80}]}]
    members = {"g": [Member("be-1", "198.18.0.21", 80, 1, "off", False, backend_port)]}
    return render_config(only_loadbalancer(lb_id, listeners, groups), outer, members, inner="127.0.0.1")


def lb_text(
    lb_id: str, port: int, backend_port: int, health_check: dict | None = None, outer: str = "127.0.0.1", **fields
) -> str:
    listener = {"id": "l", "listener_type": "tcp", "listener_port": port, "backend_group_id": "g", **fields}
    if health_check:
        listener["health_check"] = health_check
    return lb_config(lb_id, [listener], backend_port, outer).text


async def echo_through(port: int, payload: bytes = b"ping\n", host: str = "127.0.0.1") -> bool:
    """True if a connection to 127.0.0.1:port echoes `payload` back (through haproxy to the echo server)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), WAIT)
    except OSError:
        return False
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), WAIT) == payload
    except (OSError, asyncio.IncompleteReadError):
        return False
    finally:
        writer.close()
