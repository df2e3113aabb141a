"""The rules of the desired state that span several objects.

References (a listener's backend group, a load balancer's subnet),
uniqueness (ids, ports per transport, certificate ids, rule matches),
addresses that must lie inside their subnet, and which options each listener
type may carry. Every problem is reported at the JSON path of the field that
breaks the rule, never at the enclosing object. IPv6 values (cidr6,
gateway6, ip6, and the backends, pods, routes and access lists of either
family) are held to the same rules as IPv4 ones.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from functools import lru_cache
from ipaddress import IPv4Network, IPv6Network, ip_address
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from lbagent.desired.details import Location, json_pointer
from lbagent.desired.fields import MAX_BACKENDS_PER_LB, family_of
from lbagent.desired.listener_types import KINDS, OPTION_TYPES

if TYPE_CHECKING:  # the models call these rules from their validators
    from lbagent.desired.model import BackendGroup, DesiredState, Listener, LoadBalancer, Redirect, Rule, Subnet

# A problem: where, what, and where the value it repeats was first used (or None).
Problem = tuple[Location, str, Location | None]


class _Problems:
    """Collects cross-field problems; `details` turns them into api.md error details.

    Locations are kept relative, so the problems of one load balancer can be
    found once and placed under whichever index it has in a later request.
    """

    def __init__(self) -> None:
        self.found: list[Problem] = []

    def add(self, location: Location, message: str, first: Location | None = None) -> None:
        """A problem at `location`; with `first`, the message ends with that location's path."""
        self.found.append((location, message, first))

    def extend(self, base: Location, problems: Iterable[Problem]) -> None:
        for location, message, first in problems:
            self.found.append(((*base, *location), message, None if first is None else (*base, *first)))

    def unique(self, entries: Iterable[tuple[Hashable, Location]], describe: Callable[[Any], str]) -> None:
        """Reports every entry whose key an earlier entry already had."""
        first: dict[Hashable, Location] = {}
        for key, location in entries:
            if key in first:
                self.found.append((location, f"{describe(key)} is already used at", first[key]))
            else:
                first[key] = location

    @property
    def details(self) -> list[dict[str, str]]:
        return [
            {
                "path": json_pointer(location),
                "message": message if first is None else f"{message} {json_pointer(first)}",
            }
            for location, message, first in self.found
        ]


def _keyed(items: Sequence[BaseModel], at: Location, field: str = "id") -> Iterable[tuple[Hashable, Location]]:
    return ((getattr(item, field), (*at, index, field)) for index, item in enumerate(items))


@lru_cache(maxsize=8192)  # a thousand load balancers on a few subnets: the same pairs every refresh
def _host_problem(ip: str, network: IPv4Network | IPv6Network) -> str | None:
    address = ip_address(ip)
    if address not in network:  # an address of the other family is in no network of this one
        return f"must lie inside the subnet {network}"
    if isinstance(network, IPv6Network):
        # IPv6 has no broadcast; its first address is every router's on the link (RFC 4291).
        if address == network.network_address:
            return f"must not be the subnet-router anycast address of {network}"
    elif address in (network.network_address, network.broadcast_address):
        return f"must not be the network or broadcast address of {network}"
    return None


def _inside(inner: IPv4Network | IPv6Network, outer: IPv4Network | IPv6Network) -> bool:
    """`inner.subnet_of(outer)`, and False (not TypeError) across families."""
    return inner.network_address in outer and inner.prefixlen >= outer.prefixlen


def check_state(state: DesiredState) -> list[dict[str, str]]:
    problems = _Problems()
    problems.unique(_keyed(state.subnets, ("subnets",)), lambda key: f"subnet id {key!r}")
    problems.unique(_keyed(state.pods, ("pods",)), lambda key: f"pod id {key!r}")
    problems.unique(
        _keyed(state.provider_networks, ("provider_networks",), "name"), lambda key: f"provider network {key!r}"
    )
    problems.unique(_keyed(state.loadbalancers, ("loadbalancers",)), lambda key: f"load balancer id {key!r}")
    vips = _vips_by_subnet(state)
    for index, subnet in enumerate(state.subnets):
        _check_subnet(problems, ("subnets", index), subnet, vips.get(subnet.id, {}))
    for index, network in enumerate(state.provider_networks):
        problems.unique(
            (
                (host, ("provider_networks", index, "custom_interfaces", c, "hosts", h))
                for c, custom in enumerate(network.custom_interfaces)
                for h, host in enumerate(custom.hosts)
            ),
            lambda key: f"host {key!r}",
        )
    for index, pod in enumerate(state.pods):
        named = [(port.name, ("pods", index, "ports", p, "name")) for p, port in enumerate(pod.ports) if port.name]
        problems.unique(named, lambda key: f"port name {key!r}")
    for index, lb in enumerate(state.loadbalancers):
        at = ("loadbalancers", index)
        _check_lb_network(problems, at, lb, state)
        problems.extend(at, lb._own_problems)
    # Two load balancers on one subnet cannot share an address or a MAC.
    lbs = list(enumerate(state.loadbalancers))
    problems.unique(
        (
            ((lb.network.subnet_id, address), ("loadbalancers", i, "network", field))
            for field in ("ip", "ip6")
            for i, lb in lbs
            if (address := getattr(lb.network, field)) is not None
        ),
        lambda key: f"address {key[1]} in subnet {key[0]!r}",
    )
    problems.unique(
        (((lb.network.subnet_id, lb.network.mac), ("loadbalancers", i, "network", "mac")) for i, lb in lbs),
        lambda key: f"MAC {key[1]} in subnet {key[0]!r}",
    )
    return problems.details


def _vips_by_subnet(state: DesiredState) -> dict[str, dict[str, Location]]:
    """Subnet id -> the load balancers' addresses on it -> where the first one is given."""
    vips: dict[str, dict[str, Location]] = {}
    for index, lb in enumerate(state.loadbalancers):
        on_subnet = vips.setdefault(lb.network.subnet_id, {})
        on_subnet.setdefault(lb.network.ip, ("loadbalancers", index, "network", "ip"))
        if lb.network.ip6 is not None:
            on_subnet.setdefault(lb.network.ip6, ("loadbalancers", index, "network", "ip6"))
    return vips


def _check_subnet(problems: _Problems, at: Location, subnet: Subnet, vips: dict[str, Location]) -> None:
    problem = _host_problem(subnet.gateway, subnet.network)
    if problem:
        problems.add((*at, "gateway"), problem)
    _check_subnet6(problems, at, subnet)
    for index, route in enumerate(subnet.routes):
        route_at = (*at, "routes", index)
        family = family_of(route.cidr)
        if family_of(route.nexthop) != family:
            problems.add((*route_at, "nexthop"), f"must be an IPv{family} address, like the route's cidr")
            continue
        network = subnet.network if family == 4 else subnet.network6
        if network is None:
            problems.add((*route_at, "cidr"), "an IPv6 route needs the subnet's cidr6, and this subnet has none")
            continue
        if _inside(route.network, network):
            # The subnet is on-link: a route into it takes the place of the link.
            problems.add((*route_at, "cidr"), f"must not lie inside the subnet's own prefix {network}")
        problem = _host_problem(route.nexthop, network)
        if problem:
            problems.add((*route_at, "nexthop"), problem)
        elif route.nexthop in vips:
            # Every namespace on the subnet would send that traffic to a load balancer.
            message = f"next hop {route.nexthop} is a load balancer's own address, which is already used at"
            problems.add((*route_at, "nexthop"), message, vips[route.nexthop])
    problems.unique(_keyed(subnet.routes, (*at, "routes"), "cidr"), lambda key: f"a route to {key}")


def _check_subnet6(problems: _Problems, at: Location, subnet: Subnet) -> None:
    if (subnet.cidr6 is None) != (subnet.gateway6 is None):
        given, missing = ("cidr6", "gateway6") if subnet.gateway6 is None else ("gateway6", "cidr6")
        problems.add((*at, missing), f"required with {given}: a subnet has both cidr6 and gateway6 or neither")
        return
    if subnet.network6 is not None and subnet.gateway6 is not None:
        problem = _host_problem(subnet.gateway6, subnet.network6)
        if problem:
            problems.add((*at, "gateway6"), problem)


def _check_lb_network(problems: _Problems, at: Location, lb: LoadBalancer, state: DesiredState) -> None:
    subnet_id = lb.network.subnet_id
    try:
        subnet = state.subnet(subnet_id)
    except KeyError:
        problems.add((*at, "network", "subnet_id"), f"names no subnet of this request ({subnet_id!r})")
    else:
        problem = _host_problem(lb.network.ip, subnet.network)
        if problem is None and lb.network.ip == subnet.gateway:
            problem = "must not be the subnet's gateway"
        if problem:
            problems.add((*at, "network", "ip"), problem)
        if lb.network.ip6 is not None:
            problem = _ip6_problem(lb.network.ip6, subnet)
            if problem:
                problems.add((*at, "network", "ip6"), problem)


def _ip6_problem(ip6: str, subnet: Subnet) -> str | None:
    if subnet.network6 is None:
        return f"needs a subnet with cidr6, and subnet {subnet.id!r} has none"
    problem = _host_problem(ip6, subnet.network6)
    if problem is None and ip6 == subnet.gateway6:
        problem = "must not be the subnet's gateway6"
    return problem


def own_problems(lb: LoadBalancer) -> list[Problem]:
    """The cross-field problems inside one load balancer, relative to it: they
    depend on nothing else, so `LoadBalancer._own_problems` keeps them."""
    problems = _Problems()
    at: Location = ()
    listeners = list(enumerate(lb.listeners))
    groups = list(enumerate(lb.backend_groups))
    problems.unique(_keyed(lb.listeners, (*at, "listeners")), lambda key: f"listener id {key!r}")
    problems.unique(_keyed(lb.backend_groups, (*at, "backend_groups")), lambda key: f"backend group id {key!r}")
    problems.unique(
        (
            (rule.id, (*at, "listeners", i, "rules", r, "id"))
            for i, listener in listeners
            for r, rule in enumerate(listener.rules)
        ),
        lambda key: f"rule id {key!r}",
    )
    problems.unique(
        (
            (backend.id, (*at, "backend_groups", g, "backends", b, "id"))
            for g, group in groups
            for b, backend in enumerate(group.backends)
        ),
        lambda key: f"backend id {key!r}",
    )
    problems.unique(
        (
            ((listener.kind.transport, listener.listener_port), (*at, "listeners", i, "listener_port"))
            for i, listener in listeners
        ),
        lambda key: f"{key[0]} port {key[1]}",
    )
    _check_backend_count(problems, groups)
    _check_kernel_balanced_groups(problems, listeners, groups)
    if lb.network.ip6 is None:
        # Its namespace has no IPv6 address to reach an IPv6 member from.
        for g, group in groups:
            for b, backend in enumerate(group.backends):
                if family_of(backend.address) == 6:
                    problems.add(
                        (*at, "backend_groups", g, "backends", b, "address"),
                        "is IPv6, and the load balancer has no network.ip6 to reach it from",
                    )
    group_ids = {group.id for group in lb.backend_groups}
    for index, listener in listeners:
        _check_listener(problems, (*at, "listeners", index), listener, group_ids)
    return problems.found


def _ports_per_backend(group: BackendGroup) -> int:
    # A separate health check port is reached through a port on INNER of its own.
    return 1 if group.health_check_port is None else 2


def _check_backend_count(problems: _Problems, groups: list[tuple[int, BackendGroup]]) -> None:
    """Reports the first backend beyond what a load balancer can give a port to."""
    seen = 0
    for g, group in groups:
        each = _ports_per_backend(group)
        if seen + each * len(group.backends) > MAX_BACKENDS_PER_LB:
            b = (MAX_BACKENDS_PER_LB - seen) // each
            problems.add(
                ("backend_groups", g, "backends", b),
                f"a load balancer has at most {MAX_BACKENDS_PER_LB} backends across its groups "
                "(each gets a port of its own, two in a group with a health_check_port); "
                "pods its selectors take count too",
            )
            return
        seen += each * len(group.backends)


def _check_kernel_balanced_groups(
    problems: _Problems, listeners: list[tuple[int, Listener]], groups: list[tuple[int, BackendGroup]]
) -> None:
    """The kernel picks a udp flow's member at once, at full weight: a group a
    udp listener uses cannot ramp its members up."""
    udp_users: dict[str, int] = {}
    for i, listener in listeners:
        if listener.kind.transport == "udp":
            udp_users.setdefault(listener.backend_group_id, i)
    for g, group in groups:
        if group.slow_start and group.id in udp_users:
            problems.add(
                ("backend_groups", g, "slow_start"),
                "cannot apply to udp flows, which the kernel balances at full weight: this group is already used at",
                ("listeners", udp_users[group.id], "backend_group_id"),
            )


def _check_group_reference(problems: _Problems, location: Location, group_id: str, group_ids: set[str]) -> None:
    if group_id not in group_ids:
        problems.add(location, f"names no backend group of this load balancer ({group_id!r})")


def _check_listener(problems: _Problems, at: Location, listener: Listener, group_ids: set[str]) -> None:
    kind = listener.listener_type
    _check_group_reference(problems, (*at, "backend_group_id"), listener.backend_group_id, group_ids)
    for option, types in OPTION_TYPES.items():
        if kind in types or option == "certificates":  # certificates: below, with the rules' own
            continue
        path = tuple(option.split("."))
        if _is_set(listener, path):
            if option == "http2":
                problems.add((*at, *path), "needs an https listener (HTTP/2 is negotiated through TLS)")
            else:
                problems.add((*at, *path), f"only allowed on {_type_names(types)} listeners, not on {kind}")

    rule_certificates = [(r, rule) for r, rule in enumerate(listener.rules) if rule.certificates]
    if listener.kind.terminates_tls:
        if not listener.certificates:
            problems.add((*at, "certificates"), "an https listener needs at least one certificate")
    else:
        if listener.certificates:
            problems.add((*at, "certificates"), f"only https listeners carry certificates, not {kind}")
        for r, _ in rule_certificates:
            problems.add((*at, "rules", r, "certificates"), f"only https listeners carry certificates, not {kind}")
    # One SNI set per listener: rule certificates join the listener's own.
    certificates = list(_keyed(listener.certificates, (*at, "certificates")))
    for r, rule in rule_certificates:
        certificates += _keyed(rule.certificates, (*at, "rules", r, "certificates"))
    problems.unique(certificates, lambda key: f"certificate id {key!r}")

    check = listener.health_check
    if check is not None:
        if check.type == "http" and kind == "udp":
            problems.add((*at, "health_check", "type"), "an http health check cannot probe a udp listener")
        if check.type == "udp" and kind != "udp":
            problems.add((*at, "health_check", "type"), f"a udp health check needs a udp listener, not {kind}")
        # What one type of check reads, another ignores (a tcp check sends no uri).
        for field, check_type in CHECK_FIELDS.items():
            option = f"health_check.{field}"
            if check.type != check_type and kind in OPTION_TYPES.get(option, KINDS) and _is_set(check, (field,)):
                problems.add(
                    (*at, "health_check", field), f"only used by a {check_type} health check, not {check.type}"
                )

    if listener.redirect is not None and listener.is_http and _listener_redirect_loops(listener, listener.redirect):
        problems.add((*at, "redirect"), _LOOP_MESSAGE)
    for index, rule in enumerate(listener.rules):
        _check_rule(problems, (*at, "rules", index), rule, group_ids)
        if rule.redirect is not None and listener.is_http and _rule_redirect_loops(listener, rule, rule.redirect):
            problems.add((*at, "rules", index, "redirect"), _LOOP_MESSAGE)
    problems.unique(
        (((rule.domain, rule.path), (*at, "rules", r, "path")) for r, rule in enumerate(listener.rules)),
        lambda key: f"a rule for domain {key[0]!r} and path {key[1]!r}",
    )


_LOOP_MESSAGE = "redirects to the very request it answers (a redirect loop): change the scheme, host or path"
# The port a client reaches when a redirect names a host and no port.
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _keeps_scheme(listener: Listener, redirect: Redirect) -> bool:
    return redirect.scheme in ("", listener.kind.scheme)


def _listener_redirect_loops(listener: Listener, redirect: Redirect) -> bool:
    """A listener's redirect answers the requests no rule takes: it loops when
    it keeps scheme and host and its path (kept, or new) is one no rule takes
    for every host (a rule with a domain takes only that host's requests)."""
    if not _keeps_scheme(listener, redirect) or redirect.host:
        return False
    if not redirect.path:
        return True
    return not any(
        not rule.domain and (not rule.path or redirect.path.startswith(rule.path)) for rule in listener.rules
    )


def _rule_redirect_loops(listener: Listener, rule: Rule, redirect: Redirect) -> bool:
    """A rule's redirect loops when the request it sends the client to is one
    the same rule takes again: scheme kept, the same host (kept, set to the
    rule's exact domain, or any host for a rule without a domain that no other
    rule claims), and a path the rule's prefix matches that no longer prefix
    of another rule for that domain takes first."""
    if not _keeps_scheme(listener, redirect):
        return False
    host = redirect.host.lower()
    if host and rule.domain:
        # an exact domain: a wildcard names no one host
        same_host = host == rule.domain.lower() and listener.listener_port == _DEFAULT_PORTS[listener.kind.scheme]
    else:
        same_host = not host or not any(other.domain.lower() == host for other in listener.rules)
    if not same_host:
        return False
    path = redirect.path or rule.path
    if not path.startswith(rule.path):
        return False
    return not any(
        other is not rule
        and other.domain == rule.domain
        and len(other.path) > len(rule.path)
        and path.startswith(other.path)
        for other in listener.rules
    )


# Health check fields that only one type of check reads.
CHECK_FIELDS = {"uri": "http", "domain": "http", "http_code": "http", "udp_request": "udp", "udp_expect": "udp"}


def _is_set(model: BaseModel, path: Sequence[str]) -> bool:
    """Whether the field at `path` below `model` differs from its default (an absent parent: not set)."""
    *parents, field = path
    for name in parents:
        model = getattr(model, name)
        if model is None:
            return False
    default = type(model).model_fields[field].get_default(call_default_factory=True)
    return getattr(model, field) != default


def _type_names(types: frozenset[str]) -> str:
    names = [name for name in KINDS if name in types]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _check_rule(problems: _Problems, at: Location, rule: Rule, group_ids: set[str]) -> None:
    if not rule.domain and not rule.path:
        problems.add(at, "a rule needs a domain, a path or both")
    if rule.backend_group_id is None and rule.redirect is None:
        problems.add((*at, "backend_group_id"), "a rule needs backend_group_id or redirect")
    if rule.backend_group_id is not None and rule.redirect is not None:
        problems.add((*at, "redirect"), "a rule takes either backend_group_id or redirect, not both")
    if rule.backend_group_id is not None:
        _check_group_reference(problems, (*at, "backend_group_id"), rule.backend_group_id, group_ids)
