"""BridgePorts over a fake OVSDB client: an OVSDB that does not answer fails a
shared turn once for all, without retrying each port on its own; new ports
wait, bounded, for the passes still building theirs."""

import asyncio

import pytest
from ovsdbapp.exceptions import TimeoutException

from lbagent.ovnhost import bridgeports
from lbagent.ovnhost.bridgeports import BridgePorts
from lbagent.ovnhost.errors import OvsdbError, OvsdbUnavailable
from lbagent.ovnhost.ovs import OvsClient, PortState
from lbagent.support.blocking import BlockingPool
from lbagent.support.waits import InFlight


class FakeOvs:
    def __init__(self, error: Exception | None = None, refused: str = ""):
        self.turns: list[list[str]] = []
        self.error, self.refused = error, refused

    def converge_ports(self, wants):
        self.turns.append([w.name for w in wants])
        if self.error is not None:
            raise self.error
        if self.refused in {w.name for w in wants}:
            raise OvsdbError(f"OVSDB write {len(wants)} ports: {self.refused} refused")
        return [PortState("br-int", dict(w.external_ids)) for w in wants]


@pytest.fixture
async def pool():
    pool = BlockingPool("t-ovsdb", 1)
    yield pool
    pool.shutdown()


async def converge_all(ports, names):
    return await asyncio.gather(*(ports.converge(n, {"iface-id": n}) for n in names), return_exceptions=True)


async def test_an_unanswering_ovsdb_fails_the_turn_once(pool):
    ovs = FakeOvs(error=OvsdbUnavailable("OVSDB write 3 ports: timed out"))
    outcomes = await converge_all(BridgePorts(ovs, pool), ["a", "b", "c"])
    assert all(isinstance(o, OvsdbUnavailable) for o in outcomes)
    assert ovs.turns == [["a", "b", "c"]]


async def test_a_refused_port_fails_alone(pool):
    ovs = FakeOvs(refused="b")
    outcomes = await converge_all(BridgePorts(ovs, pool), ["a", "b", "c"])
    assert [o.on_bridge for o in (outcomes[0], outcomes[2])] == ["br-int", "br-int"]
    assert isinstance(outcomes[1], OvsdbError)
    assert ovs.turns == [["a", "b", "c"], ["a"], ["b"], ["c"]]


class TimingOut:
    """An ovsdbapp API whose transactions and commands time out."""

    def transaction(self, **kwargs):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        raise TimeoutException(commands=[], timeout=10, cause="no answer")

    def add(self, cmd):
        pass


def test_an_ovsdb_timeout_is_unavailability_not_a_refusal():
    client = OvsClient("unix:/nonexistent", "br-int", "gw-test")
    client._api = TimingOut()
    with pytest.raises(OvsdbUnavailable, match="delete port x"):
        client._transact("delete port x")

    class Command:
        def execute(self, **kwargs):
            raise TimeoutException(commands=[], timeout=10, cause="no answer")

    with pytest.raises(OvsdbUnavailable):
        client._execute(Command())


async def test_new_ports_wait_for_the_passes_still_building_theirs(pool, monkeypatch):
    monkeypatch.setattr(bridgeports, "GATHER_LIMIT", 30)  # only the building pass ends this wait
    ovs, building = FakeOvs(), InFlight()
    ports = BridgePorts(ovs, pool, building)
    later = building.entered()
    later.__enter__()  # a pass whose port is still to come
    first = asyncio.ensure_future(ports.converge("a", {"iface-id": "a"}, reattach=True))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(ports.converge("b", {"iface-id": "b"}, reattach=True))
    await asyncio.sleep(0.05)
    assert ovs.turns == []  # held back while the other pass builds
    later.__exit__(None, None, None)
    await asyncio.gather(first, second)
    assert ovs.turns == [["a", "b"]]


async def test_a_known_port_or_a_long_build_does_not_hold_a_turn(pool, monkeypatch):
    ovs, building = FakeOvs(), InFlight()
    ports = BridgePorts(ovs, pool, building)
    monkeypatch.setattr(bridgeports, "GATHER_LIMIT", 30)
    with building.entered():  # a pass that never gets to its port
        await asyncio.wait_for(ports.converge("known", {"iface-id": "known"}), 1)  # not new: goes at once
        assert ovs.turns == [["known"]]
        monkeypatch.setattr(bridgeports, "GATHER_LIMIT", 0.01)
        await asyncio.wait_for(ports.converge("new", {"iface-id": "new"}, reattach=True), 5)
    assert ovs.turns == [["known"], ["new"]]
