"""The supervisor and its controllers wired on one served queue, as the agent
wires them, over a fake host: a refresh wakes exactly the load balancers its
changes concern, and a waiting refresh waits for those woken by a dependency."""

import pytest

from lbagent.desired.model import parse_desired_state
from lbagent.state import StateStore
from lbagent.workers.controllers import requeue_loadbalancers, wire
from lbagent.workers.dispatch import kind_of
from lbagent.workers.ovn_worker import OvnWorker
from lbagent.workers.queue import WorkQueue
from tests.unit.fakes import FakeHaproxy, FakeHost
from tests.unit.samples import lb_body, on_net2, pod_body, selecting_lb, two_subnets


class FakeProviderNetworks:
    def __init__(self):
        self.updates, self.passes = [], []

    def update(self, networks):
        self.updates.append([n.name for n in networks])

    async def reconcile(self, name):
        self.passes.append(name)


@pytest.fixture
async def agent(tmp_path, fake_render):
    queue = WorkQueue("t-agent", kind_of=kind_of)
    worker = OvnWorker(
        FakeHost(), FakeHaproxy(), StateStore(tmp_path), resync_interval=3600, requeue=requeue_loadbalancers(queue)
    )
    controllers = wire(queue, worker, FakeProviderNetworks())
    queue.start(controllers.dispatcher, workers=4)
    yield worker, controllers, queue
    await queue.shutdown(timeout=5)
    await worker.stop()


LBS = [
    selecting_lb("web", "198.18.0.12", "web"),
    selecting_lb("db", "198.18.0.13", "db"),
    on_net2(lb_body("plain", ip="198.18.0.14")),
]


async def refresh(worker, generation, pods, mtu2=1442) -> dict[str, int]:
    """Apply and wait until every load balancer reached the generation; how many passes each made."""
    before = {lb_id: task.passes for lb_id, task in worker.tasks.items()}
    body = two_subnets(generation, LBS, mtu2=mtu2, pods=pods)
    await worker.apply(parse_desired_state(body), body)
    assert await worker.wait_settled(generation, 5)
    return {lb_id: task.passes - before.get(lb_id, 0) for lb_id, task in worker.tasks.items()}


async def test_each_change_wakes_exactly_the_load_balancers_it_concerns(agent):
    worker, controllers, queue = agent
    assert controllers.dispatcher.kinds == ("loadbalancer", "subnet", "pod", "provider_network")
    w1, d1 = pod_body("w1", "198.18.0.21"), pod_body("d1", "198.18.0.40", app="db")
    assert await refresh(worker, 1, [w1, d1]) == {"web": 1, "db": 1, "plain": 1}
    assert controllers.pods.status()["count"] == 2

    # Scaled up: web's own allocation changes too; still one pass.
    w2 = pod_body("w2", "198.18.0.22")
    assert await refresh(worker, 2, [w1, w2, d1]) == {"web": 1, "db": 0, "plain": 0}
    # A pod moves: a dependency of web only (its ports on INNER stay).
    ports = dict(worker.allocations["web"].ports)
    assert await refresh(worker, 3, [pod_body("w1", "198.18.0.29"), w2, d1]) == {"web": 1, "db": 0, "plain": 0}
    assert worker.allocations["web"].ports == ports
    # A renamed pod: nobody, and every load balancer still reaches the generation.
    assert await refresh(worker, 4, [pod_body("w1", "198.18.0.29"), w2, {**d1, "name": "db-7"}]) == {
        "web": 0,
        "db": 0,
        "plain": 0,
    }
    # The subnet of plain.
    assert await refresh(worker, 5, [pod_body("w1", "198.18.0.29"), w2, d1], mtu2=1400) == {
        "web": 0,
        "db": 0,
        "plain": 1,
    }
    assert [s["mtu"] for s in controllers.subnets.status()] == [1442, 1400]
    assert controllers.provider_networks.updates == [["physnet1"]] * 5


async def test_queue_figures_come_per_kind(agent):
    worker, controllers, queue = agent
    await refresh(worker, 1, [])
    stats = queue.stats_by_kind(controllers.dispatcher.kinds)
    assert set(stats) == {"loadbalancer", "subnet", "pod", "provider_network"}
    assert all(v == {"depth": 0, "delayed": 0, "processing": 0, "retrying": 0} for v in stats.values())
