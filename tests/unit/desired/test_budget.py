"""The server budget: what a desired state expands to in haproxy, and the limits on it."""

from __future__ import annotations

import copy

import pytest

from lbagent.desired import budget
from lbagent.desired.budget import MAX_SERVERS_PER_LB, budget_problems, servers_in, servers_of
from lbagent.desired.model import parse_desired_state
from lbagent.desired.parser import RefreshParser
from lbagent.errors import InvalidDesiredState
from lbagent.workers.plan import selected_pods
from tests.unit.samples import EXAMPLE, pod_body

GROUP_SIZE = 256


def routed_lb(index: int, listeners: int = 1, rules: int = 0, backends: int = GROUP_SIZE) -> dict:
    """A load balancer whose listeners and rules all route to one group of `backends` backends."""
    return {
        "id": f"lb-{index}",
        "network": {"subnet_id": "net-1", "ip": f"198.18.0.{20 + index}", "mac": f"00:22:0a:00:00:{20 + index:02x}"},
        "listeners": [
            {
                "id": f"l{k}",
                "listener_type": "http",
                "listener_port": 80 + k,
                "backend_group_id": "bg-1",
                "rules": [{"id": f"r{k}-{r}", "path": f"/p{r}", "backend_group_id": "bg-1"} for r in range(rules)],
            }
            for k in range(listeners)
        ],
        "backend_groups": [
            {
                "id": "bg-1",
                "backends": [
                    {"id": f"be-{b}", "address": f"198.18.0.{100 + b % 100}", "port": 1000 + b} for b in range(backends)
                ],
            }
        ],
    }


def body(*lbs: dict, pods: list[dict] | None = None) -> dict:
    state = {"generation": 1, "subnets": copy.deepcopy(EXAMPLE["subnets"]), "loadbalancers": list(lbs)}
    if pods is not None:
        state["pods"] = pods
    return state


def problems(*lbs: dict, pods: list[dict] | None = None) -> list[dict]:
    return budget_problems(parse_desired_state(body(*lbs, pods=pods)))


def test_every_listener_and_every_rule_counts_its_groups_members():
    # 1 listener + 15 rules, each its own haproxy backend of 256 servers: 4096, the limit.
    assert problems(routed_lb(1, rules=15)) == []
    assert problems(routed_lb(1, rules=16), routed_lb(2)) == [
        {
            "path": "/loadbalancers/0",
            "message": f"needs {17 * GROUP_SIZE} haproxy servers, more than the {MAX_SERVERS_PER_LB} a load balancer "
            "may have (each listener and each rule counts the members of its backend group)",
        }
    ]


def test_a_redirect_rule_needs_no_servers():
    lb = routed_lb(1, rules=15)
    lb["listeners"][0]["rules"].append({"id": "away", "path": "/old", "redirect": {"path": "/new"}})
    assert problems(lb) == []


def test_selected_pods_do_not_count_at_refresh_but_are_counted_for_the_pass():
    lb = routed_lb(1, rules=15, backends=GROUP_SIZE - 1)
    lb["backend_groups"][0]["pod_selector"] = {"namespace": "shop", "labels": {"app": "web"}, "port": "http"}
    one = [pod_body("p1", "198.18.0.40")]
    # Not ready, another app, no port of that name: not members.
    others = [
        pod_body("p2", "198.18.0.41", ready=False),
        pod_body("p3", "198.18.0.42", app="db"),
        {**pod_body("p4", "198.18.0.43"), "ports": []},
    ]
    two = [*one, pod_body("p5", "198.18.0.44")]
    assert problems(lb, pods=two + others) == []  # a tenant's pods never refuse the host's body
    state = parse_desired_state(body(lb, pods=two + others))
    lb_model = state.loadbalancers[0]
    group = lb_model.backend_groups[0]
    members = len(group.backends) + len(selected_pods(group.pod_selector, state.pods))
    assert servers_in(lb_model, {group.id: members}) == 16 * (GROUP_SIZE + 1)  # what its pass counts
    assert servers_of(lb_model) == 16 * (GROUP_SIZE - 1)


def test_the_host_has_a_limit_of_its_own(monkeypatch):
    monkeypatch.setattr(budget, "MAX_SERVERS_PER_HOST", 3 * GROUP_SIZE)
    assert problems(routed_lb(1), routed_lb(2), routed_lb(3)) == []
    assert problems(routed_lb(1), routed_lb(2), routed_lb(3), routed_lb(4, backends=1)) == [
        {
            "path": "/loadbalancers",
            "message": f"the load balancers need {3 * GROUP_SIZE + 1} haproxy servers, more than the "
            f"{3 * GROUP_SIZE} a host may have",
        }
    ]


def test_the_limits_stay_far_above_the_benchmarks_hosts():
    # bench: up to 3,000 load balancers of 2 listeners of 4 backends.
    assert budget.MAX_SERVERS_PER_HOST >= 10 * 3000 * 2 * 4
    assert MAX_SERVERS_PER_LB >= 100 * 2 * 4


def test_the_refresh_parser_refuses_a_body_over_the_budget_and_keeps_what_it_knew():
    parser = RefreshParser()
    first = parser.parse(body(routed_lb(1)))
    renamed = {**routed_lb(1), "name": "renamed"}
    with pytest.raises(InvalidDesiredState) as exc:
        parser.parse(body(renamed, routed_lb(2, listeners=2, rules=8)))
    assert [d["path"] for d in exc.value.details] == ["/loadbalancers/1"]
    assert parser.parse(body(routed_lb(1))).loadbalancer("lb-1") is first.loadbalancer("lb-1")
