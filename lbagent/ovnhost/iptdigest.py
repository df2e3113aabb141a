"""A digest of an iptables table of the calling thread's namespace, straight from the kernel.

Reading a table through python-iptables builds Python objects for every rule
and match: the most expensive part of a resync pass that finds nothing to do.
The kernel hands out the whole table as one blob (the IPT_SO_GET_ENTRIES
socket option that libiptc uses too); its digest, with the per-rule packet
counters left out, changes exactly when a rule does. `converge_nat` records it
after a pass and skips the next one when nothing changed. The same goes for
the filter table, which holds UDP access lists; a namespace gets one only when
something first uses it (`present_tables` says which exist without making
one: asking the kernel for a table's entries would).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import socket
import struct

from lbagent.ovnhost.errors import IptablesError

SOL_IP = 0
IPT_SO_GET_INFO = 64
IPT_SO_GET_ENTRIES = 65
TABLE_NAME_LEN = 32
GETINFO_SIZE = 84  # struct ipt_getinfo
ENTRIES_HEADER = 40  # struct ipt_get_entries: name, size, then entries aligned to 8
NEXT_OFFSET = 90  # struct ipt_entry: u16 next_offset after ipt_ip (84), nfcache, target_offset
VOLATILE = slice(92, 112)  # comefrom (kernel bookkeeping) and the packet/byte counters
_libc = ctypes.CDLL(None, use_errno=True)


def present_tables() -> set[str]:
    """The iptables tables that exist in the calling thread's namespace."""
    with open("/proc/thread-self/net/ip_tables_names") as names:
        return set(names.read().split())


def nat_table_digest() -> str:
    return table_digest("nat")


def table_digest(table: str) -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW) as sock:
        info = _getsockopt(sock, table, IPT_SO_GET_INFO, GETINFO_SIZE)
        size = struct.unpack_from("I", info, 80)[0]
        blob = _getsockopt(sock, table, IPT_SO_GET_ENTRIES, ENTRIES_HEADER + size, size)
    digest = hashlib.sha256(info[:80])  # hooks and underflows: which rule each chain starts at
    entries = memoryview(blob)[ENTRIES_HEADER:]
    offset = 0
    while offset < size:
        next_offset = struct.unpack_from("H", entries, offset + NEXT_OFFSET)[0]
        if next_offset <= 0:
            raise IptablesError(f"iptables {table}: malformed table from the kernel")
        entry = bytearray(entries[offset : offset + next_offset])
        entry[VOLATILE] = bytes(VOLATILE.stop - VOLATILE.start)
        digest.update(entry)
        offset += next_offset
    return digest.hexdigest()


def _getsockopt(sock: socket.socket, table: str, option: int, length: int, size: int | None = None) -> bytes:
    """getsockopt with a buffer that carries the table name (and size) in, which Python's cannot."""
    buf = ctypes.create_string_buffer(length)
    name = table.encode()
    buf[: len(name)] = name  # type: ignore[call-overload]  # typeshed: a char array's slice takes bytes too
    if size is not None:
        struct.pack_into("I", buf, TABLE_NAME_LEN, size)
    buflen = ctypes.c_uint32(length)
    if _libc.getsockopt(sock.fileno(), SOL_IP, option, buf, ctypes.byref(buflen)) != 0:
        code = ctypes.get_errno()
        raise IptablesError(f"iptables {table}: reading the table from the kernel: {os.strerror(code)}")
    return buf.raw[: buflen.value]
