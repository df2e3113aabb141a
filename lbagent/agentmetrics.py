"""Metrics read from the agent at scrape time: what it already keeps, exported as it is.

The haproxy manager counts its reloads, the supervisor knows every load
balancer's retries and generation; copying those into counters at every change
would be a second truth to keep in step. This collector reads them when
Prometheus asks, on the event loop that owns them (cheap, nothing blocks).
"""

from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

from lbagent.counters import queue_depths


class AgentCollector:
    def __init__(self, agent):
        self._agent = agent

    def collect(self):
        agent = self._agent
        tasks = list(agent.worker.tasks.values())
        generation = agent.worker.generation
        haproxy = agent.haproxy.status()
        yield _counter("lbagent_haproxy_reloads", "haproxy reloads that succeeded", haproxy.get("reloads", 0))
        yield _counter("lbagent_haproxy_failed_reloads", "haproxy reloads refused or failed (rolled back)",
                       haproxy.get("failed_reloads", 0))
        yield _counter("lbagent_haproxy_live_updates", "server-only changes applied to the running haproxy "
                       "without a reload", haproxy.get("live_updates", 0))
        yield _counter("lbagent_haproxy_starts", "haproxy master processes started by this agent",
                       haproxy.get("starts", 0))
        yield _gauge("lbagent_haproxy_up", "1 while the haproxy master runs", 1 if haproxy.get("running") else 0)
        yield _gauge("lbagent_reconcile_retries", "Consecutive failed passes, summed over load balancers",
                     sum(t.retries for t in tasks))
        yield _gauge("lbagent_loadbalancers_in_backoff", "Load balancers waiting to retry after a failed pass",
                     sum(1 for t in tasks if t.last_error is not None))
        yield _gauge("lbagent_generation", "Generation of the accepted desired state (-1: none yet)",
                     -1 if generation is None else generation)
        yield _gauge("lbagent_ready", "1 once the agent is ready (see /readyz)",
                     1 if agent.not_ready_reason() is None else 0)
        depths = GaugeMetricFamily("lbagent_queue_depth", "Items waiting in a work queue", labels=["queue"])
        # Load balancers not yet reconciled at the accepted generation, or still being deleted.
        depths.add_metric(["loadbalancers"], sum(
            1 for t in tasks if t.deleting or t.state == "pending" or t.attempted_generation != generation))
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
