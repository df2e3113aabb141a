"""SubnetController alone and on a served queue: which subnets a refresh
queues, which load balancers a subnet's key kicks, and what status says."""

import asyncio

import pytest

from lbagent.desired.model import LoadBalancer, Subnet
from lbagent.workers.dispatch import SUBNET, Dispatcher, key, kind_of
from lbagent.workers.queue import WorkQueue
from lbagent.workers.subnets import SubnetController
from tests.unit.fakes import KickHarness

NET1 = {
    "id": "net-1",
    "cidr": "198.18.0.0/24",
    "gateway": "198.18.0.1",
    "mtu": 1442,
    "routes": [{"cidr": "198.19.0.0/16", "nexthop": "198.18.0.254"}],
}
NET2 = {"id": "net-2", "cidr": "198.18.1.0/24", "gateway": "198.18.1.1"}


def subnet(body=NET1, **changes) -> Subnet:
    return Subnet.model_validate({**body, **changes})


def lb(lb_id: str, subnet_id: str) -> LoadBalancer:
    return LoadBalancer.model_validate(
        {"id": lb_id, "network": {"subnet_id": subnet_id, "ip": "198.18.0.12", "mac": "00:22:0a:00:00:12"}}
    )


LBS = [lb("a", "net-1"), lb("b", "net-1"), lb("c", "net-2")]


@pytest.fixture
async def harness():
    states: dict[str, str] = {}
    h = KickHarness(SUBNET, lambda queue, kick: SubnetController(queue, kick, states.get))
    h.states = states
    yield h
    await h.stop()


async def test_reconcile_kicks_exactly_the_load_balancers_on_that_subnet():
    kicks = []
    ctl = SubnetController(WorkQueue("unused"), kicks.append, lambda lb_id: None)
    ctl.update([subnet(), subnet(NET2)], LBS)
    await ctl.reconcile("net-1")
    assert kicks == ["a", "b"]
    kicks.clear()
    await ctl.reconcile("net-2")
    await ctl.reconcile("net-9")  # unknown or gone: nobody to kick
    assert kicks == ["c"]


@pytest.mark.parametrize(
    "change",
    [
        {"gateway": "198.18.0.254"},
        {"mtu": 1400},
        {"routes": [{"cidr": "198.19.0.0/16", "nexthop": "198.18.0.253"}]},
        {"routes": []},
        {"cidr": "198.18.0.0/23"},
    ],
)
async def test_a_changed_subnet_kicks_exactly_its_load_balancers(harness, change):
    assert await harness.refresh([subnet(), subnet(NET2)], LBS) == []  # the first state: every LB is new anyway
    assert await harness.refresh([subnet(**change), subnet(NET2)], LBS) == ["a", "b"]
    assert await harness.refresh([subnet(**change), subnet(NET2)], LBS) == []  # unchanged: nothing


def test_only_changed_or_removed_subnets_are_queued():
    queue = WorkQueue("unserved", kind_of=kind_of)
    ctl = SubnetController(queue, print, lambda lb_id: None)
    ctl.update([subnet(), subnet(NET2)], LBS)
    assert queue.stats()["depth"] == 0
    net3 = subnet(NET2, id="net-3", cidr="198.18.3.0/24", gateway="198.18.3.1")
    ctl.update([subnet(NET2, mtu=1300), net3], [lb("c", "net-2")])  # net-1 gone with its load balancers
    assert queue.stats()["depth"] == 2
    assert queue.is_pending(key(SUBNET, "net-1")) and queue.is_pending(key(SUBNET, "net-2"))


async def test_status_says_what_each_subnet_is_and_how_its_load_balancers_are(harness):
    harness.states.update(a="ready", b="ready", c="ready")
    await harness.refresh([subnet(), subnet(NET2)], LBS)
    net1, net2 = harness.ctl.status()
    assert net1 == {
        "id": "net-1",
        "state": "ready",
        "loadbalancers": 2,
        "cidr": "198.18.0.0/24",
        "gateway": "198.18.0.1",
        "mtu": 1442,
        "routes": [{"cidr": "198.19.0.0/16", "nexthop": "198.18.0.254"}],
        "retries": 0,
        "error": None,
    }
    assert net2["mtu"] == 1442 and net2["routes"] == [] and net2["loadbalancers"] == 1

    harness.states["b"] = "pending"
    assert harness.ctl.status()[0]["state"] == "pending"
    harness.states["a"] = "error"
    net1 = harness.ctl.status()[0]
    assert net1["state"] == "error"
    assert net1["error"] == "1 of 2 load balancers on this subnet failed their last pass: a"

    many = [lb(f"lb{i}", "net-2") for i in range(5)]
    harness.states.update({f"lb{i}": "error" for i in range(5)})
    await harness.refresh([subnet(NET2)], many)
    assert (
        harness.ctl.status()[0]["error"]
        == "5 of 5 load balancers on this subnet failed their last pass: lb0, lb1, lb2, …"
    )


async def test_a_subnet_is_pending_while_its_change_waits_and_shows_a_failed_kick():
    def kick(lb_id):
        raise RuntimeError("supervisor gone")

    queue = WorkQueue("t-subnets", backoff_start=10, backoff_max=20, kind_of=kind_of)
    ctl = SubnetController(queue, kick, lambda lb_id: "ready")
    ctl.update([subnet()], LBS)
    ctl.update([subnet(mtu=1300)], LBS)
    assert ctl.status()[0]["state"] == "pending"
    queue.start(Dispatcher({SUBNET: ctl.reconcile}))
    try:
        await asyncio.wait_for(_until(lambda: queue.retries(key(SUBNET, "net-1"))), 5)
        status = ctl.status()[0]
        assert status["state"] == "error" and status["error"] == "supervisor gone" and status["retries"] == 1
    finally:
        await queue.shutdown(timeout=5)


async def _until(predicate):
    while not predicate():
        await asyncio.sleep(0.01)


def test_status_is_empty_before_the_first_state():
    assert SubnetController(WorkQueue("unused"), print, print).status() == []
