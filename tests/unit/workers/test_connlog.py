"""udp and tcp listeners' connection lines (lbagent.workers.connlog) with a fake conntrack
subscription: a subscription only while a udp or tcp listener logs, opened inside the load
balancer's namespace and reopened when that namespace is replaced; start and end lines for flows
to the listener's protocol, VIP and port only, through the access log's per-listener cap."""

from __future__ import annotations

import logging
import socket
from types import SimpleNamespace

import pytest

from lbagent.desired.listener_types import listener_kind
from lbagent.haproxy.accesslog import AccessLogReader, RateCap
from lbagent.logs import message_fields
from lbagent.ovnhost.conntrack import ConntrackError, Counters, Destination, FlowEvent, Tuple
from lbagent.workers.connlog import LOST_EVERY, ConnectionLogs, LoggedListener, logged_listeners, namespace_inode
from tests.unit.samples import until

VIP = "198.18.0.10"
LISTENER = LoggedListener("dns", "udp", 53, 2)
TCP_LISTENER = LoggedListener("db", "tcp", 53, 2)


class Raw:
    """`event` as the subscription reads it: its destination known, the rest to decode."""

    def __init__(self, event: FlowEvent):
        self.kind = event.kind
        self.destination = Destination(event.protocol, event.original.dst, event.original.dport)
        self.decodes = 0
        self._event = event

    def decode(self) -> FlowEvent:
        self.decodes += 1
        return self._event


class FakeEvents:
    """A subscription whose file descriptor is one end of a socket pair: `push` makes it readable."""

    def __init__(self, namespace: int):
        self.namespace = namespace
        self.lost = 0
        self.queued: list[Raw] = []
        self.read_so_far: list[Raw] = []
        self.fail = False
        self.closed = False
        self._ours, self._kernel = socket.socketpair()

    def fileno(self) -> int:
        return self._ours.fileno()

    def push(self, *events: FlowEvent) -> None:
        self.queued += [Raw(event) for event in events]
        self._kernel.send(b"x")

    def read(self) -> list[Raw]:
        self._ours.recv(4096)
        if self.fail:
            raise ConntrackError("read conntrack events: gone")
        events, self.queued = self.queued, []
        self.read_so_far += events
        return events

    def close(self) -> None:
        self.closed = True
        self._ours.close()
        self._kernel.close()


class Namespaces:
    """Runs calls at once, remembering in which namespace; the namespace's inode is `inode`."""

    def __init__(self):
        self.inode = 100
        self.entered: list[str | None] = []

    async def run(self, netns, function, *args):
        if function is namespace_inode:
            return self.inode
        self.entered.append(netns)
        return function(*args)


class Lines(logging.Handler):
    """The fields of the access lines written."""

    def __init__(self):
        super().__init__()
        self.fields: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.fields.append(message_fields(record.getMessage()))


@pytest.fixture
def lines():
    handler = Lines()
    logger = logging.getLogger("lbagent.access")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler.fields
    logger.removeHandler(handler)
    logger.setLevel(level)


class Harness:
    def __init__(self):
        self.namespaces = Namespaces()
        self.opened: list[FakeEvents] = []
        self.open_error: Exception | None = None
        self.now = 0.0
        self.access = AccessLogReader(("127.0.0.1", 0), cap=RateCap(clock=lambda: self.now))
        self.logs = ConnectionLogs(self.namespaces, self.access, self._open, clock=lambda: self.now)

    def _open(self) -> FakeEvents:
        if self.open_error is not None:
            raise self.open_error
        self.opened.append(FakeEvents(self.namespaces.inode))
        return self.opened[-1]

    async def sync(self, listeners=(LISTENER,)) -> None:
        await self.logs.sync("lb-1", "lb-lb-1", VIP, list(listeners))


def flow(kind: str, port: int = 53, protocol: str = "udp", vip: str = VIP) -> FlowEvent:
    original = Tuple("198.18.1.5", vip, 40000, port)
    reply = Tuple("198.18.2.7", "169.254.0.1", 5353, 40000)
    if kind == "start":
        return FlowEvent("start", 9, protocol, original, reply)
    return FlowEvent("end", 9, protocol, original, reply, Counters(2, 80), Counters(1, 120), 10**9, 10**9 + 1_500_000)


def udp_lb(*listeners):
    return SimpleNamespace(enabled=True, listeners=list(listeners))


def udp_listener(listener_id, access_log, enabled=True, listener_type="udp"):
    kind = listener_kind(listener_type)
    return SimpleNamespace(
        id=listener_id,
        enabled=enabled,
        kind=kind,
        listener_port=53,
        access_log=access_log,
        access_log_rate=7,
    )


def test_only_enabled_udp_and_tcp_listeners_with_access_log_are_logged():
    lb = udp_lb(
        udp_listener("a", True),
        udp_listener("b", False),
        udp_listener("c", True, enabled=False),
        udp_listener("d", True, listener_type="tcp"),
        udp_listener("e", True, listener_type="http"),  # haproxy's per-request lines only
        udp_listener("f", True, listener_type="https"),
    )
    assert logged_listeners(lb) == [LoggedListener("a", "udp", 53, 7), LoggedListener("d", "tcp", 53, 7)]
    lb.enabled = False
    assert logged_listeners(lb) == []


async def test_no_listener_that_logs_means_no_subscription():
    harness = Harness()
    await harness.sync(listeners=())
    assert harness.opened == [] and not harness.logs.subscribed("lb-1")


async def test_flows_to_the_listener_get_a_start_and_an_end_line(lines):
    harness = Harness()
    await harness.sync()
    assert harness.namespaces.entered == ["lb-lb-1"]  # opened inside the load balancer's namespace
    harness.opened[0].push(flow("start"), flow("end"))
    await until(lambda: len(lines) == 2, "both lines")
    start, end = lines
    assert start == {
        "object": "access",
        "lb": "lb-1",
        "listener": "dns",
        "event": "start",
        "proto": "udp",
        "client": "198.18.1.5:40000",
        "member": "198.18.2.7:5353",
    }
    assert end["event"] == "end" and end["member"] == "198.18.2.7:5353"
    assert (end["packets_in"], end["bytes_in"], end["packets_out"], end["bytes_out"]) == ("2", "80", "1", "120")
    assert end["duration_ms"] == "1"
    harness.logs.stop()


async def test_flows_elsewhere_or_of_the_other_protocol_are_not_logged(lines):
    harness = Harness()
    await harness.sync()
    harness.opened[0].push(flow("start", port=54), flow("start", protocol="tcp"), flow("start", vip="198.18.0.11"))
    harness.opened[0].push(flow("start"))
    await until(lambda: len(lines) == 1, "the line of the listener's flow")
    assert lines[0]["client"] == "198.18.1.5:40000" and lines[0]["proto"] == "udp"
    harness.logs.stop()


async def test_a_tcp_connection_gets_a_start_and_an_end_line_without_a_member(lines):
    harness = Harness()
    await harness.sync(listeners=(TCP_LISTENER,))
    harness.opened[0].push(flow("start"), flow("start", protocol="tcp"), flow("end", protocol="tcp"))
    await until(lambda: len(lines) == 2, "both lines of the tcp connection")
    start, end = lines
    assert start == {
        "object": "access",
        "lb": "lb-1",
        "listener": "db",
        "event": "start",
        "proto": "tcp",
        "client": "198.18.1.5:40000",
    }
    assert (end["event"], end["proto"], end["bytes_in"], end["bytes_out"]) == ("end", "tcp", "80", "120")
    assert "member" not in end  # the reply is haproxy's, whose own line names the server
    harness.logs.stop()


async def test_turning_the_option_off_or_forgetting_closes_the_subscription():
    harness = Harness()
    await harness.sync()
    await harness.sync()  # unchanged: the same subscription
    assert len(harness.opened) == 1
    await harness.sync(listeners=())
    assert harness.opened[0].closed and not harness.logs.subscribed("lb-1")
    await harness.sync()
    harness.logs.forget("lb-1")
    assert harness.opened[1].closed and not harness.logs.subscribed("lb-1")


async def test_a_replaced_namespace_is_subscribed_anew():
    harness = Harness()
    await harness.sync()
    harness.namespaces.inode = 101
    await harness.sync()
    assert len(harness.opened) == 2 and harness.opened[0].closed and not harness.opened[1].closed
    harness.logs.stop()
    assert harness.opened[1].closed


async def test_a_subscription_that_cannot_be_opened_is_tried_again_at_the_next_pass(caplog):
    harness = Harness()
    harness.open_error = ConntrackError("open conntrack events: no conntrack here")
    with caplog.at_level(logging.ERROR):
        await harness.sync()
    assert not harness.logs.subscribed("lb-1") and "action=subscribe result=error" in caplog.text
    harness.open_error = None
    await harness.sync()
    assert harness.logs.subscribed("lb-1")
    harness.logs.stop()


async def test_a_read_that_fails_drops_the_subscription(caplog):
    harness = Harness()
    await harness.sync()
    harness.opened[0].fail = True
    with caplog.at_level(logging.ERROR):
        harness.opened[0].push(flow("start"))
        await until(lambda: not harness.logs.subscribed("lb-1"), "the subscription dropped")
    assert harness.opened[0].closed and "action=read_conntrack result=error" in caplog.text


async def test_lost_events_are_said_in_the_log_at_most_every_few_seconds(caplog, lines):
    harness = Harness()
    await harness.sync()
    events = harness.opened[0]
    with caplog.at_level(logging.WARNING):
        for overflows, now in ((3, 0.0), (5, 1.0), (6, LOST_EVERY)):
            events.lost, harness.now = overflows, now
            events.push(flow("start"))
            await until(lambda: not events.queued, "the flow read")
    said = [r.getMessage() for r in caplog.records if "result=lost" in r.getMessage()]
    assert [m.split()[-1] for m in said] == ["overflows=3", "overflows=3"]  # the second: 5 and 6 since
    harness.logs.stop()


async def test_lines_over_the_listeners_cap_are_dropped_before_they_are_decoded(lines):
    harness = Harness()
    await harness.sync()  # LISTENER's rate is 2 lines a second
    harness.opened[0].push(*(flow("start") for _ in range(4)))
    await until(lambda: len(harness.opened[0].read_so_far) == 4, "the flows read")
    assert len(lines) == 2 and sum(raw.decodes for raw in harness.opened[0].read_so_far) == 2
    harness.now += 0.5  # one more line's worth
    harness.opened[0].push(flow("end"))
    await until(lambda: len(lines) == 3, "the next line")
    assert lines[2]["event"] == "end" and lines[2]["dropped"] == "2"
    harness.logs.stop()
