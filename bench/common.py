"""What every part of the benchmark shares: its addresses, its configuration, the bodies it posts."""

from __future__ import annotations

import ipaddress
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "functional"))  # the functional tests' agent runner and bodies

from bench.traffic import BACKEND_PORT  # noqa: E402

from lbstate import backend, loadbalancer, tcp_listener  # noqa: E402

SUBNET = {"id": "net-1", "cidr": "198.18.0.0/16", "gateway": "198.18.0.1", "mtu": 1442}
# The same subnet with its IPv6 prefix, posted only while the IPv6 leg runs: the IPv4 figures are
# of a subnet (and load balancers) without one.
SUBNET6 = {**SUBNET, "cidr6": "2001:db8:0:1::/64", "gateway6": "2001:db8:0:1::1"}
BACKEND_HOSTS = {"b1": "198.18.0.21", "b2": "198.18.0.22", "b3": "198.18.0.23", "b4": "198.18.0.24"}
SPARE_HOSTS = {"s1": "198.18.0.25", "s2": "198.18.0.26", "s3": "198.18.0.27"}
CLIENT = ("client", "198.18.0.31")
FIRST_VIP = ipaddress.IPv4Address("198.18.4.1")
FIRST_VIP6 = ipaddress.IPv6Address("2001:db8:0:1::4:1")


def ip6_of(ip: str) -> str:
    """A VPC host's IPv6 address: its IPv4 address's last octet, as written, in SUBNET6's prefix
    (198.18.0.21 → 2001:db8:0:1::21), so the two addresses of a host are told apart at a glance."""
    return f"2001:db8:0:1::{ip.rsplit('.', 1)[1]}"


BACKEND_HOSTS6 = {name: ip6_of(ip) for name, ip in BACKEND_HOSTS.items()}
SPARE_HOSTS6 = {name: ip6_of(ip) for name, ip in SPARE_HOSTS.items()}
CLIENT6 = ip6_of(CLIENT[1])
OVN_LB_VIP = "198.19.0.10"
LISTENER_PORTS = (80, 81)
PROFILE_DIR = Path("/var/tmp/lbagent-bench-profiles")
P3_CHANGE_LIMIT = 60.0  # seconds one change may take to reach the client before it counts as missed
P3_GIVE_UP = 3  # changes missed before P3 stops trying
P3_POLL_SAMPLE = 1.0  # seconds of polling before the changes, to time one round of requests on the data path
DRIFT_REPAIR_LIMIT = 120.0  # seconds a deleted veth may take to carry traffic again before it counts as missed
P5_RELOAD_LIMIT = 60.0  # seconds one change may take to show up as a reload
P1_REPEAT_UP_TO = 200  # N up to which P1 is measured `p1_runs` times (a run of 100 takes seconds)
RETIRE_BY_AGENT = 4096  # above this many load balancers the teardown does not wait for the agent


@dataclass
class BenchConfig:
    ns: list[int] = field(default_factory=lambda: [100, 1000])
    p3_small: int = 10
    p2_seconds: float = 40.0
    # The largest N's agent resyncs every load balancer this often (its resync_interval, with
    # resync_rate = N / p2_every): P2 measures the CPU of checking all of them that often.
    p2_every: float = 30.0
    changes: int = 20
    reloads: int = 20
    wrk_seconds: float = 10.0
    connections: int = 32
    # P4: the agent's leg and its reference legs run one after the other this many times, each
    # for wrk_seconds; the figure is the median of the rounds' ratios (bench/p4rounds.py).
    p4_rounds: int = 3
    converge_timeout: float = 300.0
    policy_rules: bool = True
    p1_only: bool = False  # for profiling convergence: no P2-P6
    # P7 (`make bench-scale`): P1 at each N, the agent's memory once converged, and at the largest
    # N `lbagent cleanup` timed with every load balancer still in place (P8); the agent sizes the
    # kernel's neighbour tables, which the run puts back afterwards.
    scale: bool = False
    p1_runs: int = 3  # floor-then-agent pairs at each N up to P1_REPEAT_UP_TO; the median pair is the figure
    profile: bool = False
    ipv6: bool = True  # the IPv6 leg: dual-stack P1, P3 with an IPv6 backend, P4 with an IPv6 client
    output: Path | None = REPO / "bench" / "results.json"

    def __post_init__(self) -> None:
        self.ns = sorted(set(self.ns))
        if not self.ns or self.ns[0] < 1 or self.ns[-1] > 60000:
            raise ValueError("every N must be between 1 and 60000")
        if self.p1_runs < 1:
            raise ValueError("p1_runs must be at least 1")
        if self.p4_rounds < 1:
            raise ValueError("p4_rounds must be at least 1")


_T0 = time.monotonic()


def say(message: str) -> None:
    """Progress lines carry the seconds since start, so a daemon's log can be lined up with them."""
    if message.startswith("==>"):
        message = f"[{time.monotonic() - _T0:7.1f}s] {message}"
    print(message, flush=True)


def lb_id(prefix: str, index: int) -> str:
    return f"{prefix}-{index:05d}"


def four_backends() -> list[dict]:
    return [backend(f"be-{k}", ip, BACKEND_PORT) for k, ip in enumerate(BACKEND_HOSTS.values(), 1)]


def vip6_of(index: int) -> str:
    return str(FIRST_VIP6 + index)


def lb_body(prefix: str, index: int, members: list[dict] | None = None, dual_stack: bool = False, **listener) -> dict:
    """Load balancer `index`: its two listeners on `members` (the four backends); `dual_stack`
    gives it its IPv6 VIP as well (the subnet posted must then be SUBNET6)."""
    vip = FIRST_VIP + index
    mac = "0a:5a:" + ":".join(f"{b:02x}" for b in vip.packed)
    listeners = [tcp_listener(f"l{port}", port, **listener) for port in LISTENER_PORTS]
    body = loadbalancer(lb_id(prefix, index), str(vip), mac, listeners, {"bg-1": members or four_backends()})
    if dual_stack:
        body["network"]["ip6"] = vip6_of(index)
    return body
