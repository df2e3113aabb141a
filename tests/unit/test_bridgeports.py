"""BridgePorts over a fake OVSDB client: an OVSDB that does not answer fails a
shared turn once for all, without retrying each port on its own."""

import asyncio

import pytest
from ovsdbapp.exceptions import TimeoutException

from lbagent.blocking import BlockingPool
from lbagent.ovnhost.bridgeports import BridgePorts
from lbagent.ovnhost.errors import OvsdbError, OvsdbUnavailable
from lbagent.ovnhost.ovs import OvsClient, PortState


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
