"""schemathesis against a running agent: `lbagent run` on the OVS/OVN sandbox,
real namespaces, OVS ports, NAT rules and haproxy, reached over HTTP the way
the region controller reaches it.

The document is the one the agent serves. Bodies the document calls valid
get no 5xx but the documented 504 of `?wait`, answers that conform to the
document, and a 400 only for the cross-field rules JSON Schema cannot
express; bodies it calls invalid are refused. Afterwards the agent still
answers and its log holds no unexpected failure.

What a generated body names is made safe before it is sent, keeping it as
valid as it was: every IPv4 address and prefix is moved into 198.18.0.0/15
(the agent's health checks reach backends), and every interface a provider
network would take over gets a name no interface of this machine has.
`?wait` is cut to half a second: no generated load balancer has an OVN
port, so none turns ready and each wait runs out.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re

import pytest
import requests
import schemathesis
from hypothesis import Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.core.parameters import ParameterLocation

from tests.unit.api.schemarules import CHECKS, FUZZ, not_cross_field

EXAMPLES = 30
# No shrinking: each step of it is a refresh the agent applies to the host,
# and hypothesis spent more than five minutes on one failure.
FUZZ_AGENT = settings(FUZZ, max_examples=EXAMPLES, phases=[Phase.explicit, Phase.generate])
VPC = ipaddress.IPv4Network("198.18.0.0/15")
IPV4 = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")
IPV4_PREFIX = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}/\d{1,2}$")
INTERFACE_KEYS = frozenset({"interface", "default_interface"})
MAX_WAIT = 0.5


INTERFACE_NAME = re.compile(r"^(?!\.\.?$)[A-Za-z0-9_.-]{1,15}$")
NOT_UNICAST = [ipaddress.IPv4Network(n) for n in ("0.0.0.0/32", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/3")]


def into_vpc(address: ipaddress.IPv4Address) -> ipaddress.IPv4Address:
    return VPC.network_address + (int(address) % VPC.num_addresses)


def safe(value, key: str | None = None):
    """`value` with its addresses moved into the VPC range and its interfaces
    renamed. Only valid addresses, prefixes and names are changed, into valid
    ones: what the document calls invalid stays invalid."""
    if isinstance(value, dict):
        return {k: safe(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [safe(v, key) for v in value]
    if not isinstance(value, str):
        return value
    if key in INTERFACE_KEYS and INTERFACE_NAME.match(value):
        return "zq" + hashlib.sha1(value.encode()).hexdigest()[:8]
    try:
        if IPV4.match(value):
            address = ipaddress.IPv4Address(value)
            return value if any(address in n for n in NOT_UNICAST) else str(into_vpc(address))
        if IPV4_PREFIX.match(value):
            network = ipaddress.IPv4Network(value)  # host bits set: ValueError
            prefixlen = max(network.prefixlen, VPC.prefixlen)
            return str(ipaddress.IPv4Network((into_vpc(network.network_address), prefixlen), strict=False))
    except ValueError:  # "999.1.1.1", "10.0.0.1/8": invalid as generated, and left so
        return value
    return value


@pytest.fixture(scope="module")
def running(sandbox, tmp_path_factory):
    """One agent for the module's examples (its own host name), destroyed afterwards."""
    from agentproc import AgentProcess

    base = tmp_path_factory.mktemp("fuzzed")
    agent = AgentProcess(base, sandbox.ovs_db, host=f"fz{base.name[-6:]}-gw", env=sandbox.env)
    try:
        agent.start()
        session = requests.Session()
        served = session.get(agent.url + "/v1/openapi.json", timeout=10).json()
        yield agent, session, schemathesis.openapi.from_dict(served)
        session.close()
    finally:
        agent.destroy()


def send(agent, session, case):
    if case.body is not None:
        case.body = safe(case.body)
    if case.query and "wait" in case.query:
        try:
            case.query = {**case.query, "wait": min(float(case.query["wait"]), MAX_WAIT)}
        except (TypeError, ValueError):
            pass  # not a number: refused as it is
    case.headers = {**(case.headers or {}), "Authorization": f"Bearer {agent.token}"}
    response = case.call(base_url=agent.url, session=session, timeout=60)
    case.validate_response(response, checks=CHECKS)
    return response


def still_well(agent) -> None:
    assert agent.proc.poll() is None, agent.log()[-3000:]
    assert agent.request("GET", "/healthz")[0] == 200
    assert "result=error method=" not in agent.log(), agent.log()[-3000:]  # no 500 was answered


def test_bodies_the_document_calls_valid_are_accepted_by_the_running_agent(running):
    agent, session, schema = running
    operation = schema["/v1/refresh"]["POST"]

    @FUZZ_AGENT
    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def check(case):
        response = send(agent, session, case)
        status = response.status_code
        waited = case.query is not None and "wait" in case.query
        assert status < 500 or (status == 504 and waited), (status, response.text)
        if status == 400:
            refused = not_cross_field(response.json())
            assert not refused, f"the document calls this body valid, the agent refuses it: {refused}"
        else:
            assert status in (200, 202, 409, 504), (status, response.text)

    check()
    still_well(agent)


def test_bodies_the_document_calls_invalid_are_refused_by_the_running_agent(running):
    agent, session, schema = running
    operation = schema["/v1/refresh"]["POST"]

    @FUZZ_AGENT
    @given(case=operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
    def check(case):
        negated_body = case.meta.components[ParameterLocation.BODY].mode is GenerationMode.NEGATIVE
        response = send(agent, session, case)
        assert response.status_code < 500, (response.status_code, response.text)
        if negated_body:
            assert response.status_code == 400, response.text

    check()
    still_well(agent)
