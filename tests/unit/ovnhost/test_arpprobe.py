"""ARP frames built and recognised, and the exchange over a socket pair standing in for a packet socket."""

import asyncio
import os
import socket

import pytest

from lbagent.ovnhost import arpprobe

MAC, IP, GATEWAY = "00:22:0a:00:00:12", "198.18.0.12", "198.18.0.1"
GATEWAY_MAC = bytes.fromhex("0a0000000001")


def reply(frame: bytes, sender: str = GATEWAY, to: str = IP) -> bytes:
    """The gateway's answer to a request frame (what OVN's ARP responder sends)."""
    ether, arp = frame[:14], frame[14:]
    answer = (
        arp[:6] + (2).to_bytes(2, "big") + GATEWAY_MAC + socket.inet_aton(sender) + arp[8:14] + socket.inet_aton(to)
    )
    return ether[6:12] + GATEWAY_MAC + ether[12:14] + answer


def test_a_request_asks_for_the_gateway_from_the_load_balancers_own_mac_and_address():
    frame = arpprobe.request(MAC, IP, GATEWAY)
    assert frame[:6] == b"\xff" * 6 and frame[6:12] == bytes.fromhex("00220a000012") and frame[12:14] == b"\x08\x06"
    assert frame[20:22] == b"\x00\x01"  # a request
    assert frame[28:32] == socket.inet_aton(IP) and frame[38:42] == socket.inet_aton(GATEWAY)


def test_only_the_gateways_reply_to_us_answers():
    frame = arpprobe.request(MAC, IP, GATEWAY)
    assert arpprobe.answers(reply(frame), IP, GATEWAY)
    assert not arpprobe.answers(frame, IP, GATEWAY)  # our own request, seen again
    assert not arpprobe.answers(reply(frame, sender="198.18.0.9"), IP, GATEWAY)
    assert not arpprobe.answers(reply(frame, to="198.18.0.13"), IP, GATEWAY)
    assert not arpprobe.answers(b"\x00" * 20, IP, GATEWAY)


async def test_the_exchange_asks_again_until_the_gateway_answers():
    ours, wire = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.setblocking(False)
    wire.setblocking(False)
    loop = asyncio.get_running_loop()

    async def gateway():
        await loop.sock_recv(wire, 2048)  # the first request is lost
        await loop.sock_sendall(wire, b"noise")
        request = await loop.sock_recv(wire, 2048)
        await loop.sock_sendall(wire, reply(request))

    answering = asyncio.create_task(gateway())
    try:
        assert await arpprobe.exchange(ours, arpprobe.request(MAC, IP, GATEWAY), IP, GATEWAY, timeout=3.0, tries=3)
    finally:
        await answering
        wire.close()
        ours.close()


async def test_a_silent_gateway_is_no_answer_within_the_timeout():
    ours, wire = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.setblocking(False)
    try:
        assert not await arpprobe.exchange(ours, arpprobe.request(MAC, IP, GATEWAY), IP, GATEWAY, timeout=0.3, tries=2)
    finally:
        wire.close()
        ours.close()


async def test_a_socket_that_fails_is_a_typed_error():
    ours, wire = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.setblocking(False)
    wire.close()
    with pytest.raises(arpprobe.ProbeError, match="ARP exchange with 198.18.0.1"):
        await arpprobe.exchange(ours, arpprobe.request(MAC, IP, GATEWAY), IP, GATEWAY, timeout=0.3)


def test_a_socket_on_a_missing_interface_is_a_typed_error():
    try:
        arpprobe.open_socket("lbagent-none0").close()
    except arpprobe.ProbeError as exc:
        assert "lbagent-none0" in str(exc) or "ARP socket" in str(exc)
    else:
        pytest.fail("a packet socket bound to a missing interface")


@pytest.mark.skipif(os.geteuid() != 0, reason="packet sockets need CAP_NET_RAW")
def test_the_socket_takes_arp_only_from_its_bind():
    # Made with a protocol, the socket is hooked in at once and its bind waits an RCU grace period.
    sock = arpprobe.open_socket("lo")
    try:
        assert sock.proto == 0
        name, protocol = sock.getsockname()[:2]
        assert name == "lo" and protocol == arpprobe.ETH_P_ARP
    finally:
        sock.close()
