"""High availability across gateway hosts, on the multi-host sandbox, driven as the region
controller drives it: the same load balancer pushed over HTTP to two gateway agents, traffic
from a client on a host of its own, the binding read from the Southbound database.

One sandbox (gw-1, gw-2, and cl for the client and the backend) serves the module; each test
makes its own load balancer and agents, and removes them.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest
from hostagent import HostAgent, agents_on

from devtools.multihost import MultiHost
from devtools.procs import CommandError

from agentproc import wait_until
from lbstate import SUBNET, backend, desired, loadbalancer, tcp_listener

GATEWAYS = ["gw-1", "gw-2"]
BACKEND_IP, CLIENT_IP = "198.18.0.21", "198.18.0.30"
LEASE = 1.5
WAIT = 60
LB_NUMBERS = itertools.count(1)  # one VIP and MAC per load balancer of the module


@pytest.fixture(scope="module")
def multihost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    prefix = f"ha{int(time.time()) % 100000:05d}"[:7]
    with MultiHost(tmp_path_factory.mktemp("ha"), prefix, [*GATEWAYS, "cl"]) as mh:
        vpc = mh.vpc()
        vpc.add_host("web", BACKEND_IP, http_text="web", on="cl")
        mh.client = vpc.add_host("client", CLIENT_IP, on="cl")
        mh.vpc_ = vpc
        try:
            yield mh
        finally:
            vpc.cleanup()


class Lb:
    """One load balancer with `ha`: its port in NB, its body, and the gateways' agents."""

    def __init__(self, mh: MultiHost, index: int, hosts: list[str], preempt: bool = False):
        self.mh = mh
        self.id = f"ha-{mh.prefix}-{index}"
        self.vip, self.mac = f"198.18.0.{100 + index}", f"00:22:0a:00:01:{index:02x}"
        self.lsp = mh.vpc_.add_lb_port(self.id, self.mac, self.vip)
        self.hosts = hosts
        self.preempt = preempt
        self.generation = 0

    def body(self, hosts: list[str] | None = None, present: bool = True) -> dict:
        self.generation += 1
        if not present:
            return desired(self.generation, subnets=[SUBNET])
        ha = {"hosts": hosts or self.hosts, "preempt": self.preempt}
        lb = loadbalancer(
            self.id,
            self.vip,
            self.mac,
            [tcp_listener("lsn-80", 80)],
            {"bg-1": [backend("be-web", BACKEND_IP)]},
            ha=ha if hosts != [] else None,
        )
        return desired(self.generation, lb, subnets=[SUBNET])

    def push(self, agents: dict[str, HostAgent], **kwargs) -> dict[str, int]:
        """One generation to every agent named, as the region controller pushes it."""
        body = self.body(**kwargs)
        answers = {name: agent.refresh(body, wait=WAIT) for name, agent in agents.items()}
        for name, (code, answer) in answers.items():
            assert code == 200, (name, answer)
        return {name: code for name, (code, _) in answers.items()}

    def bound_to(self) -> str | None:
        return self.mh.central.port_binding_chassis(self.lsp)

    def lease(self) -> dict[str, str]:
        text = self.mh.central.nbctl("get", "Logical_Switch_Port", self.lsp, "external_ids")
        pairs = (item.split("=", 1) for item in text.strip().strip("{}").replace('"', "").split(", ") if "=" in item)
        return {k: v for k, v in pairs if k.startswith("lbagent:")}

    def serves(self, timeout: float = 2) -> bool:
        try:
            return self.mh.client.curl(f"http://{self.vip}/", timeout=timeout).strip() == "web"
        except Exception:
            return False

    def remove(self) -> None:
        self.mh.vpc_.del_lb_port(self.id)


@pytest.fixture
def make(multihost):
    made: list[tuple[Lb, dict[str, HostAgent]]] = []

    def build(hosts=GATEWAYS, preempt: bool = False, start: bool = True) -> tuple[Lb, dict[str, HostAgent]]:
        lb = Lb(multihost, next(LB_NUMBERS), list(hosts), preempt)
        agents = agents_on(multihost, list(hosts), lease=LEASE)
        made.append((lb, agents))
        if start:
            for agent in agents.values():
                agent.start()
        return lb, agents

    yield build
    for lb, agents in made:
        for agent in agents.values():
            agent.destroy()
        lb.remove()


def chassis(mh: MultiHost, name: str) -> str:
    return mh.host(name).chassis


def role_of(agent: HostAgent, lb: Lb) -> str | None:
    return agent.ha(lb.id).get("role")


def wait_roles(lb: Lb, agents: dict[str, HostAgent], active: str, timeout: float = 15) -> None:
    def settled() -> bool:
        roles = {name: role_of(agent, lb) for name, agent in agents.items()}
        return roles == {name: "active" if name == active else "standby" for name in agents}

    wait_until(settled, timeout, f"{active} active and the others standing by for {lb.id}")


def pushed(make, **kwargs) -> tuple[Lb, dict[str, HostAgent]]:
    """A load balancer with `ha` pushed to both gateways, gw-1 active."""
    lb, agents = make(**kwargs)
    lb.push(agents)
    wait_roles(lb, agents, active="gw-1")
    return lb, agents


class Watcher:
    """Samples the binding and makes one new connection every 50 ms, on a thread, for the verdict.

    A request fails either before its connection is made (`refused`: a new connection the
    load balancer did not take) or after (`broken`: a connection made on the old active host
    while the binding moved; warm standby does not carry connections over)."""

    def __init__(self, lb: Lb):
        self.lb = lb
        self.bindings: list[str | None] = []
        self.answers = self.refused = self.broken = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        # The thread may have spent the last seconds in one request (a connection that timed
        # out): the list ends with the binding as the watch ends, not with its last sample.
        self._sample()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._attempt()
            self._stop.wait(0.05)

    def _sample(self) -> None:
        bound = self.lb.bound_to()
        if not self.bindings or self.bindings[-1] != bound:
            self.bindings.append(bound)

    def _attempt(self) -> None:
        curl = ("curl", "-sS", "--noproxy", "*", "--connect-timeout", "3", "--max-time", "5")
        try:
            answer = self.lb.mh.client.run(*curl, f"http://{self.lb.vip}/", timeout=10)
        except CommandError as exc:
            # curl: 7 could not connect; 28 with "Connection timed out" is the connect phase.
            connecting = exc.returncode == 7 or "Connection timed out" in exc.stderr
            self.refused += connecting
            self.broken += not connecting
            return
        self.answers += answer.strip() == "web"


def test_warm_standby_serves_only_from_the_active_host(multihost, make):
    lb, agents = pushed(make)
    wait_until(lambda: lb.bound_to() == chassis(multihost, "gw-1"), 15, "the port bound on gw-1")
    assert multihost.central.nbctl("get", "Logical_Switch_Port", lb.lsp, "options:requested-chassis").strip() == (
        chassis(multihost, "gw-1")
    )
    assert lb.serves()
    standby = agents["gw-2"].lb(lb.id)
    # Built completely, its port carrying the iface-id, but not bound: ovn-controller left it alone.
    assert standby["state"] == "ready" and standby["ovn_installed"] is False
    iface = multihost.host("gw-2").vsctl("get", "Interface", standby["ovs_port"], "external_ids:iface-id")
    assert iface.strip().strip('"') == lb.lsp
    assert standby["netns"] in multihost.host("gw-2").netns_list()
    assert agents["gw-1"].lb(lb.id)["ovn_installed"] is True
    lease = lb.lease()
    assert lease["lbagent:holder"] == "gw-1" and lease["lbagent:term"] == "1"
    status = agents["gw-1"].status()["agent"]["ha"]
    assert status["in_contact"] is True and status["chassis"] == chassis(multihost, "gw-1")
    shown = agents["gw-2"].cli("status").stdout
    assert "standby" in shown


def test_a_crashed_active_host_fails_over_to_the_standby(multihost, make):
    lb, agents = pushed(make)
    wait_until(lb.serves, 15, "the VIP to answer through gw-1")
    killed = time.monotonic()
    multihost.host("gw-1").crash()
    wait_until(lambda: lb.bound_to() == chassis(multihost, "gw-2"), 15, "the binding to move to gw-2")
    wait_until(lb.serves, 15, "the VIP to answer through gw-2")
    print(f"failover: first answer through the standby {time.monotonic() - killed:.2f}s after the crash")
    ha = agents["gw-2"].ha(lb.id)
    assert (ha["role"], ha["active_host"], ha["term"]) == ("active", "gw-2", 2)
    assert ha["last_failover_s"] >= LEASE
    metrics = agents["gw-2"].request("GET", "/metrics")[1]
    assert "lbagent_ha_failovers_total 1.0" in metrics
    # The crashed host comes back as a standby: no preempt, nothing moves back.
    multihost.host("gw-1").revive()
    agents["gw-1"].start()
    wait_roles(lb, agents, active="gw-2")
    assert lb.bound_to() == chassis(multihost, "gw-2") and lb.serves()


def test_a_restart_of_the_active_agent_moves_nothing(multihost, make):
    lb, agents = pushed(make)
    wait_until(lb.serves, 15, "the VIP to answer")
    with Watcher(lb) as watcher:
        agents["gw-1"].stop()
        assert lb.lease().get("lbagent:grace") == "30"
        agents["gw-1"].start()
        wait_until(lambda: "lbagent:grace" not in lb.lease(), 15, "the restarted agent to renew")
        wait_roles(lb, agents, active="gw-1")
    assert watcher.bindings == [chassis(multihost, "gw-1")]
    assert (watcher.refused, watcher.broken) == (0, 0) and watcher.answers > 0
    assert lb.lease()["lbagent:term"] == "1"


def test_a_newer_term_makes_the_old_active_step_down(multihost, make):
    lb, agents = pushed(make)
    lease = lb.lease()
    term = int(lease["lbagent:term"]) + 1
    multihost.central.nbctl(
        "set",
        "Logical_Switch_Port",
        lb.lsp,
        f'external_ids:"lbagent:term"="{term}"',
        'external_ids:"lbagent:holder"="gw-2"',
        f"options:requested-chassis={chassis(multihost, 'gw-2')}",
    )
    wait_roles(lb, agents, active="gw-2")
    wait_until(lambda: lb.bound_to() == chassis(multihost, "gw-2"), 15, "the binding on gw-2")
    wait_until(lb.serves, 15, "the VIP through gw-2")
    beat = int(lb.lease().get("lbagent:beat", 0))
    wait_until(lambda: int(lb.lease().get("lbagent:beat", 0)) > beat + 2, 10, "gw-2 to beat on its port")
    assert lb.lease()["lbagent:holder"] == "gw-2"


def test_a_planned_handover_moves_the_lease_without_a_failed_request(multihost, make):
    lb, agents = pushed(make)
    wait_until(lb.serves, 15, "the VIP to answer")
    with Watcher(lb) as watcher:
        done = agents["gw-1"].cli("ha", "handover", lb.id)
        assert done.stdout.strip() == f"{lb.id}: handed_over (active: gw-2)"
        wait_until(lambda: lb.bound_to() == chassis(multihost, "gw-2"), 15, "the binding on gw-2")
        wait_until(lb.serves, 15, "the VIP through gw-2")
    print(f"handover: {watcher.answers} answers, {watcher.refused} refused, {watcher.broken} broken in flight")
    assert watcher.refused == 0  # no new connection fails
    assert watcher.broken <= 1  # at most the one in flight when the binding moved
    assert watcher.bindings == [chassis(multihost, "gw-1"), chassis(multihost, "gw-2")]  # one move
    assert lb.bound_to() == chassis(multihost, "gw-2")
    assert agents["gw-2"].ha(lb.id)["term"] == 2
    again = agents["gw-1"].cli("ha", "handover", lb.id)
    assert again.stdout.strip() == f"{lb.id}: not_active (active: gw-2)"


def test_removing_a_host_tears_its_copy_down_and_leaves_the_active_one_alone(multihost, make):
    lb, agents = pushed(make)
    standby = agents["gw-2"].lb(lb.id)
    lease = lb.lease()
    with Watcher(lb) as watcher:
        # The region controller takes gw-2 out: it stops pushing the load balancer there.
        code, answer = agents["gw-2"].refresh(lb.body(present=False), wait=WAIT)
        assert code == 200, answer
        wait_until(
            lambda: standby["netns"] not in multihost.host("gw-2").netns_list(), 30, "gw-2's copy to be torn down"
        )
    ports = multihost.host("gw-2").vsctl("--bare", "--columns=name", "list", "Interface").split()
    assert standby["ovs_port"] not in ports
    assert (watcher.refused, watcher.broken) == (0, 0) and watcher.bindings == [chassis(multihost, "gw-1")]
    assert lb.lease()["lbagent:term"] == lease["lbagent:term"]
    assert lb.lease()["lbagent:holder"] == "gw-1"


def test_ha_needs_this_host_in_its_list(multihost):
    # (An agent without [ovn] nb refuses `ha` too: test_ha_single_host.py, on the single-host sandbox.)
    lb = Lb(multihost, 90, GATEWAYS)
    try:
        outsider = HostAgent(multihost, multihost.host("cl")).start()
        try:
            code, answer = outsider.refresh(lb.body(), wait=None)
            assert code == 400
            assert answer["details"][0]["path"] == "/loadbalancers/0/ha/hosts"
            assert outsider.status()["agent"]["generation"] is None  # nothing was applied
        finally:
            outsider.destroy()
    finally:
        lb.remove()


def test_preempt_brings_the_load_balancer_back_to_the_preferred_host(multihost, make):
    lb, agents = pushed(make, preempt=True)
    multihost.host("gw-1").crash()
    wait_until(lambda: lb.bound_to() == chassis(multihost, "gw-2"), 15, "the binding to move to gw-2")
    multihost.host("gw-1").revive()
    agents["gw-1"].start()
    # Back and built, the preferred host takes its load balancer back, and it serves from there.
    wait_roles(lb, agents, active="gw-1", timeout=60)
    wait_until(lambda: lb.bound_to() == chassis(multihost, "gw-1"), 15, "the binding back on gw-1")
    wait_until(lb.serves, 15, "the VIP through gw-1 again")
    assert int(lb.lease()["lbagent:term"]) == 3


def test_a_partitioned_active_host_loses_its_load_balancer_and_steps_down_when_healed(multihost, make):
    lb, agents = pushed(make)
    wait_until(lb.serves, 15, "the VIP to answer through gw-1")
    with Watcher(lb) as watcher:
        multihost.host("gw-1").cut_underlay()  # off the central and the other hosts
        wait_until(lambda: role_of(agents["gw-2"], lb) == "active", 15, "gw-2 to take the lease")
        wait_until(lb.serves, 15, "the VIP through gw-2")
        # Cut off, gw-1 cannot tell: it keeps serving as it was, and says so once it notices.
        try:
            wait_until(lambda: role_of(agents["gw-1"], lb) == "unknown", 30, "gw-1 to notice it is out of contact")
        except TimeoutError:
            raise AssertionError(agents["gw-1"].log()[-6000:]) from None
        assert agents["gw-1"].status()["agent"]["ha"]["in_contact"] is False
        multihost.host("gw-1").heal_underlay()
        wait_roles(lb, agents, active="gw-2", timeout=60)
    assert watcher.bindings == [chassis(multihost, "gw-1"), chassis(multihost, "gw-2")]  # one move, no flapping
    assert lb.lease()["lbagent:holder"] == "gw-2"


def test_the_active_host_taken_out_offers_its_load_balancer_on_at_once(multihost, make):
    lb, agents = pushed(make)
    started = time.monotonic()
    code, answer = agents["gw-1"].refresh(lb.body(present=False), wait=WAIT)
    assert code == 200, answer
    wait_until(lambda: role_of(agents["gw-2"], lb) == "active", 15, "gw-2 to take the offered lease")
    taken = time.monotonic() - started
    wait_until(lb.serves, 15, "the VIP through gw-2")
    # Offered as gw-1 went, not waited out: the handover is on record, not a silent holder.
    assert agents["gw-2"].ha(lb.id)["last_failover_s"] is None
    assert "lbagent_ha_failovers_total 0.0" in agents["gw-2"].request("GET", "/metrics")[1]
    print(f"taken out: gw-2 active {taken:.2f}s after the refresh that removed it from gw-1")


def test_a_host_shutting_down_is_taken_over_without_waiting_for_the_grace(multihost, make):
    lb, agents = pushed(make)
    wait_until(lb.serves, 15, "the VIP to answer through gw-1")
    agents["gw-1"].stop()  # the agent goes first and asks for its 30 s of grace
    assert lb.lease().get("lbagent:grace") == "30"
    stopped = time.monotonic()
    multihost.host("gw-1").appctl("ovn-controller", "exit")  # then ovn-controller, as a shutdown does
    wait_until(lambda: role_of(agents["gw-2"], lb) == "active", 15, "gw-2 to take over before the grace ends")
    assert time.monotonic() - stopped < 15
    wait_until(lb.serves, 15, "the VIP through gw-2")
    multihost.host("gw-1").crash()  # the rest of the shutdown; then the host boots again
    multihost.host("gw-1").revive()
