"""`lbagent status` as an operator uses it: the table, one load balancer with the
packet counters of its NAT rules moving with real traffic, and the same from
the state directory and the host once the agent is stopped."""

from __future__ import annotations

import json

from operatorproc import VIP, served_state, wait_ready


def counters(agent, lb_id: str) -> dict[str, int]:
    document = json.loads(agent.cli("status", "--json", lb_id).stdout)
    (lb,) = document["loadbalancers"]
    assert lb["nat_rules_error"] is None, lb
    return {rule["tag"]: rule["packets"] for rule in lb["nat_rules"]}


def test_status_running_and_stopped(configured_agent, served_vpc):
    lb_id, client = served_vpc
    agent = configured_agent().start()
    assert agent.refresh(served_state(1, lb_id))[0] == 200
    wait_ready(agent, lb_id)

    table = agent.cli("status").stdout
    assert table.startswith("source: agent\n")
    row = next(line for line in table.splitlines() if line.startswith(lb_id))
    assert row.split()[1] == "ready" and VIP in row and "\x1b[" not in table  # no colour off a terminal

    before = counters(agent, lb_id)
    assert {"listener tcp/80", "backend be-a", "backend be-b"} <= set(before), before
    for _ in range(4):
        assert client.curl(f"http://{VIP}:80/").strip() in {"be-a", "be-b"}
    after = counters(agent, lb_id)
    # Every connection passes the listener's DNAT and one backend's DNAT (first packets of each flow).
    assert after["listener tcp/80"] >= before["listener tcp/80"] + 4
    assert after["backend be-a"] + after["backend be-b"] >= before["backend be-a"] + before["backend be-b"] + 4

    detail = agent.cli("status", lb_id).stdout
    assert "listeners:" in detail and "backends:" in detail and "NAT rules in lb-" in detail
    assert any(line.split()[:3] == ["lsn-80", "tcp", "80"] for line in detail.splitlines()), detail
    assert any(line.split()[:3] == ["be-a", "198.18.0.21:8000", "1025"] for line in detail.splitlines()), detail
    assert agent.cli("status", "nope", check=False).returncode != 0

    # Stopped: the state directory and the host answer, and say so; the data path still serves.
    assert agent.stop() == 0
    offline = agent.cli("status").stdout
    assert "source: state directory (the agent is not running)" in offline and "agent: not running" in offline
    assert any(line.startswith(lb_id) for line in offline.splitlines()), offline
    document = json.loads(agent.cli("status", "--json", lb_id).stdout)
    assert document["source"] == "state directory (the agent is not running)"
    (lb,) = document["loadbalancers"]
    assert lb["netns_present"] is True and {b["mapped_port"] for b in lb["backends"]} == {1025, 1026}
    assert client.curl(f"http://{VIP}:80/").strip() in {"be-a", "be-b"}
    assert counters(agent, lb_id)["listener tcp/80"] > after["listener tcp/80"]
