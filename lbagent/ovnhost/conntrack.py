"""Conntrack events of one load balancer's namespace: the socket and the decoder.

`open_events` subscribes to the netfilter netlink groups of new and destroyed
connections (NFNLGRP_CONNTRACK_NEW, NFNLGRP_CONNTRACK_DESTROY). It must run
on a thread inside the namespace (`NamespaceExecutor.run`): a netlink socket
belongs to the namespace it was created in and keeps hearing that one after
the thread goes home. It also turns on, in that namespace only (both are
per-namespace sysctls), the byte and packet counters (`nf_conntrack_acct`)
and the start and stop timestamps (`nf_conntrack_timestamp`) that destroy
events then carry; a flow tracked before they were on has neither.

The socket is non-blocking: `ConntrackEvents.read` takes what is queued and
never waits, so its file descriptor can be watched by the event loop. When
the kernel's queue for the socket overflows, events are lost (ENOBUFS):
`read` counts them as `lost` and goes on.

`split` cuts the bytes of one read into `RawEvent`s, each with the flow's
destination (protocol, address, port) read straight from the message: a
reader skips what it does not log for about a tenth of the cost of decoding
it. `RawEvent.decode` then makes the whole `FlowEvent` with pyroute2's
`nfct_msg`. Anything else on the socket (errors, other message types) is
skipped, and bytes that are not netlink messages raise `ConntrackError`.

Every open socket pins its namespace: close it before the namespace is
deleted, or the namespace's links outlive `ip netns del`.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

from pyroute2.netlink.nfnetlink import NFNL_SUBSYS_CTNETLINK, NFNLGRP_CONNTRACK_DESTROY, NFNLGRP_CONNTRACK_NEW
from pyroute2.netlink.nfnetlink.nfctsocket import IPCTNL_MSG_CT_DELETE, IPCTNL_MSG_CT_NEW, nfct_msg

from lbagent.ovnhost.errors import HostError
from lbagent.ovnhost.eventsocket import EventSocket, raise_receive_buffer
from lbagent.ovnhost.netns import write_sysctl

NETLINK_NETFILTER = 12
GROUPS = (1 << (NFNLGRP_CONNTRACK_NEW - 1)) | (1 << (NFNLGRP_CONNTRACK_DESTROY - 1))
MSG_NEW = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW
MSG_DESTROY = (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE
SYSCTLS = {"net/netfilter/nf_conntrack_acct": "1", "net/netfilter/nf_conntrack_timestamp": "1"}
_NLMSG_HEADER = struct.Struct("=IHHII")
_NFGEN_HEADER_SIZE = 4
_NLA_HEADER = struct.Struct("=HH")
_NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER
# Attribute numbers of the path to a flow's destination (linux/netfilter/nfnetlink_conntrack.h).
CTA_TUPLE_ORIG, CTA_TUPLE_IP, CTA_TUPLE_PROTO = 1, 1, 2
CTA_IP_V4_DST, CTA_PROTO_NUM, CTA_PROTO_DST_PORT = 2, 1, 3
PROTOCOLS = {socket.IPPROTO_TCP: "tcp", socket.IPPROTO_UDP: "udp", socket.IPPROTO_ICMP: "icmp"}


class ConntrackError(HostError):
    """The conntrack event socket could not be opened or read, or sent bytes that do not decode."""


@dataclass(frozen=True)
class Tuple:
    """One direction of a flow: from src:sport to dst:dport."""

    src: str
    dst: str
    sport: int
    dport: int


@dataclass(frozen=True)
class Counters:
    packets: int
    bytes: int


@dataclass(frozen=True)
class FlowEvent:
    """A flow conntrack began (`start`) or forgot (`end`).

    `original` is the flow as the client sent it (to the VIP); `reply` as the
    answer comes back, so after DNAT `reply.src:reply.sport` is the member
    chosen. The counters and timestamps come with `end` only, and only if
    accounting and timestamps were on when the flow began.
    """

    kind: str  # "start" | "end"
    flow_id: int
    protocol: str  # "tcp", "udp", "icmp" or the protocol number
    original: Tuple
    reply: Tuple
    sent: Counters | None = None  # original direction: from the client
    received: Counters | None = None  # reply direction: to the client
    started_ns: int | None = None  # CLOCK_REALTIME nanoseconds
    stopped_ns: int | None = None

    @property
    def duration_ms(self) -> int | None:
        if self.started_ns is None or self.stopped_ns is None:
            return None
        return max(0, self.stopped_ns - self.started_ns) // 1_000_000


def open_events() -> ConntrackEvents:
    """Subscribe to new and destroyed flows of the calling thread's namespace."""
    try:
        for path, value in SYSCTLS.items():
            write_sysctl(path, value)
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, NETLINK_NETFILTER)
    except OSError as exc:
        raise ConntrackError(f"open conntrack events: {exc}") from exc
    try:
        raise_receive_buffer(sock)
        sock.bind((0, GROUPS))
        namespace = os.stat("/proc/thread-self/ns/net").st_ino
    except OSError as exc:
        sock.close()
        raise ConntrackError(f"subscribe to conntrack events: {exc}") from exc
    return ConntrackEvents(sock, namespace)


class ConntrackEvents(EventSocket):
    """An open subscription; `namespace` is the inode of the namespace it hears."""

    def __init__(self, sock: socket.socket, namespace: int):
        super().__init__(sock)
        self.namespace = namespace

    def read(self) -> list[RawEvent]:
        """The events queued now (up to MAX_READS datagrams of them); never waits."""
        try:
            return [event for data in self.datagrams() for event in split(data)]
        except OSError as exc:
            raise ConntrackError(f"read conntrack events: {exc}") from exc


@dataclass(frozen=True)
class Destination:
    """Where the client sent a flow, before any DNAT."""

    protocol: str
    address: str
    port: int


@dataclass(frozen=True)
class RawEvent:
    """One event as the kernel sent it, with its destination already read."""

    kind: str  # "start" | "end"
    destination: Destination | None  # None: not an IPv4 flow with ports (ICMP, IPv6)
    data: bytes

    def decode(self) -> FlowEvent | None:
        return _event(self.data, self.kind) if self.destination is not None else None


def split(data: bytes) -> list[RawEvent]:
    """The flow events among the netlink messages of one datagram, not decoded yet."""
    events = []
    offset = 0
    while offset + _NLMSG_HEADER.size <= len(data):
        length, msg_type, _flags, _seq, _pid = _NLMSG_HEADER.unpack_from(data, offset)
        if length < _NLMSG_HEADER.size or offset + length > len(data):
            raise ConntrackError(f"truncated netlink message: length {length} at {offset} of {len(data)}")
        if msg_type in (MSG_NEW, MSG_DESTROY):
            message = data[offset : offset + length]
            events.append(RawEvent("start" if msg_type == MSG_NEW else "end", _destination(message), message))
        offset += (length + 3) & ~3
    return events


def decode(data: bytes) -> list[FlowEvent]:
    """Every flow event of one datagram, decoded."""
    return [event for raw in split(data) if (event := raw.decode()) is not None]


def _destination(message: bytes) -> Destination | None:
    original = _attribute(message, _NLMSG_HEADER.size + _NFGEN_HEADER_SIZE, len(message), CTA_TUPLE_ORIG)
    ip = original and _attribute(message, *original, CTA_TUPLE_IP)
    proto = original and _attribute(message, *original, CTA_TUPLE_PROTO)
    address = ip and _attribute(message, *ip, CTA_IP_V4_DST)
    number = proto and _attribute(message, *proto, CTA_PROTO_NUM)
    port = proto and _attribute(message, *proto, CTA_PROTO_DST_PORT)
    if not address or not number or not port or address[1] - address[0] != 4 or port[1] - port[0] != 2:
        return None
    protocol = message[number[0]]
    return Destination(
        PROTOCOLS.get(protocol, str(protocol)),
        socket.inet_ntoa(message[address[0] : address[1]]),
        int.from_bytes(message[port[0] : port[1]], "big"),
    )


def _attribute(message: bytes, start: int, end: int, wanted: int) -> tuple[int, int] | None:
    """Where the payload of the attribute numbered `wanted` lies among the attributes in start..end."""
    while start + _NLA_HEADER.size <= end:
        length, number = _NLA_HEADER.unpack_from(message, start)
        if length < _NLA_HEADER.size or start + length > end:
            raise ConntrackError(f"truncated conntrack attribute: length {length} at {start}")
        if number & _NLA_TYPE_MASK == wanted:
            return start + _NLA_HEADER.size, start + length
        start += (length + 3) & ~3
    return None


def _event(raw: bytes, kind: str) -> FlowEvent | None:
    msg = nfct_msg(raw)
    try:
        msg.decode()
    except Exception as exc:  # pyroute2 raises whatever its parsing meets
        raise ConntrackError(f"undecodable conntrack event: {exc!r}") from exc
    original = _tuple(msg, "CTA_TUPLE_ORIG")
    reply = _tuple(msg, "CTA_TUPLE_REPLY")
    if original is None or reply is None:
        return None  # not an IPv4 flow with ports (ICMP, IPv6): nothing a listener serves
    number = msg.get_nested("CTA_TUPLE_ORIG", "CTA_TUPLE_PROTO", "CTA_PROTO_NUM")
    return FlowEvent(
        kind,
        msg.get("CTA_ID") or 0,
        PROTOCOLS.get(number, str(number)),
        original,
        reply,
        _counters(msg, "CTA_COUNTERS_ORIG"),
        _counters(msg, "CTA_COUNTERS_REPLY"),
        msg.get_nested("CTA_TIMESTAMP", "CTA_TIMESTAMP_START"),
        msg.get_nested("CTA_TIMESTAMP", "CTA_TIMESTAMP_STOP"),
    )


def _tuple(msg: nfct_msg, name: str) -> Tuple | None:
    src = msg.get_nested(name, "CTA_TUPLE_IP", "CTA_IP_V4_SRC")
    dst = msg.get_nested(name, "CTA_TUPLE_IP", "CTA_IP_V4_DST")
    sport = msg.get_nested(name, "CTA_TUPLE_PROTO", "CTA_PROTO_SRC_PORT")
    dport = msg.get_nested(name, "CTA_TUPLE_PROTO", "CTA_PROTO_DST_PORT")
    if src is None or dst is None or sport is None or dport is None:
        return None
    return Tuple(src, dst, sport, dport)


def _counters(msg: nfct_msg, name: str) -> Counters | None:
    packets = msg.get_nested(name, "CTA_COUNTERS_PACKETS")
    size = msg.get_nested(name, "CTA_COUNTERS_BYTES")
    if packets is None or size is None:
        return None
    return Counters(packets, size)
