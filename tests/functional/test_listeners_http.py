"""Every http listener option with real traffic from a VPC client through OVN:
one load balancer with a listener per option, each test showing that option's
effect. The tests that depend on haproxy seeing the client's own address
(access lists, X-Forwarded-For, source hashing, per-source rates, the PROXY
line) come last."""

from __future__ import annotations

import collections
import re
from contextlib import contextmanager

import pytest

from agentproc import wait_until
from lbstate import backend, loadbalancer
from listenerenv import (
    APP_COOKIE,
    BACKEND_ADDRESSES,
    backends_of,
    listener_env,
    refused,
    request,
    start_backend,
    status_codes,
)

VIP, MAC = "198.18.0.12", "00:22:0a:00:00:12"
CLIENTS = 4  # 198.18.0.31 .. 198.18.0.34


def http(listener_id: str, port: int, group: str = "bg-ab", **fields) -> dict:
    return {"id": listener_id, "listener_type": "http", "listener_port": port, "backend_group_id": group, **fields}


def member(group: str, name: str, **fields) -> dict:
    # Backend ids are unique per load balancer: "<group>-<host>".
    return backend(f"{group}-{name}", BACKEND_ADDRESSES[name], **fields)


HEALTH = {"type": "http", "uri": "/healthz", "http_code": "http_2xx", "rise": 1, "fall": 1, "interval": 1, "timeout": 1}
CLIENT_ONLY = ["198.18.0.31/32"]

LISTENERS = {
    "plain": http("plain", 8000),
    "insert": http("insert", 8001, sticky_session={"type": "insert", "cookie": "LBSRV", "cookie_timeout": 3600}),
    "server": http("server", 8002, sticky_session={"type": "server", "cookie": APP_COOKIE}),
    "rules": http(
        "rules",
        8003,
        rules=[
            {"id": "api-v1", "domain": "api.example.com", "path": "/v1", "backend_group_id": "bg-c"},
            {"id": "wild", "domain": "*.example.com", "backend_group_id": "bg-b"},
            {"id": "v1", "path": "/v1", "backend_group_id": "bg-a"},
            {"id": "v1-admin", "path": "/v1/admin", "backend_group_id": "bg-c"},
            {"id": "old", "domain": "old.example.com", "redirect": {"code": 301, "host": "new.example.com"}},
        ],
    ),
    "to-https": http("to-https", 8004, redirect={"code": 307, "scheme": "https"}),
    "moved": http("moved", 8005, redirect={"code": 302, "host": "www.example.com", "path": "/moved"}),
    "gzip": http("gzip", 8006, gzip=True),
    "rate": http("rate", 8007, http_request_rate=5),
    "rate-src": http("rate-src", 8008, http_request_rate_per_src=5),
    "drain": http("drain", 8009, group="bg-drain", scheduler="wrr"),
    "health": http(
        "health",
        8010,
        group="hc",
        health_check=HEALTH,
        rules=[{"id": "hc-rule", "path": "/rule", "backend_group_id": "hc-rule"}],
    ),
    "proxy": {
        "id": "proxy",
        "listener_type": "tcp",
        "listener_port": 8011,
        "backend_group_id": "bg-proxy",
        "send_proxy": "v1",
    },
    "nobody": http("nobody", 8012, acl={"type": "white", "cidrs": []}),
    "xff": http("xff", 8013, x_forwarded_for=True),
    "white": http("white", 8014, acl={"type": "white", "cidrs": CLIENT_ONLY}),
    "black": http("black", 8015, acl={"type": "black", "cidrs": CLIENT_ONLY}),
    "sch": http("sch", 8016, scheduler="sch"),
}


def url(listener: str, path: str = "/") -> str:
    return f"http://{VIP}:{LISTENERS[listener]['listener_port']}{path}"


@pytest.fixture(scope="module")
def env(sandbox, tmp_path_factory):
    with listener_env(
        sandbox,
        tmp_path_factory.mktemp("http"),
        backends=("a", "b", "c"),
        clients=CLIENTS,
        lb_ports={"web": (MAC, VIP)},
    ) as e:
        e.lb_id = f"{e.vpc.prefix}-web"
        e.apply(web_lb(e.lb_id))
        yield e


def web_lb(lb_id: str) -> dict:
    groups = {
        "bg-ab": [member("bg-ab", "a"), member("bg-ab", "b")],
        "bg-a": [member("bg-a", "a")],
        "bg-b": [member("bg-b", "b")],
        "bg-c": [member("bg-c", "c")],
        "bg-drain": [member("bg-drain", "a", weight=0), member("bg-drain", "b")],
        "hc": [member("hc", "a"), member("hc", "b")],
        "hc-rule": [member("hc-rule", "c")],
        "bg-proxy": [member("bg-proxy", "c", port=8100)],
    }
    return loadbalancer(lb_id, VIP, MAC, list(LISTENERS.values()), groups)


def test_plain_http_balances_round_robin(env):
    assert collections.Counter(backends_of(env.client, url("plain"), 4)) == {"backend-a": 2, "backend-b": 2}


def test_sticky_insert_cookie_pins_a_client(env):
    first = request(env.client, url("insert"))
    cookie = next(c for c in first.headers["set-cookie"] if c.startswith("LBSRV="))
    value = cookie.split(";")[0]
    pinned = backends_of(env.client, url("insert"), 6, "-b", value)
    assert set(pinned) == {first.backend}, pinned
    # The backend never sees the agent's cookie; without it, both backends answer.
    assert "LBSRV" not in request(env.client, url("insert"), "-b", value).seen["headers"].get("cookie", "")
    assert set(backends_of(env.client, url("insert"), 4)) == {"backend-a", "backend-b"}


def test_sticky_server_cookie_is_prefixed_and_pins_a_client(env):
    first = request(env.client, url("server"))
    cookie = next(c for c in first.headers["set-cookie"] if c.startswith(f"{APP_COOKIE}="))
    value = cookie.split(";")[0]
    # haproxy prefixes the backend's own cookie with the server's tag ...
    assert re.fullmatch(rf"{APP_COOKIE}=[0-9a-f]{{16}}~{first.backend}-session", value), value
    replies = [request(env.client, url("server"), "-b", value) for _ in range(6)]
    assert {reply.backend for reply in replies} == {first.backend}
    # ... and strips the tag again before the backend sees its cookie.
    assert replies[0].seen["headers"]["cookie"] == f"{APP_COOKIE}={first.backend}-session"


@pytest.mark.parametrize(
    ("host", "path", "expected"),
    [
        ("api.example.com", "/v1/users", {"backend-c"}),  # domain and path beat the rest
        ("API.example.com:8003", "/v1", {"backend-c"}),  # case and port do not matter
        ("api.example.com", "/other", {"backend-b"}),  # the wildcard
        ("www.example.com", "/v1", {"backend-b"}),  # a domain beats a path
        ("example.org", "/v1/x", {"backend-a"}),  # a path alone
        ("example.org", "/v1/admin/x", {"backend-c"}),  # the longer path
        ("example.org", "/", {"backend-a", "backend-b"}),  # no rule: the listener's group
    ],
)
def test_rules_route_to_the_most_specific_match(env, host, path, expected):
    assert set(backends_of(env.client, url("rules", path), 4, host=host)) == expected


def test_rule_redirect_answers_with_its_code_and_location(env):
    reply = request(env.client, url("rules", "/p?q=1"), host="old.example.com")
    assert (reply.status, reply.header("location")) == (301, "http://new.example.com/p?q=1")


def test_listener_redirects_keep_what_they_do_not_set(env):
    reply = request(env.client, url("to-https", "/a?b=1"))
    assert (reply.status, reply.header("location")) == (307, f"https://{VIP}:8004/a?b=1")
    reply = request(env.client, url("moved", "/x?y=1"))
    assert (reply.status, reply.header("location")) == (302, "http://www.example.com/moved?y=1")
    assert request(env.client, url("moved", "/x")).header("location") == "http://www.example.com/moved"


def test_gzip_compresses_when_the_client_asks(env):
    asked = request(env.client, url("gzip"), "-H", "Accept-Encoding: gzip", "--compressed")
    assert asked.header("content-encoding") == "gzip"
    assert asked.backend in {"backend-a", "backend-b"}  # curl decompressed it
    assert request(env.client, url("gzip")).header("content-encoding") is None
    assert request(env.client, url("plain"), "-H", "Accept-Encoding: gzip").header("content-encoding") is None


def wait_below_rate(client, listener: str) -> None:
    """Until `client` is served again; polling slower than the limits (5/s) so as not to keep it above."""
    wait_until(lambda: status_codes(client, url(listener), 1) == [200], 10, f"{listener} below the rate", interval=0.5)


def test_request_rate_answers_429_above_the_limit(env):
    for listener in ("rate", "rate-src"):
        codes = collections.Counter(status_codes(env.client, url(listener), 30))
        assert set(codes) == {200, 429}, (listener, codes)
        assert 1 <= codes[200] <= 12 and codes[429] >= 18, (listener, codes)
        wait_below_rate(env.client, listener)


def test_weight_zero_drains_a_backend(env):
    assert set(backends_of(env.client, url("drain"), 6)) == {"backend-b"}


def test_health_check_takes_a_failing_backend_out_and_brings_it_back(env):
    # hc-rule-c serves the rule's own backend.
    env.wait_health(env.lb_id, {"hc-a": "up", "hc-b": "up", "hc-rule-c": "up"})
    assert env.health(env.lb_id)["bg-ab-a"] == "unchecked"  # a listener without a check
    env.backends["b"].stop_http()
    try:
        env.wait_health(env.lb_id, {"hc-b": "down"})
        assert env.health(env.lb_id)["hc-a"] == "up"
        assert set(backends_of(env.client, url("health"), 6)) == {"backend-a"}
    finally:
        env.restart_backend("b")
    env.wait_health(env.lb_id, {"hc-b": "up"})
    assert set(backends_of(env.client, url("health"), 4)) == {"backend-a", "backend-b"}
    assert set(backends_of(env.client, url("health", "/rule"), 2)) == {"backend-c"}


def test_empty_white_list_admits_no_one(env):
    assert all(refused(client, url("nobody")) for client in env.clients[:2])
    assert not refused(env.client, url("plain"))


@contextmanager
def proxy_protocol_backend(env):
    """c answers on 8100 expecting a PROXY v1 line (its usual server is back afterwards)."""
    server = env.backends["c"]
    server.stop_http()
    try:
        start_backend(server, "c", port=8100, proxy_protocol=True)
        yield
    finally:
        env.restart_backend("c")


def test_send_proxy_v1_announces_the_connection(env):
    with proxy_protocol_backend(env):
        proxy_line = request(env.client, url("proxy")).seen["proxy"]
    assert re.fullmatch(r"PROXY TCP4 [0-9.]+ [0-9.]+ \d+ 8011", proxy_line), proxy_line


# --- haproxy must see the client's own address ---------------------------------------------


def test_x_forwarded_for_is_the_clients_vpc_address(env):
    for client in env.clients[:2]:
        assert request(client, url("xff")).seen["headers"]["x-forwarded-for"] == client.ip
    assert "x-forwarded-for" not in request(env.client, url("plain")).seen["headers"]


def test_white_list_admits_the_listed_client_only(env):
    listed, other = env.clients[0], env.clients[1]
    assert listed.ip == "198.18.0.31"
    assert request(listed, url("white")).status == 200
    assert refused(other, url("white"))


def test_black_list_refuses_the_listed_client_only(env):
    listed, other = env.clients[0], env.clients[1]
    assert refused(listed, url("black"))
    assert request(other, url("black")).status == 200


def test_source_hash_pins_each_client_and_spreads_several(env):
    chosen = {}
    for client in env.clients:
        seen = set(backends_of(client, url("sch"), 4))
        assert len(seen) == 1, (client.ip, seen)
        chosen[client.ip] = seen.pop()
    assert set(chosen.values()) == {"backend-a", "backend-b"}, chosen


def test_per_source_rate_limits_each_client_alone(env):
    wait_below_rate(env.client, "rate-src")
    assert 429 in status_codes(env.client, url("rate-src"), 30)
    assert status_codes(env.clients[1], url("rate-src"), 3) == [200, 200, 200]


def test_proxy_line_names_the_client(env):
    with proxy_protocol_backend(env):
        proxy_line = request(env.client, url("proxy")).seen["proxy"]
    assert proxy_line.startswith(f"PROXY TCP4 {env.client.ip} "), proxy_line
