"""The batch encoder says what pyroute2 would say, and reads every answer."""

import ctypes
import errno
import os
import socket
import struct
import threading
from contextlib import closing

import pytest
from pyroute2 import IPBatch
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from lbagent.metrics import write_counts
from lbagent.ovnhost.errors import AlreadyExists, LinkNotFound, NetlinkError
from lbagent.ovnhost.iplib import KernelRoute
from lbagent.ovnhost.netns import CLONE_NEWNET
from lbagent.ovnhost.rtnl_batch import RtnlBatch, route_via
from lbagent.ovnhost.rtnl_socket import open_socket

TABLE = 0x4C420065


def _without_sequence(data: bytes) -> bytes:
    """A message with its sequence number and port id zeroed: each client numbers its own."""
    return data[:8] + bytes(8) + data[16:]


def _pyroute2(call) -> bytes:
    compiler = IPBatch()
    try:
        call(compiler)
        return _without_sequence(bytes(compiler.batch))
    finally:
        compiler.close()


def _address_message(compiler, index: int, address: str, prefixlen: int, flags: int) -> None:
    """What the agent sends for an IPv6 address, through pyroute2's message class: IPBatch's
    `addr` leaves IFA_LOCAL out for IPv6, or puts it before IFA_FLAGS when given."""
    msg = ifaddrmsg()
    msg["family"], msg["prefixlen"], msg["index"] = 10, prefixlen, index
    msg["attrs"] = [("IFA_ADDRESS", address), ("IFA_FLAGS", flags), ("IFA_LOCAL", address)]
    msg["header"]["type"], msg["header"]["flags"] = 20, 0x605  # RTM_NEWADDR; request, ack, excl, create
    msg.encode()
    compiler.batch += msg.data


def _ours(call) -> bytes:
    batch = RtnlBatch()
    call(batch)
    assert len(batch) == 1
    return _without_sequence(batch._requests[0].data)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (
            lambda b: b.add_veth("o1234abcd0", "o1234abcd1", 7, mtu=1442, mac="00:22:0a:00:00:12", peer_mtu=1442),
            lambda c: c.link(
                "add",
                ifname="o1234abcd0",
                kind="veth",
                mtu=1442,
                address="00:22:0a:00:00:12",
                state="up",
                peer={"ifname": "o1234abcd1", "net_ns_fd": 7, "mtu": 1442},
            ),
        ),
        (
            lambda b: b.add_veth("h1234abcd0", "h1234abcd1", 7),
            lambda c: c.link(
                "add", ifname="h1234abcd0", kind="veth", state="up", peer={"ifname": "h1234abcd1", "net_ns_fd": 7}
            ),
        ),
        (lambda b: b.set_up(1, "lo"), lambda c: c.link("set", index=1, state="up")),
        (
            lambda b: b.set_up(9, "h1234abcd1", "lbagent/gw-1"),
            lambda c: c.link("set", index=9, state="up", ifalias="lbagent/gw-1"),
        ),
        (
            lambda b: b.add_address(5, "x", "169.254.0.101", 16, noprefixroute=True),
            lambda c: c.addr("add", index=5, address="169.254.0.101", prefixlen=16, flags=0x200),
        ),
        (
            lambda b: b.add_address(2, "x", "198.18.0.12", 24),
            lambda c: c.addr("add", index=2, address="198.18.0.12", prefixlen=24),
        ),
        (
            lambda b: b.replace_route(KernelRoute("0.0.0.0/0", "198.18.0.1", 2, None)),
            lambda c: c.route("replace", dst="0.0.0.0/0", gateway="198.18.0.1", oif=2, table=254),
        ),
        (
            lambda b: b.replace_route(KernelRoute("198.19.0.0/16", "198.18.0.254", 2, None)),
            lambda c: c.route("replace", dst="198.19.0.0/16", gateway="198.18.0.254", oif=2, table=254),
        ),
        (
            lambda b: b.replace_route(KernelRoute("169.254.0.100/32", None, 5, "169.254.0.101", TABLE)),
            lambda c: c.route(
                "replace", dst="169.254.0.100/32", oif=5, prefsrc="169.254.0.101", scope=253, table=TABLE
            ),
        ),
        (
            lambda b: b.replace_route(KernelRoute("0.0.0.0/0", "169.254.0.100", 5, None, TABLE)),
            lambda c: c.route("replace", dst="0.0.0.0/0", gateway="169.254.0.100", oif=5, table=TABLE),
        ),
        (
            lambda b: b.add_source_rule("169.254.0.101", TABLE, 31000),
            lambda c: c.rule("add", src="169.254.0.101", src_len=32, table=TABLE, priority=31000),
        ),
        (
            lambda b: b.add_veth("o1", "o2", 9, mac="02:00:00:00:00:01", peer_mac="02:00:00:00:00:02", index=40),
            lambda c: c.link(
                "add",
                index=40,
                ifname="o1",
                kind="veth",
                address="02:00:00:00:00:01",
                state="up",
                peer={"ifname": "o2", "net_ns_fd": 9, "address": "02:00:00:00:00:02"},
            ),
        ),
        (
            lambda b: b.add_address(2, "x", "2001:db8::5", 64),
            lambda c: _address_message(c, 2, "2001:db8::5", 64, 0x02),
        ),
        (
            lambda b: b.add_address(5, "x", "fd4c:4241::3", 64, noprefixroute=True),
            lambda c: _address_message(c, 5, "fd4c:4241::3", 64, 0x202),
        ),
        (
            lambda b: b.replace_route(KernelRoute("::/0", "2001:db8::1", 2, None)),
            lambda c: c.route("replace", dst="::/0", gateway="2001:db8::1", oif=2, table=254),
        ),
        (
            lambda b: b.replace_route(KernelRoute("fd4c:4241::2/128", None, 5, "fd4c:4241::3", TABLE)),
            lambda c: c.route("replace", dst="fd4c:4241::2/128", oif=5, prefsrc="fd4c:4241::3", scope=253, table=TABLE),
        ),
        (
            lambda b: b.add_source_rule("fd4c:4241::3", TABLE, 31000),
            lambda c: c.rule("add", family=10, src="fd4c:4241::3", src_len=128, table=TABLE, priority=31000),
        ),
        (
            lambda b: b.replace_route(KernelRoute("::/0", "fd4c:4241::2", 5, None, TABLE)),
            lambda c: c.route("replace", dst="::/0", gateway="fd4c:4241::2", oif=5, table=TABLE),
        ),
        (
            lambda b: b.add_source_rule("169.254.0.101", 100, 31000),
            lambda c: c.rule("add", src="169.254.0.101", src_len=32, table=100, priority=31000),
        ),
    ],
)
def test_requests_are_encoded_as_pyroute2_encodes_them(ours, theirs):
    assert _ours(ours).hex() == _pyroute2(theirs).hex()


def test_skip_rules_are_the_pair_iplib_adds():
    batch = RtnlBatch()
    batch.add_skip_rules("169.254.0.0", 16, 30999, 31999)
    nop, skip = (_without_sequence(r.data) for r in batch._requests)
    assert nop == _pyroute2(lambda c: c.rule("add", priority=31999, action="FR_ACT_NOP"))
    assert skip == _pyroute2(
        lambda c: c.rule(
            "add", priority=30999, src="169.254.0.0", src_len=16, flags=2, action="FR_ACT_GOTO", goto=31999
        )
    )


def test_ipv6_skip_rules_are_the_pair_iplib_adds():
    batch = RtnlBatch()
    batch.add_skip_rules("fc00::", 7, 30999, 31999)
    nop, skip = (_without_sequence(r.data) for r in batch._requests)
    assert nop == _pyroute2(lambda c: c.rule("add", family=10, priority=31999, action="FR_ACT_NOP"))
    assert skip == _pyroute2(
        lambda c: c.rule(
            "add", family=10, priority=30999, src="fc00::", src_len=7, flags=2, action="FR_ACT_GOTO", goto=31999
        )
    )


class FakeSocket:
    """Answers each request of the batch it was sent with the given errno, in
    messages split across reads as the kernel may split them."""

    def __init__(self, codes: list[int], per_read: int = 2):
        self.codes, self.per_read, self.sent, self.replies = codes, per_read, b"", []

    def send(self, data: bytes) -> int:
        self.sent = data
        acks = [
            struct.pack("=IHHIIi", 36, 2, 0x100, seq, 0, -code) + bytes(16)
            for seq, code in enumerate(self.codes, start=1)
        ]
        self.replies = [b"".join(acks[i : i + self.per_read]) for i in range(0, len(acks), self.per_read)]
        return len(data)

    def recv(self, size: int) -> bytes:
        return self.replies.pop(0)


def _three_requests() -> RtnlBatch:
    batch = RtnlBatch()
    batch.add_skip_rules("169.254.0.0", 16, 30999, 31999)
    batch.add_address(5, "h1234abcd1", "169.254.0.101", 16)
    return batch


def test_every_answer_is_read_and_an_existing_rule_is_no_failure():
    before = write_counts()["netlink"]
    sock = FakeSocket([errno.EEXIST, 0, 0])
    _three_requests().send(sock)
    assert sock.sent.count(b"\x20\x00\x05\x06") == 2  # both rules (RTM_NEWRULE, create|excl|ack) in one write
    assert write_counts()["netlink"] == before + 2


def test_the_first_failure_is_raised_typed_once_all_answers_are_in():
    sock = FakeSocket([0, errno.ENODEV, errno.EEXIST], per_read=1)
    with pytest.raises(LinkNotFound) as raised:
        _three_requests().send(sock)
    assert "not from 169.254.0.0/16 goto 31999" in str(raised.value)
    assert sock.replies == []  # the third answer was read too: the next batch starts clean


def test_an_existing_address_is_a_failure():
    batch = RtnlBatch()
    batch.add_address(5, "h1234abcd1", "169.254.0.101", 16)
    with pytest.raises(AlreadyExists, match="add address 169.254.0.101/16 h1234abcd1"):
        batch.send(FakeSocket([errno.EEXIST]))


def test_a_socket_error_is_a_netlink_error():
    class Broken(FakeSocket):
        def send(self, data):
            raise OSError(errno.ENOBUFS, "no buffer space")

    with pytest.raises(NetlinkError, match="ENOBUFS"):
        _three_requests().send(Broken([]))


def test_an_empty_batch_sends_nothing():
    sock = FakeSocket([])
    RtnlBatch().send(sock)
    assert sock.sent == b""


class Replies:
    """A socket that answers each recv with the next of `replies`; a reply with sequence
    number 1 is made the answer to the request sent (its sequence number copied)."""

    def __init__(self, *replies: bytes):
        self.replies, self.sent = list(replies), b""

    def send(self, data):
        self.sent = data
        return len(data)

    def recv(self, size):
        reply = self.replies.pop(0)
        if struct.unpack_from("=I", reply, 8)[0] != 1:
            return reply
        return reply[:8] + self.sent[8:12] + reply[12:]


def _error_reply(code: int) -> bytes:
    return struct.pack("=IHHIIi", 36, 2, 0, 1, 0, -code) + bytes(16)


@pytest.mark.parametrize("code", [errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EINVAL])
def test_no_route_is_none(code):
    assert route_via(Replies(_error_reply(code)), "198.18.255.254", "169.254.0.101") is None


def test_a_failed_route_lookup_is_a_netlink_error():
    with pytest.raises(NetlinkError, match="get route 198.18.255.254: EPERM"):
        route_via(Replies(_error_reply(errno.EPERM)), "198.18.255.254", "169.254.0.101")


def test_a_route_answer_gives_gateway_and_device():
    answer = rtmsg()
    answer["family"], answer["dst_len"] = 2, 32
    answer["attrs"] = [("RTA_DST", "198.18.255.254"), ("RTA_GATEWAY", "169.254.0.100"), ("RTA_OIF", 42)]
    answer["header"]["type"], answer["header"]["sequence_number"] = 24, 1
    answer.encode()
    sock = Replies(bytes(answer.data))
    assert route_via(sock, "198.18.255.254", "169.254.0.101") == ("169.254.0.100", 42)
    request = rtmsg(sock.sent)
    request.decode()
    assert (request.get_attr("RTA_DST"), request.get_attr("RTA_SRC")) == ("198.18.255.254", "169.254.0.101")


def test_an_answer_to_something_else_is_skipped():
    stray = struct.pack("=IHHII", 16, 3, 0, 7, 0)  # NLMSG_DONE of another request
    with pytest.raises(NetlinkError, match="get route 198.18.255.254: EPERM"):
        route_via(Replies(stray, stray, _error_reply(errno.EPERM)), "198.18.255.254", "169.254.0.101")


def _in_a_namespace_of_its_own(work):
    """work() on a thread of its own in a fresh network namespace, which goes with the thread."""
    outcome: list = []

    def run() -> None:
        try:
            if ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "unshare")
            outcome.append(work())
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]


def _setting(name: str, key: str) -> str:
    with open(f"/proc/sys/net/ipv4/conf/{name}/{key}") as f:
        return f.read().strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="a namespace of its own needs CAP_SYS_ADMIN")
def test_a_link_forwards_ipv4_and_refuses_redirects_and_nothing_else_changes():
    def settings() -> dict[str, str]:
        # A new namespace copies the host's IPv4 `all` and `default`: compared before and after.
        return {
            name: _setting(name, "forwarding") + _setting(name, "accept_redirects")
            for name in ("fw0", "fw1", "all", "default")
        }

    def build() -> tuple[dict[str, str], dict[str, str]]:
        with open("/proc/thread-self/ns/net") as own, closing(open_socket()) as sock:
            batch = RtnlBatch()
            batch.add_veth("fw0", "fw1", own.fileno())
            batch.send(sock)
            before = settings()
            batch.forward_ipv4(socket.if_nametoindex("fw0"), "fw0")
            batch.send(sock)
        return before, settings()

    before, after = _in_a_namespace_of_its_own(build)
    assert after == {**before, "fw0": "10"}
