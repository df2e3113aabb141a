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

# Listener options that only some types may carry (an option not listed here
# applies to every type). A body that sets one on another type is refused
# with a 400 naming the option's path.
OPTION_TYPES: dict[str, frozenset[str]] = {
    "sticky_session": HTTP_TYPES,
    "redirect": HTTP_TYPES,
    "rules": HTTP_TYPES,
    "http2": frozenset({"https"}),
    "certificates": frozenset({"https"}),
}


def listener_kind(listener_type: str) -> ListenerKind:
    return KINDS[listener_type]
