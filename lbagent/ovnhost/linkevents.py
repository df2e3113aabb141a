"""The host's link deletions, as the kernel announces them (RTNLGRP_LINK).

`open_link_events` subscribes a non-blocking rtnetlink socket of the calling
thread's namespace (the agent's main thread: the host) to link notifications,
of which a socket filter lets only deletions through;
`LinkEvents.deleted` takes what is queued, never waits, and returns the names
of the links deleted (RTM_DELLINK), so its file descriptor can be watched by
the event loop. When the kernel's queue for the socket overflows, events are
lost (ENOBUFS): `deleted` counts them in `lost` and goes on; the periodic
resync finds what they would have said.
"""

from __future__ import annotations

import ctypes
import errno
import socket
import struct

from lbagent.ovnhost.errors import NetlinkError
from lbagent.ovnhost.eventsocket import EventSocket, raise_receive_buffer
from lbagent.ovnhost.rtnl_messages import LINK, Message
from lbagent.ovnhost.rtnl_socket import HEADER, NETLINK_ROUTE

RTNLGRP_LINK = 1
RTM_DELLINK = 17


def open_link_events() -> LinkEvents:
    """Subscribe to the link notifications of the calling thread's namespace."""
    try:
        sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC, NETLINK_ROUTE
        )
    except OSError as exc:
        raise NetlinkError("open link events", exc.errno or errno.EIO) from exc
    try:
        raise_receive_buffer(sock)
        _keep_deletions_only(sock)
        sock.bind((0, 1 << (RTNLGRP_LINK - 1)))
    except OSError as exc:
        sock.close()
        raise NetlinkError("subscribe to link events", exc.errno or errno.EIO) from exc
    return LinkEvents(sock)


# A socket filter (classic BPF) that drops every notification but RTM_DELLINK
# in the kernel: links come and go, change state and counters all the time
# (every port OVS adds), and each notification would wake the event loop.
_BPF = struct.Struct("=HBBI")  # struct sock_filter: code, jt, jf, k
_FILTER = b"".join(
    (
        _BPF.pack(0x28, 0, 0, 4),  # BPF_LD|BPF_H|BPF_ABS: nlmsg_type, loaded in network byte order
        _BPF.pack(0x15, 0, 1, socket.htons(RTM_DELLINK)),  # BPF_JMP|BPF_JEQ|BPF_K
        _BPF.pack(0x06, 0, 0, 0xFFFFFFFF),  # BPF_RET|BPF_K: the whole message
        _BPF.pack(0x06, 0, 0, 0),  # BPF_RET|BPF_K: nothing
    )
)
SO_ATTACH_FILTER = 26


def _keep_deletions_only(sock: socket.socket) -> None:
    program = ctypes.create_string_buffer(_FILTER)
    # struct sock_fprog: the number of instructions and a pointer to them (the kernel copies them).
    sock.setsockopt(
        socket.SOL_SOCKET, SO_ATTACH_FILTER, struct.pack("@HP", len(_FILTER) // _BPF.size, ctypes.addressof(program))
    )


class LinkEvents(EventSocket):
    def deleted(self) -> list[str]:
        """Names of the links deleted, from the notifications queued now; never waits."""
        try:
            return [name for data in self.datagrams() for name in deleted_links(data)]
        except OSError as exc:
            raise NetlinkError("read link events", exc.errno or errno.EIO) from exc


def deleted_links(data: bytes) -> list[str]:
    """The names in the RTM_DELLINK messages of one datagram (other messages skipped)."""
    names = []
    offset = 0
    while offset + HEADER.size <= len(data):
        length, kind = HEADER.unpack_from(data, offset)[:2]
        if length < HEADER.size or offset + length > len(data):
            break  # not a whole message: nothing after it can be read either
        if kind == RTM_DELLINK:
            name = Message(data[offset : offset + length], LINK).get("IFLA_IFNAME")
            if name:
                names.append(name)
        offset += (length + 3) & ~3
    return names
