"""haproxy configuration text from the desired state: the base file and one file per load balancer.

This module decides what haproxy is told (names, keywords, numbers) and
hands plain views to the templates in `templates/haproxy/`, which only lay
them out. Values are validated upstream; every one of them still goes through
the templates' `token` filter, which raises RenderError rather than write a
line haproxy would read differently.

Only tcp and http listeners get a frontend/backend pair: udp is balanced by
the kernel in the namespace, https comes in a later milestone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lbagent.haproxy.errors import RenderError
from lbagent.haproxy.files import HaproxyPaths
from lbagent.haproxy.templates import environment
from lbagent.members import Member

# api.md timeouts a listener leaves unset (seconds), as in cloudpods.
DEFAULT_TIMEOUTS = {"client_request": 10, "client_idle": 90, "backend_connect": 5, "backend_idle": 90, "check": 5}
# Old workers serve their established connections at most this long after a
# reload: long enough for ordinary sessions, short enough that a burst of
# reloads does not leave a crowd of old workers holding memory.
HARD_STOP_AFTER = 1800

MODES = {"tcp": "tcp", "http": "http"}  # https: later milestone; udp: kernel
BALANCE = {"rr": "roundrobin", "wrr": "roundrobin", "wlc": "leastconn", "sch": "source", "tch": "source"}
SEND_PROXY = {"off": None, "v1": "send-proxy", "v2": "send-proxy-v2",
              "v2-ssl": "send-proxy-v2-ssl", "v2-ssl-cn": "send-proxy-v2-ssl-cn"}
_BLANK_RUNS = re.compile(r"\n{3,}")
HTTP_CODE_CLASSES = {"http_2xx": 2, "http_3xx": 3, "http_4xx": 4, "http_5xx": 5}


# ':' cannot occur in an id, so "<lb>:<listener>" names one listener only
# (with '_' a load balancer "a_b" + listener "c" would meet "a" + "b_c").
def frontend_name(lb_id: str, listener_id: str) -> str:
    return f"fe:{lb_id}:{listener_id}"


def backend_name(lb_id: str, listener_id: str) -> str:
    return f"be:{lb_id}:{listener_id}"


def server_name(member_key: str) -> str:
    # Pod members are keyed "<group>/<pod>"; '/' is not allowed in a server name.
    return member_key.replace("/", ".")


@dataclass(frozen=True)
class ServerView:
    name: str
    address: str
    port: int
    weight: int
    send_proxy: str | None
    ssl: bool


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
class ListenerView:
    frontend: str
    backend: str
    mode: str
    outer: str
    port: int
    balance: str
    forwardfor: bool
    frontend_timeouts: tuple[tuple[str, int], ...]
    backend_timeouts: tuple[tuple[str, int], ...]
    health: HealthView | None
    servers: tuple[ServerView, ...]


def render_base(run_dir: Path, prometheus_listen: str = "") -> str:
    paths = HaproxyPaths(Path(run_dir))
    return _render(
        "base.cfg.j2",
        stats_socket=str(paths.stats_sock),
        hard_stop_after=HARD_STOP_AFTER,
        timeouts=DEFAULT_TIMEOUTS,
        prometheus_listen=prometheus_listen,
    )


def render_loadbalancer(lb, outer: str, members: dict[str, list[Member]], *, inner: str) -> str:
    """One load balancer's file: it binds `outer:<listener port>`, its servers are `inner:<mapped port>`.

    `members` maps backend group id to the group's resolved members. A disabled
    load balancer renders to its header alone (nothing bound, nothing checked).
    """
    listeners = []
    if _value(lb.status) == "enabled":
        listeners = [
            _listener_view(lb.id, listener, outer, inner, members.get(listener.backend_group_id, []))
            for listener in lb.listeners
            if _value(listener.status) == "enabled" and _value(listener.listener_type) in MODES
        ]
    return _render("loadbalancer.cfg.j2", lb_id=lb.id, listeners=listeners)


def _render(template: str, **context) -> str:
    text = environment().get_template(template).render(**context)
    # Macros leave blank lines where optional parts are absent; one blank line
    # between sections and one final newline keep the files diff-friendly.
    return _BLANK_RUNS.sub("\n\n", text).strip("\n") + "\n"


def _value(field) -> str:
    """A model field as plain text, whether the model keeps it as a str or a str enum."""
    return getattr(field, "value", field)


def _lookup(table: dict, key: str, what: str):
    try:
        return table[key]
    except KeyError:
        raise RenderError(f"unsupported {what}: {key!r}") from None


def _listener_view(lb_id: str, listener, outer: str, inner: str, members: list[Member]) -> ListenerView:
    mode = MODES[_value(listener.listener_type)]
    scheduler = _value(listener.scheduler)
    frontend_timeouts, backend_timeouts = _timeouts(listener.timeouts, mode)
    health = _health(listener.health_check)
    if health is not None:
        backend_timeouts += (("check", listener.health_check.timeout),)
    return ListenerView(
        frontend=frontend_name(lb_id, listener.id),
        backend=backend_name(lb_id, listener.id),
        mode=mode,
        outer=outer,
        port=listener.listener_port,
        balance=_lookup(BALANCE, scheduler, "scheduler"),
        forwardfor=mode == "http" and bool(listener.x_forwarded_for),
        frontend_timeouts=frontend_timeouts,
        backend_timeouts=backend_timeouts,
        health=health,
        servers=_servers(members, inner, scheduler, _value(listener.send_proxy), use_ssl=mode == "http"),
    )


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
    kind = _value(check.type)
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


def _servers(members: list[Member], inner: str, scheduler: str, listener_proxy: str, use_ssl: bool):
    listener_keyword = _lookup(SEND_PROXY, listener_proxy, "send_proxy")
    servers = []
    seen = set()
    for member in members:
        name = server_name(member.key)
        if name in seen:
            # haproxy would refuse the whole directory, not just this load balancer.
            raise RenderError(f"two members named {name!r} in one backend")
        seen.add(name)
        servers.append(ServerView(
            name=name,
            address=inner,
            port=member.mapped_port,
            weight=_weight(member.weight, scheduler),
            send_proxy=listener_keyword or _lookup(SEND_PROXY, member.send_proxy, "send_proxy"),
            ssl=use_ssl and member.ssl,
        ))
    return tuple(servers)


def _weight(weight: int, scheduler: str) -> int:
    # As in LVS, plain rr ignores weights except that 0 still drains the server;
    # the weighted and hashing schedulers honour them.
    if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= 256:
        raise RenderError(f"weight must be 0-256, not {weight!r}")
    if scheduler == "rr":
        return min(weight, 1)
    return weight
