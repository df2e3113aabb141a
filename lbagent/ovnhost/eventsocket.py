"""A non-blocking netlink socket subscribed to event groups, read without waiting.

Shared by the conntrack events of a namespace (`conntrack`) and the host's
link deletions (`linkevents`): both are watched by the event loop, and a read
takes what is queued and returns. When the kernel's queue for the socket
overflows, events are lost (ENOBUFS): a read counts that in `lost` and goes on.
"""

from __future__ import annotations

import errno
import socket

# The kernel's queue of events for a socket: a burst larger than this many
# bytes is lost rather than delayed (a conntrack event is about 150 bytes,
# a link notification about 1.5 kB).
RECEIVE_BUFFER = 4 << 20
SO_RCVBUFFORCE = 33  # linux/asm-generic/socket.h; the socket module does not name it
READ_SIZE = 65536
MAX_READS = 64  # datagrams one read takes: a flood of events never holds its caller long


def raise_receive_buffer(sock: socket.socket) -> None:
    try:  # past net.core.rmem_max, which caps SO_RCVBUF (about 200 KiB by default)
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RECEIVE_BUFFER)
    except PermissionError:  # without CAP_NET_ADMIN: as much as rmem_max allows
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)


class EventSocket:
    def __init__(self, sock: socket.socket):
        self._sock = sock
        self.lost = 0  # times the kernel dropped events for want of room in the queue

    def fileno(self) -> int:
        return self._sock.fileno()

    def datagrams(self) -> list[bytes]:
        """The datagrams queued now (up to MAX_READS of them); never waits. A
        failed read raises OSError (an overflow is counted, not raised)."""
        found: list[bytes] = []
        for _ in range(MAX_READS):
            try:
                found.append(self._sock.recv(READ_SIZE))
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                self.lost += 1
        return found

    def close(self) -> None:
        self._sock.close()
