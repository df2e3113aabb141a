"""haproxy configuration text from the desired state: the base file and one file per load balancer.

This module decides what haproxy is told (names, keywords, numbers) and
hands plain views to the templates in `templates/haproxy/`, which only lay
them out. Values are validated upstream; every one of them still goes through
the templates' `token` filter, which raises RenderError rather than write a
line haproxy would read differently.

tcp, http and https listeners get a frontend and a backend (plus one backend
per rule that routes to a group); udp is balanced by the kernel in the
namespace. Routing and redirects live in `routing`, TLS in `tls`, the plain
views handed to the templates in `views`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from lbagent.desired.fields import DEFAULT_DRAIN_TIMEOUT, family_of
from lbagent.desired.memberoptions import options_of
from lbagent.desired.members import Member
from lbagent.desired.model import Listener
from lbagent.haproxy.accesslog import log_format, log_target
from lbagent.haproxy.capacity import DEFAULT_LISTENER_MAXCONN, PROMETHEUS_MAXCONN, Capacity
from lbagent.haproxy.errors import RenderError
from lbagent.haproxy.files import HaproxyPaths
from lbagent.haproxy.routing import RULE_VARIABLE, redirect_view, rule_views
from lbagent.haproxy.settings import Privileges
from lbagent.haproxy.templating import environment
from lbagent.haproxy.tls import certificate_files, client_cert_files, tls_bind
from lbagent.haproxy.views import (
    AclView,
    BackendView,
    CookieView,
    HaproxyConfig,
    HashKeyView,
    HealthView,
    HttpCheckView,
    ListenerView,
    ServerView,
)

# api.md timeouts a listener leaves unset (seconds), as in cloudpods.
DEFAULT_TIMEOUTS = {"client_request": 10, "client_idle": 90, "backend_connect": 5, "backend_idle": 90, "check": 5}
# Old workers serve their established connections at most this long after a
# reload: long enough for ordinary sessions, short enough that a burst of
# reloads does not leave a crowd of old workers holding memory.
HARD_STOP_AFTER = 1800

BALANCE = {"rr": "roundrobin", "wrr": "roundrobin", "wlc": "leastconn", "sch": "source", "tch": "hash"}
# tch hashes the connection's 4-tuple, so one client's connections spread over
# the members by source port (sch, `balance source`, keeps them on one). haproxy
# 2.6 hashes one sample, so a rule joins the four into a variable first.
FLOW_KEY_VARIABLE = "txn.lbagent_flow"
FLOW_KEY_FORMAT = "%[src]:%[src_port]:%[dst]:%[dst_port]"
FLOW_KEY_RULE = {"tcp": ("tcp-request", "content"), "http": ("http-request",)}
SEND_PROXY = {
    "off": None,
    "v1": "send-proxy",
    "v2": "send-proxy-v2",
    "v2-ssl": "send-proxy-v2-ssl",
    "v2-ssl-cn": "send-proxy-v2-ssl-cn",
}
# Sticky sessions: the agent's own cookie, or a prefix on the backend's cookie
# (haproxy strips it again before the request reaches the backend).
COOKIE_METHODS = {"insert": "insert", "server": "prefix"}
# What gzip compresses: text, not already-compressed images or archives.
COMPRESSIBLE_TYPES = (
    "text/html",
    "text/plain",
    "text/css",
    "text/xml",
    "text/javascript",
    "application/javascript",
    "application/json",
    "application/xml",
)
ACL_CIDRS_PER_LINE = 16  # haproxy reads at most 64 words a line
# Per-source request rates are kept this long after a source's last request
# (well over the 1 s they measure), for at most this many sources per listener.
SOURCE_TABLE_EXPIRE = 10
SOURCE_TABLE_SIZE = "100k"
_BLANK_RUNS = re.compile(r"\n{3,}")
HTTP_CODE_CLASSES = {"http_2xx": 2, "http_3xx": 3, "http_4xx": 4, "http_5xx": 5}


# ':' cannot occur in an id, so "<lb>:<listener>" names one listener only
# (with '_' a load balancer "a_b" + listener "c" would meet "a" + "b_c").
def frontend_name(lb_id: str, listener_id: str) -> str:
    return f"fe:{lb_id}:{listener_id}"


def backend_name(lb_id: str, listener_id: str, rule_id: str | None = None) -> str:
    name = f"be:{lb_id}:{listener_id}"
    return name if rule_id is None else f"{name}:{rule_id}"


def server_name(member_key: str) -> str:
    # Pod members are keyed "<group>/<pod>"; '/' is not allowed in a server name.
    return member_key.replace("/", ".")


def server_cookie(member_key: str) -> str:
    # Stable per member, and no backend id or address in the client's cookie.
    return hashlib.sha256(member_key.encode()).hexdigest()[:16]


def render_base(
    run_dir: Path,
    prometheus_listen: str = "",
    crt_base: Path | None = None,
    *,
    listener_maxconn: int = DEFAULT_LISTENER_MAXCONN,
    capacity: Capacity | None = None,
    privileges: Privileges | None = None,
    access_log: bool = False,
) -> str:
    """The global/defaults file; `crt_base` (default: the live certificates directory) for checks.

    `capacity` None leaves the process's connection and descriptor limits to
    haproxy; `privileges` None keeps its workers root and unjailed.
    """
    paths = HaproxyPaths(Path(run_dir))
    return _render(
        "base.cfg.j2",
        stats_socket=str(paths.stats_sock),
        crt_base=str(crt_base or paths.certs_dir),
        hard_stop_after=HARD_STOP_AFTER,
        timeouts=DEFAULT_TIMEOUTS,
        prometheus_listen=prometheus_listen,
        prometheus_maxconn=PROMETHEUS_MAXCONN,
        listener_maxconn=listener_maxconn,
        capacity=capacity,
        privileges=privileges,
        access_log_target=log_target(paths) if access_log else None,
    )


def render_config(
    lb, outer: str, members: dict[str, list[Member]], *, inner: str, outer6: str = "", inner6: str = ""
) -> HaproxyConfig:
    """One load balancer's file and files: it binds `outer:<listener port>`, its servers are `inner:<mapped port>`.

    A dual-stack load balancer binds `outer6:<listener port>` as well, and
    reaches its IPv6 members at `inner6:<mapped port>`.

    `members` maps backend group id to the group's resolved members. A disabled
    load balancer renders to its header alone (nothing bound, nothing checked).
    """
    listeners = []
    if lb.enabled:
        listeners = [listener for listener in lb.listeners if listener.enabled and listener.kind.through_haproxy]
    drains = {group.id: _drain_timeout(group) for group in lb.backend_groups}
    pair = _Pairs(outer, inner, outer6, inner6)
    views = [_listener_view(lb.id, listener, pair, members, drains) for listener in listeners]
    files: dict[str, bytes] = {}
    for listener in listeners:
        if listener.kind.terminates_tls:
            files.update(certificate_files(listener))
            files.update(client_cert_files(listener))
    return HaproxyConfig(_render("loadbalancer.cfg.j2", lb_id=lb.id, listeners=views), files)


def render_loadbalancer(
    lb, outer: str, members: dict[str, list[Member]], *, inner: str, outer6: str = "", inner6: str = ""
) -> str:
    """The text of `render_config` alone."""
    return render_config(lb, outer, members, inner=inner, outer6=outer6, inner6=inner6).text


@dataclass(frozen=True)
class _Pairs:
    """Where haproxy binds (OUTER) and reaches members (INNER), per family; "" for no IPv6."""

    outer: str
    inner: str
    outer6: str
    inner6: str

    def inner_for(self, member: Member) -> str:
        if family_of(member.address) == 4:
            return self.inner
        if not self.inner6:
            raise RenderError(f"member {member.key} is IPv6 and the load balancer has no IPv6 address")
        return self.inner6


def _render(template: str, **context) -> str:
    text = environment().get_template(template).render(**context)
    # Macros leave blank lines where optional parts are absent; one blank line
    # between sections and one final newline keep the files diff-friendly.
    return _BLANK_RUNS.sub("\n\n", text).strip("\n") + "\n"


def _lookup(table: dict, key: str, what: str):
    try:
        return table[key]
    except KeyError:
        raise RenderError(f"unsupported {what}: {key!r}") from None


def _drain_timeout(group) -> int | None:
    """The group's drain timeout for live edits to read (see live.DRAIN_COMMENT); None at the default."""
    return None if group.drain_timeout == DEFAULT_DRAIN_TIMEOUT else group.drain_timeout


def _listener_view(
    lb_id: str,
    listener,
    pair: _Pairs,
    members: dict[str, list[Member]],
    drains: dict[str, int | None],
) -> ListenerView:
    kind = listener.kind
    mode = kind.haproxy_mode
    http = kind.is_http
    frontend_timeouts, backend_timeouts = _timeouts(listener.timeouts, mode)
    health = _health(listener.health_check)
    if health is not None:
        backend_timeouts += (("check", listener.health_check.timeout),)

    cookie = _cookie(listener.sticky_session) if http else None
    balance = _lookup(BALANCE, listener.scheduler, "scheduler")
    hash_key = None
    if balance == "hash":
        hash_key = HashKeyView(rule=FLOW_KEY_RULE[mode], variable=FLOW_KEY_VARIABLE, format=FLOW_KEY_FORMAT)

    def backend(name: str, group_id: str) -> BackendView:
        return BackendView(
            name=name,
            mode=mode,
            balance=balance,
            hash_key=hash_key,
            timeouts=backend_timeouts,
            health=health,
            cookie=cookie,
            servers=_servers(members.get(group_id, []), pair, listener, cookies=cookie is not None),
            drain_timeout=drains.get(group_id),
        )

    default = backend(backend_name(lb_id, listener.id), listener.backend_group_id)
    rules = rule_views(listener.rules, lambda rule: backend_name(lb_id, listener.id, rule.id), kind.scheme)
    routed = {rule.id: rule.backend_group_id for rule in listener.rules}
    rule_backends = tuple(backend(rule.backend, routed[rule.id]) for rule in rules if rule.backend)
    per_src = listener.http_request_rate_per_src if http else 0
    return ListenerView(
        frontend=frontend_name(lb_id, listener.id),
        mode=mode,
        outer=pair.outer,
        outer6=pair.outer6,
        port=listener.listener_port,
        maxconn=_connection_limit(listener),
        tls=tls_bind(lb_id, listener) if kind.terminates_tls else None,
        timeouts=frontend_timeouts,
        acl=_acl(listener.acl),
        request_rate=listener.http_request_rate if http else 0,
        request_rate_per_src=per_src,
        source_table=(SOURCE_TABLE_SIZE, SOURCE_TABLE_EXPIRE, "ipv6" if pair.outer6 else "ip") if per_src else None,
        forwardfor=http and bool(listener.x_forwarded_for),
        forwarded_proto=(kind.scheme, listener.listener_port) if http and listener.x_forwarded_proto else None,
        client_cert_headers=kind.terminates_tls and listener.client_certificate is not None,
        access_log_format=log_format(mode, listener.access_log_rate) if listener.access_log else None,
        compression=COMPRESSIBLE_TYPES if http and listener.gzip else (),
        rules=rules,
        rule_variable=RULE_VARIABLE,
        redirect=redirect_view(listener.redirect, kind.scheme) if http and listener.redirect else None,
        default_backend=default.name,
        backends=(default, *rule_backends),
    )


def _connection_limit(listener: Listener) -> int | None:
    """The listener's own cap; None (`connection_limit` 0) takes the base file's default."""
    return listener.connection_limit or None


def _timeouts(timeouts, mode: str) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    """(frontend, backend) `timeout` directives for the values the listener sets; the rest come from defaults."""
    if timeouts is None:
        return (), ()
    frontend = [("client", timeouts.client_idle)]
    if mode == "http":  # a tcp stream has no request to time
        frontend.append(("http-request", timeouts.client_request))
    backend = [("connect", timeouts.backend_connect), ("server", timeouts.backend_idle)]
    return (
        tuple((name, seconds) for name, seconds in frontend if seconds is not None),
        tuple((name, seconds) for name, seconds in backend if seconds is not None),
    )


def _health(check) -> HealthView | None:
    if check is None:
        return None
    kind = check.type
    if kind == "tcp":
        http = None
    elif kind == "http":
        http = HttpCheckView(uri=check.uri or "/", host=check.domain, expect=_expect_status(check.http_code))
    else:
        raise RenderError(f"a {kind} health check cannot probe a tcp or http listener")
    return HealthView(inter=check.interval, rise=check.rise, fall=check.fall, http=http)


def _expect_status(http_code: str) -> str:
    """'http_2xx,http_3xx,http_5xx' -> '200-399,500-599' (adjacent classes merged)."""
    if not http_code:
        return ""
    classes = sorted({_lookup(HTTP_CODE_CLASSES, code, "http_code class") for code in http_code.split(",")})
    ranges: list[list[int]] = []
    for cls in classes:
        if ranges and ranges[-1][1] == cls - 1:
            ranges[-1][1] = cls
        else:
            ranges.append([cls, cls])
    return ",".join(f"{first}00-{last}99" for first, last in ranges)


def _cookie(sticky) -> CookieView | None:
    if sticky is None:
        return None
    method = _lookup(COOKIE_METHODS, sticky.type, "sticky_session type")
    maxlife = sticky.cookie_timeout if method == "insert" and sticky.cookie_timeout else None
    return CookieView(name=sticky.cookie, method=method, maxlife=maxlife)


def _acl(acl) -> AclView | None:
    if acl is None:
        return None
    kind = acl.type
    if kind not in ("black", "white"):
        raise RenderError(f"unsupported acl type: {kind!r}")
    if kind == "black" and not acl.cidrs:
        return None  # denies no one
    cidrs = list(acl.cidrs)
    lines = tuple(tuple(cidrs[i : i + ACL_CIDRS_PER_LINE]) for i in range(0, len(cidrs), ACL_CIDRS_PER_LINE))
    return AclView(cidr_lines=lines, reject_listed=kind == "black")


def _servers(members: list[Member], pair: _Pairs, listener, cookies: bool) -> tuple[ServerView, ...]:
    scheduler = listener.scheduler
    listener_keyword = _lookup(SEND_PROXY, listener.send_proxy, "send_proxy")
    servers = []
    seen: dict[str, set[str | None]] = {"name": set(), "cookie": set()}
    for member in members:
        name = server_name(member.key)
        cookie = server_cookie(member.key) if cookies else None
        for what, value in (("name", name), ("cookie", cookie)):
            if value is not None and value in seen[what]:
                # haproxy would refuse the whole directory, not just this load balancer.
                raise RenderError(f"two members with the {what} {value!r} in one backend")
            seen[what].add(value)
        options = options_of(member)
        servers.append(
            ServerView(
                name=name,
                address=pair.inner_for(member),
                port=member.mapped_port,
                weight=_weight(member.weight, scheduler),
                send_proxy=listener_keyword or _lookup(SEND_PROXY, member.send_proxy, "send_proxy"),
                ssl=member.ssl,  # TLS to the member, in tcp mode as in http
                cookie=cookie,
                backup=options.backup,
                slowstart=options.slow_start,
                check_port=options.mapped_check_port,
            )
        )
    return tuple(servers)


def _weight(weight: int, scheduler: str) -> int:
    # As in LVS, plain rr ignores weights except that 0 still drains the server;
    # the weighted and hashing schedulers honour them.
    if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= 256:
        raise RenderError(f"weight must be 0-256, not {weight!r}")
    if scheduler == "rr":
        return min(weight, 1)
    return weight
