"""The UDP checker's probes on loopback: each ends in a reason, it probes a
group's health check port instead of the member's own, and its health words
carry the last reason and when the member last turned."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import pytest

from lbagent.desired.memberoptions import GroupMember, TrafficOptions
from lbagent.desired.model import HealthCheck
from lbagent.haproxy.health import reason_of, since_of
from lbagent.workers.udp_health import Probe, UdpHealthChecker

WAIT = 10.0


class HostNamespaces:
    """Runs the checker's socket work in this process's own namespace."""

    async def run(self, netns, function, *args):
        return function(*args)


def closed_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def answering() -> Iterator[int]:
    """A UDP port on loopback that answers every datagram with "pong"."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.1)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                _, peer = sock.recvfrom(512)
            except TimeoutError:
                continue
            sock.sendto(b"pong", peer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1]
    stop.set()
    thread.join(WAIT)
    sock.close()


def probe(port: int, expect: bytes = b"pong", timeout: float = 0.3) -> Probe:
    return Probe("ns", "udp", "127.0.0.1", port, b"ping", expect, 1.0, timeout, 1, 1)


async def check(port: int, expect: bytes = b"pong") -> str:
    return await UdpHealthChecker(HostNamespaces(), lambda lb_id: None).check_once(probe(port, expect))


def test_an_answer_with_the_expected_text_is_ok(answering):
    assert asyncio.run(check(answering)) == "ok"


def test_an_answer_without_the_expected_text_is_a_bad_response(answering):
    assert asyncio.run(check(answering, b"nope")) == "bad_response"


def test_a_closed_port_is_refused():
    assert asyncio.run(check(closed_udp_port())) == "connect_refused"


def test_silence_is_a_timeout_when_an_answer_is_expected_and_ok_when_not():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        port = silent.getsockname()[1]
        assert asyncio.run(check(port)) == "timeout"
        assert asyncio.run(check(port, b"")) == "ok"


def test_the_group_health_check_port_is_probed_instead_of_the_members_own(answering):
    closed = closed_udp_port()
    options = TrafficOptions(check_port=closed, mapped_check_port=2001)
    member = GroupMember("be-1", "127.0.0.1", answering, 1, "off", False, 2000, options=options)
    check_model = HealthCheck(type="udp", udp_request="ping", udp_expect="pong", rise=1, fall=1, interval=1, timeout=1)

    async def scenario():
        changed = asyncio.Event()
        checker = UdpHealthChecker(HostNamespaces(), lambda lb_id: changed.set())
        checker.sync("lb-1", "ns", [("dns", check_model, [member])])
        try:
            async with asyncio.timeout(WAIT):
                await changed.wait()
            return checker.health("lb-1"), checker.unhealthy("lb-1")
        finally:
            await checker.stop()

    health, unhealthy = asyncio.run(scenario())
    assert health == {"be-1": "down"} and unhealthy == {"dns": {"be-1"}}
    assert reason_of(health["be-1"]) == "connect_refused"
    assert since_of(health["be-1"]) is not None


def test_an_ipv6_member_is_probed_over_ipv6():
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as server:
        server.bind(("::1", 0))
        port = server.getsockname()[1]
        checker = UdpHealthChecker(HostNamespaces(), lambda lb_id: None)
        ipv6 = Probe("ns", "udp", "::1", port, b"ping", b"pong", 1.0, 2.0, 1, 1)

        async def answer() -> None:
            loop = asyncio.get_running_loop()
            server.setblocking(False)
            data, peer = await loop.sock_recvfrom(server, 512)
            await loop.sock_sendto(server, b"pong" if data == b"ping" else b"?", peer)

        async def both() -> list[str]:
            return await asyncio.gather(checker.check_once(ipv6), answer())

        assert asyncio.run(both())[0] == "ok"


FAST = {"rise": 1, "fall": 1, "interval": 1, "timeout": 1}


class Recorded:
    """A checker of one member of lb-1 whose load balancer carries traffic while
    `carries` says so; `probed` gets each probe's reason once the checker has
    taken it in, `changed` is set when the member turns."""

    def __init__(self, port: int, carries: bool, expect: str = "pong"):
        self.carries, self.changed, self.probed = carries, asyncio.Event(), asyncio.Queue[str]()
        self.checker = UdpHealthChecker(HostNamespaces(), lambda lb_id: self.changed.set(), lambda lb_id: self.carries)
        check_once = self.checker.check_once

        async def recorded(probe: Probe) -> str:
            reason = await check_once(probe)
            self.probed.put_nowait(reason)
            return reason

        self.checker.check_once = recorded  # type: ignore[method-assign]
        member = GroupMember("be-1", "127.0.0.1", port, 1, "off", False, 2000)
        check_model = HealthCheck(type="udp", udp_request="ping", udp_expect=expect, **FAST)
        self.checker.sync("lb-1", "ns", [("dns", check_model, [member])])

    def health(self):
        return self.checker.health("lb-1")["be-1"], self.checker.unhealthy("lb-1")

    async def turned(self):
        self.changed.clear()
        await self.changed.wait()


def test_failures_while_the_load_balancer_carries_no_traffic_do_not_count():
    """A new load balancer's port does not forward yet (nor does a standby's):
    its probes fail whatever the member, which stays up, with no reason
    recorded, until probes through a port that carries traffic fail."""

    async def scenario():
        recorded = Recorded(closed_udp_port(), carries=False)
        try:
            async with asyncio.timeout(WAIT):
                first = await recorded.probed.get()
                before = recorded.health()
                recorded.carries = True
                await recorded.turned()
            return first, before, recorded.health()
        finally:
            await recorded.checker.stop()

    first, (health_before, unhealthy_before), (health, unhealthy) = asyncio.run(scenario())
    assert first == "connect_refused"
    assert health_before == "up" and reason_of(health_before) is None and unhealthy_before == {}
    assert health == "down" and unhealthy == {"dns": {"be-1"}}
    assert reason_of(health) == "connect_refused"


def test_a_probe_sent_before_the_port_carried_traffic_does_not_count():
    """The port starts to forward while a probe is out: its timeout is no verdict either."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))

        async def scenario():
            recorded = Recorded(silent.getsockname()[1], carries=False)
            try:
                async with asyncio.timeout(WAIT):
                    await asyncio.sleep(0.2)  # the first probe is out, waiting for an answer
                    recorded.carries = True
                    first = await recorded.probed.get()
                    before = recorded.health()
                    await recorded.turned()  # the next probe, sent through a port that carries traffic
                return first, before, recorded.health()
            finally:
                await recorded.checker.stop()

        first, (health_before, _), (health, _) = asyncio.run(scenario())
    assert first == "timeout" and health_before == "up"
    assert health == "down" and reason_of(health) == "timeout"


def test_a_down_member_comes_back_only_through_a_port_that_carries_traffic():
    """Without `udp_expect` silence passes: through a port that forwards nothing
    every member would be silent, so passes do not count there either."""
    port = closed_udp_port()

    async def scenario():
        recorded = Recorded(port, carries=True, expect="")
        try:
            async with asyncio.timeout(WAIT):
                await recorded.turned()  # refused: down
                recorded.carries = False
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
                    silent.bind(("127.0.0.1", port))  # from now on each probe passes
                    while (await recorded.probed.get()) != "ok":
                        pass
                    during = recorded.health()
                    recorded.carries = True
                    await recorded.turned()
            return during, recorded.health()
        finally:
            await recorded.checker.stop()

    (health_during, unhealthy_during), (health, unhealthy) = asyncio.run(scenario())
    assert health_during == "down" and unhealthy_during == {"dns": {"be-1"}}
    assert health == "up" and unhealthy == {}


def test_each_load_balancer_sees_its_own_members_and_forgets_them_alone(answering):
    down = GroupMember("be-1", "127.0.0.1", closed_udp_port(), 1, "off", False, 2000)
    alive = GroupMember("be-2", "127.0.0.1", answering, 1, "off", False, 2001)
    check_model = HealthCheck(type="udp", udp_request="ping", udp_expect="pong", rise=1, fall=1, interval=1, timeout=1)

    async def scenario():
        changed = asyncio.Event()
        checker = UdpHealthChecker(HostNamespaces(), lambda lb_id: changed.set())
        checker.sync("lb-1", "ns-1", [("dns", check_model, [down])])
        checker.sync("lb-2", "ns-2", [("dns", check_model, [alive]), ("dns2", check_model, [alive])])
        try:
            async with asyncio.timeout(WAIT):
                await changed.wait()
            seen = [(checker.unhealthy(lb), checker.health(lb)) for lb in ("lb-1", "lb-2")]
            checker.forget("lb-1")
            checker.sync("lb-2", "ns-2", [("dns", check_model, [alive])])  # one listener's check left
            after = [(checker.unhealthy(lb), checker.health(lb)) for lb in ("lb-1", "lb-2")]
            checker.sync("lb-2", "ns-2", [])
            return seen, after, checker.health("lb-2"), len(checker._tasks)
        finally:
            await checker.stop()

    seen, after, emptied, tasks = asyncio.run(scenario())
    assert seen == [({"dns": {"be-1"}}, {"be-1": "down"}), ({}, {"be-2": "up"})]
    assert after == [({}, {}), ({}, {"be-2": "up"})]
    assert emptied == {} and tasks == 0
