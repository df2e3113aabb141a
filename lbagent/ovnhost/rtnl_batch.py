"""rtnetlink requests sent together: one write, every request acknowledged on its own.

For building what is known not to exist yet (a load balancer's new
namespace, the host ends of its new veths), where there is nothing to read
first. pyroute2's `IPRoute` spends about 0.3 ms of Python on every request
(its argument processors and an asyncio loop run per call, even in
`IPBatch`). Its message classes did the same in a fraction of that, but each
left objects in reference cycles behind for the collector: thousands of
them in a cold start, collected with the interpreter lock held while the
event loop waited. The requests are now encoded with struct
(`rtnl_writes`, the same bytes), and the kernel answers the whole batch to
one socket.

Every request asks for an acknowledgement; a failed one becomes the same
typed `NetlinkError` as in `iplib`, naming the request. The kernel goes on
with the requests after a failed one, so `send` reads every answer and
raises the first failure once all are in.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink import NLMSG_ERROR
from pyroute2.netlink.rtnl import RTM_GETROUTE

from lbagent.metrics import count_write
from lbagent.ovnhost import rtnl_requests, rtnl_socket, rtnl_writes
from lbagent.ovnhost.errors import NetlinkError, netlink_error
from lbagent.ovnhost.iplib import UNREACHABLE, KernelRoute, route_to_write
from lbagent.ovnhost.rtnl_messages import ROUTE, decoder
from lbagent.ovnhost.rtnl_socket import ERRNO, HEADER
from lbagent.ovnhost.rtnl_writes import Write


@dataclass(frozen=True, slots=True)
class _Request:
    write: Write
    data: bytes  # with its header


class RtnlBatch:
    """Requests collected in order, then sent with `send` on a socket of the
    namespace they are meant for (`open_socket` on a thread inside it)."""

    def __init__(self) -> None:
        self._requests: list[_Request] = []

    def __len__(self) -> int:
        return len(self._requests)

    def _add(self, write: Write) -> None:
        header = HEADER.pack(HEADER.size + len(write.body), write.kind, write.flags, len(self._requests) + 1, 0)
        self._requests.append(_Request(write, header + write.body))

    def add_veth(self, name: str, peer: str, peer_netns_fd: int, **options: Any) -> None:
        """A veth pair, `name` up, `peer` made directly in the namespace of
        `peer_netns_fd` and down (set up by a later request); `options` as
        `rtnl_writes.add_veth`'s (MTUs, MACs, indexes)."""
        self._add(rtnl_writes.add_veth(name, peer, peer_netns_fd, up=True, **options))

    def set_up(self, index: int, name: str, alias: str = "") -> None:
        """The link up and, if given, its `ifalias` set in the same request
        (the kernel ignores an alias in the request that creates a link)."""
        self._add(rtnl_writes.set_link(index, name, alias=alias or None, up=True))

    def forward_ipv4(self, index: int, name: str) -> None:
        self._add(rtnl_writes.forward_ipv4(index, name))

    def add_address(self, index: int, name: str, address: str, prefixlen: int, noprefixroute: bool = False) -> None:
        self._add(rtnl_writes.add_address(index, name, address, prefixlen, noprefixroute=noprefixroute))

    def replace_route(self, route: KernelRoute) -> None:
        self._add(rtnl_writes.replace_route(route_to_write(route)))

    def add_source_rule(self, src: str, table: int, priority: int) -> None:
        """`from src/32` (`/128`) `lookup table`; an identical rule already there is fine."""
        self._add(rtnl_writes.source_rule(src, table, priority))

    def add_skip_rules(self, src: str, src_len: int, first: int, target: int) -> None:
        """The pair `iplib.Netlink.add_skip_rules` makes; either one already there is fine."""
        for write in rtnl_writes.skip_rules(src, src_len, first, target):
            self._add(write)

    def send(self, sock: socket.socket) -> None:
        """Send every request in one write, read every answer, count what was
        applied; raise the first failure (as a typed NetlinkError) after all."""
        if not self._requests:
            return
        requests, self._requests = self._requests, []
        try:
            sock.send(b"".join(r.data for r in requests))
            codes = _read_acks(sock, len(requests))
        except OSError as exc:
            raise NetlinkError("send batch", exc.errno or errno.EIO, requests[0].write.target) from exc
        failure = None
        for write, code in zip((r.write for r in requests), codes):
            if code == 0:
                count_write("netlink", what=f"{write.op} {write.target}")
            elif not (code == errno.EEXIST and write.exists_ok) and failure is None:
                failure = netlink_error(write.op, code, write.target)
        if failure is not None:
            raise failure


def route_via(sock: socket.socket, dst: str, src: str) -> tuple[str | None, int | None] | None:
    """(gateway, output interface) of the route the kernel would use from `src`
    to `dst`, policy rules included; None if it has none. One request on the
    batch's socket (the probe after a build), not an IPRoute of its own."""
    try:
        body = rtnl_requests.get_route(dst, src)
        answers = rtnl_socket.request(sock, "get route", dst, body, RTM_GETROUTE, decoder(ROUTE))
    except NetlinkError as exc:
        if exc.code in UNREACHABLE:
            return None
        raise
    return answers[0].get("RTA_GATEWAY"), answers[0].get("RTA_OIF")


def _read_acks(sock: socket.socket, count: int) -> list[int]:
    """The errno (0: done) answered to each of requests 1..count."""
    codes: dict[int, int] = {}
    while len(codes) < count:
        buf = sock.recv(1 << 16)
        offset = 0
        while offset + HEADER.size <= len(buf):
            length, kind, _, seq, _ = HEADER.unpack_from(buf, offset)
            if kind == NLMSG_ERROR and 1 <= seq <= count:
                codes[seq] = -ERRNO.unpack_from(buf, offset + HEADER.size)[0]
            offset += max((length + 3) & ~3, HEADER.size)
    return [codes[seq] for seq in range(1, count + 1)]
