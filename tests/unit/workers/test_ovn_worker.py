"""OvnWorker with fake host and haproxy: allocation, persistence, task lifecycle,
waiting, the rule that nothing unchanged is touched, and which load balancers a
refresh queues itself and which it leaves to their dependencies' controllers."""

import asyncio
import json
import threading
from dataclasses import replace

import pytest

from lbagent.desired.model import parse_desired_state
from lbagent.errors import StaleGeneration
from lbagent.haproxy.render import HaproxyConfig
from lbagent.naming import interface_names, netns_name
from lbagent.ovnhost.inventory import Inventory
from lbagent.state import Allocation, PersistedState, StateStore
from lbagent.workers import allocator
from lbagent.workers import ovn_worker as worker_mod
from lbagent.workers.ovn_worker import OvnWorker
from lbagent.workers.readiness import WAITING_FOR_TRAFFIC
from lbagent.workers.traffic_probes import ProbeTarget, TrafficProbes
from tests.unit.fakes import FakeHaproxy, FakeHost
from tests.unit.samples import lb_body, on_net2, pod_body, selecting_lb, state, two_subnets


@pytest.fixture
def worker(tmp_path, fake_render):
    queued = []  # what the worker put on the (here absent) queue: it kicks at once instead

    def requeue(lb_id):
        queued.append(lb_id)
        w.kick(lb_id)

    haproxy = FakeHaproxy()
    w = OvnWorker(FakeHost(), haproxy, StateStore(tmp_path), resync_interval=3600, requeue=requeue)
    w.queued = queued
    w.haproxy = haproxy  # the fake, for the tests to look into
    yield w


async def apply(worker, body):
    return await worker.apply(parse_desired_state(body), body)


async def test_apply_allocates_persists_and_converges(worker, tmp_path):
    gen = await apply(worker, state(1, [lb_body("a"), lb_body("b", ip="198.18.0.13", backends=("x", "y"))]))
    assert gen == 1
    assert await worker.wait_settled(1, 5)
    assert {t.state for t in worker.tasks.values()} == {"ready"}
    a, b = worker.allocations["a"], worker.allocations["b"]
    # 169.254.0.101 is on the host: the first pair is skipped.
    assert a.inner == "169.254.0.102" and b.inner == "169.254.0.104"
    assert b.ports == {"x": 1025, "y": 1026}
    persisted = StateStore(tmp_path).load()
    assert persisted.desired["generation"] == 1 and set(persisted.allocations) == {"a", "b"}


class DualStackHost(FakeHost):
    """A host with an address inside the default inner_prefix6, and no namespaces to adopt."""

    async def host_addresses(self):
        return {"169.254.0.101", "fd4c:4241::3"}

    async def inventory(self):
        return Inventory()


def dual_worker(tmp_path, **kwargs):
    return OvnWorker(DualStackHost(), FakeHaproxy(), StateStore(tmp_path), resync_interval=3600, **kwargs)


async def test_every_load_balancer_gets_an_ipv6_pair_that_avoids_host_addresses(tmp_path):
    worker = dual_worker(tmp_path)
    await apply(worker, state(1, [lb_body("a"), lb_body("b", ip="198.18.0.13")]))
    a, b = worker.allocations["a"], worker.allocations["b"]
    # fd4c:4241::3 is on the host: the first pair is skipped.
    assert (a.inner6, a.outer6, b.inner6, b.outer6) == ("fd4c:4241::4", "fd4c:4241::5", "fd4c:4241::6", "fd4c:4241::7")
    assert StateStore(tmp_path).load().allocations == worker.allocations
    await apply(worker, state(2, [lb_body("a"), lb_body("b", ip="198.18.0.13", backends=("x",))]))
    assert (worker.allocations["a"], worker.allocations["b"].inner6) == (a, b.inner6)  # stable
    await worker.stop()


def dual_stack_state(generation: int, with_ip6: bool) -> dict:
    body = state(generation, [lb_body("a"), lb_body("b", ip="198.18.0.13")])
    body["subnets"][0].update(cidr6="2001:db8:0:1::/64", gateway6="2001:db8:0:1::1")
    if with_ip6:
        body["loadbalancers"][0]["network"]["ip6"] = "2001:db8:0:1::12"
    return body


async def test_the_ipv6_reply_rule_is_in_use_only_while_its_load_balancer_has_ip6(tmp_path):
    worker = dual_worker(tmp_path)
    await apply(worker, dual_stack_state(1, with_ip6=True))
    a, b = worker.allocations["a"], worker.allocations["b"]
    assert worker.in_use().reply_rules == {a.outer, a.outer6, b.outer}
    await apply(worker, dual_stack_state(2, with_ip6=False))  # garbage collection may take a's
    assert worker.in_use().reply_rules == {a.outer, b.outer}


async def test_a_state_file_without_ipv6_pairs_gets_them_and_keeps_the_rest(tmp_path):
    body = state(1, [lb_body("a")])
    old = Allocation("169.254.0.200", "169.254.0.201", 3, {"be-1": 1030})
    StateStore(tmp_path).save(PersistedState(body, {"a": old}))
    worker = dual_worker(tmp_path)
    await worker.resume(StateStore(tmp_path).load(), parse_desired_state(body))
    assert worker.allocations["a"] == replace(old, inner6="fd4c:4241::4", outer6="fd4c:4241::5")
    await worker.stop()


async def test_an_ipv6_pair_outside_a_changed_prefix_is_allocated_anew(tmp_path):
    body = state(1, [lb_body("a"), lb_body("b", ip="198.18.0.13")])
    kept = Allocation("169.254.0.100", "169.254.0.101", 0, {}, "fd00:1::2", "fd00:1::3")
    moved = Allocation("169.254.0.102", "169.254.0.103", 0, {}, "fd4c:4241::8", "fd4c:4241::9")
    StateStore(tmp_path).save(PersistedState(body, {"a": kept, "b": moved}))
    worker = dual_worker(tmp_path, inner_prefix6="fd00:1::/64")
    await worker.resume(StateStore(tmp_path).load(), parse_desired_state(body))
    a, b = worker.allocations["a"], worker.allocations["b"]
    assert (a.inner, a.inner6, a.outer6) == ("169.254.0.100", "fd00:1::2", "fd00:1::3")
    assert (b.inner, b.inner6, b.outer6) == ("169.254.0.102", "fd00:1::4", "fd00:1::5")
    await worker.stop()


async def test_configurations_are_rendered_off_the_event_loop(worker, monkeypatch):
    loop_thread = threading.get_ident()
    rendered_on = []

    def render(lb, outer, members, inner):
        rendered_on.append(threading.get_ident())
        return HaproxyConfig(f"{lb.id} {outer} {inner}")

    monkeypatch.setattr(worker_mod, "render_config", render)
    await apply(worker, state(1, [lb_body("a"), lb_body("b", ip="198.18.0.13")]))
    assert await worker.wait_settled(1, 5)
    assert len(rendered_on) == 2 and loop_thread not in rendered_on


async def test_unchanged_load_balancer_reaches_new_generation_without_a_pass(worker):
    await apply(worker, state(1, [lb_body("a"), lb_body("b", ip="198.18.0.13")]))
    await worker.wait_settled(1, 5)
    passes = {k: t.passes for k, t in worker.tasks.items()}
    await apply(worker, state(2, [lb_body("a"), lb_body("b", ip="198.18.0.13", backends=("be-1", "be-2"))]))
    assert await worker.wait_settled(2, 5)
    assert worker.tasks["a"].passes == passes["a"]
    assert worker.tasks["b"].passes == passes["b"] + 1
    assert worker.tasks["a"].generation == 2
    assert worker.allocations["b"].ports == {"be-1": 1025, "be-2": 1026}
    assert await worker.wait_settled(2, 0)  # settled already: no time is needed (?wait=0 answers 200)


async def test_removed_load_balancer_is_torn_down_and_released(worker, tmp_path):
    await apply(worker, state(1, [lb_body("a"), lb_body("b", ip="198.18.0.13")]))
    await worker.wait_settled(1, 5)
    await apply(worker, state(2, [lb_body("a")]))
    assert await worker.wait_settled(2, 5)
    assert "b" not in worker.tasks and "b" not in worker.allocations
    assert worker._host.removed == ["b"] and "b" not in worker.haproxy.configs
    assert set(StateStore(tmp_path).load().allocations) == {"a"}


async def test_the_worker_keeps_the_accepted_body_as_text_only(worker, tmp_path):
    """A save after a teardown writes the body as it was accepted: the worker
    keeps its JSON text, not the decoded body (3 MB at a thousand load
    balancers), so the caller's dict changed afterwards changes nothing."""
    body = state(1, [lb_body("a"), lb_body("b", ip="198.18.0.13")])
    accepted = json.loads(json.dumps(body))
    await apply(worker, body)
    body["generation"] = 7
    body["loadbalancers"].clear()
    await worker._save_state([None])
    assert StateStore(tmp_path).load().desired == accepted


async def test_stale_generation_is_refused(worker):
    await apply(worker, state(5, [lb_body("a")]))
    with pytest.raises(StaleGeneration):
        await apply(worker, state(4, [lb_body("a")]))
    assert worker.generation == 5


async def test_one_failing_load_balancer_does_not_stop_the_others(worker):
    worker._host.fail.add("bad")
    await apply(worker, state(1, [lb_body("good"), lb_body("bad", ip="198.18.0.13")]))
    assert await worker.wait_settled(1, 5)
    bad, good = worker.tasks["bad"], worker.tasks["good"]
    assert good.state == "ready"
    assert bad.state == "error" and "boom bad" in bad.last_error and bad.retries == 1
    worker._host.fail.clear()
    bad.kick()
    await asyncio.wait_for(_until(lambda: bad.state == "ready"), 5)
    assert bad.last_error is None and bad.retries == 0


def gate_host(worker) -> asyncio.Event:
    """The host part of every pass waits until the returned event is set."""
    gate = asyncio.Event()
    original = worker._host.converge

    async def slow(spec):
        await gate.wait()
        return await original(spec)

    worker._host.converge = slow
    return gate


async def test_haproxy_checks_while_the_host_converges_and_goes_live_after_it(worker):
    gate = gate_host(worker)
    await apply(worker, state(1, [lb_body("a")]))
    await asyncio.wait_for(_until(lambda: worker.haproxy.prepared == ["a"]), 5)
    assert "a" not in worker.haproxy.configs  # checked, not live: the host is not there yet
    assert worker.haproxy_changes_coming()  # haproxy's next reload waits a little for it
    gate.set()
    assert await worker.wait_settled(1, 5)
    assert "a" in worker.haproxy.configs and worker.tasks["a"].state == "ready"
    assert not worker.haproxy_changes_coming()


async def test_a_failed_host_drops_the_checked_change(worker):
    worker._host.fail.add("a")
    await apply(worker, state(1, [lb_body("a")]))
    assert await worker.wait_settled(1, 5)
    assert worker.tasks["a"].state == "error"
    await asyncio.wait_for(_until(lambda: worker.haproxy.dropped == ["a"]), 5)
    assert "a" not in worker.haproxy.configs


def gate_prepare(worker, gate: asyncio.Event) -> list:
    """haproxy's check of every pass waits for `gate`; returns the ids whose check was cancelled."""
    cancelled = []

    async def prepare_slowly(lb_id, text, files=None):
        try:
            await gate.wait()
        except asyncio.CancelledError:
            cancelled.append(lb_id)
            raise
        return lb_id, text

    worker.haproxy.prepare = prepare_slowly
    return cancelled


async def test_a_failed_host_does_not_wait_for_the_check_which_stop_then_cancels(worker):
    worker._host.fail.add("a")
    cancelled = gate_prepare(worker, asyncio.Event())
    await apply(worker, state(1, [lb_body("a")]))
    assert await worker.wait_settled(1, 5)  # the pass failed with the check still under way
    assert worker.tasks["a"].state == "error" and "boom a" in worker.tasks["a"].last_error
    assert cancelled == []
    await asyncio.wait_for(worker.stop(), 5)  # the abandoned check goes with the agent
    assert cancelled == ["a"] and worker.haproxy.dropped == [] and "a" not in worker.haproxy.configs


def hang_host(worker) -> asyncio.Event:
    """The host part of every pass hangs; returns the event set once one has started."""
    started = asyncio.Event()

    async def hanging(spec):
        started.set()
        await asyncio.Event().wait()

    worker._host.converge = hanging
    return started


async def test_a_cancelled_pass_cancels_its_check(worker):
    started = hang_host(worker)
    cancelled = gate_prepare(worker, asyncio.Event())
    await apply(worker, state(1, [lb_body("a")]))
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.wait_for(worker.stop(), 5)
    assert cancelled == ["a"] and worker.haproxy.dropped == [] and "a" not in worker.haproxy.configs


async def test_a_pass_cancelled_after_its_check_drops_the_change(worker):
    started = hang_host(worker)
    await apply(worker, state(1, [lb_body("a")]))
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.wait_for(_until(lambda: worker.haproxy.prepared == ["a"]), 5)
    await asyncio.wait_for(worker.stop(), 5)
    assert worker.haproxy.dropped == ["a"] and "a" not in worker.haproxy.configs


async def test_disabled_load_balancer_leaves_the_data_path_but_keeps_allocations(worker):
    await apply(worker, state(1, [lb_body("a")]))
    await worker.wait_settled(1, 5)
    disabled = lb_body("a")
    disabled["status"] = "disabled"
    await apply(worker, state(2, [disabled]))
    assert await worker.wait_settled(2, 5)
    assert worker._host.removed == ["a"] and "a" not in worker.haproxy.configs
    assert "a" in worker.allocations


async def test_wait_times_out_while_a_pass_is_outstanding(worker):
    gate = gate_host(worker)
    await apply(worker, state(1, [lb_body("a")]))
    assert not await worker.wait_settled(1, 0.2)
    gate.set()
    assert await worker.wait_settled(1, 5)
    await worker.stop()


async def _until(predicate):
    while not predicate():
        await asyncio.sleep(0.01)


async def test_a_pod_change_requeues_exactly_the_load_balancers_selecting_it(worker):
    pods = [pod_body("w1", "198.18.0.21"), pod_body("d1", "198.18.0.40", app="db")]
    body = state(1, [selecting_lb("web", "198.18.0.12", "web"), selecting_lb("db", "198.18.0.13", "db")])
    body["pods"] = pods
    await apply(worker, body)
    assert await worker.wait_settled(1, 5)
    passes = {k: t.passes for k, t in worker.tasks.items()}
    assert worker.allocations["web"].ports == {"bg-1/w1": 1025}
    body = state(2, body["loadbalancers"])
    body["pods"] = pods + [pod_body("w2", "198.18.0.22"), pod_body("w3", "198.18.0.23", ready=False)]
    await apply(worker, body)
    assert await worker.wait_settled(2, 5)
    assert worker.tasks["web"].passes == passes["web"] + 1
    assert worker.tasks["db"].passes == passes["db"]
    # The member that did not change keeps its port.
    assert worker.allocations["web"].ports == {"bg-1/w1": 1025, "bg-1/w2": 1026}
    members = worker.members(worker.desired.loadbalancer("web"))["bg-1"]
    assert [(m.key, m.address, m.port, m.mapped_port) for m in members] == [
        ("bg-1/w1", "198.18.0.21", 8080, 1025),
        ("bg-1/w2", "198.18.0.22", 8080, 1026),
    ]


async def test_a_refresh_queues_only_new_deleted_and_own_changed_load_balancers(worker):
    lbs = [
        lb_body("a"),
        lb_body("b", ip="198.18.0.13"),
        on_net2(lb_body("c", ip="198.18.0.14")),
        lb_body("d", ip="198.18.0.15"),
    ]
    await apply(worker, two_subnets(1, lbs))
    assert await worker.wait_settled(1, 5)
    assert sorted(worker.queued) == ["a", "b", "c", "d"]
    worker.queued.clear()
    passes = {k: t.passes for k, t in worker.tasks.items()}

    # a unchanged; b's own spec changed; c's subnet changed (a dependency only); d deleted.
    lbs = [
        lb_body("a"),
        lb_body("b", ip="198.18.0.13", backends=("be-1", "be-2")),
        on_net2(lb_body("c", ip="198.18.0.14")),
    ]
    await apply(worker, two_subnets(2, lbs, mtu2=1400))
    assert sorted(worker.queued) == ["b", "d"]
    a, c = worker.tasks["a"], worker.tasks["c"]
    assert a.generation == 2 and a.passes == passes["a"]  # moved on without a pass
    assert not await worker.wait_settled(2, 0.2)  # c waits for its subnet's controller
    assert c.generation == 1 and c.passes == passes["c"] and c.state == "ready"

    worker.dependency_changed("c")  # what the subnet controller's handler does
    assert await worker.wait_settled(2, 5)
    assert c.generation == 2 and c.passes == passes["c"] + 1
    assert worker._host.converged[-1].links.mtu == 1400
    assert "d" not in worker.tasks


async def test_a_dependency_change_kicks_only_a_load_balancer_no_pass_has_seen_it_for(worker):
    lbs = [selecting_lb("web", "198.18.0.12", "web")]
    await apply(worker, two_subnets(1, lbs, pods=[pod_body("w1", "198.18.0.21")]))
    assert await worker.wait_settled(1, 5)
    task = worker.tasks["web"]
    worker.dependency_changed("web")  # nothing it uses changed
    await asyncio.sleep(0.05)
    assert task.passes == 1

    # The pod moves (same id, same port on INNER): only a dependency changed.
    gate, original = asyncio.Event(), worker._host.converge

    async def held(spec):
        await gate.wait()
        return await original(spec)

    worker._host.converge = held
    worker.queued.clear()
    await apply(worker, two_subnets(2, lbs, pods=[pod_body("w1", "198.18.0.22")]))
    assert worker.queued == [] and task.generation == 1
    worker.dependency_changed("web")
    await _until(lambda: worker.runtime["web"].running_deps is not None)
    worker.dependency_changed("web")  # the running pass already sees the change: no second one
    worker.dependency_changed("gone")  # unknown: nothing to do
    gate.set()
    assert await worker.wait_settled(2, 5)
    await asyncio.sleep(0.05)
    assert task.passes == 2 and task.generation == 2
    assert [m.address for m in worker.members(worker.desired.loadbalancer("web"))["bg-1"]] == ["198.18.0.22"]
    worker.dependency_changed("web")  # and a finished one too
    await asyncio.sleep(0.05)
    assert task.passes == 2


async def test_accepted_states_reach_the_controllers_in_the_same_step(worker):
    seen = []
    worker.on_accept.append(lambda desired: seen.append((desired.generation, worker.generation)))
    await apply(worker, state(1, [lb_body("a")]))
    await apply(worker, state(2, [lb_body("a")]))
    assert seen == [(1, 1), (2, 2)]


async def test_without_a_controller_the_periodic_resync_still_brings_a_dependency_change(fake_render, tmp_path):
    resyncing = OvnWorker(FakeHost(), FakeHaproxy(), StateStore(tmp_path / "r"), resync_interval=0.05)
    lbs = [on_net2(lb_body("c"))]
    await apply(resyncing, two_subnets(1, lbs))
    assert await resyncing.wait_settled(1, 5)
    await apply(resyncing, two_subnets(2, lbs, mtu2=1400))  # nobody calls dependency_changed
    assert await resyncing.wait_settled(2, 5)
    assert resyncing._host.converged[-1].links.mtu == 1400
    await resyncing.stop()


async def test_resyncs_are_spread_so_all_together_stay_under_the_rate(tmp_path):
    worker = OvnWorker(FakeHost(), FakeHaproxy(), StateStore(tmp_path), resync_interval=30, resync_rate=10)
    assert worker.resync_interval() == 30
    worker.tasks = {f"lb-{i}": object() for i in range(1000)}
    assert worker.resync_interval() == 100  # 1,000 load balancers at 10 passes a second


async def test_new_load_balancers_whose_names_collide_get_the_next_salt(tmp_path, monkeypatch):
    from types import SimpleNamespace

    # Every id hashes to the same tag for a given salt: only the salt tells them apart.
    monkeypatch.setattr(worker_mod, "interface_names", lambda lb_id, salt=0: SimpleNamespace(tag=f"t{salt}"))
    worker = OvnWorker(FakeHost(), FakeHaproxy(), StateStore(tmp_path), resync_interval=3600)
    body = state(1, [lb_body("a"), lb_body("b", ip="198.18.0.13"), lb_body("c", ip="198.18.0.14")])
    allocations, _ = await worker._allocate(parse_desired_state(body), frozenset())
    assert sorted(a.salt for a in allocations.values()) == [0, 1, 2]


async def apply_parsed(worker, parser, body):
    """As the API does: the parser hands over the very models of unchanged entries."""
    return await worker.apply(parser.parse(body), body)


async def test_a_refresh_changing_one_of_many_derives_only_its_members_again(worker, monkeypatch):
    from lbagent.desired.parser import RefreshParser
    from lbagent.workers import plan

    parser, derived = RefreshParser(), []
    group_targets = plan.group_targets
    monkeypatch.setattr(plan, "group_targets", lambda lb, pods: derived.append(lb.id) or group_targets(lb, pods))
    lbs = [lb_body(f"lb-{i}", ip=f"198.18.0.{20 + i}") for i in range(5)]
    await apply_parsed(worker, parser, state(1, lbs))
    assert await worker.wait_settled(1, 5)
    derived.clear()
    lbs[3] = lb_body("lb-3", ip="198.18.0.23", backends=("be-1", "be-2"))
    await apply_parsed(worker, parser, state(2, lbs))
    assert await worker.wait_settled(2, 5)
    assert set(derived) == {"lb-3"}
    assert worker.allocations["lb-3"].ports == {"be-1": 1025, "be-2": 1026}


async def test_a_reused_load_balancer_still_follows_the_pods_it_selects(worker):
    from lbagent.desired.parser import RefreshParser

    parser = RefreshParser()
    body = state(1, [selecting_lb("web", "198.18.0.12", "web"), lb_body("plain", ip="198.18.0.13")])
    body["pods"] = [pod_body("w1", "198.18.0.21")]
    await apply_parsed(worker, parser, body)
    assert await worker.wait_settled(1, 5)
    web = worker.desired.loadbalancer("web")
    body = state(2, body["loadbalancers"])
    body["pods"] = [pod_body("w1", "198.18.0.21"), pod_body("w2", "198.18.0.22")]
    await apply_parsed(worker, parser, body)
    assert worker.desired.loadbalancer("web") is web  # the same model: only the pods differ
    assert await worker.wait_settled(2, 5)
    assert worker.allocations["web"].ports == {"bg-1/w1": 1025, "bg-1/w2": 1026}
    assert [m.key for m in worker.members(web)["bg-1"]] == ["bg-1/w1", "bg-1/w2"]


async def test_a_refresh_looks_again_only_at_the_load_balancers_it_changed(worker, monkeypatch):
    """The others are the very models of the last state, with the same subnets
    and pods: their fingerprints are not computed again, and they still reach
    the new generation without a pass. A changed subnet list turns that off."""
    from lbagent.desired.parser import RefreshParser

    parser, looked_at = RefreshParser(), []
    own_fingerprint = OvnWorker._own_fingerprint
    monkeypatch.setattr(
        OvnWorker, "_own_fingerprint", lambda self, lb_id: looked_at.append(lb_id) or own_fingerprint(self, lb_id)
    )
    lbs = [lb_body(f"lb-{i}", ip=f"198.18.0.{20 + i}") for i in range(5)]
    await apply_parsed(worker, parser, state(1, lbs))
    assert await worker.wait_settled(1, 5)
    passes = {lb_id: task.passes for lb_id, task in worker.tasks.items()}
    looked_at.clear()

    lbs[3] = lb_body("lb-3", ip="198.18.0.23", backends=("be-1", "be-2"))
    await apply_parsed(worker, parser, state(2, lbs))
    assert set(looked_at) == {"lb-3"}
    assert await worker.wait_settled(2, 5)
    assert {lb_id: task.generation for lb_id, task in worker.tasks.items()} == dict.fromkeys(passes, 2)
    assert [lb_id for lb_id, task in worker.tasks.items() if task.passes != passes[lb_id]] == ["lb-3"]

    looked_at.clear()
    body = state(3, lbs)
    body["subnets"][0]["mtu"] = 1400  # every load balancer's subnet: nothing is taken as it was
    await apply_parsed(worker, parser, body)
    assert set(looked_at) == {f"lb-{i}" for i in range(5)}
    for lb_id in worker.tasks:  # as the subnet controller does
        worker.dependency_changed(lb_id)
    assert await worker.wait_settled(3, 5)
    assert all(task.passes == passes[lb_id] + 1 + (lb_id == "lb-3") for lb_id, task in worker.tasks.items())


def watched(worker):
    worker.installed_ports = worker._host.installed_ports
    return worker


async def test_a_load_balancer_is_pending_until_ovn_controller_installs_its_port(worker):
    watched(worker)._host.not_installed.add("a")
    await apply(worker, state(1, [lb_body("a"), lb_body("b", ip="198.18.0.13")]))
    await _until(lambda: all(t.passes for t in worker.tasks.values()))
    a, b = worker.tasks["a"], worker.tasks["b"]
    assert (a.state, a.reason, b.state, b.reason) == ("pending", "waiting for ovn-installed", "ready", None)
    assert not await worker.wait_settled(1, 0.1)  # ?wait answers 504 meanwhile
    assert "waiting for ovn-installed" in worker.not_serving()
    assert await worker.check_readiness() == 0  # still not installed: nothing changes
    assert worker._host.installed_asked[-1] == {worker._host.ports["a"]}  # only the port waited for
    passes = a.passes
    worker._host.not_installed.clear()  # ovn-controller installs the port
    assert await worker.check_readiness() == 1
    assert (a.state, a.reason, a.passes) == ("ready", None, passes)  # without another pass
    assert await worker.wait_settled(1, 0)
    assert worker.not_serving() is None
    await worker.stop()


async def test_the_readiness_watch_turns_a_load_balancer_ready_by_itself(worker):
    watched(worker)._host.not_installed.add("a")
    await apply(worker, state(1, [lb_body("a")]))
    await _until(lambda: worker.tasks["a"].state == "pending" and worker.tasks["a"].passes)
    watch = asyncio.create_task(worker.watch_readiness(0.01))
    try:
        worker._host.not_installed.clear()
        assert await worker.wait_settled(1, 5)
        assert worker.tasks["a"].state == "ready"
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await worker.stop()


async def test_a_waiting_load_balancer_is_not_queued_again_by_an_unchanged_refresh(worker):
    watched(worker)._host.not_installed.add("a")
    await apply(worker, state(1, [lb_body("a")]))
    await _until(lambda: worker.tasks["a"].passes)
    worker.queued.clear()
    await apply(worker, state(2, [lb_body("a")]))
    assert worker.queued == [] and worker.tasks["a"].generation == 2
    assert worker.tasks["a"].state == "pending"
    await worker.stop()


async def test_haproxy_not_running_keeps_its_load_balancers_from_ready(worker):
    await apply(worker, state(1, [lb_body("a")]))
    assert await worker.wait_settled(1, 5)
    worker.haproxy.counts.update(running=False, last_error="haproxy did not start (exit 1)")
    assert await worker.check_readiness() == 1
    task = worker.tasks["a"]
    assert task.state == "pending"
    assert task.reason == "haproxy not running: haproxy did not start (exit 1)"
    assert not worker.haproxy_up() and not worker.settled(1)
    worker.haproxy.counts.update(running=True, last_error=None)
    assert await worker.check_readiness() == 1
    assert task.state == "ready" and worker.settled(1)
    await worker.stop()


async def test_haproxy_coming_back_retries_failed_load_balancers_at_once(worker):
    worker._host.fail.add("a")
    await apply(worker, state(1, [lb_body("a")]))
    await _until(lambda: worker.tasks["a"].state == "error")
    worker.haproxy.counts["running"] = False
    await worker.check_readiness()
    assert worker.tasks["a"].state == "error"  # a failed pass stays failed
    worker._host.fail.clear()
    worker.tasks["a"].retries = 8  # a long backoff
    worker.haproxy.counts["running"] = True
    await worker.check_readiness()
    await _until(lambda: worker.tasks["a"].state == "ready")
    await worker.stop()


async def test_a_restarted_haproxy_serves_a_load_balancer_only_after_its_next_pass(worker):
    await apply(worker, state(1, [lb_body("a")]))
    assert await worker.wait_settled(1, 5)
    await worker.check_readiness()  # the watch learns how many masters were started
    task, passes = worker.tasks["a"], worker.tasks["a"].passes
    gate = gate_host(worker)
    worker.haproxy.counts["starts"] += 1  # the master died and the supervisor started another
    await worker.check_readiness()
    assert task.state == "pending" and task.reason.startswith("haproxy restarted")
    gate.set()
    await _until(lambda: task.passes > passes)  # kicked at once, not at the next resync
    assert task.state == "ready"
    await worker.stop()


async def test_pods_beyond_the_backend_ports_fail_their_load_balancer_alone(worker, monkeypatch):
    monkeypatch.setattr(allocator, "PORT_MAX", allocator.PORT_MIN + 1)  # two ports per load balancer
    lbs = [selecting_lb("web", "198.18.0.12", "web"), lb_body("other", ip="198.18.0.13")]
    body = state(1, lbs)
    body["pods"] = [pod_body("w1", "198.18.0.21"), pod_body("w2", "198.18.0.22")]
    await apply(worker, body)
    assert await worker.wait_settled(1, 5)
    web, other = worker.tasks["web"], worker.tasks["other"]
    assert web.state == "ready" and worker.allocations["web"].ports == {"bg-1/w1": 1025, "bg-1/w2": 1026}

    body = state(2, lbs)
    body["pods"] = [pod_body(f"w{i}", f"198.18.0.{20 + i}") for i in (1, 2, 3)]
    assert await apply(worker, body) == 2  # accepted: the body itself is valid
    await asyncio.wait_for(_until(lambda: web.state == "error"), 5)
    assert web.last_error == (
        "3 members (backends and selected pods) need a port on INNER each, more than the 2 of 1025-1026: "
        "remove backends or narrow the pod selectors"
    )
    assert worker.allocations["web"].ports == {"bg-1/w1": 1025, "bg-1/w2": 1026}  # kept while short
    assert worker.members(worker.desired.loadbalancer("web")) == {}
    assert other.state == "ready" and other.generation == 2

    body = state(3, lbs)
    body["pods"] = [pod_body("w2", "198.18.0.22"), pod_body("w3", "198.18.0.23")]
    await apply(worker, body)
    await asyncio.wait_for(_until(lambda: web.state == "ready"), 5)
    assert web.last_error is None and web.generation == 3
    assert worker.allocations["web"].ports == {"bg-1/w2": 1026, "bg-1/w3": 1025}


async def test_pods_beyond_the_server_budget_fail_their_load_balancer_alone(worker, monkeypatch):
    monkeypatch.setattr(worker_mod, "MAX_SERVERS_PER_LB", 2)
    lbs = [selecting_lb("web", "198.18.0.12", "web"), lb_body("other", ip="198.18.0.13")]
    body = state(1, lbs)
    body["pods"] = [pod_body(f"w{i}", f"198.18.0.{20 + i}") for i in (1, 2, 3)]
    assert await apply(worker, body) == 1  # accepted: pods do not count at refresh
    await asyncio.wait_for(_until(lambda: worker.tasks["web"].state == "error"), 5)
    assert worker.tasks["web"].last_error == (
        "3 haproxy servers with the pods its selectors take, more than the 2 a load balancer may have: "
        "remove backends or narrow the pod selectors"
    )
    assert await worker.wait_settled(1, 5) and worker.tasks["other"].state == "ready"


HA_TWO_HOSTS = {"hosts": ["gw-1", "gw-2"]}


async def test_a_standby_is_ready_once_built_and_the_active_one_once_installed(worker):
    roles = {}
    worker.ha_role = roles.get
    watched(worker)._host.not_installed.update({"a", "b"})  # standbys' ports are never bound
    await apply(
        worker, state(1, [{**lb_body("a"), "ha": HA_TWO_HOSTS}, {**lb_body("b", ip="198.18.0.13"), "ha": HA_TWO_HOSTS}])
    )
    await _until(lambda: all(t.passes for t in worker.tasks.values()))
    a, b = worker.tasks["a"], worker.tasks["b"]
    assert (a.state, a.reason) == ("pending", "waiting to learn its role from the OVN Northbound database")
    assert not await worker.wait_settled(1, 0.05)
    assert not worker.carries_traffic("a")  # its UDP members' failed probes do not count meanwhile

    roles.update(a="standby", b="active")
    worker.ha_role_changed("a")
    worker.ha_role_changed("b")
    assert (a.state, b.state, b.reason) == ("ready", "pending", "waiting for ovn-installed")
    assert not worker.carries_traffic("a") and not worker.carries_traffic("b")  # a standby; not installed yet
    worker._host.not_installed.discard("b")  # ovn-controller binds the active host's port
    assert await worker.check_readiness() == 1
    assert b.state == "ready"
    assert worker.carries_traffic("b")  # active and installed, with no traffic probes

    roles["a"] = "active"  # a failover to this host: it serves once bound
    worker.ha_role_changed("a")
    assert (a.state, a.reason) == ("pending", "waiting for ovn-installed")
    roles["a"] = "unknown"  # out of contact: it serves as it was
    worker.ha_role_changed("a")
    assert a.state == "ready"
    assert not worker.carries_traffic("a")  # its port never installed here
    roles["b"] = "unknown"
    worker.ha_role_changed("b")
    assert b.state == "ready" and worker.carries_traffic("b")  # installed here: its UDP members still judged
    assert set(worker.ha_loadbalancers()) == {"a", "b"}
    assert worker.ha_loadbalancers()["a"].hosts == ["gw-1", "gw-2"]
    await worker.stop()


async def test_an_installed_port_is_ready_once_its_gateway_answers_and_pending_when_it_stops(worker):
    clock, answers, asked = [0.0], {}, []

    async def gateway(target):
        asked.append(target)
        return answers.get(target.netns, False)

    worker.traffic = TrafficProbes(gateway, recheck=lambda: 30.0, retry=1.0, strikes=2, clock=lambda: clock[0])
    await apply(worker, state(1, [lb_body("a")]))
    await _until(lambda: worker.tasks["a"].passes)
    a = worker.tasks["a"]
    assert (a.state, a.reason) == ("pending", WAITING_FOR_TRAFFIC)
    assert not await worker.wait_settled(1, 0.05)
    assert not worker.carries_traffic("a")
    assert await worker.check_traffic() == 0  # not answered
    names = interface_names("a", worker.allocations["a"].salt)
    assert asked == [ProbeTarget(netns_name("a"), names.ovn_ns, "00:22:0a:00:00:0c", "198.18.0.12", "198.18.0.1")]

    answers[netns_name("a")] = True
    assert await worker.check_traffic() == 0 and len(asked) == 1  # its retry is not due yet
    clock[0] += 1.0
    assert await worker.check_traffic() == 1
    assert (a.state, a.reason) == ("ready", None) and await worker.wait_settled(1, 0)
    assert worker.carries_traffic("a")

    answers[netns_name("a")] = False  # the port stops forwarding: two rechecks unanswered
    clock[0] += 30.0
    assert await worker.check_traffic() == 0 and a.state == "ready"
    clock[0] += 1.0
    assert await worker.check_traffic() == 1
    assert (a.state, a.reason) == ("pending", WAITING_FOR_TRAFFIC)
    assert WAITING_FOR_TRAFFIC in worker.not_serving() and not worker.carries_traffic("a")

    await apply(worker, state(2, []))  # gone: forgotten, never probed again
    assert await worker.wait_settled(2, 5)
    assert not worker.carries_traffic("a")
    clock[0] += 60.0
    asked.clear()
    assert await worker.check_traffic() == 0 and asked == []
    await worker.stop()


class RecordingConnectionLogs:
    """Records, with the host's own calls, when the worker subscribes and forgets."""

    def __init__(self, host):
        self.host = host
        self.calls = []

    async def sync(self, lb_id, netns, vip, listeners):
        self.calls.append(("sync", lb_id, netns, vip, [listener.listener_id for listener in listeners]))

    def forget(self, lb_id):
        self.calls.append(("forget", lb_id, len(self.host.removed)))

    def stop(self):
        self.calls.append(("stop",))


async def test_udp_flows_are_logged_once_the_namespace_is_built_and_until_just_before_it_goes(worker):
    logs = worker.connection_logs = RecordingConnectionLogs(worker._host)
    body = lb_body("a")
    body["listeners"].append(
        {"id": "dns", "listener_type": "udp", "listener_port": 53, "backend_group_id": "bg-1", "access_log": True}
    )
    await apply(worker, state(1, [body]))
    assert await worker.wait_settled(1, 5)
    assert logs.calls == [("sync", "a", "lb-a", "198.18.0.12", ["dns"])] and len(worker._host.converged) == 1
    await apply(worker, state(2, []))
    assert await worker.wait_settled(2, 5)
    assert logs.calls[-1] == ("forget", "a", 0)  # before the namespace is removed: its socket would pin it
    assert worker._host.removed == ["a"]
    await worker.stop()
    assert logs.calls[-1] == ("stop",)


async def test_a_probe_that_hangs_holds_up_only_its_own_batch(worker):
    release = asyncio.Event()

    async def gateway(target):
        if target.netns == netns_name("a"):
            await release.wait()  # ovs-vswitchd has not applied its flows yet
        return True

    worker.traffic = TrafficProbes(gateway, recheck=lambda: 30.0)
    await apply(worker, state(1, [lb_body("a")]))
    await _until(lambda: worker.tasks["a"].passes)
    watch = asyncio.create_task(worker.watch_traffic(0.01))
    try:
        await apply(worker, state(2, [lb_body("a"), lb_body("b", ip="198.18.0.13")]))
        await _until(lambda: worker.tasks["b"].state == "ready")
        assert worker.tasks["a"].state == "pending"
        release.set()
        await _until(lambda: worker.tasks["a"].state == "ready")
    finally:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await worker.stop()


def resync_checks(result: str) -> float:
    return worker_mod.RESYNC_CHECKS.labels(result)._value.get()


async def test_a_resync_stops_after_its_first_look_once_a_whole_pass_left_the_data_path_as_it_found_it(worker):
    await apply(worker, state(1, [lb_body("a")]))
    assert await worker.wait_settled(1, 5)
    host = worker._host
    passes, unchanged, changed = len(host.converged), resync_checks("unchanged"), resync_checks("changed")

    await worker.reconcile("a", resync=True)  # no baseline yet: a whole pass, which finds it as wanted
    assert (len(host.converged), resync_checks("changed")) == (passes + 1, changed + 1)
    await worker.reconcile("a", resync=True)  # the same look: nothing else
    await worker.reconcile("a", resync=True)
    assert (len(host.converged), resync_checks("unchanged")) == (passes + 1, unchanged + 2)

    host.looks["a"] = b"an address gone"  # drift: a whole pass, which repairs it (the look differs after)
    await worker.reconcile("a", resync=True)
    assert len(host.converged) == passes + 2
    await worker.reconcile("a", resync=True)  # the repaired look is no baseline yet: one more whole pass
    await worker.reconcile("a", resync=True)
    assert len(host.converged) == passes + 3

    worker.haproxy.configs["a"] = "edited on disk"  # the files count too
    await worker.reconcile("a", resync=True)
    assert len(host.converged) == passes + 4
    await worker.reconcile("a")  # asked for: always whole
    assert len(host.converged) == passes + 5


async def test_a_resync_whose_inputs_changed_or_whose_look_fails_is_a_whole_pass(worker):
    await apply(worker, state(1, [lb_body("a")]))
    assert await worker.wait_settled(1, 5)
    host = worker._host
    await worker.reconcile("a", resync=True)
    await worker.reconcile("a", resync=True)
    passes, looks = len(host.converged), host.snapshots

    async def failing(spec, also):
        raise OSError("namespace thread gone")

    host.snapshot = failing
    await worker.reconcile("a", resync=True)
    assert len(host.converged) == passes + 1
    del host.snapshot
    worker.runtime["a"].deps = "some other subnet"  # as if a dependency changed since the last pass
    await worker.reconcile("a", resync=True)
    assert (len(host.converged), host.snapshots) == (passes + 2, looks)


async def test_no_baseline_from_a_pass_during_which_something_was_written(worker, monkeypatch):
    """A repair that someone undid before the second look looks like nothing changed: only a
    pass with no write anywhere meanwhile gives the baseline."""
    await apply(worker, state(1, [lb_body("a")]))
    assert await worker.wait_settled(1, 5)
    host = worker._host
    written = iter(range(100))
    monkeypatch.setattr(worker_mod, "writes_so_far", lambda: next(written))  # a write between any two reads
    await worker.reconcile("a", resync=True)
    await worker.reconcile("a", resync=True)
    assert worker.runtime["a"].baseline is None
    passes = len(host.converged)
    monkeypatch.setattr(worker_mod, "writes_so_far", lambda: 7)  # quiet
    await worker.reconcile("a", resync=True)
    await worker.reconcile("a", resync=True)
    assert len(host.converged) == passes + 1 and worker.runtime["a"].baseline is not None


class FlippingHealth:
    def __init__(self):
        self.down = {}

    def sync(self, lb_id, netns, checks):
        pass

    def unhealthy(self, lb_id):
        return self.down


async def test_a_resync_after_a_udp_member_went_down_is_a_whole_pass(worker):
    worker.udp_health = FlippingHealth()
    await apply(worker, state(1, [lb_body("a")]))
    assert await worker.wait_settled(1, 5)
    host = worker._host
    await worker.reconcile("a", resync=True)
    await worker.reconcile("a", resync=True)
    passes = len(host.converged)
    worker.udp_health.down = {"lsn-1": {"be-1"}}
    await worker.reconcile("a", resync=True)
    assert len(host.converged) == passes + 1
