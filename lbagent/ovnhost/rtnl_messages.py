"""The rtnetlink answers a pass reads (links, addresses, routes), decoded on demand.

pyroute2's message classes decode every attribute of an answer into objects
before anything is read; a converged pass reads a handful of fields of a
dozen answers and spent a fifth of its time there. `Message` keeps an
answer's header fields and the raw bytes of its attributes, and decodes an
attribute when it is asked for, under pyroute2's name for it; `get` and
`[...]` answer as a pyroute2 message would for the fields listed here (and
None, or KeyError, for any other).
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NLMSG_HEADER_SIZE = 16
_ATTRIBUTE = struct.Struct("=HH")
_NUMBER = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
_U32 = struct.Struct("=I")


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


def _u32(raw: bytes) -> int:
    return _U32.unpack_from(raw)[0]


def _mac(raw: bytes) -> str:
    return ":".join(f"{byte:02x}" for byte in raw)


def _ip(raw: bytes) -> str:
    """An address of either family: the kernel sends 4 bytes for IPv4, 16 for IPv6."""
    if len(raw) >= 16:
        return socket.inet_ntop(socket.AF_INET6, raw[:16])
    return socket.inet_ntoa(raw[:4])


def _attributes(data: bytes, start: int, end: int) -> dict[int, bytes]:
    """Attribute number -> its payload (the first of a number), in data[start:end]."""
    found: dict[int, bytes] = {}
    while start + _ATTRIBUTE.size <= end:
        length, number = _ATTRIBUTE.unpack_from(data, start)
        if length < _ATTRIBUTE.size or start + length > end:
            break  # a truncated attribute ends the list, as the kernel's own parser does
        found.setdefault(number & _NUMBER, data[start + _ATTRIBUTE.size : start + length])
        start += (length + 3) & ~3
    return found


_CONF_OF_FAMILY: dict[int, int] = {socket.AF_INET: 1, socket.AF_INET6: 2}  # IFLA_INET_CONF, IFLA_INET6_CONF


def _af_spec(raw: bytes) -> dict[int, tuple[int, ...]]:
    """A link's per-family settings (the net.ipv4/ipv6.conf.<link> sysctls), as arrays by family."""
    found = {}
    for family, payload in _attributes(raw, 0, len(raw)).items():
        conf = _attributes(payload, 0, len(payload)).get(_CONF_OF_FAMILY.get(family, -1))
        if conf is not None:
            found[family] = struct.unpack_from(f"={len(conf) // 4}i", conf)
    return found


def _nested(names: dict[str, tuple[int, Callable[[bytes], Any]]]) -> Callable[[bytes], dict]:
    def decode(raw: bytes) -> dict:
        inner = _attributes(raw, 0, len(raw))
        return {name: convert(inner[number]) for name, (number, convert) in names.items() if number in inner}

    return decode


@dataclass(frozen=True)
class Kind:
    """One message type: its fixed header after the netlink header, and the attributes read of it."""

    header: struct.Struct
    fields: tuple[str, ...]
    attributes: dict[str, tuple[int, Callable[[bytes], Any]]]


LINK = Kind(
    struct.Struct("=BxHiII"),
    ("family", "ifi_type", "index", "flags", "change"),
    {
        "IFLA_ADDRESS": (1, _mac),
        "IFLA_IFNAME": (3, _text),
        "IFLA_MTU": (4, _u32),
        "IFLA_LINK": (5, _u32),
        "IFLA_LINKINFO": (18, _nested({"IFLA_INFO_KIND": (1, _text)})),
        "IFLA_IFALIAS": (20, _text),
        "IFLA_AF_SPEC": (26, _af_spec),
    },
)
ADDRESS = Kind(
    struct.Struct("=BBBBI"),
    ("family", "prefixlen", "flags", "scope", "index"),
    {
        "IFA_ADDRESS": (1, _ip),
        "IFA_LOCAL": (2, _ip),
        "IFA_BROADCAST": (4, _ip),
        "IFA_FLAGS": (8, _u32),
    },
)
_RTMSG = struct.Struct("=BBBBBBBBI")  # struct rtmsg; struct fib_rule_hdr has the same layout
ROUTE = Kind(
    _RTMSG,
    ("family", "dst_len", "src_len", "tos", "table", "proto", "scope", "type", "flags"),
    {
        "RTA_DST": (1, _ip),
        "RTA_OIF": (4, _u32),
        "RTA_GATEWAY": (5, _ip),
        "RTA_PRIORITY": (6, _u32),
        "RTA_PREFSRC": (7, _ip),
        "RTA_TABLE": (15, _u32),
    },
)
RULE = Kind(
    _RTMSG,
    ("family", "dst_len", "src_len", "tos", "table", "res1", "res2", "action", "flags"),
    {"FRA_SRC": (2, _ip), "FRA_PRIORITY": (6, _u32), "FRA_TABLE": (15, _u32)},
)


class Message:
    """One answer of `kind` (the whole netlink message in `data`)."""

    __slots__ = ("_kind", "_fields", "_raw")

    def __init__(self, data: bytes, kind: Kind):
        self._kind = kind
        self._fields = dict(zip(kind.fields, kind.header.unpack_from(data, NLMSG_HEADER_SIZE), strict=True))
        self._raw = _attributes(data, NLMSG_HEADER_SIZE + kind.header.size, len(data))

    def __getitem__(self, name: str) -> Any:
        return self._fields[name]

    def get(self, name: str, default: Any = None) -> Any:
        if name in self._fields:
            return self._fields[name]
        number, convert = self._kind.attributes.get(name, (-1, None))
        raw = self._raw.get(number)
        return default if raw is None or convert is None else convert(raw)


def decoder(kind: Kind) -> Callable[[bytes], Message]:
    return lambda data: Message(data, kind)
