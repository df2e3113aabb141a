"""The rtnetlink read requests of a pass, encoded with struct, and the pieces
every request is made of (`rtnl_batch` builds its writes from them).

A converged pass asks the kernel a dozen questions (a link by name, a link's
addresses, a table's routes, the route to an address). pyroute2's message
classes took 110-160 µs to encode each on the development VM and left eight
or nine objects of cyclic garbage behind, which the collector then walked:
together about as much as the rest of the pass's Python. Each function here
returns the request's body (what follows the netlink header, which
`rtnl_socket.request` adds), the same bytes pyroute2 would send.
"""

from __future__ import annotations

import socket
import struct

from lbagent.ovnhost.families import family_of, host_prefixlen

_ATTRIBUTE = struct.Struct("=HH")
IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
IFADDRMSG = struct.Struct("=BBBBI")  # family, prefixlen, flags, scope, index
RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst_len, src_len, tos, table, protocol, scope, type, flags
U32 = struct.Struct("=I")
IFLA_IFNAME = 3
IFLA_EXT_MASK = 29
# Leaves IPv6's counters out of a link's answer (a third of its bytes); the
# link's own IFLA_STATS and IFLA_STATS64 stay in it.
RTEXT_FILTER_SKIP_STATS = 1 << 3
RTA_DST, RTA_SRC, RTA_OIF, RTA_TABLE = 1, 2, 4, 15
RT_TABLE_COMPAT = 252  # rtm_table of a table whose id does not fit in a byte (RTA_TABLE has it)


def attribute(number: int, payload: bytes) -> bytes:
    length = _ATTRIBUTE.size + len(payload)
    return _ATTRIBUTE.pack(length, number) + payload + b"\0" * (-length % 4)


def text(value: str) -> bytes:
    """A string attribute's payload, as the kernel wants it: NUL-terminated."""
    return value.encode() + b"\0"


def address(text: str) -> bytes:
    return socket.inet_pton(family_of(text), text)


def get_link(name: str) -> bytes:
    """RTM_GETLINK of one link by name."""
    return IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + attribute(IFLA_IFNAME, text(name))


def get_link_settings(name: str) -> bytes:
    """RTM_GETLINK of one link by name, without IPv6's counters."""
    return get_link(name) + attribute(IFLA_EXT_MASK, U32.pack(RTEXT_FILTER_SKIP_STATS))


def dump_links() -> bytes:
    """RTM_GETLINK dump of every link of the namespace, without IPv6's counters."""
    return IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + attribute(IFLA_EXT_MASK, U32.pack(RTEXT_FILTER_SKIP_STATS))


def get_route(dst: str, src: str | None = None) -> bytes:
    """RTM_GETROUTE: the route the kernel would use to `dst` (from `src`)."""
    family = family_of(dst)
    bits = host_prefixlen(family)
    header = RTMSG.pack(family, bits, bits if src else 0, 0, 0, 0, 0, 0, 0)
    return header + attribute(RTA_DST, address(dst)) + (attribute(RTA_SRC, address(src)) if src else b"")


def dump_addresses(index: int, family: int) -> bytes:
    """RTM_GETADDR dump of one link's addresses of `family` (filtered by the kernel)."""
    return IFADDRMSG.pack(family, 0, 0, 0, index)


def dump_rules(family: int) -> bytes:
    """RTM_GETRULE dump of one family's policy rules."""
    return RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)  # struct fib_rule_hdr has rtmsg's layout


def dump_routes(table: int, oif: int | None, family: int) -> bytes:
    """RTM_GETROUTE dump of one table (out of `oif`, if given), filtered by the kernel."""
    header = RTMSG.pack(family, 0, 0, 0, table if table <= 255 else RT_TABLE_COMPAT, 0, 0, 0, 0)
    oif_attribute = attribute(RTA_OIF, U32.pack(oif)) if oif is not None else b""
    return header + attribute(RTA_TABLE, U32.pack(table)) + oif_attribute
