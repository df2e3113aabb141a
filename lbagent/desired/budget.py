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
from typing import TYPE_CHECKING

from lbagent.errors import LbAgentError

if TYPE_CHECKING:  # the model counts its servers with servers_of, once per instance
    from lbagent.desired.model import DesiredState, LoadBalancer

# Far above what real load balancers carry (a few listeners of a few groups of
# tens of members), and above the benchmark's largest host (3,000 load
# balancers of 2 listeners of 4 backends: 24,000 servers).
MAX_SERVERS_PER_LB = 4096
MAX_SERVERS_PER_HOST = 262_144


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


def servers_of(lb: LoadBalancer) -> int:
    """The haproxy servers of `lb`'s backends (its pods are counted by its pass)."""
    return servers_in(lb, {group.id: len(group.backends) for group in lb.backend_groups})


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
        servers = lb.static_servers
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
