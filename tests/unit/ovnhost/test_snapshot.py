"""What a resync's look keeps of the kernel's answers: everything but what moves by itself."""

import socket
import struct

from lbagent.ovnhost import snapshot


def attribute(number: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, number) + payload + b"\0" * (-length % 4)


def message(header: bytes, *attributes: bytes, sequence: int = 1) -> bytes:
    body = header + b"".join(attributes)
    return struct.pack("=IHHII", 16 + len(body), 16, 2, sequence, 0) + body


def link(mtu: int, stats: bytes, reachable_ms: int, disable_ipv6: int, sequence: int = 1, change: int = 0) -> bytes:
    ifinfomsg = struct.pack("=BxHiII", 0, 1, 7, 0x1043, change)
    inet = attribute(socket.AF_INET, attribute(1, struct.pack("=4i", 1, 0, 0, 0)))
    cacheinfo = attribute(5, struct.pack("=IIII", 65535, 100, reachable_ms, 1000))
    inet6 = attribute(
        socket.AF_INET6, attribute(1, b"\0\0\0\x80") + cacheinfo + attribute(2, struct.pack("=2i", 0, disable_ipv6))
    )
    return message(
        ifinfomsg,
        attribute(3, b"veth0\0"),
        attribute(4, struct.pack("=I", mtu)),
        attribute(7, stats),
        attribute(23, stats * 2),
        attribute(26, inet + inet6),
        attribute(20, b"mark\0"),
        sequence=sequence,
    )


def test_a_link_reads_the_same_whatever_its_counters_and_ipv6_cache_information_say():
    first = snapshot._link(link(1442, b"\1" * 8, 30000, 1, sequence=1, change=0))
    assert first == snapshot._link(link(1442, b"\2" * 8, 24312, 1, sequence=9, change=0xFFFFFFFF))
    assert first != snapshot._link(link(1400, b"\1" * 8, 30000, 1))  # its MTU
    assert first != snapshot._link(link(1442, b"\1" * 8, 30000, 0))  # IPv6 turned on
    assert b"mark" in first and b"veth0" in first


def test_a_link_without_ipv6_settings_or_with_a_truncated_attribute_is_kept_as_it_is():
    plain = message(struct.pack("=BxHiII", 0, 1, 3, 1, 0), attribute(3, b"lo\0"), attribute(26, attribute(2, b"")))
    assert snapshot._link(plain).endswith(attribute(3, b"lo\0") + attribute(26, attribute(2, b"")))
    truncated = message(struct.pack("=BxHiII", 0, 1, 3, 1, 0), attribute(3, b"lo\0")) + struct.pack("=HH", 40, 4)
    assert snapshot._link(truncated).endswith(struct.pack("=HH", 40, 4))
    assert snapshot._attribute_at(truncated, 32, len(truncated), 4) is None


def route(last_use: int, gateway: bytes, sequence: int = 1) -> bytes:
    rtmsg = struct.pack("=BBBBBBBBI", socket.AF_INET, 0, 0, 0, 254, 4, 0, 1, 0)
    return message(
        rtmsg,
        attribute(15, struct.pack("=I", 254)),
        attribute(5, gateway),
        attribute(12, struct.pack("=8I", 0, 0, 0, 0, last_use, 0, 0, 0)),  # RTA_CACHEINFO
        attribute(4, struct.pack("=I", 2)),
        sequence=sequence,
    )


def test_a_route_reads_the_same_whatever_its_last_use():
    first = snapshot._route(route(10, socket.inet_aton("198.18.0.1")))
    assert first == snapshot._route(route(99, socket.inet_aton("198.18.0.1"), sequence=5))
    assert first != snapshot._route(route(10, socket.inet_aton("198.18.0.254")))


def test_an_address_is_kept_without_its_netlink_header():
    header = struct.pack("=BBBBI", socket.AF_INET, 24, 0x80, 0, 2)
    one = message(header, attribute(2, socket.inet_aton("198.18.0.10")), sequence=1)
    again = message(header, attribute(2, socket.inet_aton("198.18.0.10")), sequence=2)
    assert (
        snapshot._address(one)
        == snapshot._address(again)
        != snapshot._address(message(header, attribute(2, socket.inet_aton("198.18.0.11"))))
    )


def test_the_digest_tells_the_parts_apart_not_only_their_bytes():
    assert snapshot.digest([b"ab", b"c"]) != snapshot.digest([b"a", b"bc"])
    assert snapshot.digest([b"ab", b"c"]) == snapshot.digest([b"ab", b"c"])
    assert len(snapshot.digest([])) == 16
