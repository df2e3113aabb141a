"""TrafficProbes: confirmation at the first answer, retries while waiting, rechecks, three strikes."""

import asyncio
import threading

import pytest

from lbagent.ovnhost.arpprobe import ProbeError
from lbagent.support.blocking import BlockingPool
from lbagent.workers import traffic_probes
from lbagent.workers.traffic_probes import PROBES_AT_ONCE, ProbeTarget, TrafficProbes


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Gateways:
    """Answers per load balancer: True, False, or an exception to raise."""

    def __init__(self):
        self.answer: dict[str, object] = {}
        self.asked: list[str] = []

    async def __call__(self, target: ProbeTarget) -> bool:
        self.asked.append(target.netns)
        answer = self.answer.get(target.netns, True)
        if isinstance(answer, BaseException):
            raise answer
        return bool(answer)


def target(lb_id: str) -> ProbeTarget:
    return ProbeTarget(lb_id, "v0", "00:22:0a:00:00:12", "198.18.0.12", "198.18.0.1")


@pytest.fixture
def probes():
    clock, gateways = Clock(), Gateways()
    return TrafficProbes(gateways, recheck=lambda: 30.0, retry=1.0, strikes=3, clock=clock), clock, gateways


async def probe_due(probes):
    return await probes.probe({lb_id: target(lb_id) for lb_id in probes.due()})


async def test_a_waiting_load_balancer_is_confirmed_at_its_first_answer_and_retried_until_then(probes):
    probes, clock, gateways = probes
    gateways.answer["a"] = False
    probes.want("a")
    probes.want("b")
    assert await probe_due(probes) == ({"b"}, set())
    assert not probes.confirmed("a") and probes.confirmed("b")
    probes.want("a")  # already scheduled: not sooner
    assert await probe_due(probes) == (set(), set())  # not due before its retry
    assert sorted(gateways.asked) == ["a", "b"]
    clock.now += 1.0
    gateways.answer["a"] = True
    assert await probe_due(probes) == ({"a"}, set())
    assert probes.confirmed("a") and probes.confirmed("b")


async def test_a_confirmed_one_is_rechecked_and_lost_after_three_failures_in_a_row(probes):
    probes, clock, gateways = probes
    probes.want("a")
    await probe_due(probes)
    clock.now += 29.0
    assert probes.due() == []
    clock.now += 1.0
    gateways.answer["a"] = False
    for _ in range(2):
        assert await probe_due(probes) == (set(), set())
        assert probes.confirmed("a")
        clock.now += 1.0
    gateways.answer["a"] = True  # an answer clears the strikes
    assert await probe_due(probes) == (set(), set())
    gateways.answer["a"] = ProbeError("gone")  # a failed probe is no answer
    for strike in range(3):
        clock.now += 30.0 if strike == 0 else 1.0
        gained, lost = await probe_due(probes)
    assert lost == {"a"} and not probes.confirmed("a")
    clock.now += 1.0
    assert probes.due() == ["a"]  # waiting again: retried every second


async def test_forget_drops_the_confirmation_and_the_schedule(probes):
    probes, clock, _ = probes
    probes.want("a")
    await probe_due(probes)
    probes.forget("a")
    clock.now += 60.0
    assert not probes.confirmed("a") and probes.due() == []


async def test_a_verdict_on_a_load_balancer_forgotten_meanwhile_is_dropped(probes):
    probes, _, _ = probes
    started, release = asyncio.Event(), asyncio.Event()

    async def slow_answer(target):
        started.set()
        await release.wait()
        return True

    probes._probe = slow_answer
    probes.want("a")
    probing = asyncio.create_task(probes.probe({lb_id: target(lb_id) for lb_id in probes.due()}))
    await started.wait()
    probes.forget("a")  # its port lost ovn-installed while the probe was out
    release.set()
    assert await probing == (set(), set())
    assert not probes.confirmed("a") and probes.due() == []


async def test_one_tick_probes_a_bounded_number_the_longest_due_first(probes):
    probes, clock, _ = probes
    for i in range(PROBES_AT_ONCE + 5):
        probes.want(f"lb-{i:03d}")
        clock.now += 0.001
    due = probes.due()
    assert due == [f"lb-{i:03d}" for i in range(PROBES_AT_ONCE)]
    assert probes.due() == [f"lb-{i:03d}" for i in range(PROBES_AT_ONCE, PROBES_AT_ONCE + 5)]


async def test_an_unexpected_error_or_a_stalled_probe_is_a_failed_probe_not_the_watchs(probes, monkeypatch):
    probes, _, gateways = probes
    gateways.answer["a"] = RuntimeError("a bug")
    monkeypatch.setattr(traffic_probes, "PROBE_DEADLINE", 0.05)

    async def stalled(target):
        if target.netns == "b":
            await asyncio.sleep(10)
        return await gateways(target)

    probes._probe = stalled
    probes.want("a")
    probes.want("b")
    probes.want("c")
    assert await probe_due(probes) == ({"c"}, set())


async def test_arp_probe_opens_its_socket_in_the_namespace_exchanges_on_the_loop_and_closes_it_off_it(monkeypatch):
    opened, exchanged, closed = [], [], []
    loop_thread = threading.get_ident()

    class Socket:
        def close(self):
            closed.append(threading.get_ident() != loop_thread)

    class Namespaces:
        async def run(self, netns, fn, *args):
            opened.append((netns, fn, args))
            return Socket()

    async def exchange(sock, frame, ip, gateway, timeout):
        exchanged.append((frame, ip, gateway, timeout))
        raise ProbeError("lost")

    monkeypatch.setattr(traffic_probes.arpprobe, "exchange", exchange)
    closer = BlockingPool("test-close")
    with pytest.raises(ProbeError):
        await traffic_probes.arp_probe(Namespaces(), closer, target("lb-x"), timeout=0.5)
    closer.shutdown()  # waits for the close
    assert opened == [("lb-x", traffic_probes.arpprobe.open_socket, ("v0",))]
    frame = traffic_probes.arpprobe.request("00:22:0a:00:00:12", "198.18.0.12", "198.18.0.1")
    assert exchanged == [(frame, "198.18.0.12", "198.18.0.1", 0.5)]
    assert closed == [True]  # on a thread of its own
