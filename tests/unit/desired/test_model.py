"""Desired-state validation (lbagent.desired.model): the api.md example, defaults, and 400-style details."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lbagent.desired.fields import MAX_ECHO_LEN, MAX_LISTENERS_PER_LB
from lbagent.desired.model import DesiredState, Timeouts, json_schema, parse_desired_state
from lbagent.errors import InvalidDesiredState, LbAgentError
from tests.unit.samples import EXAMPLE, certificate

CERT, KEY = certificate("www.example.com").values()
KEY_LINE = KEY.splitlines()[1]  # a line of key material, which no message or repr may show

UNSET = object()


def body(**changes: Any) -> dict[str, Any]:
    """The api.md example with the fields at "a__0__b" paths set, appended or (given UNSET) removed."""
    doc = copy.deepcopy(EXAMPLE)
    for pointer, value in changes.items():
        *parents, last = pointer.split("__")
        node: Any = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = int(last) if isinstance(node, list) else last
        if value is UNSET:
            del node[key]
        elif isinstance(node, list) and key == len(node):
            node.append(value)
        else:
            node[key] = value
    return doc


def problems(doc: Any) -> list[dict[str, str]]:
    with pytest.raises(InvalidDesiredState) as caught:
        parse_desired_state(doc)
    assert caught.value.details, "an invalid body must say why"
    return caught.value.details


def problem_at(doc: Any, path: str) -> str:
    details = problems(doc)
    messages = [d["message"] for d in details if d["path"] == path]
    assert messages, f"no problem reported at {path}: {details}"
    return messages[0]


LB = "loadbalancers__0"
LSN = f"{LB}__listeners__0"
LSN_PATH = "/loadbalancers/0/listeners/0"


def https_listener(**extra: Any) -> dict[str, Any]:
    return {
        "id": "lsn-tls",
        "listener_type": "https",
        "listener_port": 443,
        "backend_group_id": "bg-1",
        "certificates": [{"id": "cert-1", "certificate": CERT, "private_key": KEY}],
        **extra,
    }


# --- valid input -----------------------------------------------------------------


def test_api_example_parses_unchanged() -> None:
    state = parse_desired_state(copy.deepcopy(EXAMPLE))
    lb = state.loadbalancers[0]
    listener = lb.listeners[0]
    assert state.generation == 7
    assert lb.id == "3f2a9c1e-5d7b-4e0a-9c3f-2a9c1e5d7b4e"
    assert lb.network.mac == "00:22:0a:00:00:12"
    assert listener.listener_port == 80 and listener.redirect is None
    assert listener.health_check is not None and listener.health_check.http_code == "http_2xx,http_3xx"
    assert listener.rules[0].backend_group_id == "bg-2"
    assert lb.backend_groups[1].pod_selector is not None and lb.backend_groups[1].pod_selector.port == "http"
    assert state.pods[0].ports[0].name == "http"


def test_dump_round_trips() -> None:
    state = parse_desired_state(copy.deepcopy(EXAMPLE))
    assert parse_desired_state(json.loads(json.dumps(state.model_dump(mode="json")))) == state


def test_helpers() -> None:
    state = parse_desired_state(body(**{f"{LB}__status": "disabled", f"{LSN}__status": "disabled"}))
    lb = state.loadbalancers[0]
    assert state.subnet("net-1").gateway == "198.18.0.1"
    assert state.loadbalancer(lb.id) is lb
    assert lb.backend_group("bg-2").pod_selector is not None
    assert not lb.enabled and not lb.listeners[0].enabled
    with pytest.raises(KeyError):
        state.subnet("net-9")
    with pytest.raises(KeyError):
        lb.backend_group("bg-9")
    network = state.provider_networks[0]
    assert network.interface_for("gw-1") == "eth1"
    assert network.interface_for("gw-2") == "eth2"
    assert network.interface_for("gw-3") is None


def test_models_are_frozen() -> None:
    state = parse_desired_state(copy.deepcopy(EXAMPLE))
    with pytest.raises(ValidationError):
        state.generation = 8  # type: ignore[misc]


def test_defaults_filled() -> None:
    state = parse_desired_state(
        {
            "generation": 0,
            "subnets": [{"id": "n", "cidr": "10.0.0.0/24", "gateway": "10.0.0.1"}],
            "loadbalancers": [
                {
                    "id": "lb",
                    "network": {"subnet_id": "n", "ip": "10.0.0.5", "mac": "02:00:00:00:00:05"},
                    "listeners": [
                        {
                            "id": "l",
                            "listener_type": "http",
                            "listener_port": 80,
                            "backend_group_id": "g",
                            "sticky_session": {},
                            "timeouts": {"client_idle": 60},
                            "health_check": {},
                        }
                    ],
                    "backend_groups": [{"id": "g", "backends": [{"id": "b", "address": "10.0.0.9", "port": 80}]}],
                }
            ],
        }
    )
    assert state.pods == [] and state.provider_networks == []
    subnet = state.subnets[0]
    assert subnet.mtu == 1442 and subnet.routes == []
    lb = state.loadbalancers[0]
    assert lb.status == "enabled" and lb.name == ""
    listener = lb.listeners[0]
    assert listener.scheduler == "rr" and listener.send_proxy == "off"
    assert listener.tls_cipher_policy == "tls_cipher_policy_1_2"
    assert not (listener.x_forwarded_for or listener.gzip or listener.http2)
    assert listener.acl is None and listener.redirect is None
    assert listener.certificates == [] and listener.rules == []
    assert listener.http_request_rate == 0 and listener.http_request_rate_per_src == 0
    assert listener.sticky_session is not None
    assert listener.sticky_session.type == "insert" and listener.sticky_session.cookie == "SERVERID"
    assert listener.timeouts is not None
    assert listener.timeouts.client_idle == 60 and listener.timeouts.backend_connect is None
    assert listener.health_check is not None and listener.health_check.type == "tcp"
    backend = lb.backend_groups[0].backends[0]
    assert backend.weight == 1 and backend.send_proxy == "off" and backend.ssl is False
    assert lb.backend_groups[0].pod_selector is None


def test_https_listener_with_certificates() -> None:
    doc = body()
    doc["loadbalancers"][0]["listeners"].append(https_listener(http2=True))
    state = parse_desired_state(doc)
    served = state.loadbalancers[0].listeners[1].certificates[0]
    assert served.private_key == KEY
    assert KEY_LINE not in repr(state)


def test_mac_is_normalised_to_lowercase() -> None:
    state = parse_desired_state(body(**{f"{LB}__network__mac": "00:22:0A:00:00:12"}))
    assert state.loadbalancers[0].network.mac == "00:22:0a:00:00:12"


@pytest.mark.parametrize(
    "changes",
    [
        {f"{LSN}__rules__0__domain": "*.example.com"},
        {f"{LSN}__rules__0__domain": "", f"{LSN}__rules__0__path": "/"},
        {f"{LB}__backend_groups__1__pod_selector__port": 8080},
        {f"{LB}__backend_groups__0__backends__0__weight": 0},
        {f"{LSN}__redirect": {"code": 301, "scheme": "https"}},
        {f"{LSN}__acl": {"type": "white", "cidrs": []}},
        {"subnets__0__routes__0__cidr": "0.0.0.0/0"},
        {"pods__0__labels": {"app.kubernetes.io/name": "web", "tier": ""}},
    ],
)
def test_other_valid_values(changes: dict[str, Any]) -> None:
    parse_desired_state(body(**changes))


# --- per-field problems ------------------------------------------------------------

BAD_VALUES = [
    # (where, value, message fragment); the problem is reported at that path
    (f"{LB}__network__ip", "198.18.0.300", "IPv4"),
    (f"{LB}__network__ip", "198.18.0.012", "leading zeros"),
    (f"{LB}__network__ip", "198.18.12", "dotted-quad"),
    (f"{LB}__network__ip", "::1", "dotted-quad"),
    (f"{LB}__network__ip", "0.0.0.0", "unicast"),
    (f"{LB}__network__ip", "127.0.0.1", "unicast"),
    (f"{LB}__network__ip", "224.0.0.5", "unicast"),
    (f"{LB}__network__ip", "255.255.255.255", "unicast"),
    (f"{LB}__network__ip", "169.254.0.100", "unicast"),
    (f"{LB}__network__ip", 3232235777, "JSON string"),
    (f"{LB}__network__mac", "01:22:0a:00:00:12", "unicast"),
    (f"{LB}__network__mac", "00:00:00:00:00:00", "zeros"),
    (f"{LB}__network__mac", "00-22-0a-00-00-12", "MAC"),
    (f"{LSN}__listener_port", 0, "greater than or equal to 1"),
    (f"{LSN}__listener_port", 65536, "less than or equal to 65535"),
    (f"{LSN}__listener_port", "80", "JSON integer"),
    (f"{LSN}__listener_port", 80.0, "JSON integer"),
    (f"{LSN}__listener_port", True, "JSON integer"),
    (f"{LSN}__gzip", 1, "true or false"),
    (f"{LSN}__gzip", "false", "true or false"),
    (f"{LSN}__listener_type", "tpc", "'tcp'"),
    (f"{LSN}__scheduler", "lc", "'rr'"),
    (f"{LSN}__tls_cipher_policy", "_1_2", "tls_cipher_policy_1_2"),
    (f"{LB}__id", "a/b", "1-64 characters"),
    (f"{LB}__id", "has space", "1-64 characters"),
    (f"{LB}__id", "", "1-64 characters"),
    (f"{LB}__id", "x" * 65, "1-64 characters"),
    (f"{LSN}__backend_group_id", "bg 1", "1-64 characters"),
    ("provider_networks__0__name", "physnet12345", "br-<name>"),
    (f"{LB}__name", "web\nserver", "control characters"),
    (f"{LB}__name", "web\x00", "control characters"),
    (f"{LB}__name", "w" * 129, "at most 128"),
    (f"{LSN}__health_check__uri", "healthz", "start with '/'"),
    (f"{LSN}__health_check__uri", "/a b", "without spaces"),
    (f"{LSN}__health_check__uri", '/a"b', "quotes"),
    (f"{LSN}__health_check__uri", "/a#b", "'#'"),
    (f"{LSN}__health_check__uri", "/a\\b", "backslashes"),
    (f"{LSN}__health_check__uri", "/a\nb", "printable ASCII"),
    (f"{LSN}__health_check__uri", "/" + "a" * 300, "at most 255"),
    (f"{LSN}__health_check__domain", "bad_host", "host name"),
    (f"{LSN}__health_check__domain", "a.b\n", "host name"),
    (f"{LSN}__health_check__domain", "*.example.com", "host name"),
    (f"{LSN}__health_check__domain", ("a" * 60 + ".") * 5, "at most 253"),
    (f"{LSN}__health_check__http_code", "http_2xx, http_3xx", "comma list"),
    (f"{LSN}__health_check__http_code", "http_200", "comma list"),
    (f"{LSN}__health_check__http_code", "", "comma list"),
    (f"{LSN}__health_check__http_code", "http_2xx,http_2xx", "twice"),
    (f"{LSN}__health_check__rise", 0, "greater than or equal to 1"),
    (f"{LSN}__health_check__interval", 3601, "less than or equal to 3600"),
    (f"{LSN}__health_check__udp_request", "ping\n", "printable ASCII"),
    (f"{LSN}__rules__0__domain", "api.example.com'", "host name"),
    (f"{LSN}__rules__0__domain", "*.*.example.com", "host name"),
    (f"{LSN}__rules__0__path", "v1", "start with '/'"),
    (f"{LSN}__rules__0__path", "/v1 x", "without spaces"),
    (f"{LSN}__rules__0__path", "/v1'", "quotes"),
    (f"{LSN}__sticky_session__cookie", "SRV ID", "1-64 characters"),
    (f"{LSN}__sticky_session__cookie", 'SRV"', "1-64 characters"),
    (f"{LSN}__sticky_session__cookie", "SRV;x", "1-64 characters"),
    (f"{LSN}__sticky_session__cookie", "C" * 65, "1-64 characters"),
    (f"{LSN}__acl__cidrs__0", "198.18.0.5/24", "host bits set; the prefix is 198.18.0.0/24"),
    (f"{LSN}__acl__cidrs__0", "198.18.0.0/33", "IPv4 prefix"),
    (f"{LSN}__acl__cidrs__0", "198.18.0.0", "IPv4 prefix"),
    (f"{LSN}__acl__type", "grey", "'black'"),
    (f"{LSN}__timeouts__client_idle", 0, "greater than or equal to 1"),
    (f"{LSN}__timeouts__client_idle", 3601, "less than or equal to 3600"),
    (f"{LSN}__timeouts__client_request", 3601, "less than or equal to 3600"),
    (f"{LSN}__http_request_rate", -1, "greater than or equal to 0"),
    (f"{LSN}__send_proxy", "v3", "'off'"),
    (f"{LB}__backend_groups__0__backends__0__weight", 257, "less than or equal to 256"),
    (f"{LB}__backend_groups__0__backends__0__address", "198.18.0.0.1", "dotted-quad"),
    (f"{LB}__backend_groups__1__pod_selector__port", "80", "port name"),
    (f"{LB}__backend_groups__1__pod_selector__port", "HTTP", "port name"),
    (f"{LB}__backend_groups__1__pod_selector__port", 0, "port number"),
    (f"{LB}__backend_groups__1__pod_selector__port", None, "port number"),
    ("subnets__0__mtu", 575, "greater than or equal to 576"),
    ("subnets__0__mtu", 9001, "less than or equal to 9000"),
    ("subnets__0__cidr", "198.18.0.1/24", "host bits set"),
    ("pods__0__ports__0__name", "Http", "port name"),
    ("generation", -1, "greater than or equal to 0"),
    ("generation", "7", "JSON integer"),
    ("subnets", {}, "JSON array"),
    (f"{LB}__network", "net-1", "JSON object"),
]


@pytest.mark.parametrize(("where", "value", "fragment"), BAD_VALUES)
def test_bad_value_reported_at_its_path(where: str, value: Any, fragment: str) -> None:
    path = "/" + where.replace("__", "/")
    assert fragment in problem_at(body(**{where: value}), path)


def test_client_timeouts_reach_an_hour_and_backend_ones_stay_longer() -> None:
    timeouts = {"client_idle": 3600, "client_request": 3600, "backend_idle": 86400, "backend_connect": 86400}
    state = parse_desired_state(body(**{f"{LSN}__timeouts": timeouts}))
    assert state.loadbalancers[0].listeners[0].timeouts == Timeouts(**timeouts)


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [("code", 303, "301, 302 or 307"), ("scheme", "ftp", "'http'"), ("host", "a b", "host name"), ("path", "x", "'/'")],
)
def test_bad_redirect_part(field: str, value: Any, fragment: str) -> None:
    redirect = {"code": 301, "scheme": "https", field: value}
    assert fragment in problem_at(body(**{f"{LSN}__redirect": redirect}), f"{LSN_PATH}/redirect/{field}")


def test_redirect_that_keeps_everything_is_rejected() -> None:
    message = problem_at(body(**{f"{LSN}__redirect": {"code": 301}}), f"{LSN_PATH}/redirect")
    assert "at least one of scheme, host or path" in message


def test_unknown_field_names_itself_and_suggests() -> None:
    details = problems(body(**{f"{LSN}__listner_port": 81}))
    assert details == [{"path": f"{LSN_PATH}/listner_port", "message": "unknown field; did you mean 'listener_port'?"}]
    assert problem_at(body(colour="blue"), "/colour") == "unknown field"


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        (
            f"{LB}__network__ip",
            "2001:db8::5",
            "must be an IPv4 address in dotted-quad form: an IPv6 address goes in its own field (ip6, gateway6) "
            "(got '2001:db8::5')",
        ),
        (
            "subnets__0__cidr",
            "2001:db8::/64",
            "must be an IPv4 prefix like 198.18.0.0/24: an IPv6 prefix goes in its own field (cidr6)",
        ),
    ],
)
def test_ipv6_in_an_ipv4_field_is_pointed_to_its_ipv6_twin(where: str, value: Any, message: str) -> None:
    assert message in problem_at(body(**{where: value}), "/" + where.replace("__", "/"))


def test_missing_required_fields() -> None:
    doc = body(**{f"{LSN}__listener_type": UNSET, f"{LB}__network__mac": UNSET, "generation": UNSET})
    paths = {d["path"] for d in problems(doc)}
    assert paths == {f"{LSN_PATH}/listener_type", "/loadbalancers/0/network/mac", "/generation"}
    assert problem_at({}, "/generation") == "required field is missing"


def test_bad_label_key_is_reported_at_the_key() -> None:
    doc = body(**{"pods__0__labels": {"bad key": "x", "a/b": "no spaces"}})
    details = problems(doc)
    assert {d["path"] for d in details} == {"/pods/0/labels/bad key", "/pods/0/labels/a~1b"}
    assert any(d["message"].startswith("invalid key") for d in details)


def test_too_many_listeners() -> None:
    listener = EXAMPLE["loadbalancers"][0]["listeners"][0]
    listeners = [dict(listener, id=f"l{i}", listener_port=1000 + i) for i in range(MAX_LISTENERS_PER_LB + 1)]
    message = problem_at(body(**{f"{LB}__listeners": listeners}), "/loadbalancers/0/listeners")
    assert f"at most {MAX_LISTENERS_PER_LB}" in message


@pytest.mark.parametrize(
    ("cert", "key", "where", "fragment"),
    [
        ("not pem", KEY, "certificate", "PEM certificate"),
        (CERT + KEY, KEY, "certificate", "must not contain a private key"),
        (CERT, "not a key", "private_key", "PEM private key"),
        (CERT, KEY.replace("PRIVATE KEY", "ENCRYPTED PRIVATE KEY"), "private_key", "unencrypted"),
        (CERT, "-----BEGIN PRIVATE KEY-----\n" + "A" * 70000 + "\n-----END PRIVATE KEY-----", "private_key", "bytes"),
    ],
)
def test_bad_certificates_never_echo_their_content(cert: str, key: str, where: str, fragment: str) -> None:
    doc = body()
    doc["loadbalancers"][0]["listeners"].append(
        https_listener(certificates=[{"id": "c", "certificate": cert, "private_key": key}])
    )
    details = problems(doc)
    message = problem_at(doc, f"/loadbalancers/0/listeners/1/certificates/0/{where}")
    assert fragment in message
    assert not any(KEY_LINE in d["message"] or "not a key" in d["message"] for d in details)


def test_echoed_values_are_truncated() -> None:
    message = problem_at(body(**{f"{LB}__name": "x" * 5000 + "\n"}), "/loadbalancers/0/name")
    assert len(message) < 200
    assert "x" * MAX_ECHO_LEN not in message


def test_every_per_field_problem_is_reported_at_once() -> None:
    doc = body(
        **{
            f"{LB}__network__ip": "198.18.0.256",
            f"{LSN}__listener_port": 0,
            f"{LSN}__health_check__uri": "/a b",
            f"{LSN}__typo": 1,
            "subnets__0__gateway": "x",
            "pods__0__ip": "1.2.3",
        }
    )
    assert {d["path"] for d in problems(doc)} == {
        "/loadbalancers/0/network/ip",
        f"{LSN_PATH}/listener_port",
        f"{LSN_PATH}/health_check/uri",
        f"{LSN_PATH}/typo",
        "/subnets/0/gateway",
        "/pods/0/ip",
    }


def test_error_is_an_lbagent_error_with_a_summary() -> None:
    with pytest.raises(LbAgentError, match="listener_port"):
        parse_desired_state(body(**{f"{LSN}__listener_port": 0}))


# --- cross-field problems -------------------------------------------------------------


def second_listener(**fields: Any) -> dict[str, Any]:
    return {"id": "lsn-2", "listener_type": "tcp", "listener_port": 81, "backend_group_id": "bg-1", **fields}


def with_listener(listener: dict[str, Any]) -> dict[str, Any]:
    doc = body()
    doc["loadbalancers"][0]["listeners"].append(listener)
    return doc


L2 = "/loadbalancers/0/listeners/1"

CROSS_FIELD = [
    # (body, path, message fragment)
    (body(**{f"{LB}__network__ip": "198.18.1.12"}), "/loadbalancers/0/network/ip", "inside the subnet"),
    (body(**{f"{LB}__network__ip": "198.18.0.1"}), "/loadbalancers/0/network/ip", "gateway"),
    (body(**{f"{LB}__network__ip": "198.18.0.255"}), "/loadbalancers/0/network/ip", "broadcast"),
    (body(**{f"{LB}__network__subnet_id": "net-9"}), "/loadbalancers/0/network/subnet_id", "names no subnet"),
    (body(**{"subnets__0__gateway": "198.18.1.1"}), "/subnets/0/gateway", "inside the subnet"),
    (body(**{"subnets__0__gateway": "198.18.0.0"}), "/subnets/0/gateway", "network or broadcast"),
    (body(**{"subnets__0__routes__0__nexthop": "10.0.0.1"}), "/subnets/0/routes/0/nexthop", "inside the subnet"),
    (with_listener(second_listener(listener_port=80)), f"{L2}/listener_port", "tcp port 80 is already used"),
    (with_listener(second_listener(listener_type="https", listener_port=80)), f"{L2}/listener_port", "already"),
    (with_listener(second_listener(id="lsn-1")), f"{L2}/id", "listener id 'lsn-1' is already used"),
    (with_listener(second_listener(backend_group_id="bg-9")), f"{L2}/backend_group_id", "no backend group"),
    (body(**{f"{LSN}__rules__0__backend_group_id": "bg-9"}), f"{LSN_PATH}/rules/0/backend_group_id", "no backend"),
    (with_listener(second_listener(sticky_session={"type": "insert"})), f"{L2}/sticky_session", "http and https"),
    (
        with_listener(second_listener(rules=[{"id": "r", "path": "/", "backend_group_id": "bg-1"}])),
        f"{L2}/rules",
        "http",
    ),
    (with_listener(second_listener(redirect={"scheme": "https"})), f"{L2}/redirect", "http and https"),
    (body(**{f"{LSN}__http2": True}), f"{LSN_PATH}/http2", "https"),
    (with_listener(https_listener(certificates=[])), f"{L2}/certificates", "at least one certificate"),
    (
        body(**{f"{LSN}__certificates": [{"id": "c", "certificate": CERT, "private_key": KEY}]}),
        f"{LSN_PATH}/certificates",
        "only https",
    ),
    (
        with_listener(https_listener(certificates=[{"id": "c", "certificate": CERT, "private_key": KEY}] * 2)),
        f"{L2}/certificates/1/id",
        "certificate id 'c'",
    ),
    (
        with_listener(second_listener(listener_type="udp", health_check={"type": "http"})),
        f"{L2}/health_check/type",
        "http health check",
    ),
    (body(**{f"{LSN}__health_check__type": "udp"}), f"{LSN_PATH}/health_check/type", "udp health check"),
    (body(**{f"{LSN}__rules__0__domain": "", f"{LSN}__rules__0__path": ""}), f"{LSN_PATH}/rules/0", "domain, a path"),
    (body(**{f"{LSN}__rules__0__backend_group_id": None}), f"{LSN_PATH}/rules/0/backend_group_id", "or redirect"),
    (body(**{f"{LSN}__rules__0__redirect": {"scheme": "https"}}), f"{LSN_PATH}/rules/0/redirect", "not both"),
    (body(**{f"{LB}__backend_groups__1__id": "bg-1"}), "/loadbalancers/0/backend_groups/1/id", "backend group id"),
    (
        body(**{f"{LB}__backend_groups__1__backends": [{"id": "be-1", "address": "198.18.0.22", "port": 1}]}),
        "/loadbalancers/0/backend_groups/1/backends/0/id",
        "backend id 'be-1'",
    ),
    (body(**{"pods__0__ports__1": {"name": "http", "port": 9090}}), "/pods/0/ports/1/name", "port name 'http'"),
    (
        body(**{"provider_networks__0__custom_interfaces__1": {"interface": "eth3", "hosts": ["gw-2"]}}),
        "/provider_networks/0/custom_interfaces/1/hosts/0",
        "host 'gw-2'",
    ),
]


@pytest.mark.parametrize(("doc", "path", "fragment"), CROSS_FIELD)
def test_cross_field_problem_reported_at_its_path(doc: dict[str, Any], path: str, fragment: str) -> None:
    assert fragment in problem_at(doc, path)


def test_duplicate_ids_across_the_body() -> None:
    doc = body()
    doc["loadbalancers"].append(copy.deepcopy(doc["loadbalancers"][0]))
    doc["subnets"].append(copy.deepcopy(doc["subnets"][0]))
    doc["pods"].append(copy.deepcopy(doc["pods"][0]))
    doc["provider_networks"].append(copy.deepcopy(doc["provider_networks"][0]))
    paths = {d["path"] for d in problems(doc)}
    assert {
        "/loadbalancers/1/id",
        "/subnets/1/id",
        "/pods/1/id",
        "/provider_networks/1/name",
        "/loadbalancers/1/network/ip",
        "/loadbalancers/1/network/mac",
    } <= paths


def test_udp_and_tcp_may_share_a_port_number() -> None:
    parse_desired_state(with_listener(second_listener(listener_type="udp", listener_port=80)))


def test_backend_addresses_may_repeat_within_a_group() -> None:
    backends = [
        {"id": "be-1", "address": "198.18.0.21", "port": 8000},
        {"id": "be-2", "address": "198.18.0.21", "port": 8000},
    ]
    parse_desired_state(body(**{f"{LB}__backend_groups__0__backends": backends}))


def test_every_cross_field_problem_is_reported_at_once() -> None:
    doc = body(**{f"{LB}__network__subnet_id": "net-9", f"{LSN}__http2": True, "subnets__0__gateway": "198.18.0.0"})
    doc["loadbalancers"][0]["listeners"].append(second_listener(listener_port=80, backend_group_id="nope"))
    assert {d["path"] for d in problems(doc)} == {
        "/loadbalancers/0/network/subnet_id",
        f"{LSN_PATH}/http2",
        "/subnets/0/gateway",
        f"{L2}/listener_port",
        f"{L2}/backend_group_id",
    }


def test_model_validate_applies_cross_field_rules_too() -> None:
    with pytest.raises(InvalidDesiredState):
        DesiredState.model_validate(body(**{f"{LB}__network__subnet_id": "net-9"}))


def test_json_schema() -> None:
    schema = json_schema()
    json.dumps(schema)
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"generation", "subnets", "provider_networks", "pods", "loadbalancers"}
    assert "Listener" in schema["$defs"]


# --- robustness ----------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)


def _leaf_paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        items: Any = node.items()
    elif isinstance(node, list):
        items = enumerate(node)
    else:
        return [prefix]
    return [prefix] + [path for key, child in items for path in _leaf_paths(child, (*prefix, key))]


EXAMPLE_PATHS = _leaf_paths(EXAMPLE)[1:]


def _accepts_or_explains(doc: Any) -> None:
    try:
        parse_desired_state(doc)
    except InvalidDesiredState as exc:
        assert exc.details
        for detail in exc.details:
            assert isinstance(detail["path"], str) and isinstance(detail["message"], str)
            assert len(detail["message"]) < 600


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_arbitrary_json_only_raises_invalid_desired_state(doc: Any) -> None:
    _accepts_or_explains(doc)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(EXAMPLE_PATHS), json_values)
def test_example_with_one_value_replaced_only_raises_invalid_desired_state(path: tuple[Any, ...], value: Any) -> None:
    doc = copy.deepcopy(EXAMPLE)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    _accepts_or_explains(doc)
