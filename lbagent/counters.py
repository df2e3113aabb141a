"""Process-wide counters of side effects, exported as Prometheus metrics.

Every module that writes to the kernel, OVS or haproxy counts its writes here,
so "a pass over a converged load balancer writes nothing" is something tests
and operators can observe rather than take on trust.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

HOST_WRITES = Counter(
    "lbagent_host_writes_total",
    "Writes made to the kernel (netlink, ioctl, sysctl), iptables and OVSDB",
    ["kind"],
)
WRITE_KINDS = ("netlink", "iptables", "ovsdb")
STATE_WRITES = Counter("lbagent_state_writes_total", "Atomic writes of the state file")
RECONCILE_SECONDS = Histogram("lbagent_reconcile_seconds", "Duration of one load balancer's reconcile pass")
RECONCILE_ERRORS = Counter("lbagent_reconcile_errors_total", "Failed reconcile passes")


def count_write(kind: str, amount: int = 1) -> None:
    HOST_WRITES.labels(kind).inc(amount)


def write_counts() -> dict[str, int]:
    return {
        kind: int(REGISTRY.get_sample_value("lbagent_host_writes_total", {"kind": kind}) or 0)
        for kind in WRITE_KINDS
    }

LB_STATES = ("pending", "ready", "error", "deleting")
LOADBALANCERS = Gauge("lbagent_loadbalancers", "Load balancers by state", ["state"])


def set_lb_states(states) -> None:
    counts = dict.fromkeys(LB_STATES, 0)
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    for state, count in counts.items():
        LOADBALANCERS.labels(state).set(count)
