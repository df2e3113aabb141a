"""The desired state pushed by the region controller (api.md "Desired state"), validated.

Owns the pydantic models of the POST /v1/refresh body and the cross-field
rules that span several objects (references, uniqueness, what each listener
type may carry), and reports every problem as an api.md error detail
{"path": JSON pointer, "message": text}. Rules about a single value, all
limits, and the wording of per-field errors live in lbagent.desired.fields.

parse_desired_state() is the entry point. Validating a DesiredState any other
way (model_validate, model_validate_json) applies the same rules but lets the
pydantic ValidationError of per-field problems through unconverted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Sequence
from functools import cached_property, lru_cache
from ipaddress import IPv4Address, IPv4Network
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lbagent.desired.details import Location, error_details, json_pointer
from lbagent.desired.fields import (
    DEFAULT_MTU,
    DEFAULT_WEIGHT,
    MAX_ACL_CIDRS,
    MAX_BACKEND_GROUPS_PER_LB,
    MAX_BACKENDS_PER_GROUP,
    MAX_CERTIFICATES_PER_LISTENER,
    MAX_CUSTOM_INTERFACES,
    MAX_HOSTS_PER_LIST,
    MAX_LISTENERS_PER_LB,
    MAX_LOADBALANCERS,
    MAX_PODS,
    MAX_PORTS_PER_POD,
    MAX_PROVIDER_NETWORKS,
    MAX_ROUTES_PER_SUBNET,
    MAX_RULES_PER_LISTENER,
    MAX_SUBNETS,
    BridgeSuffix,
    CheckSeconds,
    Cidr,
    Cookie,
    CookieTimeout,
    DomainPatternOrEmpty,
    Generation,
    HostIPv4,
    Hostname,
    HostnameOrEmpty,
    HttpCodes,
    Id,
    InterfaceName,
    Labels,
    Mac,
    Mtu,
    Name,
    Namespace,
    PemCertificate,
    PemPrivateKey,
    Port,
    PortName,
    PortOrName,
    ProbePayload,
    Rate,
    RiseFall,
    TimeoutSeconds,
    UriPath,
    Weight,
)
from lbagent.desired.listener_types import (
    HTTP_TYPES,
    OPTION_TYPES,
    ListenerKind,
    ListenerType,
    listener_kind,
)
from lbagent.errors import InvalidDesiredState

Status = Literal["enabled", "disabled"]
Scheduler = Literal["rr", "wrr", "wlc", "sch", "tch"]
SendProxy = Literal["off", "v1", "v2", "v2-ssl", "v2-ssl-cn"]
TlsCipherPolicy = Literal[
    "tls_cipher_policy_1_0", "tls_cipher_policy_1_1", "tls_cipher_policy_1_2", "tls_cipher_policy_1_2_strict"
]



def many(max_items: int) -> Any:
    """An optional JSON array (omitted means empty) of at most max_items entries."""
    return Field(default_factory=list, max_length=max_items)


class _Model(BaseModel):
    # strict: "80" is not a port and 1 is not true; forbid: unknown fields are
    # usually typos; frozen: one state object is shared by every worker.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


# --- network -------------------------------------------------------------------


class Route(_Model):
    """A route of the subnet; one to 0.0.0.0/0 replaces the gateway as the default route."""

    cidr: Cidr
    nexthop: HostIPv4


class Subnet(_Model):
    id: Id
    cidr: Cidr
    gateway: HostIPv4
    mtu: Mtu = DEFAULT_MTU
    routes: list[Route] = many(MAX_ROUTES_PER_SUBNET)

    @cached_property
    def network(self) -> IPv4Network:
        return IPv4Network(self.cidr)


class CustomInterface(_Model):
    interface: InterfaceName
    hosts: list[Hostname] = many(MAX_HOSTS_PER_LIST)


class ProviderNetwork(_Model):
    name: BridgeSuffix
    default_interface: Optional[InterfaceName] = None
    custom_interfaces: list[CustomInterface] = many(MAX_CUSTOM_INTERFACES)
    exclude_hosts: list[Hostname] = many(MAX_HOSTS_PER_LIST)

    def interface_for(self, host: str) -> str | None:
        """The uplink on `host`, or None when this network does not reach that host."""
        if host in self.exclude_hosts:
            return None
        for custom in self.custom_interfaces:
            if host in custom.hosts:
                return custom.interface
        return self.default_interface


class PodPort(_Model):
    name: Optional[PortName] = None
    port: Port
    protocol: Literal["tcp", "udp", "sctp"] = "tcp"


class Pod(_Model):
    id: Id
    namespace: Namespace
    name: Name = ""
    ip: HostIPv4
    labels: Labels = Field(default_factory=dict)
    ready: bool = False
    ports: list[PodPort] = many(MAX_PORTS_PER_POD)


# --- backends --------------------------------------------------------------------


class Backend(_Model):
    id: Id
    address: HostIPv4
    port: Port
    weight: Weight = DEFAULT_WEIGHT
    send_proxy: SendProxy = "off"
    ssl: bool = False


class PodSelector(_Model):
    namespace: Namespace
    labels: Labels = Field(default_factory=dict)
    port: PortOrName
    weight: Weight = DEFAULT_WEIGHT


class BackendGroup(_Model):
    id: Id
    backends: list[Backend] = many(MAX_BACKENDS_PER_GROUP)
    pod_selector: Optional[PodSelector] = None


# --- listeners -------------------------------------------------------------------


class HealthCheck(_Model):
    type: Literal["tcp", "http", "udp"] = "tcp"
    uri: UriPath = ""  # empty: "/"
    domain: HostnameOrEmpty = ""  # empty: no Host header
    http_code: HttpCodes = "http_2xx,http_3xx"
    rise: RiseFall = 2
    fall: RiseFall = 3
    interval: CheckSeconds = 5
    timeout: CheckSeconds = 5
    udp_request: ProbePayload = ""
    udp_expect: ProbePayload = ""


class StickySession(_Model):
    type: Literal["insert", "server"] = "insert"
    cookie: Cookie = "SERVERID"
    cookie_timeout: Optional[CookieTimeout] = None  # None or 0: a session cookie


class Acl(_Model):
    # No default: guessing wrong turns a white list into a black list.
    type: Literal["black", "white"]
    cidrs: list[Cidr] = many(MAX_ACL_CIDRS)


class Redirect(_Model):
    code: Literal[301, 302, 307] = 302
    scheme: Literal["http", "https", ""] = ""
    host: HostnameOrEmpty = ""
    path: UriPath = ""

    @model_validator(mode="after")
    def check_changes_something(self) -> Redirect:
        # With every part kept from the request, the redirect points at itself.
        if not (self.scheme or self.host or self.path):
            raise ValueError("a redirect needs at least one of scheme, host or path")
        return self


class Timeouts(_Model):
    """Seconds; None takes the agent's default."""

    client_request: Optional[TimeoutSeconds] = None
    client_idle: Optional[TimeoutSeconds] = None
    backend_connect: Optional[TimeoutSeconds] = None
    backend_idle: Optional[TimeoutSeconds] = None


class Certificate(_Model):
    id: Id
    certificate: PemCertificate = Field(repr=False)
    private_key: PemPrivateKey = Field(repr=False)


class Rule(_Model):
    id: Id
    domain: DomainPatternOrEmpty = ""
    path: UriPath = ""  # a prefix
    backend_group_id: Optional[Id] = None
    redirect: Optional[Redirect] = None
    # api.md: "a rule may carry more" certificates (added to the listener's SNI set).
    certificates: list[Certificate] = many(MAX_CERTIFICATES_PER_LISTENER)


class Listener(_Model):
    id: Id
    name: Name = ""
    status: Status = "enabled"
    listener_type: ListenerType
    listener_port: Port
    backend_group_id: Id
    scheduler: Scheduler = "rr"
    health_check: Optional[HealthCheck] = None
    sticky_session: Optional[StickySession] = None
    acl: Optional[Acl] = None
    x_forwarded_for: bool = False
    gzip: bool = False
    http2: bool = False
    send_proxy: SendProxy = "off"
    timeouts: Optional[Timeouts] = None
    http_request_rate: Rate = 0
    http_request_rate_per_src: Rate = 0
    redirect: Optional[Redirect] = None
    certificates: list[Certificate] = many(MAX_CERTIFICATES_PER_LISTENER)
    tls_cipher_policy: TlsCipherPolicy = "tls_cipher_policy_1_2"
    rules: list[Rule] = many(MAX_RULES_PER_LISTENER)

    @property
    def enabled(self) -> bool:
        return self.status == "enabled"

    @property
    def kind(self) -> ListenerKind:
        return listener_kind(self.listener_type)

    @property
    def is_http(self) -> bool:
        return self.kind.is_http


# --- load balancers and the whole state -----------------------------------------


class Network(_Model):
    subnet_id: Id
    ip: HostIPv4
    mac: Mac


class LoadBalancer(_Model):
    id: Id
    name: Name = ""
    status: Status = "enabled"
    network: Network
    listeners: list[Listener] = many(MAX_LISTENERS_PER_LB)
    backend_groups: list[BackendGroup] = many(MAX_BACKEND_GROUPS_PER_LB)

    @property
    def enabled(self) -> bool:
        return self.status == "enabled"

    @cached_property
    def _groups_by_id(self) -> dict[str, BackendGroup]:
        return {group.id: group for group in self.backend_groups}

    def backend_group(self, group_id: str) -> BackendGroup:
        """The group with that id; KeyError if there is none."""
        return self._groups_by_id[group_id]

    @cached_property
    def _own_problems(self) -> list[Problem]:
        # Once per validated instance: a refresh that reuses the instance of an
        # unchanged load balancer (see lbagent.desired.parser) does not check it again.
        return own_problems(self)

    @cached_property
    def canonical_json(self) -> str:
        """The load balancer as canonical JSON, computed once per instance (a fingerprint's basis)."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)


class DesiredState(_Model):
    generation: Generation
    subnets: list[Subnet] = many(MAX_SUBNETS)
    provider_networks: list[ProviderNetwork] = many(MAX_PROVIDER_NETWORKS)
    pods: list[Pod] = many(MAX_PODS)
    loadbalancers: list[LoadBalancer] = many(MAX_LOADBALANCERS)

    @cached_property
    def _subnets_by_id(self) -> dict[str, Subnet]:
        return {subnet.id: subnet for subnet in self.subnets}

    @cached_property
    def _loadbalancers_by_id(self) -> dict[str, LoadBalancer]:
        return {lb.id: lb for lb in self.loadbalancers}

    def subnet(self, subnet_id: str) -> Subnet:
        """The subnet with that id; KeyError if there is none."""
        return self._subnets_by_id[subnet_id]

    def loadbalancer(self, lb_id: str) -> LoadBalancer:
        """The load balancer with that id; KeyError if there is none."""
        return self._loadbalancers_by_id[lb_id]

    @model_validator(mode="after")
    def check_cross_field_rules(self) -> DesiredState:
        # Raised directly rather than as ValueError: pydantic would report a
        # model validator's error at the model's own location, and each of
        # these belongs at the path of the field that breaks the rule.
        details = _check_state(self)
        if details:
            raise InvalidDesiredState(details)
        return self


# --- cross-field rules ------------------------------------------------------------


# A problem: where, what, and where the value it repeats was first used (or None).
Problem = tuple[Location, str, Optional[Location]]


class _Problems:
    """Collects cross-field problems; `details` turns them into api.md error details.

    Locations are kept relative, so the problems of one load balancer can be
    found once and placed under whichever index it has in a later request.
    """

    def __init__(self) -> None:
        self.found: list[Problem] = []

    def add(self, location: Location, message: str) -> None:
        self.found.append((location, message, None))

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
        return [{"path": json_pointer(location),
                 "message": message if first is None else f"{message} {json_pointer(first)}"}
                for location, message, first in self.found]


def _keyed(items: Sequence[BaseModel], at: Location, field: str = "id") -> Iterable[tuple[Hashable, Location]]:
    return ((getattr(item, field), (*at, index, field)) for index, item in enumerate(items))


@lru_cache(maxsize=8192)  # a thousand load balancers on a few subnets: the same pairs every refresh
def _host_problem(ip: str, network: IPv4Network) -> str | None:
    address = IPv4Address(ip)
    if address not in network:
        return f"must lie inside the subnet {network}"
    if address in (network.network_address, network.broadcast_address):
        return f"must not be the network or broadcast address of {network}"
    return None


def _check_state(state: DesiredState) -> list[dict[str, str]]:
    problems = _Problems()
    problems.unique(_keyed(state.subnets, ("subnets",)), lambda key: f"subnet id {key!r}")
    problems.unique(_keyed(state.pods, ("pods",)), lambda key: f"pod id {key!r}")
    problems.unique(
        _keyed(state.provider_networks, ("provider_networks",), "name"), lambda key: f"provider network {key!r}"
    )
    problems.unique(_keyed(state.loadbalancers, ("loadbalancers",)), lambda key: f"load balancer id {key!r}")
    for index, subnet in enumerate(state.subnets):
        _check_subnet(problems, ("subnets", index), subnet)
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
        (((lb.network.subnet_id, lb.network.ip), ("loadbalancers", i, "network", "ip")) for i, lb in lbs),
        lambda key: f"address {key[1]} in subnet {key[0]!r}",
    )
    problems.unique(
        (((lb.network.subnet_id, lb.network.mac), ("loadbalancers", i, "network", "mac")) for i, lb in lbs),
        lambda key: f"MAC {key[1]} in subnet {key[0]!r}",
    )
    return problems.details


def _check_subnet(problems: _Problems, at: Location, subnet: Subnet) -> None:
    network = subnet.network
    problem = _host_problem(subnet.gateway, network)
    if problem:
        problems.add((*at, "gateway"), problem)
    for index, route in enumerate(subnet.routes):
        if IPv4Address(route.nexthop) not in network:
            problems.add((*at, "routes", index, "nexthop"), f"must lie inside the subnet {network}")
    problems.unique(_keyed(subnet.routes, (*at, "routes"), "cidr"), lambda key: f"a route to {key}")


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
    group_ids = {group.id for group in lb.backend_groups}
    for index, listener in listeners:
        _check_listener(problems, (*at, "listeners", index), listener, group_ids)
    return problems.found


def _check_group_reference(problems: _Problems, location: Location, group_id: str, group_ids: set[str]) -> None:
    if group_id not in group_ids:
        problems.add(location, f"names no backend group of this load balancer ({group_id!r})")


def _check_listener(problems: _Problems, at: Location, listener: Listener, group_ids: set[str]) -> None:
    kind = listener.listener_type
    _check_group_reference(problems, (*at, "backend_group_id"), listener.backend_group_id, group_ids)
    for field, types in OPTION_TYPES.items():
        if types == HTTP_TYPES and kind not in types and getattr(listener, field):
            problems.add((*at, field), f"only allowed on http and https listeners, not on {kind}")
    if listener.http2 and kind not in OPTION_TYPES["http2"]:
        problems.add((*at, "http2"), "needs an https listener (HTTP/2 is negotiated through TLS)")

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

    for index, rule in enumerate(listener.rules):
        _check_rule(problems, (*at, "rules", index), rule, group_ids)
    problems.unique(
        (((rule.domain, rule.path), (*at, "rules", r, "path")) for r, rule in enumerate(listener.rules)),
        lambda key: f"a rule for domain {key[0]!r} and path {key[1]!r}",
    )


def _check_rule(problems: _Problems, at: Location, rule: Rule, group_ids: set[str]) -> None:
    if not rule.domain and not rule.path:
        problems.add(at, "a rule needs a domain, a path or both")
    if rule.backend_group_id is None and rule.redirect is None:
        problems.add((*at, "backend_group_id"), "a rule needs backend_group_id or redirect")
    if rule.backend_group_id is not None and rule.redirect is not None:
        problems.add((*at, "redirect"), "a rule takes either backend_group_id or redirect, not both")
    if rule.backend_group_id is not None:
        _check_group_reference(problems, (*at, "backend_group_id"), rule.backend_group_id, group_ids)


# --- entry points -------------------------------------------------------------------

# Input under these fields is never repeated in a message: it holds private keys.
_UNECHOED_FIELDS = frozenset({"certificates"})

def parse_desired_state(data: object) -> DesiredState:
    """Validate a decoded POST /v1/refresh body completely.

    Raises InvalidDesiredState listing every per-field problem, or, when every
    field is well-formed, every cross-field problem.
    """
    try:
        return DesiredState.model_validate(data)
    except ValidationError as exc:
        raise InvalidDesiredState(error_details(exc, DesiredState, _UNECHOED_FIELDS)) from None


def json_schema() -> dict[str, Any]:
    """JSON schema of the POST /v1/refresh body (for the OpenAPI document)."""
    return DesiredState.model_json_schema()
