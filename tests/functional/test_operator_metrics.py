"""/metrics moves with the load balancers; haproxy's own exporter answers on the
configured address; JSON log lines carry one structured line per change and
never the token or a private key."""

from __future__ import annotations

import json
import urllib.request

from lbagent.haproxy.render import frontend_name

from agentproc import free_port, wait_until
from operatorproc import samples, served_state, wait_ready

KEY_MARKER = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
PRIVATE_KEY = f"-----BEGIN PRIVATE KEY-----\n{KEY_MARKER}\n-----END PRIVATE KEY-----\n"


def value(found: dict, name: str, **labels) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def haproxy_exporter(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return samples(response.read().decode())


def frontends(found: dict) -> set[str]:
    return {dict(labels)["proxy"] for name, labels in found if name == "haproxy_frontend_status"}


def test_metrics_move_with_load_balancers(configured_agent, served_vpc):
    lb_id, client = served_vpc
    exporter = free_port()
    agent = configured_agent(
        settings={
            "agent": ['log_format = "json"', 'log_level = "debug"'],
            "haproxy": [f'prometheus_listen = "127.0.0.1:{exporter}"'],
        }
    ).start()
    assert agent.refresh({"generation": 1})[0] == 200
    empty = agent.metrics()
    assert value(empty, "lbagent_ready") == 1 and value(empty, "lbagent_generation") == 1
    assert value(empty, "lbagent_loadbalancers", state="ready") == 0
    assert value(empty, "lbagent_haproxy_up") == 1

    assert agent.refresh(served_state(2, lb_id))[0] == 200
    wait_ready(agent, lb_id)
    one = agent.metrics()
    assert value(one, "lbagent_loadbalancers", state="ready") == 1
    assert value(one, "lbagent_generation") == 2
    assert value(one, "lbagent_queue_depth", queue="loadbalancers") == 0
    assert value(one, "lbagent_haproxy_reloads_total") > value(empty, "lbagent_haproxy_reloads_total")
    assert value(one, "lbagent_state_writes_total") > value(empty, "lbagent_state_writes_total")
    assert value(one, "lbagent_reconcile_seconds_count") > value(empty, "lbagent_reconcile_seconds_count")
    for kind in ("netlink", "iptables", "ovsdb"):
        assert value(one, "lbagent_host_writes_total", kind=kind) > value(empty, "lbagent_host_writes_total", kind=kind)
    assert value(one, "lbagent_api_requests_total", method="POST", route="/v1/refresh", code="200") == 2
    assert value(one, "lbagent_haproxy_failed_reloads_total") == 0

    # haproxy's own exporter, on the configured address, sees the load balancer's frontend.
    assert frontend_name(lb_id, "lsn-80") in frontends(haproxy_exporter(exporter))
    assert client.curl("http://198.18.0.12:80/").strip() in {"be-a", "be-b"}

    # An invalid body is counted and changes nothing, even one carrying a private key.
    broken = served_state(3, lb_id)
    broken["loadbalancers"][0]["name"] = PRIVATE_KEY
    assert agent.refresh(broken)[0] == 400
    rejected = agent.metrics()
    assert value(rejected, "lbagent_api_requests_total", method="POST", route="/v1/refresh", code="400") == 1
    assert value(rejected, "lbagent_generation") == 2

    assert agent.refresh(served_state(4, None))[0] == 200
    wait_until(lambda: not agent.status()["loadbalancers"], 30, "the load balancer to be deleted")
    gone = agent.metrics()
    assert value(gone, "lbagent_loadbalancers", state="ready") == 0
    assert value(gone, "lbagent_haproxy_reloads_total") > value(one, "lbagent_haproxy_reloads_total")
    assert frontend_name(lb_id, "lsn-80") not in frontends(haproxy_exporter(exporter))

    # The log: JSON lines, structured fields for what changed, no secret anywhere.
    log = agent.log()
    entries = [json.loads(line) for line in log.splitlines() if line.strip()]
    changes = [e for e in entries if e.get("lb") == lb_id and "action" in e]
    assert {"reload", "deleted"} <= {e["action"] for e in changes}, changes
    assert agent.token not in log and KEY_MARKER not in log and "PRIVATE KEY-----\\n" not in log
