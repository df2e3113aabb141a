"""P4's reference legs: the agent's haproxy configuration in the load balancer's namespace, nginx's stream proxy."""

from pathlib import Path

import pytest

from bench.nslegs import NGINX_STREAM_MODULE, NS_HAPROXY_OFFSET, namespace_haproxy_config, nginx_stream_config
from bench.report import p4_rows

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
OUTER, INNER, VIP = "169.254.0.101", "169.254.0.100", "198.18.4.1"
MEMBERS = {1025: "198.18.0.21:8000", 1026: "198.18.0.22:8000", 1027: "198.18.0.23:8000", 1028: "198.18.0.24:8000"}


def config() -> str:
    return namespace_haproxy_config(
        (GOLDEN / "base.cfg").read_text(),
        (GOLDEN / "loadbalancer.cfg").read_text(),
        outer=OUTER,
        inner=INNER,
        vip=VIP,
        members=MEMBERS,
    )


def test_the_agents_configuration_binds_on_the_vip_and_reaches_members_directly():
    text = config()
    assert OUTER not in text and INNER not in text
    assert f"bind {VIP}:{8001 + NS_HAPROXY_OFFSET}\n" in text
    assert f"bind {VIP}:{8443 + NS_HAPROXY_OFFSET} ssl crt lb-1/tls" in text  # the rest of a bind line stays
    assert "    server be-2 198.18.0.22:8000 weight 1 send-proxy-v2-ssl ssl verify none check inter 2s" in text
    # Everything else of the load balancer's and of the defaults is the agent's, line for line.
    for line in (GOLDEN / "loadbalancer.cfg").read_text().splitlines():
        if "bind " not in line and " server " not in line:
            assert line in text.splitlines(), line
    assert "    timeout client 90s" in text and "    hard-stop-after 1800s" in text


def test_what_belongs_to_the_agents_own_haproxy_is_left_out():
    text = config()
    assert "master-worker" not in text  # one foreground process, stopped by its pid
    assert "stats socket" not in text  # the agent's runtime socket
    assert "lbagent_prometheus" not in text and "127.0.0.1:9101" not in text
    assert text.index("global") < text.index("defaults") < text.index("frontend fe:lb-1:rr")


def test_a_server_on_a_port_no_member_has_is_refused():
    with pytest.raises(ValueError, match="1028"):
        namespace_haproxy_config(
            (GOLDEN / "base.cfg").read_text(),
            (GOLDEN / "loadbalancer.cfg").read_text(),
            outer=OUTER,
            inner=INNER,
            vip=VIP,
            members={port: at for port, at in MEMBERS.items() if port != 1028},
        )
    with pytest.raises(ValueError, match="not this load balancer"):
        namespace_haproxy_config(
            "global\n", "frontend x\n    bind 10.0.0.1:80\n", outer=OUTER, inner=INNER, vip=VIP, members={}
        )


def test_nginx_proxies_tcp_on_the_vip_to_every_member_in_turn(tmp_path):
    text = nginx_stream_config(tmp_path, VIP, 9080, list(MEMBERS.values()))
    assert text.startswith("# ") and f"load_module {NGINX_STREAM_MODULE};" in text
    assert f"listen {VIP}:9080 reuseport" in text
    assert [line.strip() for line in text.splitlines() if line.strip().startswith("server 198.")] == [
        f"server {at};" for at in MEMBERS.values()
    ]
    assert "hash" not in text and "least_conn" not in text  # round robin, nginx's default
    assert f"pid {tmp_path}/nginx.pid;" in text


def p4(**legs) -> dict:
    return {
        "n": 10,
        "loadbalancer": {"rps": 4500.0},
        "direct": {"rps": 9000.0},
        "ovn_lb": {"rps": 6000.0},
        **legs,
    }


def test_p4_is_judged_against_each_proxy_in_the_namespace_with_direct_as_context():
    rows = p4_rows(p4(ns_haproxy={"rps": 4800.0}, nginx_stream={"rps": 5200.0}))
    assert [(row[0], row[2], row[3]) for row in rows] == [
        ("P4 HTTP req/s via load balancer vs haproxy in its namespace, N=10", "≥ 0.9× haproxy in its namespace", True),
        (
            "P4 HTTP req/s via load balancer vs nginx stream in its namespace, N=10",
            "≥ 0.9× nginx stream in its namespace",
            False,
        ),
    ]
    assert rows[0][1] == "4,500 (0.94× 4,800)"
    assert "direct 9,000 (lbagent 0.50× direct)" in rows[0][4] and "OVN native LB 6,000 (0.67× direct)" in rows[0][4]


def test_a_reference_leg_not_measured_misses_with_its_reason():
    rows = p4_rows(p4(ns_haproxy={"rps": 0.0, "error": "haproxy exited"}))
    assert rows[0][3] is False and rows[0][4].startswith("haproxy exited;")
    assert rows[1][3] is False and rows[1][4].startswith("not run;")
