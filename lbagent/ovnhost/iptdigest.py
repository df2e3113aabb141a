"""A digest of an iptables table of the calling thread's namespace, straight from the kernel.

Reading a table through python-iptables builds Python objects for every rule
and match: the most expensive part of a resync pass that finds nothing to do.
The kernel hands out the whole table as one blob (the IPT_SO_GET_ENTRIES
socket option that libiptc uses too); its digest, with the per-rule packet
counters left out, changes exactly when a rule does. `converge_nat` records it
after a pass and skips the next one when nothing changed. The same goes for
the filter table, which holds UDP access lists; a namespace gets one only when
something first uses it (`present_tables` says which exist without making
one: asking the kernel for a table's entries would). The IPv6 tables
(ip6tables) are read alike, over an IPv6 socket (IP6T_SO_GET_*: the same
numbers and headers, a larger entry).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import socket
import struct
from dataclasses import dataclass
from typing import Literal

from lbagent.ovnhost.errors import IptablesError
from lbagent.support.readfile import read_small

_U16 = struct.Struct("H")

# IP6T_SO_GET_INFO and IP6T_SO_GET_ENTRIES have the same numbers, and
# struct ip6t_getinfo and ip6t_get_entries the same layout.
IPT_SO_GET_INFO = 64
IPT_SO_GET_ENTRIES = 65
TABLE_NAME_LEN = 32
GETINFO_SIZE = 84  # struct ipt_getinfo
ENTRIES_HEADER = 40  # struct ipt_get_entries: name, size, then entries aligned to 8


@dataclass(frozen=True)
class EntryLayout:
    """Where a family's table entries keep what the digest needs."""

    address_family: int
    level: int  # of the socket options
    names: str  # the /proc file listing the tables that exist
    tool: str  # for error messages
    next_offset: int  # of the entry's u16 next_offset, after its ip header, nfcache and target_offset
    volatile: slice  # comefrom (kernel bookkeeping) and the packet/byte counters (aligned to 8)


LAYOUTS = {
    4: EntryLayout(socket.AF_INET, socket.IPPROTO_IP, "ip_tables_names", "iptables", 90, slice(92, 112)),
    6: EntryLayout(socket.AF_INET6, socket.IPPROTO_IPV6, "ip6_tables_names", "ip6tables", 142, slice(144, 168)),
}
_libc = ctypes.CDLL(None, use_errno=True)


def present_tables(family: Literal[4, 6] = 4) -> set[str]:
    """The tables of this family that exist in the calling thread's namespace."""
    try:
        return set(read_small(f"/proc/thread-self/net/{LAYOUTS[family].names}").split())
    except FileNotFoundError:  # a kernel without that family's tables has none
        return set()


def nat_table_digest() -> str:
    return table_digest("nat")


def table_digest(table: str, family: Literal[4, 6] = 4) -> str:
    layout = LAYOUTS[family]
    with socket.socket(layout.address_family, socket.SOCK_RAW, socket.IPPROTO_RAW) as sock:
        info = _getsockopt(sock, layout, table, IPT_SO_GET_INFO, GETINFO_SIZE)
        size = struct.unpack_from("I", info, 80)[0]
        blob = _getsockopt(sock, layout, table, IPT_SO_GET_ENTRIES, ENTRIES_HEADER + size, size)
    # Each entry with its volatile bytes zeroed, hashed at once: a copy and an
    # update per entry were most of the cost.
    kept: list[bytes | memoryview] = [info[:80]]  # hooks and underflows: which rule each chain starts at
    entries = memoryview(blob)[ENTRIES_HEADER:]
    unpack, field = _U16.unpack_from, layout.next_offset
    cut_from, cut_to = layout.volatile.start, layout.volatile.stop
    blank = bytes(cut_to - cut_from)
    offset = 0
    while offset < size:
        next_offset = unpack(entries, offset + field)[0]
        if next_offset <= 0:
            raise IptablesError(f"{layout.tool} {table}: malformed table from the kernel")
        kept += (entries[offset : offset + cut_from], blank, entries[offset + cut_to : offset + next_offset])
        offset += next_offset
    return hashlib.sha256(b"".join(kept)).hexdigest()


def _getsockopt(
    sock: socket.socket, layout: EntryLayout, table: str, option: int, length: int, size: int | None = None
) -> bytes:
    """getsockopt with a buffer that carries the table name (and size) in, which Python's cannot."""
    buf = ctypes.create_string_buffer(length)
    name = table.encode()
    buf[: len(name)] = name  # type: ignore[call-overload]  # typeshed: a char array's slice takes bytes too
    if size is not None:
        struct.pack_into("I", buf, TABLE_NAME_LEN, size)
    buflen = ctypes.c_uint32(length)
    if _libc.getsockopt(sock.fileno(), layout.level, option, buf, ctypes.byref(buflen)) != 0:
        code = ctypes.get_errno()
        raise IptablesError(f"{layout.tool} {table}: reading the table from the kernel: {os.strerror(code)}")
    return buf.raw[: buflen.value]
