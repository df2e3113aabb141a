"""The conntrack event decoder (lbagent.ovnhost.conntrack): events the kernel sent, captured from a
namespace where 198.18.200.1:4444 sent one datagram to 198.18.200.1:5000, DNAT'ed to port 5001,
which answered (accounting and timestamps on); and messages built with pyroute2's classes."""

from __future__ import annotations

import errno
import socket

import pytest
from pyroute2.netlink.nfnetlink.nfctsocket import nfct_msg

from lbagent.ovnhost.conntrack import (
    MSG_DESTROY,
    MSG_NEW,
    ConntrackError,
    ConntrackEvents,
    Counters,
    Destination,
    Tuple,
    decode,
    split,
)

# Split for the line length; each is one datagram as read from the socket.
CAPTURED_NEW = bytes.fromhex(
    "a000000000010006000000000000000002000000340001801400018008000100c612c80108000200c612c8011c0002800500"
    "01001100000006000200115c00000600030013880000340002801400018008000100c612c80108000200c612c8011c000280"
    "0500010011000000060002001389000006000300115c000008000c00f0ddff1f08000300000001a808000700000000020c00"
    "1b0018ee22d0959f33ab"
)
CAPTURED_DESTROY = bytes.fromhex(
    "ec00000002010000000000000000000002000000340001801400018008000100c612c80108000200c612c8011c0002800500"
    "01001100000006000200115c00000600030013880000340002801400018008000100c612c80108000200c612c8011c000280"
    "0500010011000000060002001389000006000300115c000008000c00f0ddff1f08000300000003aa1c0009800c0001000000"
    "0000000000010c00020000000000000000211c000a800c00010000000000000000010c00020000000000000000221c001480"
    "0c00010018ee22d0959f32c50c00020018ee22d10cbc90700c001b0018ee22d7269de1a1"
)


def built(msg_type: int, protocol: int = socket.IPPROTO_UDP, ports: bool = True, **extra) -> bytes:
    def direction(src: str, dst: str, sport: int, dport: int) -> dict:
        proto = [["CTA_PROTO_NUM", protocol]]
        if ports:
            proto += [["CTA_PROTO_SRC_PORT", sport], ["CTA_PROTO_DST_PORT", dport]]
        ip = [["CTA_IP_V4_SRC", src], ["CTA_IP_V4_DST", dst]]
        return {"attrs": [["CTA_TUPLE_IP", {"attrs": ip}], ["CTA_TUPLE_PROTO", {"attrs": proto}]]}

    msg = nfct_msg()
    msg["header"]["type"] = msg_type
    msg["nfgen_family"] = socket.AF_INET
    msg["attrs"] = [
        ["CTA_TUPLE_ORIG", direction("198.18.1.5", "198.18.0.10", 40000, 53)],
        ["CTA_TUPLE_REPLY", direction("198.18.2.7", "169.254.0.1", 5353, 40000)],
        ["CTA_ID", 7],
        *([name, value] for name, value in extra.items()),
    ]
    msg.encode()
    return bytes(msg.data)


def test_a_captured_new_flow_is_a_start_with_both_tuples_and_no_counts():
    [event] = decode(CAPTURED_NEW)
    assert (event.kind, event.protocol) == ("start", "udp")
    assert event.original == Tuple("198.18.200.1", "198.18.200.1", 4444, 5000)
    assert event.reply == Tuple("198.18.200.1", "198.18.200.1", 5001, 4444)  # the member DNAT chose
    assert event.sent is None and event.received is None and event.duration_ms is None


def test_a_captured_destroyed_flow_is_an_end_with_counts_each_way_and_its_duration():
    [start] = decode(CAPTURED_NEW)
    [event] = decode(CAPTURED_DESTROY)
    assert (event.kind, event.flow_id, event.original) == ("end", start.flow_id, start.original)
    assert event.sent == Counters(1, 33)  # 5 bytes of payload, 28 of headers
    assert event.received == Counters(1, 34)
    assert 1900 <= event.duration_ms <= 2100  # the flow's 2 s timeout


def test_several_messages_in_one_datagram_are_all_read():
    events = decode(built(MSG_NEW) + built(MSG_DESTROY))
    assert [e.kind for e in events] == ["start", "end"]
    assert events[0].reply == Tuple("198.18.2.7", "169.254.0.1", 5353, 40000)


def test_counters_and_timestamps_without_accounting_are_missing_not_zero():
    counters = {"attrs": [["CTA_COUNTERS_PACKETS", 3], ["CTA_COUNTERS_BYTES", 300]]}
    [event] = decode(built(MSG_DESTROY, CTA_COUNTERS_ORIG=counters))
    assert event.sent == Counters(3, 300) and event.received is None and event.duration_ms is None


def test_flows_without_ports_and_other_messages_are_skipped():
    other = built(MSG_NEW)
    other = other[:4] + (0x0103).to_bytes(2, "little") + other[6:]  # IPCTNL_MSG_CT_GET_CTRZERO
    assert decode(built(MSG_NEW, socket.IPPROTO_ICMP, ports=False) + other) == []


def test_tcp_flows_are_decoded_with_their_protocol():
    assert decode(built(MSG_NEW, socket.IPPROTO_TCP))[0].protocol == "tcp"


@pytest.mark.parametrize("cut", [20, 60])
def test_a_truncated_message_is_a_typed_error(cut):
    with pytest.raises(ConntrackError):
        decode(built(MSG_NEW)[:cut])


class Socket:
    def __init__(self, reads: list):
        self.reads = reads

    def recv(self, size: int) -> bytes:
        if not self.reads:
            raise BlockingIOError()
        item = self.reads.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def test_the_destination_is_read_without_decoding_the_event():
    [start, icmp] = split(CAPTURED_NEW + built(MSG_NEW, socket.IPPROTO_ICMP, ports=False))
    assert start.destination == Destination("udp", "198.18.200.1", 5000)
    assert icmp.destination is None and icmp.decode() is None
    assert split(built(MSG_DESTROY, socket.IPPROTO_TCP))[0].destination == Destination("tcp", "198.18.0.10", 53)


def test_reading_takes_what_is_queued_and_counts_overflows():
    events = ConntrackEvents(Socket([built(MSG_NEW), OSError(errno.ENOBUFS, "full"), built(MSG_DESTROY)]), 1)
    assert [e.kind for e in events.read()] == ["start", "end"]
    assert events.lost == 1
    assert events.read() == []


def test_a_failing_socket_is_a_typed_error():
    with pytest.raises(ConntrackError):
        ConntrackEvents(Socket([OSError(errno.EBADF, "gone")]), 1).read()
