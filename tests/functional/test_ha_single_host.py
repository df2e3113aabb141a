"""High availability asked of an agent that cannot give it, on the single-host sandbox: an agent
without `[ovn] nb` refuses a load balancer with `ha`, and applies nothing of that state."""

from __future__ import annotations

from lbstate import SUBNET, backend, desired, loadbalancer, tcp_listener


def test_ha_needs_the_northbound_database(agent_factory, prefix):
    lonely = agent_factory()  # a single-host agent without [ovn] nb
    lb = loadbalancer(
        f"{prefix}-ha",
        "198.18.0.190",
        "00:22:0a:00:01:5a",
        [tcp_listener("lsn-80", 80)],
        {"bg-1": [backend("be-web", "198.18.0.21")]},
        ha={"hosts": ["gw-1", "gw-2"], "preempt": False},
    )
    code, answer = lonely.refresh(desired(1, lb, subnets=[SUBNET]), wait=None)
    assert code == 400
    assert answer["details"][0]["path"] == "/loadbalancers/0/ha", answer
    assert "[ovn] nb" in answer["details"][0]["message"]
    assert lonely.status()["agent"]["generation"] is None  # nothing was applied
