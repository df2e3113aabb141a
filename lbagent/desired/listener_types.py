"""The four listener types and what each one means, in one place.

Which transport a type listens on (listener ports collide per transport:
http and https listen on TCP too), whether haproxy serves it and in which
mode (UDP is balanced by the kernel in the namespace), its URL scheme, and
which listener options a type may carry. Validation, the namespace plan and
the haproxy renderer all read this table instead of keeping their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ListenerType = Literal["tcp", "udp", "http", "https"]


@dataclass(frozen=True)
class ListenerKind:
    name: str
    transport: Literal["tcp", "udp"]
    haproxy_mode: Literal["tcp", "http"] | None  # None: balanced by the kernel, no haproxy hop
    scheme: str = ""  # the URL scheme of an HTTP listener

    @property
    def is_http(self) -> bool:
        return self.haproxy_mode == "http"

    @property
    def through_haproxy(self) -> bool:
        return self.haproxy_mode is not None

    @property
    def terminates_tls(self) -> bool:
        return self.scheme == "https"


KINDS: dict[str, ListenerKind] = {
    "tcp": ListenerKind("tcp", "tcp", "tcp"),
    "udp": ListenerKind("udp", "udp", None),
    "http": ListenerKind("http", "tcp", "http", "http"),
    "https": ListenerKind("https", "tcp", "http", "https"),
}

HTTP_TYPES = frozenset(name for name, kind in KINDS.items() if kind.is_http)
HAPROXY_TYPES = frozenset(name for name, kind in KINDS.items() if kind.through_haproxy)
UDP_TYPES = frozenset(name for name, kind in KINDS.items() if kind.transport == "udp")
HTTPS_TYPES = frozenset(name for name, kind in KINDS.items() if kind.terminates_tls)

# Listener options that only some types may carry, by path below the listener
# ("timeouts.client_request" is the field client_request of the listener's
# timeouts). An option not listed here applies to every type. An option is set
# when its value differs from its default; a body that sets one on another type
# is refused with a 400 naming the option's path. The table in docs/api.md
# ("Options by listener type") says the same and a unit test compares the two.
OPTION_TYPES: dict[str, frozenset[str]] = {
    # haproxy runs http checks (option httpchk) in tcp and http mode alike;
    # the udp prober sends udp_request and looks for udp_expect, nothing else.
    "health_check.uri": HAPROXY_TYPES,
    "health_check.domain": HAPROXY_TYPES,
    "health_check.http_code": HAPROXY_TYPES,
    "health_check.udp_request": UDP_TYPES,
    "health_check.udp_expect": UDP_TYPES,
    "sticky_session": HTTP_TYPES,
    # haproxy's maxconn; udp flows are the kernel's.
    "connection_limit": HAPROXY_TYPES,
    "x_forwarded_for": HTTP_TYPES,
    "x_forwarded_proto": HTTP_TYPES,
    "gzip": HTTP_TYPES,
    "http2": HTTPS_TYPES,
    # A PROXY header is written by haproxy on a TCP connection.
    "send_proxy": HAPROXY_TYPES,
    # haproxy timeouts; udp flows live as long as conntrack keeps them.
    "timeouts.client_request": HTTP_TYPES,
    "timeouts.client_idle": HAPROXY_TYPES,
    "timeouts.backend_connect": HAPROXY_TYPES,
    "timeouts.backend_idle": HAPROXY_TYPES,
    "http_request_rate": HTTP_TYPES,
    "http_request_rate_per_src": HTTP_TYPES,
    "redirect": HTTP_TYPES,
    "certificates": HTTPS_TYPES,
    "tls_cipher_policy": HTTPS_TYPES,
    "client_certificate": HTTPS_TYPES,
    # access_log and access_log_rate apply to every type: haproxy writes the
    # lines of tcp, http and https, conntrack's events those of udp and tcp (workers.connlog).
    "rules": HTTP_TYPES,
}


def listener_kind(listener_type: str) -> ListenerKind:
    return KINDS[listener_type]
