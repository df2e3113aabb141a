"""A raw rtnetlink socket, and one request at a time over it with its answers decoded.

pyroute2's `IPRoute` spends about 0.3 ms of Python on every request (its
argument processing and an asyncio loop run per call) and more to set itself
up; a converged pass makes about a dozen reads, which that made the larger
part of its cost. Here a request encoded with struct (`rtnl_requests`,
`rtnl_writes`) is written to a plain socket, and its answers handed to a
decoder (`rtnl_messages`, which reads them as pyroute2 would); a write
returns once the kernel acknowledged it.

The socket belongs to the namespace of the thread that opened it. With
`strict` the kernel filters dumps by the header fields and attributes of the
request (`NETLINK_GET_STRICT_CHK`) instead of sending everything.
"""

from __future__ import annotations

import errno
import itertools
import socket
import struct
from collections.abc import Callable

from pyroute2.netlink import NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR

from lbagent.ovnhost.errors import NetlinkError, netlink_error

NETLINK_ROUTE = 0
SOL_NETLINK = 270
NETLINK_GET_STRICT_CHK = 12
RECEIVE_BUFFER = 1 << 20
READ_SIZE = 1 << 16
HEADER = struct.Struct("=IHHII")
ERRNO = struct.Struct("=i")
# Sequence numbers of requests, unique in the process: an answer is matched to its request.
_SEQUENCE = itertools.count(1 << 20)


def open_socket(strict: bool = False) -> socket.socket:
    """A raw rtnetlink socket of the calling thread's current namespace; it stays
    bound to that namespace whatever the thread does afterwards."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE)
    except OSError as exc:
        raise NetlinkError("open socket", exc.errno or errno.EIO) from exc
    try:
        # Room for the answers of a large batch (the default buffer holds about
        # a thousand plain acknowledgements, fewer failed ones, which carry
        # their request): the kernel drops what does not fit.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        if strict:
            sock.setsockopt(SOL_NETLINK, NETLINK_GET_STRICT_CHK, 1)
        sock.bind((0, 0))
    except OSError as exc:
        sock.close()
        raise NetlinkError("bind socket", exc.errno or errno.EIO) from exc
    return sock


def request(
    sock: socket.socket,
    op: str,
    target: str,
    body: bytes,
    kind: int,
    decoder: Callable,
    dump: bool = False,
    flags: int = 0,
) -> list:
    """Send `body` (a request after its netlink header, from `rtnl_requests`) as a request of
    type `kind` (a dump with `dump`) and return its answers, each the whole netlink message
    given to `decoder`. A refusal is the typed `NetlinkError` of `op` on `target`. A write
    (`rtnl_writes`, its `flags` asking for an acknowledgement) returns once acknowledged."""
    sequence = next(_SEQUENCE) & 0xFFFFFFFF
    flags |= NLM_F_REQUEST | (NLM_F_DUMP if dump else 0)
    data = HEADER.pack(HEADER.size + len(body), kind, flags, sequence, 0) + body
    try:
        sock.send(data)
        answers: list = []
        while True:
            buf = sock.recv(READ_SIZE)
            done = _answers(buf, sequence, op, target, decoder, answers)
            if done or (not dump and answers):
                return answers
    except OSError as exc:
        raise NetlinkError(op, exc.errno or errno.EIO, target) from exc


def _answers(buf: bytes, sequence: int, op: str, target: str, decoder: Callable, into: list) -> bool:
    """Decode the answers to `sequence` in one datagram into `into`; True once the last came."""
    offset = 0
    while offset + HEADER.size <= len(buf):
        length, kind, _, seq, _ = HEADER.unpack_from(buf, offset)
        if length < HEADER.size:
            raise netlink_error(op, errno.EPROTO, target)
        if seq == sequence:
            if kind in (NLMSG_ERROR, NLMSG_DONE):
                code = -ERRNO.unpack_from(buf, offset + HEADER.size)[0] if length >= HEADER.size + 4 else 0
                if code:
                    raise netlink_error(op, code, target)
                return True
            into.append(decoder(buf[offset : offset + length]))
        offset += (length + 3) & ~3
    return False
