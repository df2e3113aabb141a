"""How many haproxy servers a desired state expands to, and the limits on it (api.md "Limits").

Every listener's backend group becomes a haproxy backend, and so does every
rule's group, each with one server per member of the group: a rule does not
share its listener's backend even when both name the same group. Within the
per-field limits a single load balancer could therefore ask for millions of
servers (64 listeners of 256 rules, each rule routing to a group of 1024
backends), which the agent would render, check and hold in haproxy for
minutes. The budget refuses such a body before anything is persisted.

A body is refused for its static backends only. The pods a selector takes
(ready, in its namespace, with all its labels and its port) change with the
tenant's workload, not with the region controller's intent: a load balancer
whose pods take it past its limit fails its own pass (`ServerBudgetExceeded`,
an `error` state with its last good configuration still serving) instead of
making every refresh of the host a 400. Every listener counts, whatever its
type or status: enabling one is a change of a single field, and the budget
should not depend on it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from lbagent.desired.model import DesiredState, LoadBalancer, Pod, PodSelector
from lbagent.errors import LbAgentError

# Far above what real load balancers carry (a few listeners of a few groups of
# tens of members), and above the benchmark's largest host (3,000 load
# balancers of 2 listeners of 4 backends: 24,000 servers).
MAX_SERVERS_PER_LB = 4096
MAX_SERVERS_PER_HOST = 262_144

SelectorKey = tuple[str, tuple[tuple[str, str], ...], int | str]


def pod_port(selector: PodSelector, pod: Pod) -> int | None:
    """The port on which `selector` takes `pod` as a member, or None when it does not take it."""
    if not pod.ready or pod.namespace != selector.namespace:
        return None
    if any(pod.labels.get(name) != value for name, value in selector.labels.items()):
        return None
    if isinstance(selector.port, int):
        return selector.port
    return next((port.port for port in pod.ports if port.name == selector.port), None)


class PodCounts:
    """How many pods each selector takes, counted once per distinct selector."""

    def __init__(self, pods: list[Pod]) -> None:
        self._pods = pods
        self._by_namespace: dict[str, list[Pod]] | None = None
        self._counts: dict[SelectorKey, int] = {}

    def count(self, selector: PodSelector) -> int:
        key = (selector.namespace, tuple(sorted(selector.labels.items())), selector.port)
        if key not in self._counts:
            candidates = self._namespaces().get(selector.namespace, [])
            self._counts[key] = sum(1 for pod in candidates if pod_port(selector, pod) is not None)
        return self._counts[key]

    def _namespaces(self) -> dict[str, list[Pod]]:
        if self._by_namespace is None:
            self._by_namespace = {}
            for pod in self._pods:
                if pod.ready:
                    self._by_namespace.setdefault(pod.namespace, []).append(pod)
        return self._by_namespace


def _group_routes(lb: LoadBalancer) -> Iterator[str]:
    """The group id of every haproxy backend the load balancer needs."""
    for listener in lb.listeners:
        yield listener.backend_group_id
        for rule in listener.rules:
            if rule.backend_group_id is not None:
                yield rule.backend_group_id


def servers_in(lb: LoadBalancer, group_sizes: Mapping[str, int]) -> int:
    """The haproxy servers of `lb` when its groups have these many members."""
    return sum(group_sizes.get(group_id, 0) for group_id in _group_routes(lb))


def servers_of(lb: LoadBalancer, pods: PodCounts | None = None) -> int:
    """The haproxy servers of `lb`: its backends, and the pods `pods` counts (None: none)."""
    sizes = {
        group.id: len(group.backends)
        + (pods.count(group.pod_selector) if pods is not None and group.pod_selector is not None else 0)
        for group in lb.backend_groups
    }
    return servers_in(lb, sizes)


class ServerBudgetExceeded(LbAgentError):
    """A load balancer whose members, pods included, need more haproxy servers than it may have."""

    def __init__(self, servers: int, limit: int = MAX_SERVERS_PER_LB):
        super().__init__(
            f"{servers} haproxy servers with the pods its selectors take, more than the {limit} "
            "a load balancer may have: remove backends or narrow the pod selectors"
        )


def budget_problems(state: DesiredState) -> list[dict[str, str]]:
    """api.md error details for every load balancer whose backends take it over its server
    limit, and for the host over its own (pods are not counted here: see the module)."""
    problems = []
    total = 0
    for index, lb in enumerate(state.loadbalancers):
        servers = servers_of(lb)
        total += servers
        if servers > MAX_SERVERS_PER_LB:
            problems.append(
                {
                    "path": f"/loadbalancers/{index}",
                    "message": f"needs {servers} haproxy servers, more than the {MAX_SERVERS_PER_LB} a load balancer "
                    "may have (each listener and each rule counts the members of its backend group)",
                }
            )
    if total > MAX_SERVERS_PER_HOST:
        problems.append(
            {
                "path": "/loadbalancers",
                "message": f"the load balancers need {total} haproxy servers, more than the {MAX_SERVERS_PER_HOST} "
                "a host may have",
            }
        )
    return problems
