"""TrafficProbes: confirmation at the first answer, retries while waiting, rechecks, three strikes."""

import pytest

from lbagent.ovnhost.arpprobe import ProbeError
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


async def probe_due(probes, ids):
    return await probes.probe({lb_id: target(lb_id) for lb_id in probes.due(ids)})


async def test_a_waiting_load_balancer_is_confirmed_at_its_first_answer_and_retried_until_then(probes):
    probes, clock, gateways = probes
    gateways.answer["a"] = False
    assert await probe_due(probes, {"a", "b"}) == ({"b"}, set())
    assert not probes.confirmed("a") and probes.confirmed("b")
    assert await probe_due(probes, {"a"}) == (set(), set())  # not due before its retry
    assert gateways.asked == ["a", "b"]
    clock.now += 1.0
    gateways.answer["a"] = True
    assert await probe_due(probes, {"a"}) == ({"a"}, set())
    assert probes.confirmed_ids() == {"a", "b"}


async def test_a_confirmed_one_is_rechecked_and_lost_after_three_failures_in_a_row(probes):
    probes, clock, gateways = probes
    await probe_due(probes, {"a"})
    clock.now += 29.0
    assert probes.due({"a"}) == []
    clock.now += 1.0
    gateways.answer["a"] = False
    for _ in range(2):
        assert await probe_due(probes, {"a"}) == (set(), set())
        assert probes.confirmed("a")
        clock.now += 1.0
    gateways.answer["a"] = True  # an answer clears the strikes
    assert await probe_due(probes, {"a"}) == (set(), set())
    gateways.answer["a"] = ProbeError("gone")
    for strike in range(3):
        clock.now += 30.0 if strike == 0 else 1.0
        gained, lost = await probe_due(probes, {"a"})
    assert lost == {"a"} and not probes.confirmed("a")
    clock.now += 1.0
    assert probes.due({"a"}) == ["a"]  # waiting again: retried every second


async def test_forget_drops_the_confirmation_and_the_schedule(probes):
    probes, clock, _ = probes
    await probe_due(probes, {"a"})
    probes.forget("a")
    assert not probes.confirmed("a") and probes.due({"a"}) == ["a"]


async def test_one_tick_probes_a_bounded_number_the_longest_due_first(probes):
    probes, clock, gateways = probes
    gateways.answer.update({f"lb-{i}": False for i in range(PROBES_AT_ONCE + 5)})
    ids = {f"lb-{i}" for i in range(PROBES_AT_ONCE + 5)}
    await probe_due(probes, set(sorted(ids)[:5]))  # these five are due again first
    clock.now += 1.0
    due = probes.due(ids)
    assert len(due) == PROBES_AT_ONCE and set(sorted(ids)[5:]) <= set(due) | set(sorted(ids)[:5])
    assert due[0] in sorted(ids)[5:]  # never probed: due since always


async def test_an_unexpected_error_is_not_taken_for_silence(probes):
    probes, _, gateways = probes
    gateways.answer["a"] = RuntimeError("a bug")
    with pytest.raises(RuntimeError):
        await probe_due(probes, {"a"})


async def test_arp_probe_opens_its_socket_in_the_namespace_and_exchanges_on_the_loop(monkeypatch):
    opened, exchanged = [], []

    class Namespaces:
        async def run(self, netns, fn, *args):
            opened.append((netns, fn, args))
            return "socket"

    async def exchange(sock, mac, ip, gateway, timeout):
        exchanged.append((sock, mac, ip, gateway, timeout))
        return True

    monkeypatch.setattr(traffic_probes.arpprobe, "exchange", exchange)
    assert await traffic_probes.arp_probe(Namespaces(), target("lb-x"), timeout=0.5)
    assert opened == [("lb-x", traffic_probes.arpprobe.open_socket, ("v0",))]
    assert exchanged == [("socket", "00:22:0a:00:00:12", "198.18.0.12", "198.18.0.1", 0.5)]
