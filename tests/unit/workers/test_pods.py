"""PodController on a served queue: a pod change kicks exactly the load
balancers whose groups selected the old pod or select the new one, and
nothing else; what status says about pods."""

import pytest

from lbagent.desired.model import LoadBalancer, Pod
from lbagent.workers.dispatch import POD, key, kind_of
from lbagent.workers.pods import PodController, selections
from lbagent.workers.queue import WorkQueue
from tests.unit.fakes import KickHarness


def pod(
    pod_id: str,
    ip: str,
    app: str = "web",
    ready: bool = True,
    namespace: str = "shop",
    http: int | None = 8080,
    name: str = "",
    **labels,
) -> Pod:
    ports = [{"name": "http", "port": http}] if http is not None else [{"name": "metrics", "port": 9100}]
    return Pod.model_validate(
        {
            "id": pod_id,
            "namespace": namespace,
            "name": name or f"{pod_id}-name",
            "ip": ip,
            "ready": ready,
            "labels": {"app": app, **labels},
            "ports": ports,
        }
    )


def selecting(lb_id: str, app: str, port="http", backends=()) -> LoadBalancer:
    return LoadBalancer.model_validate(
        {
            "id": lb_id,
            "network": {"subnet_id": "net-1", "ip": "198.18.0.12", "mac": "00:22:0a:00:00:12"},
            "backend_groups": [
                {
                    "id": "bg-1",
                    "backends": list(backends),
                    "pod_selector": {"namespace": "shop", "labels": {"app": app}, "port": port},
                }
            ],
        }
    )


# web and web9000 select app=web (by the named port "http", by port 9000); db selects app=db;
# fixed lists its backends and selects nothing.
LBS = [
    selecting("web", "web"),
    selecting("web9000", "web", port=9000),
    selecting("db", "db"),
    LoadBalancer.model_validate(
        {
            "id": "fixed",
            "network": {"subnet_id": "net-1", "ip": "198.18.0.13", "mac": "00:22:0a:00:00:13"},
            "backend_groups": [{"id": "bg-1", "backends": [{"id": "be-1", "address": "198.18.0.21", "port": 8000}]}],
        }
    ),
]
W1, W2, D1 = pod("w1", "198.18.0.21"), pod("w2", "198.18.0.22"), pod("d1", "198.18.0.40", app="db")


@pytest.fixture
async def harness():
    h = KickHarness(POD, PodController)
    assert await h.refresh([W1, D1], LBS) == []  # the first state: every load balancer is new anyway
    yield h
    await h.stop()


@pytest.mark.parametrize(
    "pods, kicked",
    [
        ([W1, D1], []),  # nothing changed
        ([W1, W2, D1], ["web", "web9000"]),  # scaled up
        ([D1], ["web", "web9000"]),  # scaled down
        ([pod("w1", "198.18.0.21", app="db"), D1], ["db", "web", "web9000"]),  # relabelled: leaves web, joins db
        ([pod("w1", "198.18.0.21", tier="front"), D1], []),  # a label no selector reads
        ([pod("w1", "198.18.0.21", ready=False), D1], ["web", "web9000"]),  # not ready any more
        ([pod("w1", "198.18.0.29"), D1], ["web", "web9000"]),  # moved
        ([pod("w1", "198.18.0.21", http=8081), D1], ["web"]),  # its named port moved; 9000 is still 9000
        ([pod("w1", "198.18.0.21", http=None), D1], ["web"]),  # its named port is gone
        ([W1, pod("d1", "198.18.0.41", app="db")], ["db"]),
        ([W1, D1, pod("x1", "198.18.0.50", namespace="other")], []),  # another namespace: nobody selects there
        ([pod("w1", "198.18.0.21", name="web-7"), D1], []),  # renamed: the same member
    ],
)
async def test_a_pod_change_kicks_exactly_the_load_balancers_it_concerns(harness, pods, kicked):
    assert await harness.refresh(pods, LBS) == kicked


async def test_a_pod_that_becomes_ready_is_taken_and_a_not_ready_one_concerns_nobody(harness):
    waiting = pod("w2", "198.18.0.22", ready=False)
    assert await harness.refresh([W1, D1, waiting], LBS) == []
    assert await harness.refresh([W1, D1, pod("w2", "198.18.0.23", ready=False)], LBS) == []
    assert await harness.refresh([W1, D1, W2], LBS) == ["web", "web9000"]


async def test_changes_before_the_key_is_handled_add_up():
    kicks = []
    queue = WorkQueue("t-pods", kind_of=kind_of)
    ctl = PodController(queue, kicks.append)
    ctl.update([W1, D1], LBS)
    ctl.update([pod("w1", "198.18.0.21", http=8081), D1], LBS)  # web
    ctl.update([pod("w1", "198.18.0.21", http=8081, app="db"), D1], LBS)  # and now db, and web9000
    assert queue.stats()["depth"] == 1 and queue.is_pending(key(POD, "w1"))
    await ctl.reconcile("w1")
    await ctl.reconcile("w1")  # handled: nothing left to kick
    assert kicks == ["db", "web", "web9000"]


def test_selections_say_which_load_balancer_takes_which_pod_as_what():
    found = selections([W1, D1, pod("w3", "198.18.0.23", ready=False)], LBS)
    assert set(found) == {"w1", "d1"}
    assert {lb: [(g, t.key, t.port) for g, t in pairs] for lb, pairs in found["w1"].items()} == {
        "web": [("bg-1", "w1", 8080)],
        "web9000": [("bg-1", "w1", 9000)],
    }


async def test_status_lists_every_pod_with_the_load_balancers_selecting_it(harness):
    await harness.refresh([W2, W1, D1, pod("w3", "198.18.0.23", ready=False)], LBS)
    status = harness.ctl.status()
    assert status["count"] == 4 and status["ready"] == 3
    assert status["items"][0] == {
        "id": "d1",
        "namespace": "shop",
        "name": "d1-name",
        "ip": "198.18.0.40",
        "ready": True,
        "loadbalancers": 1,
        "pending": False,
    }
    assert [(p["id"], p["loadbalancers"]) for p in status["items"]] == [("d1", 1), ("w1", 2), ("w2", 2), ("w3", 0)]


def test_status_before_the_first_state():
    assert PodController(WorkQueue("unused"), print).status() == {"count": 0, "ready": 0, "items": []}
