"""haproxy config rendering: golden files, haproxy's own syntax check, and refusal of unsafe values.

Regenerate the golden files after an intended change with
`make golden` and review the diff.
"""

from pathlib import Path

import pytest

from lbagent.desired.members import Member
from lbagent.desired.model import parse_desired_state
from lbagent.haproxy.errors import RenderError
from lbagent.haproxy.render import render_base, render_config, render_loadbalancer
from lbagent.haproxy.templating import template_dir, token
from tests.unit.samples import assert_golden, certificate, haproxy_check, sample_members, write_checkable

INNER, OUTER = "169.254.0.100", "169.254.0.101"


def tcp(listener_id, port, scheduler, **fields):
    return {
        "id": listener_id,
        "listener_type": "tcp",
        "listener_port": port,
        "backend_group_id": "bg-web",
        "scheduler": scheduler,
        **fields,
    }


def sample_lb(**overrides):
    """tcp listeners with every scheduler, http and https ones, and what must not be rendered (udp, disabled)."""
    lb = {
        "id": "lb-1",
        "name": 'web "shop" # free text, never rendered',
        "network": {"subnet_id": "net-1", "ip": "198.18.0.12", "mac": "00:22:0a:00:00:12"},
        "listeners": [
            tcp(
                "rr",
                8001,
                "rr",
                health_check={"type": "tcp", "rise": 2, "fall": 3, "interval": 2, "timeout": 1},
                timeouts={"client_idle": 60, "backend_connect": 4, "backend_idle": 61},
            ),
            tcp("wrr", 8002, "wrr", send_proxy="v2"),
            tcp(
                "wlc",
                8003,
                "wlc",
                health_check={
                    "type": "http",
                    "uri": "/healthz",
                    "domain": "www.example.com",
                    "http_code": "http_5xx,http_2xx,http_3xx",
                    "rise": 1,
                    "fall": 2,
                    "interval": 3,
                    "timeout": 2,
                },
            ),
            tcp("sch", 8004, "sch", timeouts={"backend_connect": 3}),
            tcp("tch", 8005, "tch", send_proxy="v1"),
            {
                "id": "web",
                "listener_type": "http",
                "listener_port": 8080,
                "backend_group_id": "bg-web",
                "x_forwarded_for": True,
                "health_check": {"type": "http", "uri": "/ping", "http_code": "http_2xx"},
                "timeouts": {"client_request": 11, "client_idle": 30},
            },
            {"id": "dns", "listener_type": "udp", "listener_port": 53, "backend_group_id": "bg-web"},
            tcp("off", 8006, "rr", status="disabled"),
            {
                "id": "tls",
                "listener_type": "https",
                "listener_port": 8443,
                "backend_group_id": "bg-web",
                "certificates": [{"id": "c1", **certificate("www.example.com")}],
            },
            {"id": "empty", "listener_type": "tcp", "listener_port": 8007, "backend_group_id": "bg-none"},
        ],
        "backend_groups": [
            {
                "id": "bg-web",
                "backends": [
                    {"id": "be-1", "address": "198.18.0.21", "port": 80},
                    {
                        "id": "be-2",
                        "address": "198.18.0.22",
                        "port": 80,
                        "weight": 3,
                        "send_proxy": "v2-ssl",
                        "ssl": True,
                    },
                    {"id": "be-3", "address": "198.18.0.23", "port": 80, "weight": 0},
                ],
            },
            {"id": "bg-none"},
        ],
        **overrides,
    }
    state = parse_desired_state(
        {
            "generation": 1,
            "subnets": [{"id": "net-1", "cidr": "198.18.0.0/24", "gateway": "198.18.0.1"}],
            "loadbalancers": [lb],
        }
    )
    return state.loadbalancers[0]


def render_sample(lb=None, outer=OUTER, inner=INNER, members=None):
    lb = lb or sample_lb()
    return render_loadbalancer(lb, outer, members if members is not None else sample_members(lb), inner=inner)


# --- golden files ----------------------------------------------------------------


def test_base_matches_golden():
    assert_golden("base.cfg", render_base(Path("/run/lbagent"), prometheus_listen="127.0.0.1:9101"))


def test_loadbalancer_matches_golden():
    assert_golden("loadbalancer.cfg", render_sample())


def test_base_without_prometheus_has_no_exporter():
    text = render_base(Path("/run/lbagent"))
    assert "prometheus" not in text
    assert "stats socket /run/lbagent/haproxy/stats.sock mode 600 level admin expose-fd listeners" in text
    assert "\n    log " not in text


def test_rendered_config_is_valid_haproxy(tmp_path):
    lb = sample_lb()
    config = render_config(lb, "127.0.0.1", sample_members(lb), inner="127.0.0.1")
    result = haproxy_check(*write_checkable(tmp_path, config, lb.id, prometheus_listen="127.0.0.1:9101"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


# --- what is rendered and what is not ------------------------------------------------


def test_disabled_loadbalancer_is_just_its_header():
    assert render_sample(sample_lb(status="disabled")) == "# lbagent load balancer lb-1\n"


def test_name_is_never_rendered():
    assert "shop" not in render_sample()


@pytest.mark.parametrize("listener_id", ["dns", "off"])
def test_udp_and_disabled_listeners_are_not_rendered(listener_id):
    assert f":{listener_id}\n" not in render_sample()
    assert "frontend fe:lb-1:tls\n" in render_sample()


def test_missing_group_renders_an_empty_backend():
    text = render_sample(members={})
    assert "backend be:lb-1:rr\n    mode tcp\n    balance roundrobin\n" in text
    assert "    server " not in text


@pytest.mark.parametrize(
    ("codes", "expect"),
    [
        ("http_2xx", "200-299"),
        ("http_2xx,http_3xx", "200-399"),
        ("http_4xx,http_2xx", "200-299,400-499"),
        ("http_2xx,http_3xx,http_4xx,http_5xx", "200-599"),
    ],
)
def test_http_code_classes_become_status_ranges(codes, expect):
    check = {"type": "http", "uri": "/", "http_code": codes}
    lb = sample_lb(listeners=[tcp("l", 80, "rr", health_check=check)])
    assert f"    http-check expect status {expect}\n" in render_sample(lb)


def test_http_check_without_domain_sends_no_host_header():
    lb = sample_lb(listeners=[tcp("l", 80, "rr", health_check={"type": "http"})])
    text = render_sample(lb)
    assert "    http-check send meth GET uri /\n" in text
    assert "hdr Host" not in text


def test_rr_ignores_weights_but_still_drains():
    text = render_sample(sample_lb(listeners=[tcp("l", 80, "rr")]))
    assert "server be-2 169.254.0.100:1026 weight 1 " in text
    assert "server be-3 169.254.0.100:1027 weight 0\n" in text


def test_listener_send_proxy_overrides_member():
    text = render_sample(sample_lb(listeners=[tcp("l", 80, "wrr", send_proxy="v2-ssl-cn")]))
    assert text.count(" send-proxy-v2-ssl-cn") == 4


def test_backend_ssl_applies_on_tcp_and_http_listeners_alike():
    # It used to be dropped on tcp listeners; haproxy speaks TLS to the member in tcp mode too.
    line = "server be-2 169.254.0.100:1026 weight 1 send-proxy-v2-ssl ssl verify none\n"
    assert line in render_sample(sample_lb(listeners=[tcp("l", 80, "rr")]))
    http = {"id": "h", "listener_type": "http", "listener_port": 80, "backend_group_id": "bg-web"}
    assert line in render_sample(sample_lb(listeners=[http]))
    assert "server be-1 169.254.0.100:1025 weight 1\n" in render_sample(sample_lb(listeners=[http]))


def test_sch_hashes_the_source_and_tch_the_four_tuple():
    sch = render_sample(sample_lb(listeners=[tcp("l", 80, "sch")]))
    assert "    balance source\n" in sch
    assert "set-var-fmt" not in sch
    tch = render_sample(sample_lb(listeners=[tcp("l", 80, "tch")]))
    assert (
        "    tcp-request content set-var-fmt(txn.lbagent_flow) %[src]:%[src_port]:%[dst]:%[dst_port]\n"
        "    balance hash var(txn.lbagent_flow)\n"
    ) in tch
    http = {"id": "h", "listener_type": "http", "listener_port": 80, "backend_group_id": "bg-web", "scheduler": "tch"}
    text = render_sample(sample_lb(listeners=[http]))
    assert "    http-request set-var-fmt(txn.lbagent_flow) %[src]:%[src_port]:%[dst]:%[dst_port]\n" in text
    assert "tcp-request content set-var-fmt" not in text


def test_tch_on_an_http_listener_is_valid_haproxy_too(tmp_path):
    http = {"id": "h", "listener_type": "http", "listener_port": 80, "backend_group_id": "bg-web", "scheduler": "tch"}
    lb = sample_lb(listeners=[http])
    config = render_config(lb, "127.0.0.1", sample_members(lb), inner="127.0.0.1")
    result = haproxy_check(*write_checkable(tmp_path, config, lb.id))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


# --- refusing unsafe values --------------------------------------------------------------

UNSAFE = ["a b", "a\nb", 'a"b', "a'b", "a#b", "a\\b", "a\tb", "", "é"]


@pytest.mark.parametrize("value", UNSAFE)
def test_token_refuses_unsafe_text(value):
    with pytest.raises(RenderError):
        token(value)


@pytest.mark.parametrize("value", [None, True, 1.5, ["a"]])
def test_token_refuses_non_scalar_values(value):
    with pytest.raises(RenderError):
        token(value)


@pytest.mark.parametrize("value", ["a\nb", "a b", 'a"b'])
def test_member_key_injection_is_refused(value):
    lb = sample_lb()
    members = {"bg-web": [Member(value, "198.18.0.21", 80, 1, "off", False, 1025)]}
    with pytest.raises(RenderError):
        render_sample(lb, members=members)


@pytest.mark.parametrize("value", ["x\n    bind 0.0.0.0:22", "x y", "x'"])
def test_listener_id_injection_is_refused(value):
    lb = sample_lb()
    listener = lb.listeners[0].model_copy(update={"id": value})
    with pytest.raises(RenderError):
        render_sample(lb.model_copy(update={"listeners": [listener]}))


def test_lb_id_injection_is_refused_even_when_disabled():
    lb = sample_lb(status="disabled")
    with pytest.raises(RenderError):
        render_sample(lb.model_copy(update={"id": "lb\nglobal"}))


def test_health_check_uri_injection_is_refused():
    lb = sample_lb(listeners=[tcp("l", 80, "rr", health_check={"type": "http", "uri": "/ok"})])
    check = lb.listeners[0].health_check.model_copy(update={"uri": "/ok hdr X-Injected 1"})
    listener = lb.listeners[0].model_copy(update={"health_check": check})
    with pytest.raises(RenderError):
        render_sample(lb.model_copy(update={"listeners": [listener]}))


@pytest.mark.parametrize("outer", ["127.0.0.1 ", "127.0.0.1\n", "#"])
def test_unsafe_outer_address_is_refused(outer):
    with pytest.raises(RenderError):
        render_sample(outer=outer)


def test_unsafe_run_dir_is_refused():
    with pytest.raises(RenderError):
        render_base(Path("/run/lb agent"))


def test_duplicate_server_names_are_refused():
    # "a/b" and "a.b" would both be server a.b: haproxy would refuse every load balancer.
    members = {"bg-web": [Member(key, "198.18.0.21", 80, 1, "off", False, 1025) for key in ("a/b", "a.b")]}
    with pytest.raises(RenderError, match="a.b"):
        render_sample(members=members)


def test_udp_health_check_on_tcp_listener_is_refused():
    lb = sample_lb(listeners=[tcp("l", 80, "rr", health_check={"type": "tcp"})])
    check = lb.listeners[0].health_check.model_copy(update={"type": "udp"})
    listener = lb.listeners[0].model_copy(update={"health_check": check})
    with pytest.raises(RenderError):
        render_sample(lb.model_copy(update={"listeners": [listener]}))


def test_templates_are_found():
    assert {"base.cfg.j2", "loadbalancer.cfg.j2", "macros.j2"} <= {p.name for p in template_dir().iterdir()}


def test_preload_compiles_every_template_so_renders_never_read_them_again(monkeypatch):
    from lbagent.haproxy import templating as templates

    templates.environment.cache_clear()
    try:
        templates.preload()
        assert templates.environment().auto_reload is False  # no stat() of the files on every render
        reads = []
        loader = templates.environment().loader
        original = loader.get_source
        monkeypatch.setattr(loader, "get_source", lambda env, name: reads.append(name) or original(env, name))
        text = render_sample()
        assert "frontend" in text
        assert reads == []  # loadbalancer.cfg.j2 and the macros it imports were compiled at preload
    finally:
        templates.environment.cache_clear()


# --- dual stack ----------------------------------------------------------------------

INNER6, OUTER6 = "fd4c:4241::4", "fd4c:4241::5"


def dual_stack_members(lb):
    members = sample_members(lb)
    members["bg-web"].append(Member("be-6", "2001:db8::21", 8000, 1, "off", False, 1030))
    return members


def test_a_dual_stack_load_balancer_binds_both_outers_and_reaches_ipv6_members_on_inner6():
    lb = sample_lb()
    text = render_config(lb, OUTER, dual_stack_members(lb), inner=INNER, outer6=OUTER6, inner6=INNER6).text
    assert f"bind {OUTER}:8001\n    bind {OUTER6}:8001\n" in text
    assert f" {INNER6}:1030 " in text and " 2001:db8::21" not in text  # members only through the namespace
    assert f" {INNER}:1028 " in text  # IPv4 members as before


def test_an_ipv4_only_load_balancer_renders_as_before_and_refuses_an_ipv6_member():
    lb = sample_lb()
    assert render_config(lb, OUTER, sample_members(lb), inner=INNER, outer6="", inner6="").text == render_sample()
    with pytest.raises(RenderError, match="be-6 is IPv6"):
        render_config(lb, OUTER, dual_stack_members(lb), inner=INNER)


def test_a_dual_stack_config_is_valid_haproxy(tmp_path):
    lb = sample_lb()
    config = render_config(lb, "127.0.0.1", dual_stack_members(lb), inner="127.0.0.1", outer6="::1", inner6="::1")
    result = haproxy_check(*write_checkable(tmp_path, config, lb.id))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr
