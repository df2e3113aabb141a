"""The agent's Prometheus metrics: counters of side effects, and figures read from the agent at scrape time.

Every module that writes to the kernel, OVS or haproxy counts its writes here,
so "a pass over a converged load balancer writes nothing" is something tests
and operators can observe rather than take on trust. Modules that own a work
queue register a depth function here (`track_queue`), read at scrape time.
Figures that the agent already keeps (haproxy reloads, retries, generation)
are read from it when Prometheus asks, by `AgentCollector`: copying them into
counters at every change would be a second truth to keep in step. The
collector runs on the event loop that owns them (cheap, nothing blocks).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from contextvars import ContextVar

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

_log = logging.getLogger("lbagent.changes")
# The load balancer a pass is working on; set by its task, carried into the
# namespace and OVS threads, so every change logs which load balancer it is for.
CURRENT_LB: ContextVar[str] = ContextVar("current_lb", default="-")

HOST_WRITES = Counter(
    "lbagent_host_writes_total",
    "Writes made to the kernel (netlink, ioctl, sysctl), iptables and OVSDB",
    ["kind"],
)
WRITE_KINDS = ("netlink", "iptables", "ovsdb")
STATE_WRITES = Counter("lbagent_state_writes_total", "Atomic writes of the state file")
RECONCILE_SECONDS = Histogram("lbagent_reconcile_seconds", "Duration of one load balancer's reconcile pass")
RECONCILE_ERRORS = Counter("lbagent_reconcile_errors_total", "Failed reconcile passes")
RESYNC_CHECKS = Counter(
    "lbagent_resync_checks_total",
    "Resyncs by what their first look found: unchanged (the pass stops there) or changed (a whole pass follows)",
    ["result"],
)
API_REQUESTS = Counter(
    "lbagent_api_requests_total",
    "HTTP API requests answered, by method, route template (never the raw path) and status code",
    ["method", "route", "code"],
)
OVSDB_CONNECTIONS = Counter("lbagent_ovsdb_connections_total", "OVSDB sessions established, the first one included")
OVSDB_RECONNECTS = Counter("lbagent_ovsdb_reconnects_total", "OVSDB sessions established after the first one")
HA_FAILOVERS = Counter(
    "lbagent_ha_failovers_total", "Leases this host took over because their holder stopped renewing them"
)
HA_RENEW_SECONDS = Histogram(
    "lbagent_ha_lease_renew_seconds",
    "Duration of one lease transaction (all the renewals and takeovers of one tick) on the Northbound database",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)


_writes_lock = threading.Lock()
_writes_so_far = 0


def count_write(kind: str, amount: int = 1, what: str = "") -> None:
    """Count (and log, one line per applied change) a write to the host."""
    global _writes_so_far
    HOST_WRITES.labels(kind).inc(amount)
    with _writes_lock:
        _writes_so_far += amount
    if what:
        _log.info("lb=%s object=%s action=%s", CURRENT_LB.get(), kind, what)


def writes_so_far() -> int:
    """Every write counted since the agent started, of any kind: cheap to read
    (what changed between two reads is that a write happened meanwhile)."""
    return _writes_so_far


def write_counts() -> dict[str, int]:
    return {
        kind: int(REGISTRY.get_sample_value("lbagent_host_writes_total", {"kind": kind}) or 0) for kind in WRITE_KINDS
    }


LB_STATES = ("pending", "ready", "error", "deleting")
LOADBALANCERS = Gauge("lbagent_loadbalancers", "Load balancers by state", ["state"])


def set_lb_states(states) -> None:
    counts = dict.fromkeys(LB_STATES, 0)
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    for state, count in counts.items():
        LOADBALANCERS.labels(state).set(count)


VIPS = Gauge("lbagent_vips", "VIPs of the desired load balancers, by address family", ["family"])


def set_vips(has_ipv6) -> None:
    """`has_ipv6`: per desired load balancer, whether it has an IPv6 VIP beside its IPv4 one."""
    flags = list(has_ipv6)
    VIPS.labels("ipv4").set(len(flags))
    VIPS.labels("ipv6").set(sum(flags))


# --- OVSDB sessions ------------------------------------------------------------

_ovsdb_lock = threading.Lock()  # called from the OVSDB IDL's own thread
_ovsdb_sessions = 0


def note_ovsdb_session() -> None:
    """Count one established OVSDB session (call it from the IDL's restart_fsm)."""
    global _ovsdb_sessions
    with _ovsdb_lock:
        _ovsdb_sessions += 1
        first = _ovsdb_sessions == 1
    OVSDB_CONNECTIONS.inc()
    if not first:
        OVSDB_RECONNECTS.inc()


# --- work queues -----------------------------------------------------------------

QUEUE_RETRIES = Counter(
    "lbagent_queue_retries_total", "Items a work queue put back to retry after a failure", ["queue"]
)
_queues: dict[str, Callable[[], int]] = {}


def count_queue_retry(name: str) -> None:
    """Count one retry scheduled by the work queue `name` (call it where a failed item is re-queued)."""
    QUEUE_RETRIES.labels(name).inc()


def track_queue(name: str, depth: Callable[[], int]) -> None:
    """Export `depth()` as lbagent_queue_depth{queue=name}; a later call for the same name replaces it.

    `depth` runs on the event loop at every scrape: it must be cheap and never block.
    """
    _queues[name] = depth


def queue_depths() -> dict[str, int]:
    depths = {}
    for name, depth in list(_queues.items()):
        try:
            depths[name] = int(depth())
        except Exception:  # a scrape must never fail because one queue is gone
            continue
    return depths


# --- read from the agent at scrape time ----------------------------------------


class AgentCollector:
    def __init__(self, agent):
        self._agent = agent

    def collect(self):
        agent = self._agent
        tasks = agent.loadbalancer_tasks()
        generation = agent.generation
        haproxy = agent.haproxy_status()
        yield _counter("lbagent_haproxy_reloads", "haproxy reloads that succeeded", haproxy.get("reloads", 0))
        yield _counter(
            "lbagent_haproxy_failed_reloads",
            "haproxy reloads refused or failed (rolled back)",
            haproxy.get("failed_reloads", 0),
        )
        yield _counter(
            "lbagent_haproxy_live_updates",
            "server-only changes applied to the running haproxy without a reload",
            haproxy.get("live_updates", 0),
        )
        yield _counter(
            "lbagent_haproxy_starts", "haproxy master processes started by this agent", haproxy.get("starts", 0)
        )
        yield _gauge("lbagent_haproxy_up", "1 while the haproxy master runs", 1 if haproxy.get("running") else 0)
        yield _gauge(
            "lbagent_haproxy_reload_failing",
            "1 while haproxy's last reload or (re)start failed and no reload succeeded since "
            "(agent.haproxy.last_error in /v1/status)",
            1 if haproxy.get("last_error") else 0,
        )
        yield _gauge(
            "lbagent_reconcile_retries",
            "Consecutive failed passes, summed over load balancers",
            sum(t.retries for t in tasks),
        )
        yield _gauge(
            "lbagent_loadbalancers_in_backoff",
            "Load balancers waiting to retry after a failed pass",
            sum(1 for t in tasks if t.last_error is not None),
        )
        yield _gauge(
            "lbagent_generation",
            "Generation of the accepted desired state (-1: none yet)",
            -1 if generation is None else generation,
        )
        yield _gauge(
            "lbagent_ready", "1 once the agent is ready (see /readyz)", 1 if agent.not_ready_reason() is None else 0
        )
        neighbours = agent.neighbour_status()
        if neighbours["entries_needed"] is not None:
            yield _gauge(
                "lbagent_neighbour_entries_needed",
                "Neighbour table entries per family the accepted load balancers may hold at once",
                neighbours["entries_needed"],
            )
        limits = GaugeMetricFamily(
            "lbagent_neighbour_table_limit",
            "The kernel's hard limit (gc_thresh3) of a neighbour table, by family",
            labels=["family"],
        )
        for family, limit in neighbours["limits"].items():
            limits.add_metric([family], limit["hard"])
        yield limits
        roles = GaugeMetricFamily(
            "lbagent_ha_roles", "Highly available load balancers by this host's role", labels=["role"]
        )
        for role, count in agent.ha_role_counts().items():
            roles.add_metric([role], count)
        yield roles
        depths = GaugeMetricFamily("lbagent_queue_depth", "Items waiting in a work queue", labels=["queue"])
        # Load balancers not yet reconciled at the accepted generation, or still being deleted.
        depths.add_metric(
            ["loadbalancers"],
            sum(
                1
                for t in tasks
                if t.deleting or (t.state == "pending" and not t.passed) or t.attempted_generation != generation
            ),
        )
        for name, depth in sorted(queue_depths().items()):
            depths.add_metric([name], depth)
        yield depths


class AgentRegistry:
    """The process-wide registry plus one agent's collector, for one exposition."""

    def __init__(self, agent):
        self._agent = agent
        self._collector = AgentCollector(agent)

    def collect(self):
        self._agent.update_gauges()
        yield from REGISTRY.collect()
        yield from self._collector.collect()


def _counter(name: str, documentation: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, documentation, value=value)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
