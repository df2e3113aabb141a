"""ARP exchanges from a load balancer's namespace: does its OVN port carry traffic?

`ovn-installed` on an OVS interface says ovn-controller has sent its flows,
not that ovs-vswitchd forwards by them: a switch busy with thousands of ports
has been seen to stall for minutes with the key set and the VIP silent. An
ARP request for the subnet's gateway, sent from the namespace's OVN-side
interface with the load balancer's own MAC and address, is answered by the
OVN pipeline only when the port's flows forward both ways.

The packet socket is opened inside the namespace (a socket belongs to the
namespace it was made in) on the caller's namespace thread; the exchange then
runs on the event loop without blocking any thread.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import struct
import time

from lbagent.ovnhost.errors import HostError

ETH_P_ARP = 0x0806
ARP_REQUEST, ARP_REPLY = 1, 2
BROADCAST = b"\xff" * 6
# Ethernet header, then ARP for IPv4 over Ethernet: htype 1, ptype 0x0800, hlen 6, plen 4.
_ETHERNET = struct.Struct("!6s6sH")
_ARP = struct.Struct("!HHBBH6s4s6s4s")


class ProbeError(HostError):
    """The probe's socket could not be opened or used (the interface is gone, say)."""


def open_socket(ifname: str) -> socket.socket:
    """A non-blocking packet socket for ARP on `ifname`; call it inside the interface's namespace.

    Made with no protocol and given ARP by the bind: a socket made with one is
    hooked into the stack at once, and the bind that moves the hook to the
    interface waits for an RCU grace period (15 ms and more), holding the
    namespace thread."""
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    except OSError as exc:
        raise ProbeError(f"ARP socket: {exc}") from None
    try:
        sock.bind((ifname, ETH_P_ARP))
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ProbeError(f"ARP socket on {ifname}: {exc}") from None
    return sock


def request(mac: str, ip: str, target: str) -> bytes:
    """Who has `target`? Tell `ip` at `mac`."""
    sender = bytes.fromhex(mac.replace(":", ""))
    arp = _ARP.pack(
        1, 0x0800, 6, 4, ARP_REQUEST, sender, socket.inet_aton(ip), b"\0" * 6, socket.inet_aton(str(target))
    )
    return _ETHERNET.pack(BROADCAST, sender, ETH_P_ARP) + arp


def answers(frame: bytes, ip: str, target: str) -> bool:
    """Whether `frame` is `target`'s ARP reply to `ip`."""
    if len(frame) < _ETHERNET.size + _ARP.size:
        return False
    arp = _ARP.unpack_from(frame, _ETHERNET.size)
    return (
        arp[4] == ARP_REPLY
        and arp[6] == ipaddress.IPv4Address(target).packed
        and arp[8] == ipaddress.IPv4Address(ip).packed
    )


async def exchange(sock: socket.socket, frame: bytes, ip: str, target: str, timeout: float, tries: int = 3) -> bool:
    """Send `frame` (a `request` for `target`) up to `tries` times within `timeout`; True at the
    first answer to `ip`. The caller closes `sock`."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout
    try:
        for attempt in range(tries):
            await loop.sock_sendall(sock, frame)
            until = min(deadline, time.monotonic() + timeout / tries) if attempt < tries - 1 else deadline
            while (left := until - time.monotonic()) > 0:
                try:
                    received = await asyncio.wait_for(loop.sock_recv(sock, 2048), left)
                except TimeoutError:
                    break
                if answers(received, ip, target):
                    return True
        return False
    except OSError as exc:
        raise ProbeError(f"ARP exchange with {target}: {exc}") from None
