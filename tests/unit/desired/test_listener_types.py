"""The one table of listener types agrees with the model, and the model enforces it."""

import copy
import typing
from pathlib import Path

import pytest

from lbagent.desired.listener_types import KINDS, OPTION_TYPES, ListenerType
from lbagent.desired.model import HealthCheck, Listener, Timeouts, parse_desired_state
from lbagent.errors import InvalidDesiredState
from tests.unit.samples import EXAMPLE, certificate

CHECK_READS = {"uri": "http", "domain": "http", "http_code": "http", "udp_request": "udp", "udp_expect": "udp"}
# A value of each restricted option (by its path below the listener) that is not its default.
SAMPLE_VALUES = {
    "health_check.uri": "/ping",
    "health_check.domain": "www.example.com",
    "health_check.http_code": "http_2xx",
    "health_check.udp_request": "ping",
    "health_check.udp_expect": "pong",
    "sticky_session": {"type": "insert"},
    "connection_limit": 100,
    "x_forwarded_for": True,
    "x_forwarded_proto": True,
    "gzip": True,
    "http2": True,
    "send_proxy": "v2",
    "timeouts.client_request": 7,
    "timeouts.client_idle": 7,
    "timeouts.backend_connect": 7,
    "timeouts.backend_idle": 7,
    "http_request_rate": 5,
    "http_request_rate_per_src": 5,
    "redirect": {"code": 301, "scheme": "https", "host": "www.example.com"},
    "certificates": [{"id": "c1", **certificate("www.example.com")}],
    "tls_cipher_policy": "tls_cipher_policy_1_2_strict",
    "client_certificate": {"ca": certificate("clients.example.com")["certificate"], "verify": "optional"},
    "rules": [{"id": "r1", "path": "/a", "backend_group_id": "bg-1"}],
}


def test_the_table_names_every_listener_type_of_the_model():
    assert set(typing.get_args(ListenerType)) == set(KINDS)
    assert typing.get_args(Listener.model_fields["listener_type"].annotation) == typing.get_args(ListenerType)


def test_every_restricted_option_is_a_listener_field_and_has_a_sample():
    for option in OPTION_TYPES:
        parent, _, field = option.rpartition(".")
        model = {"": Listener, "health_check": HealthCheck, "timeouts": Timeouts}[parent]
        assert field in model.model_fields, option
    assert set(SAMPLE_VALUES) == set(OPTION_TYPES)


def _body_with(listener_type: str, option: str, value, check_type: str | None = None) -> dict:
    body = copy.deepcopy(EXAMPLE)
    listener = {
        "id": "lsn-x",
        "listener_type": listener_type,
        "listener_port": 9999,
        "backend_group_id": body["loadbalancers"][0]["backend_groups"][0]["id"],
    }
    if listener_type == "https" and option != "certificates":
        listener["certificates"] = SAMPLE_VALUES["certificates"]
    parent, _, field = option.rpartition(".")
    if parent:
        listener[parent] = {field: value}
        if parent == "health_check":
            listener[parent]["type"] = check_type or ("udp" if listener_type == "udp" else "tcp")
    else:
        listener[field] = value
    body["loadbalancers"][0]["listeners"] = [listener]
    return body


def _refused_paths(body: dict) -> set[str]:
    with pytest.raises(InvalidDesiredState) as caught:
        parse_desired_state(body)
    return {d["path"] for d in caught.value.details}


def _path(option: str) -> str:
    return "/loadbalancers/0/listeners/0/" + option.replace(".", "/")


@pytest.mark.parametrize(
    "option,listener_type",
    [(option, name) for option, types in OPTION_TYPES.items() for name in KINDS if name not in types],
)
def test_an_option_on_a_type_that_may_not_carry_it_is_refused_at_its_path(option, listener_type):
    assert _refused_paths(_body_with(listener_type, option, SAMPLE_VALUES[option])) == {_path(option)}


@pytest.mark.parametrize(
    "option,listener_type",
    [(option, name) for option, types in OPTION_TYPES.items() for name in KINDS if name in types],
)
def test_an_option_on_a_type_that_may_carry_it_is_accepted(option, listener_type):
    check_type = CHECK_READS.get(option.removeprefix("health_check."))
    parse_desired_state(_body_with(listener_type, option, SAMPLE_VALUES[option], check_type))


@pytest.mark.parametrize(
    "option,value",
    [
        ("gzip", False),
        ("x_forwarded_for", False),
        ("send_proxy", "off"),
        ("http_request_rate", 0),
        ("tls_cipher_policy", "tls_cipher_policy_1_2"),
        ("timeouts.client_request", None),
        ("health_check.http_code", "http_2xx,http_3xx"),
        ("health_check.udp_request", ""),
        ("sticky_session", None),
        ("rules", []),
    ],
)
def test_an_option_at_its_default_is_accepted_on_every_type(option, value):
    for listener_type in KINDS:
        parse_desired_state(_body_with(listener_type, option, value))


@pytest.mark.parametrize("field,check_type", sorted(CHECK_READS.items()))
def test_a_health_check_field_its_type_of_check_ignores_is_refused(field, check_type):
    assert check_type != "tcp"
    option = f"health_check.{field}"
    listener_type = next(name for name in KINDS if name in OPTION_TYPES[option])
    # A tcp check (a connection) is allowed on every listener type and reads none of them.
    assert _refused_paths(_body_with(listener_type, option, SAMPLE_VALUES[option], "tcp")) == {_path(option)}


def test_udp_listeners_may_log_their_flows():
    body = _body_with("udp", "access_log", True)
    body["loadbalancers"][0]["listeners"][0]["access_log_rate"] = 10
    listener = parse_desired_state(body).loadbalancers[0].listeners[0]
    assert (listener.access_log, listener.access_log_rate) == (True, 10)


def test_the_refusal_names_the_types_that_may_carry_the_option():
    with pytest.raises(InvalidDesiredState) as caught:
        parse_desired_state(_body_with("tcp", "gzip", True))
    assert caught.value.details == [
        {"path": "/loadbalancers/0/listeners/0/gzip", "message": "only allowed on http and https listeners, not on tcp"}
    ]
    with pytest.raises(InvalidDesiredState) as caught:
        parse_desired_state(_body_with("udp", "send_proxy", "v1"))
    assert caught.value.details[0]["message"] == "only allowed on tcp, http and https listeners, not on udp"


# --- the table in docs/api.md ----------------------------------------------------------

API_MD = Path(__file__).resolve().parents[3] / "docs" / "api.md"
TABLE_HEADING = "#### Options by listener type"


def _documented_table() -> dict[str, frozenset[str]]:
    lines = API_MD.read_text().splitlines()
    assert TABLE_HEADING in lines, f"docs/api.md has no section {TABLE_HEADING!r}"
    rows = []
    for line in lines[lines.index(TABLE_HEADING) + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    header, _, *body = rows
    assert header[0] == "option" and set(header[1:]) == set(KINDS), header
    table = {}
    for row in body:
        option = row[0].strip("`")
        assert all(cell in ("yes", "no") for cell in row[1:]), row
        table[option] = frozenset(name for name, cell in zip(header[1:], row[1:], strict=True) if cell == "yes")
    return table


def _every_option() -> list[str]:
    options = list(Listener.model_fields)
    options += [f"health_check.{field}" for field in HealthCheck.model_fields]
    options += [f"timeouts.{field}" for field in Timeouts.model_fields]
    return options


def test_the_table_in_api_md_says_what_option_types_says():
    expected = {option: OPTION_TYPES.get(option, frozenset(KINDS)) for option in _every_option()}
    documented = _documented_table()

    def line(option: str, types: frozenset[str] | None) -> str:
        if types is None:
            return f"{option}: (no row)"
        return f"{option}: {', '.join(name for name in KINDS if name in types) or 'none'}"

    differences = [
        (line(option, expected.get(option)), line(option, documented.get(option)))
        for option in dict.fromkeys([*expected, *documented])
        if expected.get(option) != documented.get(option)
    ]
    assert not differences, "docs/api.md disagrees with OPTION_TYPES (code -> docs):\n" + "\n".join(
        f"  {code}  ->  {docs}" for code, docs in differences
    )


def test_ports_collide_per_transport():
    assert {name: kind.transport for name, kind in KINDS.items()} == {
        "tcp": "tcp",
        "http": "tcp",
        "https": "tcp",
        "udp": "udp",
    }
    assert [name for name, kind in KINDS.items() if not kind.through_haproxy] == ["udp"]
