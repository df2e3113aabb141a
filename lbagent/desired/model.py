"""The desired state pushed by the region controller (api.md "Desired state"), validated.

Owns the pydantic models of the POST /v1/refresh body, and reports every
problem as an api.md error detail {"path": JSON pointer, "message": text}.
Rules about a single value and all limits live in lbagent.desired.fields,
the rules across objects (references, uniqueness, what each listener type
may carry) in lbagent.desired.crosschecks.

parse_desired_state() is the entry point. Validating a DesiredState any other
way (model_validate, model_validate_json) applies the same rules but lets the
pydantic ValidationError of per-field problems through unconverted.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from functools import cached_property
from ipaddress import IPv4Network, IPv6Network, ip_network
from typing import Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from lbagent.desired import pem
from lbagent.desired.budget import servers_of
from lbagent.desired.crosschecks import Problem, check_state, own_problems
from lbagent.desired.details import error_details, json_pointer
from lbagent.desired.fields import (
    DEFAULT_ACCESS_LOG_RATE,
    DEFAULT_DRAIN_TIMEOUT,
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
    AccessLogRate,
    AnyCidr,
    AnyRouteDestination,
    BridgeSuffix,
    CheckSeconds,
    Cidr,
    ClientTimeoutSeconds,
    ConnectionLimit,
    Cookie,
    CookieTimeout,
    DomainPatternOrEmpty,
    DrainTimeoutSeconds,
    Generation,
    HostAddress,
    HostIPv4,
    HostIPv6,
    Hostname,
    HostnameOrEmpty,
    HttpCodes,
    Id,
    Labels,
    Mac,
    Mtu,
    Name,
    Namespace,
    PemCertificate,
    PemCrlOrEmpty,
    PemPrivateKey,
    Port,
    PortName,
    PortOrName,
    ProbePayload,
    Rate,
    RiseFall,
    SlowStartSeconds,
    SubnetCidr6,
    TimeoutSeconds,
    UplinkName,
    UriPath,
    Weight,
)
from lbagent.desired.fieldsets import shared_fields_set
from lbagent.desired.ha import HighAvailability
from lbagent.desired.listener_types import (
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
    # Fields of the API that this version refuses, and what they would bring:
    # their refusal says so instead of guessing at a typo.
    NOT_YET_ACCEPTED: ClassVar[dict[str, str]] = {}

    @model_validator(mode="after")
    def _share_fields_set(self) -> Self:
        object.__setattr__(self, "__pydantic_fields_set__", shared_fields_set(self.__pydantic_fields_set__))
        return self


class _DualStackModel(_Model):
    # Its fields that only hold IPv6.
    IPV6_FIELDS: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_absent_ipv6(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # An IPv4-only object dumps as it did before there were IPv6 fields:
        # the fingerprints of IPv4-only load balancers stay what they were.
        data: dict[str, Any] = handler(self)
        for field in self.IPV6_FIELDS:
            if data.get(field, "") is None:
                del data[field]
        return data


# --- network -------------------------------------------------------------------


class Route(_Model):
    """A route of the subnet; one to 0.0.0.0/0 replaces the gateway as the default route."""

    # IPv4 or IPv6, cidr and nexthop of one family; one to ::/0 replaces the
    # gateway6 as the IPv6 default route. Not said in the docstring: that is the
    # document's description, which speaks of IPv4 only while IPv6 is not served.

    cidr: AnyRouteDestination
    nexthop: HostAddress

    @cached_property
    def network(self) -> IPv4Network | IPv6Network:
        return ip_network(self.cidr)


class Subnet(_DualStackModel):
    IPV6_FIELDS = frozenset({"cidr6", "gateway6"})

    id: Id
    cidr: Cidr
    gateway: HostIPv4
    cidr6: SubnetCidr6 | None = None  # with gateway6, or neither
    gateway6: HostIPv6 | None = None
    mtu: Mtu = DEFAULT_MTU
    routes: list[Route] = many(MAX_ROUTES_PER_SUBNET)

    @cached_property
    def network(self) -> IPv4Network:
        return IPv4Network(self.cidr)

    @cached_property
    def network6(self) -> IPv6Network | None:
        return None if self.cidr6 is None else IPv6Network(self.cidr6)


class CustomInterface(_Model):
    interface: UplinkName
    hosts: list[Hostname] = many(MAX_HOSTS_PER_LIST)


class ProviderNetwork(_Model):
    name: BridgeSuffix
    default_interface: UplinkName | None = None
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
    name: PortName | None = None
    port: Port
    protocol: Literal["tcp", "udp", "sctp"] = "tcp"


class Pod(_Model):
    id: Id
    namespace: Namespace
    name: Name = ""
    ip: HostAddress
    labels: Labels = Field(default_factory=dict)
    ready: bool = False
    ports: list[PodPort] = many(MAX_PORTS_PER_POD)


# --- backends --------------------------------------------------------------------


class Backend(_Model):
    id: Id
    address: HostAddress
    port: Port
    weight: Weight = DEFAULT_WEIGHT
    send_proxy: SendProxy = "off"
    ssl: bool = False
    backup: bool = False  # serves only while no other member of its group is up


class PodSelector(_Model):
    namespace: Namespace
    labels: Labels = Field(default_factory=dict)
    port: PortOrName
    weight: Weight = DEFAULT_WEIGHT


class BackendGroup(_Model):
    id: Id
    backends: list[Backend] = many(MAX_BACKENDS_PER_GROUP)
    pod_selector: PodSelector | None = None
    slow_start: SlowStartSeconds = 0
    health_check_port: Port | None = None  # None: each member's own port
    drain_timeout: DrainTimeoutSeconds = DEFAULT_DRAIN_TIMEOUT


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
    cookie_timeout: CookieTimeout | None = None  # None or 0: a session cookie


class Acl(_Model):
    # No default: guessing wrong turns a white list into a black list.
    type: Literal["black", "white"]
    cidrs: list[AnyCidr] = many(MAX_ACL_CIDRS)


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

    client_request: ClientTimeoutSeconds | None = None
    client_idle: ClientTimeoutSeconds | None = None
    backend_connect: TimeoutSeconds | None = None
    backend_idle: TimeoutSeconds | None = None


class Certificate(_Model):
    id: Id
    certificate: PemCertificate = Field(repr=False)
    private_key: PemPrivateKey = Field(repr=False)

    @field_validator("private_key")
    @classmethod
    def check_key_matches(cls, private_key: str, info: ValidationInfo) -> str:
        # Absent when the certificate itself was refused: that is reported already.
        certificate = info.data.get("certificate")
        if certificate is not None:
            pem.check_pair(certificate, private_key)
        return private_key

    @cached_property
    def chain(self) -> pem.CertificateChain:
        """The decoded certificate text (decoded at validation, cached by
        lbagent.desired.pem; kept here so status never decodes it again)."""
        return pem.certificate_chain(self.certificate)

    def validity_warning(self, now: datetime) -> str | None:
        """Why the first certificate would not be trusted at `now` (None: it is within its validity)."""
        chain = self.chain
        if now > chain.not_after:
            return f"certificate expired at {_utc_text(chain.not_after)}"
        if now < chain.not_before:
            return f"certificate not valid before {_utc_text(chain.not_before)}"
        return None


def _utc_text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ClientCertificate(_Model):
    """Mutual TLS: clients present a certificate issued by `ca`, checked against `crl`."""

    ca: PemCertificate
    verify: Literal["required", "optional"] = "required"
    crl: PemCrlOrEmpty = ""  # empty: no revocation list


class Rule(_Model):
    id: Id
    domain: DomainPatternOrEmpty = ""
    path: UriPath = ""  # a prefix
    backend_group_id: Id | None = None
    redirect: Redirect | None = None
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
    health_check: HealthCheck | None = None
    sticky_session: StickySession | None = None
    acl: Acl | None = None
    connection_limit: ConnectionLimit = 0
    x_forwarded_for: bool = False
    x_forwarded_proto: bool = False
    gzip: bool = False
    http2: bool = False
    send_proxy: SendProxy = "off"
    timeouts: Timeouts | None = None
    http_request_rate: Rate = 0
    http_request_rate_per_src: Rate = 0
    redirect: Redirect | None = None
    certificates: list[Certificate] = many(MAX_CERTIFICATES_PER_LISTENER)
    tls_cipher_policy: TlsCipherPolicy = "tls_cipher_policy_1_2"
    client_certificate: ClientCertificate | None = None
    access_log: bool = False
    access_log_rate: AccessLogRate = DEFAULT_ACCESS_LOG_RATE
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


class Network(_DualStackModel):
    IPV6_FIELDS = frozenset({"ip6"})

    subnet_id: Id
    ip: HostIPv4
    ip6: HostIPv6 | None = None  # in the subnet's cidr6: the load balancer serves on both addresses
    mac: Mac


class LoadBalancer(_Model):
    id: Id
    name: Name = ""
    status: Status = "enabled"
    network: Network
    listeners: list[Listener] = many(MAX_LISTENERS_PER_LB)
    backend_groups: list[BackendGroup] = many(MAX_BACKEND_GROUPS_PER_LB)
    ha: HighAvailability | None = None  # None: this host alone serves it

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
    def static_servers(self) -> int:
        """Its haproxy servers with its groups' own backends, pods aside
        (lbagent.desired.budget): once per validated instance, like its own
        problems, so a refresh counts only the load balancers that changed."""
        return servers_of(self)

    @cached_property
    def _own_problems(self) -> list[Problem]:
        # Once per validated instance: a refresh that reuses the instance of an
        # unchanged load balancer (see lbagent.desired.parser) does not check it again.
        return own_problems(self)

    def certificate_warnings(self, now: datetime) -> list[dict[str, str]]:
        """Certificates of this load balancer that are accepted but expired or not yet
        valid at `now`: {"path": JSON pointer below the load balancer, "message"}."""
        warnings = []
        for location, certificate in self._certificates():
            message = certificate.validity_warning(now)
            if message is not None:
                warnings.append({"path": json_pointer((*location, "certificate")), "message": message})
        return warnings

    def _certificates(self) -> list[tuple[tuple[str | int, ...], Certificate]]:
        found: list[tuple[tuple[str | int, ...], Certificate]] = []
        for i, listener in enumerate(self.listeners):
            found += [(("listeners", i, "certificates", c), cert) for c, cert in enumerate(listener.certificates)]
            for r, rule in enumerate(listener.rules):
                at = ("listeners", i, "rules", r, "certificates")
                found += [((*at, c), cert) for c, cert in enumerate(rule.certificates)]
        return found

    @property
    def canonical_json(self) -> str:
        """The load balancer as canonical JSON, a fingerprint's basis: computed on each use,
        as the worker keeps the fingerprint (1-2 kB a load balancer less to keep)."""
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
        details = check_state(self)
        if details:
            raise InvalidDesiredState(details)
        return self


# --- entry points -------------------------------------------------------------------

# Input under these fields is never repeated in a message: it holds private keys.
UNECHOED_FIELDS = frozenset({"certificates"})


def parse_desired_state(data: object) -> DesiredState:
    """Validate a decoded POST /v1/refresh body completely.

    Raises InvalidDesiredState listing every per-field problem, or, when every
    field is well-formed, every cross-field problem.
    """
    try:
        return DesiredState.model_validate(data)
    except ValidationError as exc:
        raise InvalidDesiredState(error_details(exc, DesiredState, UNECHOED_FIELDS)) from None


def json_schema() -> dict[str, Any]:
    """JSON schema of the POST /v1/refresh body (for the OpenAPI document)."""
    schema = DesiredState.model_json_schema()
    # The one IPv6 rule across fields that JSON Schema can say (crosschecks checks it).
    subnet = schema["$defs"]["Subnet"]
    subnet["dependentRequired"] = {"cidr6": ["gateway6"], "gateway6": ["cidr6"]}
    # What dependentRequired cannot say: presence there includes null.
    subnet["description"] = "cidr6 and gateway6 come together: both given, or both absent or null"
    return schema
