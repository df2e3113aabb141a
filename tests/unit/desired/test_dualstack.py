"""IPv6 in the desired state (api.md "Dual stack"): parsed, normalised and
cross-checked like IPv4, and described by the served schema."""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbagent.desired import fields
from lbagent.desired.fields import family_of
from lbagent.desired.model import json_schema, parse_desired_state
from lbagent.errors import InvalidDesiredState
from tests.unit.samples import EXAMPLE

CIDR6, GATEWAY6, IP6 = "2001:db8:0:1::/64", "2001:db8:0:1::1", "2001:db8:0:1::12"
LB = "/loadbalancers/0"
BACKEND = f"{LB}/backend_groups/0/backends/0/address"
ACL = f"{LB}/listeners/0/acl/cidrs"
SUBNET = "/subnets/0"


def dual_stack() -> dict[str, Any]:
    """The api.md example on both families: the subnet, the load balancer, an IPv6 route, backend, pod and ACL."""
    doc = copy.deepcopy(EXAMPLE)
    subnet = doc["subnets"][0]
    subnet.update(cidr6=CIDR6, gateway6=GATEWAY6)
    subnet["routes"].append({"cidr": "2001:db8:100::/48", "nexthop": "2001:db8:0:1::fe"})
    doc["pods"].append({"id": "pod-6", "namespace": "shop", "ip": "2001:db8:0:1::21"})
    lb = doc["loadbalancers"][0]
    lb["network"]["ip6"] = IP6
    lb["backend_groups"][0]["backends"].append({"id": "be-6", "address": "fd00:1::21", "port": 8000})
    lb["listeners"][0]["acl"]["cidrs"].append("2001:db8:0:1::/64")
    return doc


def changed(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """`doc` with the value at the JSON pointer `path` set (a list index one past the end appends)."""
    *parents, last = path.strip("/").split("/")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list) and int(last) == len(node):
        node.append(value)
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return doc


def details_of(doc: Any) -> dict[str, str]:
    with pytest.raises(InvalidDesiredState) as caught:
        parse_desired_state(doc)
    return {d["path"]: d["message"] for d in caught.value.details}


def message_at(doc: Any, path: str) -> str:
    details = details_of(doc)
    assert path in details, f"no problem reported at {path}: {details}"
    return details[path]


# --- valid dual-stack state, helpers, normalisation ------------------------------------


def test_a_dual_stack_state_parses_and_exposes_its_ipv6_values() -> None:
    state = parse_desired_state(dual_stack())
    subnet, lb = state.subnets[0], state.loadbalancers[0]
    assert subnet.network6 == ipaddress.IPv6Network(CIDR6) and subnet.gateway6 == GATEWAY6
    assert lb.network.ip6 == IP6
    assert [family_of(route.cidr) for route in subnet.routes] == [4, 6]
    assert [family_of(b.address) for b in lb.backend_groups[0].backends] == [4, 6]
    assert state.pods[1].ip == "2001:db8:0:1::21"


def test_an_ipv4_only_subnet_and_load_balancer_have_no_ipv6() -> None:
    state = parse_desired_state(copy.deepcopy(EXAMPLE))
    assert state.subnets[0].network6 is None and state.subnets[0].cidr6 is state.subnets[0].gateway6 is None
    assert state.loadbalancers[0].network.ip6 is None


def test_an_ipv4_only_state_dumps_as_before_there_were_ipv6_fields() -> None:
    # What the worker fingerprints and what parses again while IPv6 is refused.
    dumped = parse_desired_state(copy.deepcopy(EXAMPLE)).model_dump(mode="json")
    assert "cidr6" not in dumped["subnets"][0] and "gateway6" not in dumped["subnets"][0]
    assert "ip6" not in dumped["loadbalancers"][0]["network"]


def test_a_dual_stack_dump_round_trips() -> None:
    state = parse_desired_state(dual_stack())
    assert parse_desired_state(json.loads(json.dumps(state.model_dump(mode="json")))) == state


@pytest.mark.parametrize(
    ("value", "family"),
    [("198.18.0.1", 4), ("198.18.0.0/24", 4), ("2001:db8::1", 6), ("::/0", 6), ("2001:db8::/64", 6)],
)
def test_family_of(value: str, family: int) -> None:
    assert family_of(value) == family


def test_ipv6_values_are_normalised_to_one_spelling() -> None:
    doc = dual_stack()
    doc["subnets"][0].update(cidr6="2001:DB8:0:1:0::/64", gateway6="2001:0db8:0:1::0001")
    doc["subnets"][0]["routes"][1] = {"cidr": "2001:DB8:100:0::/48", "nexthop": "2001:db8:0:1:0:0:0:FE"}
    doc["loadbalancers"][0]["network"]["ip6"] = "2001:DB8:0:1::0012"
    doc["loadbalancers"][0]["backend_groups"][0]["backends"][1]["address"] = "FD00:0001:0:0::21"
    doc["loadbalancers"][0]["listeners"][0]["acl"]["cidrs"][1] = "2001:0DB8:0000:0001::/64"
    doc["pods"][1]["ip"] = "2001:db8:0:1:0000::21"
    assert parse_desired_state(doc) == parse_desired_state(dual_stack())


def test_ipv4_values_keep_their_text() -> None:
    state = parse_desired_state(copy.deepcopy(EXAMPLE))
    assert state.loadbalancers[0].backend_groups[0].backends[0].address == "198.18.0.21"


# --- per-field problems ---------------------------------------------------------------

BAD_HOSTS = [
    ("::", "unicast host address"),
    ("::1", "unicast host address"),
    ("ff02::1", "unicast host address"),
    ("fe80::1", "unicast host address"),
    ("fec0::1", "unicast host address"),  # site-local
    ("::ffff:c612:15", "unicast host address"),  # IPv4-mapped
    ("100::1", "unicast host address"),  # reserved
    ("4000::1", "unicast host address"),  # reserved: outside 2000::/3 and fc00::/7
    ("::ffff:198.18.0.21", "hexadecimal groups"),  # a dotted tail
    ("2001:db8::21%eth0", "zone id"),
    ("2001:db8::g", "hexadecimal groups"),
    ("2001:db8:1:2:3:4:5:6:7", "hexadecimal groups"),
    ("2001:db8::1::2", "hexadecimal groups"),
    ("2001:db8::12345", "hexadecimal groups"),
]


@pytest.mark.parametrize(("value", "fragment"), BAD_HOSTS)
def test_a_bad_ipv6_host_address_is_refused_at_its_path(value: str, fragment: str) -> None:
    assert fragment in message_at(changed(dual_stack(), BACKEND, value), BACKEND)
    assert fragment in message_at(changed(dual_stack(), "/pods/1/ip", value), "/pods/1/ip")
    assert fragment in message_at(changed(dual_stack(), f"{LB}/network/ip6", value), f"{LB}/network/ip6")
    assert fragment in message_at(changed(dual_stack(), f"{SUBNET}/gateway6", value), f"{SUBNET}/gateway6")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("web-1", fields._EITHER_ADDRESS),
        ("", fields._EITHER_ADDRESS),
        ("198.18.0.300", "must be an IPv4 address: four numbers 0-255 without leading zeros (got '198.18.0.300')"),
    ],
)
def test_a_bad_address_where_either_family_goes(value: str, message: str) -> None:
    assert message_at(changed(copy.deepcopy(EXAMPLE), BACKEND, value), BACKEND).startswith(message)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("2001:db8::/63", "/64 to /120"),
        ("2001:db8:0:1::/121", "/64 to /120"),
        ("2001:db8:0:1::1/64", "host bits set; the prefix is 2001:db8:0:1::/64"),
        ("2001:db8:0:1::", "IPv6 prefix"),
        ("198.18.0.0/24", "IPv6 prefix"),
        ("2001:db8:0:1::/064", "IPv6 prefix"),
        ("2001:db8:0:1::%eth0/64", "zone id"),
    ],
)
def test_a_bad_cidr6_is_refused(value: str, fragment: str) -> None:
    assert fragment in message_at(changed(dual_stack(), f"{SUBNET}/cidr6", value), f"{SUBNET}/cidr6")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("2001:db8::1/32", "host bits set; the prefix is 2001:db8::/32"),
        ("2001:db8::/129", "IPv6 prefix"),
        ("2001:db8::", "IPv6 prefix"),
        ("198.18.0.5/24", "host bits set; the prefix is 198.18.0.0/24"),
        ("198.18.0.0/33", "IPv4 prefix"),
    ],
)
def test_a_bad_acl_prefix_of_either_family_is_refused(value: str, fragment: str) -> None:
    assert fragment in message_at(changed(dual_stack(), f"{ACL}/1", value), f"{ACL}/1")


@pytest.mark.parametrize("cidr", ["::/0", "2001:db8::/32", "fd00::/8", "::1/128", "fe00::/9"])
def test_an_acl_takes_any_ipv6_prefix(cidr: str) -> None:
    parse_desired_state(changed(dual_stack(), f"{ACL}/1", cidr))


# --- subnets and routes ----------------------------------------------------------------


@pytest.mark.parametrize(("given", "missing"), [("cidr6", "gateway6"), ("gateway6", "cidr6")])
def test_cidr6_and_gateway6_come_together(given: str, missing: str) -> None:
    doc = dual_stack()
    del doc["subnets"][0][missing]
    doc["subnets"][0]["routes"].pop()  # an IPv6 route would need the cidr6
    doc["loadbalancers"][0]["network"].pop("ip6")
    message = message_at(doc, f"{SUBNET}/{missing}")
    assert message == f"required with {given}: a subnet has both cidr6 and gateway6 or neither"


@pytest.mark.parametrize(
    ("gateway6", "message"),
    [
        ("2001:db8:0:2::1", "must lie inside the subnet 2001:db8:0:1::/64"),
        ("2001:db8:0:1::", "must not be the subnet-router anycast address of 2001:db8:0:1::/64"),
    ],
)
def test_gateway6_is_a_host_of_cidr6(gateway6: str, message: str) -> None:
    assert message_at(changed(dual_stack(), f"{SUBNET}/gateway6", gateway6), f"{SUBNET}/gateway6") == message


def route6(cidr: str, nexthop: str = "2001:db8:0:1::fe") -> dict[str, Any]:
    doc = dual_stack()
    doc["subnets"][0]["routes"][1] = {"cidr": cidr, "nexthop": nexthop}
    return doc


ROUTE = f"{SUBNET}/routes/1"


def test_an_ipv6_default_route_is_accepted_beside_the_ipv4_one() -> None:
    doc = route6("::/0")
    doc["subnets"][0]["routes"].append({"cidr": "0.0.0.0/0", "nexthop": "198.18.0.254"})
    assert [r.cidr for r in parse_desired_state(doc).subnets[0].routes] == ["198.19.0.0/16", "::/0", "0.0.0.0/0"]


@pytest.mark.parametrize(
    ("cidr", "nexthop", "field", "message"),
    [
        ("2001:db8:100::/48", "198.18.0.254", "nexthop", "must be an IPv6 address, like the route's cidr"),
        ("198.19.0.0/16", "2001:db8:0:1::fe", "nexthop", "must be an IPv4 address, like the route's cidr"),
        ("2001:db8:100::/48", "2001:db8:0:2::fe", "nexthop", "must lie inside the subnet 2001:db8:0:1::/64"),
        ("2001:db8:100::/48", "2001:db8:0:1::", "nexthop", "must not be the subnet-router anycast address of"),
        ("2001:db8:0:1:8000::/65", "2001:db8:0:1::fe", "cidr", "must not lie inside the subnet's own prefix"),
        ("fe80::/64", "2001:db8:0:1::fe", "cidr", "must not lie inside fe80::/10"),
        ("ff02::/16", "2001:db8:0:1::fe", "cidr", "must not lie inside ff00::/8"),
        ("::1/128", "2001:db8:0:1::fe", "cidr", "must not lie inside ::1/128"),
        ("2001:db8:100::1/48", "2001:db8:0:1::fe", "cidr", "host bits set"),
    ],
)
def test_a_bad_ipv6_route_is_refused_at_its_field(cidr: str, nexthop: str, field: str, message: str) -> None:
    assert message in message_at(route6(cidr, nexthop), f"{ROUTE}/{field}")


def test_an_ipv6_route_needs_the_subnets_cidr6() -> None:
    doc = route6("2001:db8:100::/48")
    del doc["subnets"][0]["cidr6"], doc["subnets"][0]["gateway6"]
    doc["loadbalancers"][0]["network"].pop("ip6")
    doc["loadbalancers"][0]["backend_groups"][0]["backends"].pop()  # an IPv6 one, which needs ip6
    assert details_of(doc) == {
        f"{ROUTE}/cidr": "an IPv6 route needs the subnet's cidr6, and this subnet has none",
        # the nexthop is not checked against a prefix the subnet does not have
    }


def test_the_same_ipv6_route_in_another_spelling_is_a_duplicate() -> None:
    doc = dual_stack()
    doc["subnets"][0]["routes"].append({"cidr": "2001:DB8:100:0::/48", "nexthop": "2001:db8:0:1::fd"})
    assert details_of(doc) == {
        f"{SUBNET}/routes/2/cidr": f"a route to 2001:db8:100::/48 is already used at {ROUTE}/cidr"
    }


def test_a_route_via_a_load_balancers_ip6_is_refused() -> None:
    message = message_at(route6("2001:db8:100::/48", "2001:DB8:0:1::12"), f"{ROUTE}/nexthop")
    assert message == f"next hop {IP6} is a load balancer's own address, which is already used at {LB}/network/ip6"


# --- load balancer ip6 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ip6", "message"),
    [
        ("2001:db8:0:2::12", "must lie inside the subnet 2001:db8:0:1::/64"),
        ("2001:db8:0:1::", "must not be the subnet-router anycast address of 2001:db8:0:1::/64"),
        ("2001:db8:0:1:0::1", "must not be the subnet's gateway6"),
    ],
)
def test_ip6_is_a_host_of_the_subnets_cidr6(ip6: str, message: str) -> None:
    assert message_at(changed(dual_stack(), f"{LB}/network/ip6", ip6), f"{LB}/network/ip6") == message


def test_ip6_needs_a_subnet_with_cidr6() -> None:
    doc = dual_stack()
    del doc["subnets"][0]["cidr6"], doc["subnets"][0]["gateway6"]
    doc["subnets"][0]["routes"].pop()
    assert details_of(doc) == {f"{LB}/network/ip6": "needs a subnet with cidr6, and subnet 'net-1' has none"}


def test_two_load_balancers_cannot_share_an_ip6_in_any_spelling() -> None:
    doc = dual_stack()
    other = copy.deepcopy(doc["loadbalancers"][0])
    other["id"] = "lb-2"
    other["network"].update(ip="198.18.0.13", mac="00:22:0a:00:00:13", ip6="2001:DB8:0:1:0:0:0:12")
    doc["loadbalancers"].append(other)
    assert details_of(doc) == {
        "/loadbalancers/1/network/ip6": f"address {IP6} in subnet 'net-1' is already used at {LB}/network/ip6"
    }


def test_a_backend_group_may_mix_families() -> None:
    doc = dual_stack()
    doc["loadbalancers"][0]["backend_groups"][0]["backends"].append(
        {"id": "be-7", "address": "2001:db8:5::7", "port": 8000}
    )
    addresses = [b.address for b in parse_desired_state(doc).loadbalancers[0].backend_groups[0].backends]
    assert addresses == ["198.18.0.21", "fd00:1::21", "2001:db8:5::7"]


# --- the JSON schema ----------------------------------------------------------------------


def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json_schema())


def test_the_schema_takes_a_dual_stack_body() -> None:
    validator = _validator()
    validator.validate(dual_stack())
    validator.validate(EXAMPLE)
    no_gateway6 = dual_stack()
    del no_gateway6["subnets"][0]["gateway6"]
    assert not validator.is_valid(no_gateway6)
    for path, value in [
        (BACKEND, "fe80::1"),
        (BACKEND, "::ffff:c612:15"),
        (BACKEND, "2001:db8::1%eth0"),
        (f"{SUBNET}/cidr6", "2001:db8::/63"),
        (f"{ROUTE}/cidr", "fe80::/64"),
        (f"{ROUTE}/cidr", "ff02::/16"),
        (f"{ROUTE}/cidr", "0::0:1/128"),
    ]:
        doc = changed(dual_stack(), path, value)
        assert not validator.is_valid(doc), (path, value)
        with pytest.raises(InvalidDesiredState):
            parse_desired_state(doc)


# The schema's patterns and the validation agree on every spelling of an address.
_HOST6 = re.compile(fields._HOST_IPV6_SCHEMA["pattern"])
_ROUTE6 = re.compile(fields._ROUTE_DESTINATION6_SCHEMA["pattern"])


def _spellings(address: ipaddress.IPv6Address, upper: bool) -> list[str]:
    found = [address.compressed, address.exploded, ":".join(f"{int(g, 16):x}" for g in address.exploded.split(":"))]
    return [text.upper() for text in found] if upper else found


_IPV6_VALUES = st.one_of(
    st.ip_addresses(v=6),
    st.sampled_from(["::", "::1", "fe80::1", "ff02::1", "fec0::1", "::ffff:c612:15", "100::1", "2000::", "fdff::1"]),
).map(ipaddress.IPv6Address)


@given(address=_IPV6_VALUES, upper=st.booleans())
def test_the_host_pattern_matches_exactly_the_accepted_addresses(address: ipaddress.IPv6Address, upper: bool) -> None:
    for text in _spellings(address, upper):
        try:
            accepted = fields._check_host_address(text) == str(address)
        except ValueError:
            accepted = False
        assert bool(_HOST6.fullmatch(text)) == accepted, text


@given(address=_IPV6_VALUES, length=st.integers(0, 128), upper=st.booleans())
def test_the_route_pattern_matches_exactly_the_accepted_routes(
    address: ipaddress.IPv6Address, length: int, upper: bool
) -> None:
    network = ipaddress.IPv6Network((address, length), strict=False)
    for text in _spellings(network.network_address, upper):
        try:
            fields._check_route_destination6(f"{text}/{length}")
            accepted = True
        except ValueError:
            accepted = False
        assert bool(_ROUTE6.fullmatch(f"{text}/{length}")) == accepted, f"{text}/{length}"


def test_a_state_without_ipv6_dumps_without_its_fields() -> None:
    # The fingerprints of IPv4-only load balancers stay what they were before there was IPv6.
    state = parse_desired_state(copy.deepcopy(EXAMPLE))
    assert not {"cidr6", "gateway6"} & set(state.subnets[0].model_dump())
    assert "ip6" not in state.loadbalancers[0].network.model_dump()
    assert state.loadbalancers[0].network.model_dump(mode="json") == EXAMPLE["loadbalancers"][0]["network"]
