"""The plain views render.py hands to the templates: names, haproxy keywords and numbers only.

Every field is laid out by templates/haproxy/macros.j2 through the `token`
filter; nothing here knows the API's models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lbagent.haproxy.routing import RedirectView, RuleView
from lbagent.haproxy.tls import TlsBindView


@dataclass(frozen=True, slots=True)
class HaproxyConfig:
    """One load balancer's config text and its files (relative path -> content; keys among them)."""

    text: str
    files: dict[str, bytes] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ServerView:
    name: str
    address: str
    port: int
    weight: int
    send_proxy: str | None
    ssl: bool
    cookie: str | None
    backup: bool = False
    slowstart: int = 0  # seconds; 0: none
    check_port: int | None = None  # where its health checks connect on `address`; None: `port`


@dataclass(frozen=True)
class HttpCheckView:
    uri: str
    host: str  # "" sends no Host header (HTTP/1.0)
    expect: str  # "" accepts haproxy's default (2xx and 3xx)


@dataclass(frozen=True)
class HealthView:
    inter: int
    rise: int
    fall: int
    http: HttpCheckView | None


@dataclass(frozen=True)
class CookieView:
    name: str
    method: str  # haproxy's: "insert" or "prefix"
    maxlife: int | None


@dataclass(frozen=True)
class HashKeyView:
    """What `balance hash` hashes: a variable set from a log-format before a server is chosen."""

    rule: tuple[str, ...]  # the words of the rule that sets it: ("tcp-request", "content") or ("http-request",)
    variable: str
    format: str


@dataclass(frozen=True)
class BackendView:
    name: str
    mode: str
    balance: str
    hash_key: HashKeyView | None
    timeouts: tuple[tuple[str, int], ...]
    health: HealthView | None
    cookie: CookieView | None
    servers: tuple[ServerView, ...]
    drain_timeout: int | None = None  # seconds a removed or weight-0 server keeps its sessions; None: the default


@dataclass(frozen=True)
class AclView:
    cidr_lines: tuple[tuple[str, ...], ...]  # one `acl` line each; lines of one name are ORed
    reject_listed: bool  # black list: reject the listed; white list: reject the others


@dataclass(frozen=True)
class ListenerView:
    frontend: str
    mode: str
    outer: str
    outer6: str  # "": bound on `outer` alone
    port: int
    maxconn: int | None  # the listener's own cap; None: the base file's default
    tls: TlsBindView | None
    timeouts: tuple[tuple[str, int], ...]
    acl: AclView | None
    request_rate: int  # 0: none
    request_rate_per_src: int
    # (size, expire seconds, key type) when per-source rates are kept: `ipv6` keys
    # take clients of both families (IPv4 ones mapped), `ip` keys IPv4 only.
    source_table: tuple[str, int, str] | None
    forwardfor: bool
    forwarded_proto: tuple[str, int] | None  # (scheme, port) set in X-Forwarded-Proto and -Port; None: not set
    client_cert_headers: bool  # X-SSL-Client-DN and -Verify set from the client certificate
    access_log_format: str | None  # haproxy's log-format of its access lines (accesslog.log_format); None: no log
    compression: tuple[str, ...]  # content types gzip compresses; () for none
    rules: tuple[RuleView, ...]
    rule_variable: str  # names the matching rule, set by the first rule that matches
    redirect: RedirectView | None
    default_backend: str
    backends: tuple[BackendView, ...]
