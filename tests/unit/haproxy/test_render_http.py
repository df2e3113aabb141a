"""Rendering of http and https listeners: a golden file per feature group, each
checked by haproxy itself with real certificates, and the choices the renderer
makes on its own (rule order, redirect locations, certificate files, TLS
policies, access lists), including its refusal of unsafe values.

Regenerate the golden files after an intended change with
`make golden` and review the diff.
"""

import contextlib
import socket
import ssl
import subprocess
import threading
import time
from http.client import HTTPConnection, HTTPSConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from lbagent.desired.members import Member
from lbagent.desired.model import Redirect
from lbagent.haproxy.errors import RenderError
from lbagent.haproxy.render import render_config, server_cookie
from lbagent.haproxy.routing import redirect_view, rule_views
from lbagent.haproxy.tls import STRICT_CIPHERS, TLS_POLICIES, certificate_files
from tests.unit.samples import (
    HAPROXY,
    WAIT,
    assert_golden,
    certificate,
    free_port,
    haproxy_check,
    only_loadbalancer,
    sample_members,
    write_checkable,
)

GROUPS = [
    {
        "id": "bg-web",
        "backends": [
            {"id": "be-1", "address": "198.18.0.21", "port": 80},
            {"id": "be-2", "address": "198.18.0.22", "port": 80, "weight": 3, "ssl": True},
        ],
    },
    {"id": "bg-api", "backends": [{"id": "be-3", "address": "198.18.0.23", "port": 8080}]},
]


def http(listener_id, port, **fields):
    return {"id": listener_id, "listener_type": "http", "listener_port": port, "backend_group_id": "bg-web", **fields}


def https(listener_id, port, cert_names=("one.example.com",), **fields):
    certs = [{"id": f"c{i}", **certificate(name)} for i, name in enumerate(cert_names)]
    return {
        "id": listener_id,
        "listener_type": "https",
        "listener_port": port,
        "backend_group_id": "bg-web",
        "certificates": certs,
        **fields,
    }


def lb_with(*listeners, lb_id="lb-h"):
    return only_loadbalancer(lb_id, list(listeners), GROUPS)


def render(lb, outer="169.254.0.101", inner="169.254.0.100"):
    return render_config(lb, outer, sample_members(lb), inner=inner)


RULES = [
    {"id": "path", "path": "/v1", "backend_group_id": "bg-api"},
    {"id": "wild", "domain": "*.example.com", "backend_group_id": "bg-api"},
    {"id": "api", "domain": "api.example.com", "path": "/v1", "backend_group_id": "bg-web"},
    {
        "id": "old",
        "domain": "old.example.com",
        "redirect": {"code": 301, "scheme": "https", "host": "new.example.com", "path": "/n%41"},
    },
    {"id": "admin", "path": "/v1/admin", "redirect": {"code": 307, "path": "/login"}},
]

FEATURES = {
    # Sticky insert with a lifetime, a white list, both rate limits, X-Forwarded-For, gzip.
    "http_sticky_acl_rates.cfg": lambda: lb_with(
        http(
            "ins",
            80,
            sticky_session={"type": "insert", "cookie": "LBSRV", "cookie_timeout": 3600},
            acl={"type": "white", "cidrs": ["198.18.0.0/24", "198.19.0.0/16"]},
            x_forwarded_for=True,
            gzip=True,
            http_request_rate=100,
            http_request_rate_per_src=10,
            timeouts={"client_request": 7, "client_idle": 60},
        ),
        http(
            "srv",
            81,
            scheduler="wrr",
            sticky_session={"type": "server", "cookie": "JSESSIONID"},
            acl={"type": "black", "cidrs": ["198.18.0.66/32"]},
        ),
        http("nobody", 82, acl={"type": "white", "cidrs": []}),
    ),
    # Rules of every kind with a health check, and redirects at listener level.
    "http_rules_redirects.cfg": lambda: lb_with(
        http(
            "rules",
            80,
            scheduler="wlc",
            rules=RULES,
            redirect={"code": 302, "host": "www.example.com"},
            health_check={
                "type": "http",
                "uri": "/healthz",
                "domain": "www.example.com",
                "http_code": "http_2xx",
                "rise": 1,
                "fall": 1,
                "interval": 1,
                "timeout": 1,
            },
        ),
        http("scheme", 81, redirect={"code": 301, "scheme": "https"}),
        # A rule takes /elsewhere: the listener's redirect there does not loop.
        http(
            "path",
            82,
            redirect={"code": 307, "path": "/elsewhere"},
            rules=[{"id": "there", "path": "/elsewhere", "backend_group_id": "bg-api"}],
        ),
    ),
    # SNI over several certificates (one carried by a rule), HTTP/2, each cipher policy,
    # TLS and the PROXY protocol towards the backends.
    "https.cfg": lambda: lb_with(
        https(
            "h2",
            443,
            ("one.example.com", "two.example.com"),
            http2=True,
            send_proxy="v2-ssl-cn",
            rules=[
                {
                    "id": "three",
                    "domain": "three.example.com",
                    "backend_group_id": "bg-api",
                    "certificates": [{"id": "c3", **certificate("three.example.com")}],
                }
            ],
        ),
        https("strict", 8443, tls_cipher_policy="tls_cipher_policy_1_2_strict", x_forwarded_for=True),
        https("legacy", 8444, tls_cipher_policy="tls_cipher_policy_1_0", sticky_session={"type": "insert"}),
        https("tls11", 8445, tls_cipher_policy="tls_cipher_policy_1_1"),
    ),
}


@pytest.mark.parametrize("name", FEATURES)
def test_feature_matches_golden(name):
    assert_golden(name, render(FEATURES[name]()).text)


@pytest.mark.parametrize("name", FEATURES)
def test_feature_is_valid_haproxy(name, tmp_path):
    lb = FEATURES[name]()
    config = render(lb, outer="127.0.0.1", inner="127.0.0.1")
    result = haproxy_check(*write_checkable(tmp_path, config, lb.id))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


def test_a_dual_stack_listener_keeps_per_source_rates_for_clients_of_both_families(tmp_path):
    lb = FEATURES["http_sticky_acl_rates.cfg"]()
    assert "stick-table type ip " in render(lb).text
    dual = render_config(lb, "127.0.0.1", sample_members(lb), inner="127.0.0.1", outer6="::1", inner6="::1")
    assert "stick-table type ipv6 " in dual.text and "stick-table type ip " not in dual.text
    result = haproxy_check(*write_checkable(tmp_path, dual, lb.id))
    assert result.returncode == 0, result.stdout + result.stderr


# --- rules and redirects ------------------------------------------------------------------


def test_rules_are_tried_most_specific_first():
    lb = lb_with(
        http(
            "rules",
            80,
            rules=[
                {"id": "none-short", "path": "/v", "backend_group_id": "bg-api"},
                {"id": "wild-short", "domain": "*.example.com", "backend_group_id": "bg-api"},
                {"id": "exact", "domain": "api.example.com", "backend_group_id": "bg-api"},
                {"id": "none-long", "path": "/v1/admin", "backend_group_id": "bg-api"},
                {"id": "wild-long", "domain": "*.eu.example.com", "backend_group_id": "bg-api"},
                {"id": "exact-path", "domain": "api.example.com", "path": "/v1", "backend_group_id": "bg-api"},
                {"id": "wild-path", "domain": "*.example.com", "path": "/v1", "backend_group_id": "bg-api"},
            ],
        )
    )
    order = [rule.id for rule in rule_views(lb.listeners[0].rules, lambda rule: "b", "http")]
    assert order == ["exact-path", "exact", "wild-long", "wild-path", "wild-short", "none-long", "none-short"]


def test_rule_selection_comes_before_every_redirect_and_backend():
    text = render(FEATURES["http_rules_redirects.cfg"]()).text
    frontend = text.split("\n\n")[1]
    lines = [line.strip() for line in frontend.splitlines()]
    last_choice = max(i for i, line in enumerate(lines) if line.startswith("http-request set-var"))
    first_action = min(i for i, line in enumerate(lines) if line.startswith(("http-request redirect", "use_backend")))
    assert last_choice < first_action
    # The listener's own redirect only for requests no rule claimed.
    assert (
        "http-request redirect location http://www.example.com%[pathq] code 302 if !{ var(txn.lbagent_rule) -m found }"
    ) in lines


def test_each_routing_rule_has_its_own_backend_named_with_colons():
    text = render(FEATURES["http_rules_redirects.cfg"]()).text
    assert "backend be:lb-h:rules:api\n" in text and "backend be:lb-h:rules:path\n" in text
    # Redirect rules need no backend.
    assert "be:lb-h:rules:old" not in text and "be:lb-h:rules:admin" not in text
    assert "    use_backend be:lb-h:rules:wild if { var(txn.lbagent_rule) -m str -- wild }\n" in text


def redirect(**fields):
    return Redirect(**fields)


@pytest.mark.parametrize(
    ("fields", "own", "expected"),
    [
        ({"scheme": "https"}, "http", ("https", None, None)),
        ({"host": "b.example.com"}, "https", (None, "https://b.example.com%[pathq]", None)),
        ({"scheme": "http", "host": "b.example.com"}, "https", (None, "http://b.example.com%[pathq]", None)),
        ({"path": "/new"}, "http", (None, "/new", "/new?%[query]")),
        (
            {"scheme": "https", "path": "/new"},
            "http",
            (None, "https://%[req.hdr(host)]/new", "https://%[req.hdr(host)]/new?%[query]"),
        ),
        ({"path": "/100%"}, "http", (None, "/100%%", "/100%%?%[query]")),
    ],
)
def test_redirect_keeps_what_it_does_not_set(fields, own, expected):
    view = redirect_view(redirect(code=301, **fields), own)
    assert (view.scheme, view.location, view.location_with_query) == expected
    assert view.code == 301


# --- sticky sessions, access lists, rates ---------------------------------------------------


def test_sticky_cookie_values_are_stable_and_name_no_backend():
    text = render(FEATURES["http_sticky_acl_rates.cfg"]()).text
    assert f"server be-1 169.254.0.100:1025 weight 1 cookie {server_cookie('be-1')}\n" in text
    assert server_cookie("be-1") == server_cookie("be-1") != server_cookie("be-2")
    assert "be-1" not in server_cookie("be-1")
    assert "    cookie LBSRV insert indirect nocache maxlife 3600s\n" in text
    assert "    cookie JSESSIONID prefix\n" in text


def test_session_cookie_without_lifetime():
    text = render(lb_with(http("l", 80, sticky_session={"type": "insert", "cookie": "S"}))).text
    assert "    cookie S insert indirect nocache\n" in text


def test_long_access_lists_are_split_over_lines_of_one_name():
    cidrs = [f"198.18.{i}.0/24" for i in range(40)]
    text = render(lb_with(http("l", 80, acl={"type": "white", "cidrs": cidrs}))).text
    lines = [line for line in text.splitlines() if line.startswith("    acl lbagent_src src ")]
    assert [len(line.split()) - 3 for line in lines] == [16, 16, 8]
    assert text.count("tcp-request connection reject if !lbagent_src\n") == 1


def test_empty_white_list_admits_no_one_and_empty_black_list_everyone():
    assert "    tcp-request connection reject\n" in render(lb_with(http("l", 80, acl={"type": "white"}))).text
    assert "tcp-request" not in render(lb_with(http("l", 80, acl={"type": "black"}))).text


def test_tcp_listener_takes_the_access_list_and_no_http_line():
    # The http options themselves are refused on tcp listeners (tests/unit/desired/test_listener_types.py).
    listener = {
        "id": "t",
        "listener_type": "tcp",
        "listener_port": 80,
        "backend_group_id": "bg-web",
        "acl": {"type": "black", "cidrs": ["198.18.0.66/32"]},
    }
    text = render(lb_with(listener)).text
    assert "tcp-request connection reject if lbagent_src\n" in text
    for http_only in ("429", "compression", "forwardfor", "stick-table", "http-request"):
        assert http_only not in text


# --- TLS ---------------------------------------------------------------------------------


def test_certificate_files_put_the_listeners_first_certificate_first():
    names = [f"n{i}.example.com" for i in range(11)]
    listener = https(
        "web",
        443,
        names[:10],
        rules=[
            {
                "id": "r",
                "domain": "x.example.com",
                "backend_group_id": "bg-api",
                "certificates": [{"id": "rule-cert", **certificate(names[10])}],
            }
        ],
    )
    files = certificate_files(lb_with(listener).listeners[0])
    assert list(files) == sorted(files)
    assert list(files)[0] == "web/00-c0.pem" and list(files)[-1] == "web/10-rule-cert.pem"
    pem = files["web/00-c0.pem"].decode()
    assert pem.startswith("-----BEGIN CERTIFICATE-----") and "-----BEGIN PRIVATE KEY-----" in pem
    assert pem.index("END CERTIFICATE") < pem.index("BEGIN PRIVATE KEY")


def test_render_config_returns_files_only_for_https_listeners():
    config = render(lb_with(http("plain", 80), https("tls", 443)))
    assert set(config.files) == {"tls/0-c0.pem"}
    assert "    bind 169.254.0.101:443 ssl crt lb-h/tls ssl-min-ver TLSv1.2 ciphers " in config.text
    assert "c0" not in config.text and "PRIVATE" not in config.text
    assert "PRIVATE" not in repr(config)


def test_disabled_https_listener_writes_no_files():
    assert render(lb_with(https("tls", 443, status="disabled"))).files == {}


def test_http2_is_offered_by_alpn_only_when_asked():
    assert " alpn h2,http/1.1 " in render(lb_with(https("tls", 443, http2=True))).text
    assert " alpn " not in render(lb_with(https("tls", 443))).text


def test_cipher_policies():
    versions = {name: policy.min_version for name, policy in TLS_POLICIES.items()}
    assert versions == {
        "tls_cipher_policy_1_0": "TLSv1.0",
        "tls_cipher_policy_1_1": "TLSv1.1",
        "tls_cipher_policy_1_2": "TLSv1.2",
        "tls_cipher_policy_1_2_strict": "TLSv1.2",
    }
    strict = TLS_POLICIES["tls_cipher_policy_1_2_strict"].ciphers.split(":")
    assert strict == STRICT_CIPHERS.split(":")
    assert all(c.startswith("ECDHE-") and ("GCM" in c or "CHACHA20" in c) for c in strict)
    assert "AES128-SHA" in TLS_POLICIES["tls_cipher_policy_1_2"].ciphers.split(":")
    assert TLS_POLICIES["tls_cipher_policy_1_0"].ciphers.endswith(":@SECLEVEL=0")
    assert "@SECLEVEL" not in TLS_POLICIES["tls_cipher_policy_1_2"].ciphers


def test_backend_tls_on_https_listeners_too():
    assert "server be-2 169.254.0.100:1026 weight 1 ssl verify none\n" in render(lb_with(https("t", 443))).text


# --- unsafe values (defence in depth: the model refuses them first) -------------------------


def replace_in_listener(lb, **changes):
    return lb.model_copy(update={"listeners": [lb.listeners[0].model_copy(update=changes)]})


def replace_in_rule(lb, **changes):
    listener = lb.listeners[0]
    return replace_in_listener(lb, rules=[listener.rules[0].model_copy(update=changes)])


BAD = ["a b", "a\nb", 'a"b', "a#b", "a\\b", "x" * 10 + "\n    bind 0.0.0.0:22"]


@pytest.mark.parametrize("value", BAD)
def test_unsafe_rule_domain_is_refused(value):
    lb = lb_with(http("l", 80, rules=[{"id": "r", "domain": "a.example.com", "backend_group_id": "bg-api"}]))
    with pytest.raises(RenderError):
        render(replace_in_rule(lb, domain=value))


@pytest.mark.parametrize("value", BAD)
def test_unsafe_rule_path_is_refused(value):
    lb = lb_with(http("l", 80, rules=[{"id": "r", "path": "/a", "backend_group_id": "bg-api"}]))
    with pytest.raises(RenderError):
        render(replace_in_rule(lb, path="/" + value))


@pytest.mark.parametrize("value", BAD)
def test_unsafe_cookie_name_is_refused(value):
    lb = lb_with(http("l", 80, sticky_session={"type": "insert", "cookie": "S"}))
    sticky = lb.listeners[0].sticky_session.model_copy(update={"cookie": value})
    with pytest.raises(RenderError):
        render(replace_in_listener(lb, sticky_session=sticky))


@pytest.mark.parametrize("field", ["host", "path"])
@pytest.mark.parametrize("value", BAD)
def test_unsafe_redirect_part_is_refused(field, value):
    lb = lb_with(http("l", 80, redirect={"code": 302, "host": "a.example.com"}))
    bad = lb.listeners[0].redirect.model_copy(update={field: ("/" if field == "path" else "") + value})
    with pytest.raises(RenderError):
        render(replace_in_listener(lb, redirect=bad))


@pytest.mark.parametrize("cidr", ["198.18.0.0/24 0.0.0.0/0", "198.18.0.0/24\n"])
def test_unsafe_acl_entry_is_refused(cidr):
    lb = lb_with(http("l", 80, acl={"type": "black", "cidrs": ["198.18.0.0/24"]}))
    acl = lb.listeners[0].acl.model_copy(update={"cidrs": [cidr]})
    with pytest.raises(RenderError):
        render(replace_in_listener(lb, acl=acl))


@pytest.mark.parametrize("cert_id", ["../../etc", "a/b", "a\nb", "x" * 200])
def test_certificate_id_never_becomes_a_path_outside_the_directory(cert_id):
    lb = lb_with(https("tls", 443))
    cert = lb.listeners[0].certificates[0].model_copy(update={"id": cert_id})
    with pytest.raises(RenderError):
        render(replace_in_listener(lb, certificates=[cert]))


def test_https_listener_without_certificate_is_refused():
    lb = lb_with(https("tls", 443))
    with pytest.raises(RenderError, match="no certificate"):
        render(replace_in_listener(lb, certificates=[]))


# --- ids that look like haproxy flags ---------------------------------------------------------

# Ids may start with '-'. Where an id is an ACL pattern, haproxy would read
# these as its own flags: "-u" takes the next word as an ACL id, "--" ends the
# flags so nothing is left to match, "-m" and "-f" change how or from where.
FLAG_IDS = ("-u", "--", "-m", "-f", "-i")


class NamedBackend(BaseHTTPRequestHandler):
    """Answers every request with the member key its server was started for."""

    def do_GET(self):  # noqa: N802 - http.server's name
        body = self.server.member_key.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def named_backends(keys):
    """One HTTP server on 127.0.0.1 per member key; yields key -> port."""
    servers = {}
    try:
        for key in keys:
            server = ThreadingHTTPServer(("127.0.0.1", 0), NamedBackend)
            server.member_key = key
            threading.Thread(target=server.serve_forever, daemon=True).start()
            servers[key] = server
        yield {key: server.server_address[1] for key, server in servers.items()}
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()


@contextlib.contextmanager
def running_haproxy(paths, ports):
    """haproxy in the foreground on these files until the block ends, once it accepts on every port."""
    (paths[0].parent / "haproxy").mkdir(exist_ok=True)  # where the base file puts the stats socket
    command = [HAPROXY, "-db"] + [word for path in paths for word in ("-f", str(path))]
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + WAIT
        for port in ports:
            while not port_accepts(port):
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, f"haproxy does not accept on {port}"
                time.sleep(0.02)
        yield proc
    finally:
        proc.terminate()
        proc.wait(WAIT)
        proc.stdout.close()


def port_accepts(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def get(port, path="/", host="x.example.com", tls=False):
    """(status, body, Location) of one GET through haproxy."""
    if tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn = HTTPSConnection("127.0.0.1", port, timeout=WAIT, context=context)
    else:
        conn = HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read().decode(), response.getheader("Location")
    finally:
        conn.close()


def flag_id_lb(http_port, https_port):
    groups = [
        {"id": "-d", "backends": [{"id": "--", "address": "198.18.0.21", "port": 80}]},
        {"id": "-i", "backends": [{"id": "-f", "address": "198.18.0.22", "port": 80}]},
        {"id": "-m", "backends": [{"id": "-u", "address": "198.18.0.23", "port": 80}]},
    ]
    rules = [
        {"id": "-u", "path": "/u", "backend_group_id": "-i"},
        {"id": "--", "domain": "dash.example.com", "backend_group_id": "-m"},
        {"id": "-m", "domain": "*.m.example.com", "path": "/m", "backend_group_id": "-i"},
        {"id": "-f", "path": "/r", "redirect": {"code": 302, "path": "/moved"}},
    ]
    listeners = [
        {"id": "-f", "listener_type": "http", "listener_port": http_port, "backend_group_id": "-d", "rules": rules},
        {
            "id": "--",
            "listener_type": "https",
            "listener_port": https_port,
            "backend_group_id": "-d",
            "sticky_session": {"type": "insert", "cookie": "-u"},
            "certificates": [{"id": "-u", **certificate("one.example.com")}],
            "rules": [
                {
                    "id": "-i",
                    "domain": "two.example.com",
                    "backend_group_id": "-m",
                    "certificates": [{"id": "--", **certificate("two.example.com")}],
                }
            ],
        },
    ]
    return only_loadbalancer("-u", listeners, groups)


def test_ids_that_look_like_flags_are_valid_and_route(tmp_path):
    http_port, https_port = free_port(), free_port()
    lb = flag_id_lb(http_port, https_port)
    keys = [backend.id for group in lb.backend_groups for backend in group.backends]
    with named_backends(keys) as ports:
        members = {
            group.id: [Member(b.id, b.address, b.port, 1, "off", False, ports[b.id]) for b in group.backends]
            for group in lb.backend_groups
        }
        config = render_config(lb, "127.0.0.1", members, inner="127.0.0.1")
        checkable = write_checkable(tmp_path, config, lb.id)
        result = haproxy_check(*checkable)
        assert result.returncode == 0, result.stdout + result.stderr
        with running_haproxy(checkable, (http_port, https_port)):
            assert get(http_port, "/u/x")[:2] == (200, "-f")
            assert get(http_port, host="dash.example.com")[:2] == (200, "-u")
            assert get(http_port, "/m", host="a.m.example.com")[:2] == (200, "-f")
            assert get(http_port, "/m", host="m.example.org")[:2] == (200, "--")
            assert get(http_port, "/r") == (302, "", "/moved")
            assert get(http_port)[:2] == (200, "--")
            assert get(https_port, tls=True)[:2] == (200, "--")
            assert get(https_port, host="two.example.com", tls=True)[:2] == (200, "-u")
