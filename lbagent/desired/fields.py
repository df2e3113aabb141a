"""Single-value rules of api.md ("Values"): the limits and the reusable field types.

Owns every numeric limit of the desired state (one place, below) and the
Annotated types that lbagent.desired.model composes: ids, names, IPv4 and IPv6
addresses and prefixes, MACs, host names, URI paths, cookies, labels, PEM blocks (decoded by
lbagent.desired.pem), ports.
Each type raises ValueError with a message saying what is allowed; it never
repeats the input, because only the caller knows whether the input may be
shown (a private key may not) and how much of it.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, PlainValidator, Strict, WithJsonSchema

from lbagent.desired import pem
from lbagent.naming import HASH_CHARS

# --- limits ---------------------------------------------------------------

MAX_ID_LEN = 64
MAX_NAME_LEN = 128
MAX_IFNAME_LEN = 15  # Linux IFNAMSIZ minus the NUL
# A provider network's bridge is "br-<name>", which must be an interface name;
# the contract keeps one character to spare.
MAX_BRIDGE_SUFFIX_LEN = 11
MAX_HOSTNAME_LEN = 253
MAX_URI_LEN = 255
MAX_PROBE_PAYLOAD_LEN = 255
MAX_COOKIE_LEN = 64
MAX_PORT_NAME_LEN = 15  # a Kubernetes-style named port (IANA service name length)
MAX_NAMESPACE_LEN = 63
MAX_LABELS = 64
MAX_LABEL_NAME_LEN = 63
MAX_LABEL_PREFIX_LEN = 253
MAX_PEM_BYTES = 64 * 1024

MIN_PORT, MAX_PORT = 1, 65535
MIN_MTU, MAX_MTU, DEFAULT_MTU = 576, 9000, 1442
MIN_WEIGHT, MAX_WEIGHT, DEFAULT_WEIGHT = 0, 256, 1
MAX_RISE_FALL = 100
MAX_CHECK_SECONDS = 3600
# haproxy keeps timeouts in milliseconds in a signed 32-bit int (~24.8 days).
MAX_TIMEOUT_SECONDS = (2**31 - 1) // 1000
# A client may hold a connection (and its slot in haproxy's maxconn) open for
# this long while idle or sending headers: longer lets a few clients starve others.
MAX_CLIENT_TIMEOUT_SECONDS = 3600
MAX_COOKIE_TIMEOUT = 365 * 24 * 3600
MAX_RATE = 1_000_000
# Connections one listener may hold at once; haproxy's process limit is sized
# from the sum over every listener, so one tenant's cap bounds its share.
MAX_CONNECTION_LIMIT = 100_000
# A member that joins or comes back up ramps to its weight over at most this long.
MAX_SLOW_START_SECONDS = 900
# A backend removed or set to weight 0 keeps its established connections this long.
MAX_DRAIN_TIMEOUT_SECONDS, DEFAULT_DRAIN_TIMEOUT = 3600, 300
# Access log lines per second and listener; beyond it lines are counted, not written.
MAX_ACCESS_LOG_RATE, DEFAULT_ACCESS_LOG_RATE = 10_000, 100
# Generations are persisted and compared; keep them inside a signed 64-bit int.
MAX_GENERATION = 2**63 - 1

MAX_LOADBALANCERS = 4096
MAX_LISTENERS_PER_LB = 64
MAX_BACKEND_GROUPS_PER_LB = 256
MAX_BACKENDS_PER_GROUP = 1024
# Each backend of a load balancer gets a port of its own on the namespace's
# inner address: 1025-65535 (lbagent.workers.allocator).
MAX_BACKENDS_PER_LB = 65535 - 1025 + 1
MAX_RULES_PER_LISTENER = 256
MAX_CERTIFICATES_PER_LISTENER = 64
MAX_ACL_CIDRS = 1024
MAX_SUBNETS = 4096
MAX_ROUTES_PER_SUBNET = 64
MAX_PROVIDER_NETWORKS = 64
MAX_CUSTOM_INTERFACES = 64
MAX_HOSTS_PER_LIST = 1024
MAX_PODS = 65536
MAX_PORTS_PER_POD = 64

# How much of an offending input value an error message may repeat.
MAX_ECHO_LEN = 60

# --- building blocks --------------------------------------------------------


def int_range(low: int, high: int) -> Any:
    """A JSON integer (not a bool, not a numeric string) within [low, high]."""
    return Annotated[int, Strict(), Field(ge=low, le=high)]


def text_type(check: Callable[[str], str | None], schema: dict[str, Any], *, allow_empty: bool = False) -> Any:
    """A JSON string accepted by `check`; `check` may return a normalised value."""

    def validate(value: str) -> str:
        if allow_empty and value == "":
            return value
        normalised = check(value)
        return value if normalised is None else normalised

    return Annotated[str, Strict(), AfterValidator(validate), WithJsonSchema({"type": "string", **schema})]


def bounded_dict(key: Any, value: Any, max_length: int) -> Any:
    """A JSON object of at most `max_length` entries whose keys and values are of those types."""
    # additionalProperties: false, since patternProperties alone leaves other keys unchecked.
    return Annotated[dict[key, value], Field(max_length=max_length, json_schema_extra={"additionalProperties": False})]


def pattern_type(regex: str, what: str, *, allow_empty: bool = False) -> Any:
    """A JSON string that fully matches `regex`; `what` completes "must be ..."."""
    compiled = re.compile(regex)

    def check(value: str) -> None:
        if not compiled.fullmatch(value):
            raise ValueError(f"must be {what}")

    pattern = f"^({regex})?$" if allow_empty else f"^{regex}$"
    return text_type(check, {"pattern": pattern}, allow_empty=allow_empty)


def _check_length(value: str, limit: int) -> None:
    if len(value) > limit:
        raise ValueError(f"must be at most {limit} characters")


# --- identifiers and free text ----------------------------------------------

_ID_CHARS = "letters, digits, '_' and '-'"
Id = pattern_type(rf"[A-Za-z0-9_-]{{1,{MAX_ID_LEN}}}", f"1-{MAX_ID_LEN} characters of {_ID_CHARS}")
BridgeSuffix = pattern_type(
    rf"[A-Za-z0-9_-]{{1,{MAX_BRIDGE_SUFFIX_LEN}}}",
    f"1-{MAX_BRIDGE_SUFFIX_LEN} characters of {_ID_CHARS} (it names the bridge br-<name>)",
)
_INTERFACE_NAME = rf"(?!\.\.?$)[A-Za-z0-9_.-]{{1,{MAX_IFNAME_LEN}}}"
_INTERFACE_CHARS = f"1-{MAX_IFNAME_LEN} characters of letters, digits, '_', '.' and '-'"
InterfaceName = pattern_type(_INTERFACE_NAME, f"a network interface name: {_INTERFACE_CHARS}")
# An uplink the agent would move onto a provider bridge: never loopback, and
# never an interface the agent or Open vSwitch makes (a load balancer's veth
# ends, the integration and provider bridges br-*, OVS's own devices).
_OWN_INTERFACE = (
    rf"(?:lo|ovs-system|ovs-netdev|br-.*|(?:genev|vxlan|gre|stt|lisp)_sys.*|[oh][0-9a-f]{{{HASH_CHARS}}}[01])"
)
UplinkName = pattern_type(
    rf"(?!{_OWN_INTERFACE}$){_INTERFACE_NAME}",
    f"a host uplink: {_INTERFACE_CHARS}; not lo, a bridge br-*, ovs-system, ovs-netdev, "
    "an OVS tunnel device (genev_sys_*, vxlan_sys_*, ...) or a load balancer's veth",
)
Cookie = pattern_type(rf"[A-Za-z0-9_-]{{1,{MAX_COOKIE_LEN}}}", f"1-{MAX_COOKIE_LEN} characters of {_ID_CHARS}")
# Like Kubernetes' IANA_SVC_NAME: the letter requirement keeps "80" from passing as a name.
_PORT_NAME = rf"(?=[a-z0-9-]*[a-z])[a-z0-9-]{{1,{MAX_PORT_NAME_LEN}}}"
_PORT_NAME_WHAT = f"1-{MAX_PORT_NAME_LEN} characters of lowercase letters, digits and '-', with at least one letter"
PortName = pattern_type(_PORT_NAME, f"a port name: {_PORT_NAME_WHAT}")
Namespace = pattern_type(
    rf"[A-Za-z0-9_.-]{{1,{MAX_NAMESPACE_LEN}}}",
    f"1-{MAX_NAMESPACE_LEN} characters of letters, digits, '_', '.' and '-'",
)
LabelKey = pattern_type(
    rf"(?:[A-Za-z0-9_.-]{{1,{MAX_LABEL_PREFIX_LEN}}}/)?[A-Za-z0-9_.-]{{1,{MAX_LABEL_NAME_LEN}}}",
    f"a label key: 1-{MAX_LABEL_NAME_LEN} characters of letters, digits, '_', '.' and '-', "
    "optionally after one 'prefix/'",
)
LabelValue = pattern_type(
    rf"[A-Za-z0-9_.-]{{0,{MAX_LABEL_NAME_LEN}}}",
    f"a label value: at most {MAX_LABEL_NAME_LEN} characters of letters, digits, '_', '.' and '-'",
)
Labels = bounded_dict(LabelKey, LabelValue, MAX_LABELS)

# Line and paragraph separators end a line in some readers just like "\n" does.
_BAD_TEXT_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})


def _check_name(value: str) -> None:
    _check_length(value, MAX_NAME_LEN)
    if any(unicodedata.category(ch) in _BAD_TEXT_CATEGORIES for ch in value):
        raise ValueError("must not contain control characters or line breaks")


# _BAD_TEXT_CATEGORIES spelled out for the JSON schema, but for the lone
# surrogates (Cs): they are no Unicode text, and a regex over UTF-16 would
# take every character beyond the BMP for two of them.
_NAME_CHAR = r"[^\x00-\x1f\x7f-\x9f\u2028\u2029]"
Name = text_type(
    _check_name,
    {
        "maxLength": MAX_NAME_LEN,
        "pattern": f"^{_NAME_CHAR}*$",
        "description": "free text without control characters, line or paragraph separators (or lone surrogates)",
    },
    allow_empty=True,
)

# --- host names, URIs, probe payloads ---------------------------------------

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = rf"{_LABEL}(?:\.{_LABEL})*"
_HOSTNAME_RE = re.compile(_HOSTNAME)
_HOSTNAME_WHAT = "a host name: dot-separated labels of letters, digits and '-'"


def check_hostname(value: str, *, wildcard: bool = False) -> None:
    """Raise ValueError unless `value` is a host name (or, with wildcard, "*.<host name>")."""
    _check_length(value, MAX_HOSTNAME_LEN)
    name = value[2:] if wildcard and value.startswith("*.") else value
    if not _HOSTNAME_RE.fullmatch(name):
        raise ValueError(f"must be {_HOSTNAME_WHAT}" + (", optionally starting with '*.'" if wildcard else ""))


def _check_domain_pattern(value: str) -> None:
    check_hostname(value, wildcard=True)


Hostname = text_type(check_hostname, {"pattern": f"^{_HOSTNAME}$", "maxLength": MAX_HOSTNAME_LEN})
HostnameOrEmpty = text_type(
    check_hostname, {"pattern": f"^({_HOSTNAME})?$", "maxLength": MAX_HOSTNAME_LEN}, allow_empty=True
)
DomainPatternOrEmpty = text_type(
    _check_domain_pattern,
    {"pattern": rf"^((\*\.)?{_HOSTNAME})?$", "maxLength": MAX_HOSTNAME_LEN},
    allow_empty=True,
)

# Printable ASCII without space, quotes, '#' and backslash: safe to put in a
# haproxy config line and an HTTP request line after quoting.
_URI_CHAR = r"[!$-&(-\[\]-~]"
_URI_RE = re.compile(rf"/{_URI_CHAR}*")


def _check_uri_path(value: str) -> None:
    _check_length(value, MAX_URI_LEN)
    if not value.startswith("/"):
        raise ValueError("must start with '/'")
    if not _URI_RE.fullmatch(value):
        raise ValueError("may only contain printable ASCII without spaces, quotes, '#' or backslashes")


UriPath = text_type(_check_uri_path, {"pattern": f"^(/{_URI_CHAR}*)?$", "maxLength": MAX_URI_LEN}, allow_empty=True)
ProbePayload = pattern_type(
    rf"[ -~]{{0,{MAX_PROBE_PAYLOAD_LEN}}}",
    f"at most {MAX_PROBE_PAYLOAD_LEN} characters of printable ASCII",
)

HTTP_CODE_CLASSES = ("http_2xx", "http_3xx", "http_4xx", "http_5xx")


def _check_http_codes(value: str) -> None:
    codes = value.split(",")
    if any(code not in HTTP_CODE_CLASSES for code in codes):
        raise ValueError(f"must be a comma list (no spaces) of {', '.join(HTTP_CODE_CLASSES)}")
    if len(set(codes)) != len(codes):
        raise ValueError("must not name a status class twice")


# The lookahead refuses a class named twice.
HttpCodes = text_type(_check_http_codes, {"pattern": r"^(?!.*(http_[2-5]xx).*\1)http_[2-5]xx(,http_[2-5]xx)*$"})

# --- IPv4 ---------------------------------------------------------------------

# ipaddress alone would also take integers; the regex keeps it to dotted quads
# of ASCII digits, ipaddress then rejects octets over 255 and leading zeros.
_DOTTED_QUAD = r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}"
_DOTTED_QUAD_RE = re.compile(_DOTTED_QUAD)
_PREFIX_LEN = r"(?:[0-9]|[12][0-9]|3[0-2])"
_CIDR_RE = re.compile(rf"({_DOTTED_QUAD})/({_PREFIX_LEN})")


# An IPv6 value in a field that takes only IPv4 (a subnet's cidr and gateway,
# a load balancer's ip) is pointed to its IPv6 twin, not called malformed.
_IPV6_TWIN = "an IPv6 {} goes in its own field ({})"


def _looks_ipv6(value: str) -> bool:
    return ":" in value


def family_of(address: str) -> Literal[4, 6]:
    """The IP version of a validated address or prefix."""
    return 6 if _looks_ipv6(address) else 4


def parse_ipv4(value: str) -> IPv4Address:
    if not _DOTTED_QUAD_RE.fullmatch(value):
        if _looks_ipv6(value):
            twin = _IPV6_TWIN.format("address", "ip6, gateway6")
            raise ValueError(f"must be an IPv4 address in dotted-quad form: {twin}")
        raise ValueError("must be an IPv4 address in dotted-quad form, like 198.18.0.1")
    try:
        return IPv4Address(value)
    except ValueError:
        raise ValueError("must be an IPv4 address: four numbers 0-255 without leading zeros") from None


# The same addresses recur across a thousand load balancers (their backends,
# gateways): ipaddress objects are slow to build, so valid values are
# remembered (a refused one raises, which is never cached).
@functools.lru_cache(maxsize=65536)
def _check_host_ipv4(value: str) -> None:
    ip = parse_ipv4(value)
    # is_reserved covers 240/4 including the limited broadcast 255.255.255.255.
    if ip.is_unspecified or ip.is_loopback or ip.is_multicast or ip.is_link_local or ip.is_reserved:
        raise ValueError("must be a unicast host address (not 0.0.0.0, loopback, multicast, link-local or broadcast)")


@functools.lru_cache(maxsize=4096)
def _check_cidr(value: str) -> None:
    match = _CIDR_RE.fullmatch(value)
    if not match:
        if _looks_ipv6(value):
            raise ValueError(f"must be an IPv4 prefix like 198.18.0.0/24: {_IPV6_TWIN.format('prefix', 'cidr6')}")
        raise ValueError("must be an IPv4 prefix like 198.18.0.0/24")
    parse_ipv4(match.group(1))
    try:
        IPv4Network(value)
    except ValueError:
        raise ValueError(f"has host bits set; the prefix is {IPv4Network(value, strict=False)}") from None


def _check_ipv4(value: str) -> None:
    parse_ipv4(value)  # the value stays the text: the field is a str


# The JSON schema spells out what the checks above accept: octets 0-255
# without leading zeros and, for a host address, none of the refused ranges;
# for a prefix, only the addresses whose host bits are zero.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_NOT_HOST = r"(?!0\.0\.0\.0$)(?!127\.)(?!169\.254\.)(?!(?:22[4-9]|2[3-5][0-9])\.)"


def _cidr_pattern() -> str:
    """Every IPv4 prefix without host bits, one alternative per prefix length."""
    alternatives = []
    for length in range(33):
        whole, rest = divmod(length, 8)
        octets = [_OCTET] * whole
        if rest:
            step = 2 ** (8 - rest)
            octets.append("(?:" + "|".join(str(n) for n in range(256 - step, -1, -step)) + ")")
        octets += ["0"] * (4 - len(octets))
        alternatives.append(r"\.".join(octets) + f"/{length}")
    return "^(?:" + "|".join(alternatives) + ")$"


# Ranges a subnet route must not point into: the agent's own 169.254 address
# pairs (a route there takes every load balancer on the subnet off the air),
# loopback and multicast. A wider route that contains one (0.0.0.0/0) is fine:
# the more specific routes of the namespace still win.
ROUTE_EXCLUDED = (IPv4Network("169.254.0.0/16"), IPv4Network("127.0.0.0/8"), IPv4Network("224.0.0.0/4"))


def _check_route_destination(value: str) -> None:
    _check_cidr(value)
    network = IPv4Network(value)
    for excluded in ROUTE_EXCLUDED:
        if network.subnet_of(excluded):
            raise ValueError(f"must not lie inside {excluded} (link-local, loopback or multicast)")


def _prefix_inside(excluded: IPv4Network) -> str:
    """A lookahead refusing the prefixes inside `excluded` (whose first octets it fixes)."""
    octets = str(excluded.network_address).split(".")[: excluded.prefixlen // 8]
    first = r"\.".join(octets) if excluded.prefixlen % 8 == 0 else _first_octet_range(excluded)
    lengths = "|".join(str(n) for n in range(excluded.prefixlen, 33))
    return rf"(?!{first}\.[0-9.]*/(?:{lengths})$)"


def _first_octet_range(excluded: IPv4Network) -> str:
    low = int(str(excluded.network_address).split(".")[0])
    return "(?:" + "|".join(str(n) for n in range(low, low + 2 ** (8 - excluded.prefixlen))) + ")"


_HOST_IPV4_SCHEMA = {
    "pattern": f"^{_NOT_HOST}{_IPV4}$",
    "description": "a unicast host address: not 0.0.0.0, 127/8, 169.254/16, 224/4 or 240/4",
}
_CIDR_SCHEMA = {"pattern": _cidr_pattern(), "description": "an IPv4 prefix whose host bits are zero"}
_ROUTE_DESTINATION_SCHEMA = {
    "pattern": "^" + "".join(_prefix_inside(r) for r in ROUTE_EXCLUDED) + _cidr_pattern().removeprefix("^"),
    "description": "an IPv4 prefix whose host bits are zero, not inside 169.254/16, 127/8 or 224/4",
}

IPv4 = text_type(_check_ipv4, {"pattern": f"^{_IPV4}$"})
HostIPv4 = text_type(_check_host_ipv4, _HOST_IPV4_SCHEMA)
Cidr = text_type(_check_cidr, _CIDR_SCHEMA)
RouteDestination = text_type(_check_route_destination, _ROUTE_DESTINATION_SCHEMA)

# --- IPv6 -----------------------------------------------------------------------

# Hexadecimal groups only: ipaddress would also take a zone id ("%eth0", which
# names an interface of whichever host reads it) and a dotted IPv4 tail (the
# spelling of IPv4-mapped addresses, which are refused anyway).
_HEXTET = "[0-9A-Fa-f]{1,4}"


def _ipv6_syntax(first: str, *, leading_gap: bool) -> str:
    """IPv6 text whose first group, when written, matches `first`; with
    `leading_gap`, also the forms that start with "::" (a first group of 0)."""
    alternatives = [f"{first}(?::{_HEXTET}){{7}}"]
    for before in range(7):  # groups written between the first one and "::"
        after = 6 - before  # "::" stands for at least one group, so at most this many follow it
        tail = f"(?:{_HEXTET}(?::{_HEXTET}){{0,{after - 1}}})?" if after else ""
        alternatives.append(f"{first}(?::{_HEXTET}){{{before}}}::{tail}")
    if leading_gap:
        alternatives.append(f"::(?:{_HEXTET}(?::{_HEXTET}){{0,6}})?")
    return "(?:" + "|".join(alternatives) + ")"


_IPV6 = _ipv6_syntax(_HEXTET, leading_gap=True)
_IPV6_RE = re.compile(_IPV6)
# The unicast host addresses left once the refused ranges are out (see
# _check_host_ipv6) are exactly global unicast 2000::/3 and unique local
# fc00::/7: a first group of four digits starting with 2, 3, fc or fd.
_HOST_IPV6 = _ipv6_syntax("(?:[23][0-9A-Fa-f]{3}|[Ff][CDcd][0-9A-Fa-f]{2})", leading_gap=False)
_IPV6_PREFIX_LEN = "(?:[0-9]|[1-9][0-9]|1[01][0-9]|12[0-8])"
_IPV6_CIDR_RE = re.compile(rf"({_IPV6})/({_IPV6_PREFIX_LEN})")
MIN_SUBNET6_PREFIX, MAX_SUBNET6_PREFIX = 64, 120
_SUBNET6_PREFIX_LEN = "(?:6[4-9]|[7-9][0-9]|1[01][0-9]|120)"


def parse_ipv6(value: str) -> IPv6Address:
    if "%" in value:
        raise ValueError("must be an IPv6 address without a zone id ('%...')")
    if not _IPV6_RE.fullmatch(value):
        raise ValueError("must be an IPv6 address in hexadecimal groups, like 2001:db8::1")
    try:
        return IPv6Address(value)
    except ValueError:  # the regex already holds it to IPv6 syntax; kept as a typed refusal all the same
        raise ValueError("must be an IPv6 address in hexadecimal groups, like 2001:db8::1") from None


@functools.lru_cache(maxsize=65536)
def _check_host_ipv6(value: str) -> str:
    ip = parse_ipv6(value)
    # is_reserved covers ::/8 (with the loopback, the IPv4-compatible and IPv4-mapped
    # addresses) and every range outside 2000::/3 and fc00::/7 that has no name of its own.
    if (
        ip.is_unspecified
        or ip.is_loopback
        or ip.is_multicast
        or ip.is_link_local
        or ip.is_site_local
        or ip.is_reserved
        or ip.ipv4_mapped is not None
    ):
        raise ValueError(
            "must be a unicast host address (global 2000::/3 or unique local fc00::/7; "
            "not ::, loopback, multicast, link-local, site-local, IPv4-mapped or reserved)"
        )
    return str(ip)  # one spelling, so equal addresses compare equal and config files never differ


def _parse_cidr6(value: str) -> IPv6Network:
    match = _IPV6_CIDR_RE.fullmatch(value)
    if not match:
        if "%" in value:
            parse_ipv6(value.partition("/")[0])  # says why
        raise ValueError("must be an IPv6 prefix like 2001:db8::/64")
    try:
        return IPv6Network(value)
    except ValueError:
        raise ValueError(f"has host bits set; the prefix is {IPv6Network(value, strict=False)}") from None


@functools.lru_cache(maxsize=4096)
def _check_cidr6(value: str) -> str:
    return str(_parse_cidr6(value))


def _check_subnet_cidr6(value: str) -> str:
    network = _parse_cidr6(value)
    if not MIN_SUBNET6_PREFIX <= network.prefixlen <= MAX_SUBNET6_PREFIX:
        raise ValueError(f"must be an IPv6 prefix of length /{MIN_SUBNET6_PREFIX} to /{MAX_SUBNET6_PREFIX}")
    return str(network)


# The IPv6 twins of ROUTE_EXCLUDED. The agent's own IPv6 pairs lie in
# [agent] inner_prefix6, which is configuration, not part of the desired state.
ROUTE_EXCLUDED6 = (IPv6Network("fe80::/10"), IPv6Network("::1/128"), IPv6Network("ff00::/8"))


def _check_route_destination6(value: str) -> str:
    network = _parse_cidr6(value)
    for excluded in ROUTE_EXCLUDED6:
        if network.subnet_of(excluded):
            raise ValueError(f"must not lie inside {excluded} (link-local, loopback or multicast)")
    return str(network)


# --- either family ----------------------------------------------------------------
# A value with a ':' is IPv6, any other is held to the IPv4 rules (and their messages).

_EITHER_ADDRESS = "must be an IPv4 address in dotted-quad form, like 198.18.0.1, or an IPv6 address, like 2001:db8::1"


def _check_host_address(value: str) -> str | None:
    if _looks_ipv6(value):
        return _check_host_ipv6(value)
    if not _DOTTED_QUAD_RE.fullmatch(value):
        raise ValueError(_EITHER_ADDRESS)
    _check_host_ipv4(value)
    return None


def _either_prefix(check4: Callable[[str], None], check6: Callable[[str], str]) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        if _looks_ipv6(value):
            return check6(value)
        if "/" not in value or not _DOTTED_QUAD_RE.fullmatch(value.partition("/")[0]):
            raise ValueError("must be an IPv4 prefix like 198.18.0.0/24 or an IPv6 prefix like 2001:db8::/64")
        check4(value)
        return None

    return check


_HOST_IPV6_SCHEMA = {
    "pattern": f"^{_HOST_IPV6}$",
    "description": "an IPv6 unicast host address in hexadecimal groups: global (2000::/3) or unique local "
    "(fc00::/7); no zone id",
}
_CIDR6_SCHEMA = {
    "pattern": f"^{_IPV6}/{_IPV6_PREFIX_LEN}$",
    "description": "an IPv6 prefix in hexadecimal groups whose host bits are zero",
}
_ROUTE_DESTINATION6_SCHEMA = {
    "pattern": (
        "^(?![Ff][Ee][89ABab][0-9A-Fa-f][:/].*/(?:[1-9][0-9]|1[01][0-9]|12[0-8])$)"  # fe80::/10
        "(?![Ff]{2}[0-9A-Fa-f]{2}[:/].*/(?:[89]|[1-9][0-9]|1[01][0-9]|12[0-8])$)"  # ff00::/8
        "(?![0:]*:0{0,3}1/128$)"  # ::1/128
        f"{_IPV6}/{_IPV6_PREFIX_LEN}$"
    ),
    "description": "an IPv6 prefix in hexadecimal groups whose host bits are zero, "
    "not inside fe80::/10, ::1/128 or ff00::/8",
}


def _either_schema(ipv4: dict[str, str], ipv6: dict[str, str]) -> dict[str, Any]:
    return {"anyOf": [ipv4, ipv6]}


HostIPv6 = text_type(_check_host_ipv6, _HOST_IPV6_SCHEMA)
SubnetCidr6 = text_type(
    _check_subnet_cidr6,
    {
        "pattern": f"^{_IPV6}/{_SUBNET6_PREFIX_LEN}$",
        "description": f"an IPv6 prefix of length /{MIN_SUBNET6_PREFIX} to /{MAX_SUBNET6_PREFIX} in hexadecimal "
        "groups whose host bits are zero",
    },
)
HostAddress = text_type(_check_host_address, _either_schema(_HOST_IPV4_SCHEMA, _HOST_IPV6_SCHEMA))
AnyCidr = text_type(_either_prefix(_check_cidr, _check_cidr6), _either_schema(_CIDR_SCHEMA, _CIDR6_SCHEMA))
AnyRouteDestination = text_type(
    _either_prefix(_check_route_destination, _check_route_destination6),
    _either_schema(_ROUTE_DESTINATION_SCHEMA, _ROUTE_DESTINATION6_SCHEMA),
)


_MAC = r"[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}){5}"
_MAC_RE = re.compile(_MAC)


def _check_mac(value: str) -> str:
    if not _MAC_RE.fullmatch(value):
        raise ValueError("must be a MAC address like 00:22:0a:00:00:12")
    if int(value[:2], 16) & 1:
        raise ValueError("must be a unicast MAC address (lowest bit of the first octet clear)")
    if int(value.replace(":", ""), 16) == 0:
        raise ValueError("must not be all zeros")
    return value.lower()  # one spelling, so equal MACs compare equal


# Unicast (the first octet even) and not all zeros.
Mac = text_type(_check_mac, {"pattern": "^(?!00(?::00){5}$)[0-9A-Fa-f][02468ACEace](?::[0-9A-Fa-f]{2}){5}$"})

# --- numbers ------------------------------------------------------------------

Port = int_range(MIN_PORT, MAX_PORT)
Mtu = int_range(MIN_MTU, MAX_MTU)
Weight = int_range(MIN_WEIGHT, MAX_WEIGHT)
RiseFall = int_range(1, MAX_RISE_FALL)
CheckSeconds = int_range(1, MAX_CHECK_SECONDS)
TimeoutSeconds = int_range(1, MAX_TIMEOUT_SECONDS)
ClientTimeoutSeconds = int_range(1, MAX_CLIENT_TIMEOUT_SECONDS)
CookieTimeout = int_range(0, MAX_COOKIE_TIMEOUT)
Rate = int_range(0, MAX_RATE)
ConnectionLimit = int_range(0, MAX_CONNECTION_LIMIT)
SlowStartSeconds = int_range(0, MAX_SLOW_START_SECONDS)
DrainTimeoutSeconds = int_range(0, MAX_DRAIN_TIMEOUT_SECONDS)
AccessLogRate = int_range(1, MAX_ACCESS_LOG_RATE)
Generation = int_range(0, MAX_GENERATION)

_PORT_OR_NAME_WHAT = f"must be a port number {MIN_PORT}-{MAX_PORT} or a port name"


def _port_or_name(value: object) -> int | str:
    # A hand-written check instead of Union[Port, PortName]: a pydantic union
    # puts its branch names into the error location, which is not a JSON path.
    if isinstance(value, int) and not isinstance(value, bool):
        if not MIN_PORT <= value <= MAX_PORT:
            raise ValueError(_PORT_OR_NAME_WHAT)
        return value
    if isinstance(value, str):
        if not re.fullmatch(_PORT_NAME, value):
            raise ValueError(f"{_PORT_OR_NAME_WHAT} ({_PORT_NAME_WHAT})")
        return value
    raise ValueError(_PORT_OR_NAME_WHAT)


PortOrName = Annotated[
    int | str,
    PlainValidator(_port_or_name),
    WithJsonSchema(
        {
            "oneOf": [
                {"type": "integer", "minimum": MIN_PORT, "maximum": MAX_PORT},
                {"type": "string", "pattern": f"^{_PORT_NAME}$"},
            ]
        }
    ),
]

# --- PEM ------------------------------------------------------------------------

_B64_BODY = r"[A-Za-z0-9+/=\s]+"
_CERT_RE = re.compile(rf"-----BEGIN CERTIFICATE-----{_B64_BODY}-----END CERTIFICATE-----")
# Only unencrypted keys: haproxy cannot ask for a passphrase. An encrypted
# traditional key carries "Proc-Type:" headers, which the base64 body refuses.
_KEY_RE = re.compile(rf"-----BEGIN ((?:RSA |EC )?PRIVATE KEY)-----{_B64_BODY}-----END \1-----")
_ANY_KEY_RE = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
_PEM_TEXT_RE = re.compile(r"[ -~\t\r\n]*")


def _check_pem_text(value: str) -> None:
    if len(value.encode()) > MAX_PEM_BYTES:
        raise ValueError(f"must be at most {MAX_PEM_BYTES} bytes")
    if not _PEM_TEXT_RE.fullmatch(value):
        raise ValueError("must be PEM text (printable ASCII and line breaks)")


def _check_certificate(value: str) -> None:
    _check_pem_text(value)
    if not _CERT_RE.search(value):
        raise ValueError("must contain a PEM certificate (-----BEGIN CERTIFICATE----- ... -----END CERTIFICATE-----)")
    # Certificates are written world-readable; a key pasted here would leak.
    if _ANY_KEY_RE.search(value):
        raise ValueError("must not contain a private key; put it in private_key")
    pem.certificate_chain(value)


def _check_private_key(value: str) -> None:
    _check_pem_text(value)
    if "ENCRYPTED PRIVATE KEY" in value or "Proc-Type: 4,ENCRYPTED" in value:
        raise ValueError("must be an unencrypted private key (haproxy cannot ask for a passphrase)")
    if not _KEY_RE.search(value):
        raise ValueError("must contain a PEM private key (-----BEGIN PRIVATE KEY----- ... -----END PRIVATE KEY-----)")
    pem.private_key_public_part(value)


# The checks above as patterns: printable ASCII and line breaks only (so a
# character is a byte and maxLength is the byte limit), a body of base64 and
# white space, and no other key kind.
_PEM_CHAR = r"[ -~\t\r\n]"
_PEM_BODY = r"[A-Za-z0-9+/= \t\r\n]+"
_CERT_PATTERN = (
    rf"^(?!{_PEM_CHAR}*-----BEGIN [A-Z ]*PRIVATE KEY-----){_PEM_CHAR}*"
    rf"-----BEGIN CERTIFICATE-----{_PEM_BODY}-----END CERTIFICATE-----{_PEM_CHAR}*$"
)
_KEY_PATTERN = (
    rf"^(?!{_PEM_CHAR}*(?:ENCRYPTED PRIVATE KEY|Proc-Type: 4,ENCRYPTED)){_PEM_CHAR}*"
    "(?:"
    + "|".join(
        rf"-----BEGIN {kind}PRIVATE KEY-----{_PEM_BODY}-----END {kind}PRIVATE KEY-----" for kind in ("", "RSA ", "EC ")
    )
    + rf"){_PEM_CHAR}*$"
)
# What the patterns cannot say, the descriptions do: the blocks must decode.
PemCertificate = text_type(
    _check_certificate,
    {
        "maxLength": MAX_PEM_BYTES,
        "pattern": _CERT_PATTERN,
        "description": "PEM; every CERTIFICATE block an X.509 certificate, the server's first",
    },
)
PemPrivateKey = text_type(
    _check_private_key,
    {
        "maxLength": MAX_PEM_BYTES,
        "pattern": _KEY_PATTERN,
        "writeOnly": True,
        "description": "PEM; one private key of the first certificate: "
        f"RSA of {pem.MIN_RSA_BITS} to {pem.MAX_RSA_BITS} bits or EC of at least {pem.MIN_EC_BITS} bits",
    },
)

_CRL_RE = re.compile(rf"-----BEGIN X509 CRL-----{_B64_BODY}-----END X509 CRL-----")


def _check_crl(value: str) -> None:
    _check_pem_text(value)
    blocks = _CRL_RE.findall(value)
    if not blocks:
        raise ValueError("must contain a PEM certificate revocation list (-----BEGIN X509 CRL----- ...)")
    for block in blocks:
        try:
            pem.check_crl(block)
        except ValueError:
            raise ValueError("has an X509 CRL block that does not decode") from None


PemCrlOrEmpty = text_type(
    _check_crl,
    {
        "maxLength": MAX_PEM_BYTES,
        "pattern": rf"^({_PEM_CHAR}*-----BEGIN X509 CRL-----{_PEM_BODY}-----END X509 CRL-----{_PEM_CHAR}*)?$",
        "description": "PEM; X509 CRL blocks that decode, or empty for none",
    },
    allow_empty=True,
)
