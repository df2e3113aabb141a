"""Refusals that keep a valid-looking body from breaking the data path later:
routes into the agent's own ranges or the subnet, next hops no router has,
redirects back to the request they answer, uplinks the agent itself makes."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from lbagent.desired.fields import MAX_BACKENDS_PER_LB
from lbagent.desired.model import parse_desired_state
from lbagent.errors import InvalidDesiredState
from tests.unit.samples import EXAMPLE

SUBNET = "/subnets/0"
LISTENER = "/loadbalancers/0/listeners/0"  # http on port 80, rule-1 matches api.example.com and /v1


def with_changes(change) -> dict[str, Any]:
    doc = copy.deepcopy(EXAMPLE)
    change(doc)
    return doc


def details_of(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InvalidDesiredState) as caught:
        parse_desired_state(doc)
    return {d["path"]: d["message"] for d in caught.value.details}


def with_route(cidr: str, nexthop: str = "198.18.0.254") -> dict[str, Any]:
    return with_changes(lambda doc: doc["subnets"][0]["routes"].append({"cidr": cidr, "nexthop": nexthop}))


# --- routes ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cidr", "fragment"),
    [
        ("169.254.0.0/16", "169.254.0.0/16"),
        ("169.254.0.100/31", "169.254.0.0/16"),
        ("127.0.0.0/8", "127.0.0.0/8"),
        ("239.1.0.0/16", "224.0.0.0/4"),
    ],
)
def test_a_route_into_link_local_loopback_or_multicast_is_refused(cidr, fragment):
    assert fragment in details_of(with_route(cidr))[f"{SUBNET}/routes/1/cidr"]


@pytest.mark.parametrize("cidr", ["198.18.0.0/24", "198.18.0.128/25"])
def test_a_route_into_the_subnet_itself_is_refused(cidr):
    message = details_of(with_route(cidr))[f"{SUBNET}/routes/1/cidr"]
    assert message == "must not lie inside the subnet's own prefix 198.18.0.0/24"


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "169.0.0.0/8", "198.18.0.0/16", "224.0.0.0/3"])
def test_a_wider_route_around_those_ranges_is_accepted(cidr):
    parse_desired_state(with_route(cidr))


@pytest.mark.parametrize("nexthop", ["198.18.0.0", "198.18.0.255"])
def test_a_next_hop_at_the_network_or_broadcast_address_is_refused(nexthop):
    message = details_of(with_route("10.0.0.0/8", nexthop))[f"{SUBNET}/routes/1/nexthop"]
    assert message == "must not be the network or broadcast address of 198.18.0.0/24"


def test_a_next_hop_at_a_load_balancers_address_is_refused():
    message = details_of(with_route("10.0.0.0/8", "198.18.0.12"))[f"{SUBNET}/routes/1/nexthop"]
    assert message == (
        "next hop 198.18.0.12 is a load balancer's own address, which is already used at /loadbalancers/0/network/ip"
    )


def test_a_next_hop_at_a_load_balancers_address_on_another_subnet_is_accepted():
    def change(doc):
        doc["subnets"].append({"id": "net-2", "cidr": "198.18.1.0/24", "gateway": "198.18.1.1"})
        doc["subnets"][1]["routes"] = [{"cidr": "10.0.0.0/8", "nexthop": "198.18.1.12"}]
        doc["loadbalancers"][0]["network"]["ip"] = "198.18.0.13"

    parse_desired_state(with_changes(change))


# --- redirects -------------------------------------------------------------------


def with_listener_redirect(redirect: dict[str, Any]) -> dict[str, Any]:
    return with_changes(lambda doc: doc["loadbalancers"][0]["listeners"][0].update(redirect=redirect))


def with_rule_redirect(redirect: dict[str, Any], port: int = 80) -> dict[str, Any]:
    def change(doc):
        listener = doc["loadbalancers"][0]["listeners"][0]
        listener["listener_port"] = port
        listener["rules"][0].update(backend_group_id=None, redirect=redirect)

    return with_changes(change)


LOOP = "redirects to the very request it answers (a redirect loop): change the scheme, host or path"


@pytest.mark.parametrize(
    "redirect",
    [
        {"scheme": "http"},
        {"scheme": "http", "path": "/elsewhere"},
        {"path": "/nowhere"},
        # rule-1 takes /v1/login for api.example.com only: any other host comes back.
        {"path": "/v1/login"},
    ],
)
def test_a_listener_redirect_to_a_request_it_answers_again_is_refused(redirect):
    assert details_of(with_listener_redirect({"code": 301, **redirect}))[f"{LISTENER}/redirect"] == LOOP


@pytest.mark.parametrize(
    "redirect",
    [{"scheme": "https"}, {"host": "www.example.com"}, {"host": "api.example.com", "path": "/v1/login"}],
)
def test_a_listener_redirect_elsewhere_is_accepted(redirect):
    parse_desired_state(with_listener_redirect({"code": 301, **redirect}))


def test_a_listener_redirect_to_a_path_a_rule_of_every_host_takes_is_accepted():
    def change(doc):
        listener = doc["loadbalancers"][0]["listeners"][0]
        listener["rules"][0]["domain"] = ""
        listener["redirect"] = {"code": 301, "path": "/v1/login"}

    parse_desired_state(with_changes(change))


@pytest.mark.parametrize(
    "redirect",
    [
        {"scheme": "http"},
        {"path": "/v1"},
        {"host": "api.example.com"},
        {"scheme": "http", "host": "API.example.com", "path": "/v1"},
        # /v1/new still starts with the rule's /v1: it comes back to the same rule.
        {"path": "/v1/new"},
    ],
)
def test_a_rule_redirect_to_what_the_rule_matches_is_refused(redirect):
    assert details_of(with_rule_redirect({"code": 302, **redirect}))[f"{LISTENER}/rules/0/redirect"] == LOOP


@pytest.mark.parametrize(
    ("redirect", "port"),
    [
        ({"scheme": "https"}, 80),
        ({"path": "/v2"}, 80),
        ({"host": "www.example.com"}, 80),
        # Host names no port: the client goes to port 80, another listener.
        ({"host": "api.example.com", "path": "/v1"}, 8080),
    ],
)
def test_a_rule_redirect_that_changes_something_is_accepted(redirect, port):
    parse_desired_state(with_rule_redirect({"code": 302, **redirect}, port))


def test_a_rule_redirect_into_a_longer_rule_is_accepted():
    def change(doc):
        listener = doc["loadbalancers"][0]["listeners"][0]
        listener["rules"][0].update(backend_group_id=None, redirect={"code": 302, "path": "/v1/new"})
        listener["rules"].append(
            {"id": "rule-2", "domain": "api.example.com", "path": "/v1/new", "backend_group_id": "bg-2"}
        )

    parse_desired_state(with_changes(change))


def test_a_domain_less_rule_redirecting_to_another_host_on_the_same_path_loops():
    def change(doc):
        rule = doc["loadbalancers"][0]["listeners"][0]["rules"][0]
        rule.update(domain="", backend_group_id=None, redirect={"code": 302, "host": "www.example.com"})

    assert details_of(with_changes(change))[f"{LISTENER}/rules/0/redirect"] == LOOP


# --- provider network uplinks ------------------------------------------------


OWN_INTERFACES = [
    *("lo", "br-int", "br-physnet1", "ovs-system", "ovs-netdev", "genev_sys_6081", "vxlan_sys_4789"),
    *("o1a2b3c4d0", "h1a2b3c4d1"),
]


@pytest.mark.parametrize("name", OWN_INTERFACES)
def test_an_interface_the_agent_makes_is_no_uplink(name):
    def change(doc):
        network = doc["provider_networks"][0]
        network["default_interface"] = name
        network["custom_interfaces"][0]["interface"] = name

    details = details_of(with_changes(change))
    for path in ("/provider_networks/0/default_interface", "/provider_networks/0/custom_interfaces/0/interface"):
        assert "must be a host uplink" in details[path]
        assert "not lo, a bridge br-*" in details[path]


@pytest.mark.parametrize("name", ["eth1", "lo0", "bond0.100", "o1a2b3c4d2", "ovs-uplink", "bridge-1"])
def test_other_interface_names_are_uplinks(name):
    parse_desired_state(with_changes(lambda doc: doc["provider_networks"][0].update(default_interface=name)))


# --- how many backends a load balancer can serve --------------------------------


def with_backends(count: int) -> dict[str, Any]:
    """The example's first load balancer with `count` static backends in groups of 1024."""

    def change(doc):
        lb = doc["loadbalancers"][0]
        lb["listeners"] = [{"id": "l", "listener_type": "tcp", "listener_port": 80, "backend_group_id": "g0"}]
        lb["backend_groups"] = [
            {
                "id": f"g{g}",
                "backends": [
                    {"id": f"b{n}", "address": "198.18.0.21", "port": 1 + n % 65535}
                    for n in range(g * 1024, min(count, (g + 1) * 1024))
                ],
            }
            for g in range(-(-count // 1024))
        ]

    return with_changes(change)


def test_more_backends_than_backend_ports_is_refused_at_the_first_one_beyond():
    details = details_of(with_backends(MAX_BACKENDS_PER_LB + 1))
    assert details == {
        "/loadbalancers/0/backend_groups/62/backends/1023": (
            "a load balancer has at most 64511 backends across its groups (each gets a port of its own, "
            "two in a group with a health_check_port); pods its selectors take count too"
        )
    }


def test_as_many_backends_as_backend_ports_are_accepted():
    parse_desired_state(with_backends(MAX_BACKENDS_PER_LB))


def with_checked_backends(count: int) -> dict[str, Any]:
    doc = with_backends(count)
    for group in doc["loadbalancers"][0]["backend_groups"]:
        group["health_check_port"] = 8081
    return doc


def test_a_health_check_port_takes_a_second_backend_port_per_backend():
    details = details_of(with_checked_backends(MAX_BACKENDS_PER_LB // 2 + 1))
    # Groups 0-30 take 63488 ports, which leaves 1023: room for 511 backends of group 31.
    assert list(details) == ["/loadbalancers/0/backend_groups/31/backends/511"]
    parse_desired_state(with_checked_backends(MAX_BACKENDS_PER_LB // 2))


# --- traffic options that depend on the listeners using a group -------------------


def with_udp_group(slow_start: int) -> dict[str, Any]:
    def change(doc):
        lb = doc["loadbalancers"][0]
        lb["listeners"].append({"id": "dns", "listener_type": "udp", "listener_port": 53, "backend_group_id": "bg-2"})
        lb["backend_groups"][1]["slow_start"] = slow_start

    return with_changes(change)


def test_slow_start_on_a_group_a_udp_listener_uses_is_refused_at_its_path():
    details = details_of(with_udp_group(30))
    assert details == {
        "/loadbalancers/0/backend_groups/1/slow_start": (
            "cannot apply to udp flows, which the kernel balances at full weight: "
            "this group is already used at /loadbalancers/0/listeners/1/backend_group_id"
        )
    }


def test_slow_start_on_groups_only_haproxy_listeners_use_is_accepted():
    doc = with_changes(lambda doc: doc["loadbalancers"][0]["backend_groups"][0].update(slow_start=900))
    assert parse_desired_state(doc).loadbalancers[0].backend_groups[0].slow_start == 900
    parse_desired_state(with_udp_group(0))


# --- families of backends ----------------------------------------------------------


def with_ipv6_backend(ip6: str | None) -> dict[str, Any]:
    def change(doc):
        doc["subnets"][0].update(cidr6="2001:db8:0:1::/64", gateway6="2001:db8:0:1::1")
        if ip6 is not None:
            doc["loadbalancers"][0]["network"]["ip6"] = ip6
        doc["loadbalancers"][0]["backend_groups"][0]["backends"][0]["address"] = "2001:db8:0:1::21"

    return with_changes(change)


def test_an_ipv6_backend_needs_the_load_balancers_ip6():
    found = details_of(with_ipv6_backend(None))
    assert found == {
        "/loadbalancers/0/backend_groups/0/backends/0/address": "is IPv6, and the load balancer has no "
        "network.ip6 to reach it from"
    }
    assert parse_desired_state(with_ipv6_backend("2001:db8:0:1::12")).loadbalancers[0].network.ip6
