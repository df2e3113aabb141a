"""The agent raises the kernel's neighbour tables for the load balancers it accepts, and says so
in status and metrics; on the real kernel, with traffic through the load balancer."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from lbagent.desired.model import parse_desired_state
from lbagent.ovnhost.neighbour_tables import FAMILIES, read_limits
from lbagent.workers.neighbours import HARD_PER_SOFT, entries_needed

from agentproc import wait_until
from helpers import VIP, web_lb
from lbstate import desired


def serving(client) -> bool:
    try:
        return client.curl(f"http://{VIP}:80/", timeout=2).strip() in {"backend-a", "backend-b"}
    except Exception:
        return False


def limit_metrics(agent) -> dict[str, float]:
    code, text = agent.request("GET", "/metrics")
    assert code == 200
    return {
        sample.labels["family"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "lbagent_neighbour_table_limit"
        for sample in family.samples
    }


def test_the_neighbour_tables_are_raised_for_the_accepted_load_balancers(neighbour_limits, agent_factory, vpc, web):
    lb_id, client = web
    agent = agent_factory(size_neighbour_tables=True)
    state = desired(1, web_lb(lb_id))
    needed = entries_needed(parse_desired_state(state))
    assert any(neighbour_limits[f].hard < HARD_PER_SOFT * needed for f in FAMILIES)  # else nothing to see
    code, body = agent.refresh(state, wait=60)
    assert code == 200, body

    for family in FAMILIES:
        now, before = read_limits(family), neighbour_limits[family]
        assert now.soft == max(needed, before.soft) and now.hard == max(HARD_PER_SOFT * needed, before.hard)
    tables = agent.status()["agent"]["neighbour_tables"]
    assert tables["sizing"] is True and tables["entries_needed"] == needed and tables["last_error"] is None
    assert tables["limits"] == {f: {"soft": read_limits(f).soft, "hard": read_limits(f).hard} for f in FAMILIES}
    assert limit_metrics(agent) == {f: read_limits(f).hard for f in FAMILIES}
    wait_until(lambda: serving(client), 30, "traffic through the VIP")


def test_without_sizing_the_agent_leaves_the_tables_alone(neighbour_limits, agent_factory, vpc, web):
    lb_id, _ = web
    agent = agent_factory()  # size_neighbour_tables = false
    code, body = agent.refresh(desired(1, web_lb(lb_id)), wait=60)
    assert code == 200, body
    assert {f: read_limits(f) for f in FAMILIES} == neighbour_limits
    tables = agent.status()["agent"]["neighbour_tables"]
    assert tables["sizing"] is False and tables["limits"]["ipv4"]["hard"] == neighbour_limits["ipv4"].hard
