"""Rendering of the traffic options: X-Forwarded-Proto/-Port, backup servers,
slow start and a separate health check port, from the model through the
members `lbagent.workers.plan` resolves to haproxy's lines."""

from __future__ import annotations

import pytest

from lbagent.desired.memberoptions import check_port_key
from lbagent.desired.model import parse_desired_state
from lbagent.haproxy.live import plan_server_edits
from lbagent.haproxy.render import render_config
from lbagent.workers import plan
from lbagent.workers.allocator import assign_ports
from tests.unit.samples import assert_golden, certificate, haproxy_check, write_checkable

INNER, OUTER = "169.254.0.100", "169.254.0.101"
CHECK = {"type": "http", "uri": "/healthz", "rise": 1, "fall": 2, "interval": 1, "timeout": 1}


def traffic_lb(backends=None, **group_fields):
    backends = backends or [
        {"id": "primary", "address": "198.18.0.21", "port": 8000, "weight": 10},
        {"id": "spare", "address": "198.18.0.22", "port": 8000, "weight": 5, "backup": True},
    ]
    lb = {
        "id": "lb-t",
        "network": {"subnet_id": "net-1", "ip": "198.18.0.12", "mac": "00:22:0a:00:00:12"},
        "listeners": [
            {
                "id": "web",
                "listener_type": "http",
                "listener_port": 8080,
                "backend_group_id": "bg",
                "scheduler": "wrr",
                "x_forwarded_proto": True,
                "health_check": CHECK,
            },
            {
                "id": "tls",
                "listener_type": "https",
                "listener_port": 8443,
                "backend_group_id": "plain",
                "x_forwarded_proto": True,
                "certificates": [{"id": "c1", **certificate("www.example.com")}],
            },
        ],
        "backend_groups": [
            {"id": "bg", "backends": backends, "slow_start": 30, "health_check_port": 8081, **group_fields},
            {"id": "plain", "backends": [{"id": "solo", "address": "198.18.0.23", "port": 80}]},
        ],
    }
    state = parse_desired_state(
        {
            "generation": 1,
            "subnets": [{"id": "net-1", "cidr": "198.18.0.0/24", "gateway": "198.18.0.1"}],
            "loadbalancers": [lb],
        }
    )
    return state.loadbalancers[0]


def members_of(lb, ports):
    """The members with ports on INNER, kept in `ports` from one call to the next as the agent keeps them."""
    targets = plan.group_targets(lb, [])
    ports.update(assign_ports(ports, plan.member_keys(targets)))
    return plan.members_by_group(targets, ports)


def render(lb, inner=INNER, outer=OUTER, ports=None):
    return render_config(lb, outer, members_of(lb, {} if ports is None else ports), inner=inner)


def test_traffic_options_match_golden():
    assert_golden("traffic_options.cfg", render(traffic_lb()).text)


def test_forwarded_proto_and_port_name_the_listeners_scheme_and_port():
    text = render(traffic_lb()).text
    http, https = text.split("frontend fe:lb-t:tls")
    assert "    http-request set-header X-Forwarded-Proto http\n" in http
    assert "    http-request set-header X-Forwarded-Port 8080\n" in http
    assert "    http-request set-header X-Forwarded-Proto https\n" in https
    assert "    http-request set-header X-Forwarded-Port 8443\n" in https


def test_backup_slow_start_and_the_check_port_are_on_the_servers_of_their_group():
    ports: dict[str, int] = {}
    text = render(traffic_lb(), ports=ports).text
    check = f"check inter 1s rise 1 fall 2 port {ports[check_port_key('primary')]}"
    assert f"server primary {INNER}:{ports['primary']} weight 10 slowstart 30s {check}\n" in text
    spare = f"server spare {INNER}:{ports['spare']} weight 5 backup slowstart 30s check"
    assert spare in text
    assert f"server solo {INNER}:{ports['solo']} weight 1\n" in text  # a group without options


def test_without_a_health_check_the_check_port_is_not_rendered():
    text = render(traffic_lb(slow_start=0, health_check_port=None)).text
    assert " port " not in text and "slowstart" not in text
    assert "\n    http-request set-header X-Forwarded-Proto http\n" in text


def test_without_x_forwarded_proto_no_header_is_set():
    lb = traffic_lb()
    listeners = [listener.model_copy(update={"x_forwarded_proto": False}) for listener in lb.listeners]
    text = render(lb.model_copy(update={"listeners": listeners})).text
    assert "X-Forwarded" not in text


def test_the_options_are_valid_haproxy(tmp_path):
    result = haproxy_check(*write_checkable(tmp_path, render(traffic_lb(), "127.0.0.1", "127.0.0.1"), "lb-t"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


@pytest.mark.parametrize("backup", [False, True])
def test_a_server_added_with_the_options_goes_live_with_them(backup):
    one = [{"id": "primary", "address": "198.18.0.21", "port": 8000, "weight": 10}]
    added = {"id": "late", "address": "198.18.0.24", "port": 8000, "weight": 10, "backup": backup}
    before, after = traffic_lb(one), traffic_lb([*one, added])
    ports: dict[str, int] = {}
    edits = plan_server_edits(render(before, ports=ports).text, render(after, ports=ports).text)
    assert edits is not None and [edit.server for edit in edits] == ["late"]
    words = edits[0].line.split()
    assert ("backup" in words) == backup
    assert words[words.index("slowstart") + 1] == "30s" and "port" in words and "check" in words
