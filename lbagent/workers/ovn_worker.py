"""`OvnWorker`: this host's load balancers, their allocations and their passes.

It owns the accepted desired state, the allocations (address pairs, interface
name salts, backend ports), one `LbTask` per load balancer, and what a pass
does for one of them (`reconcile`). Everything it allocates is persisted
before a refresh is acknowledged, so a restarted agent renumbers nothing.

Which load balancers a refresh wakes: those whose *own* inputs (their spec,
their allocation) changed, and new or deleted ones, through `requeue` (the
shared work queue's `loadbalancer/<id>` key, whose handler is `kick`). Those
whose only change is a *dependency* (their subnet, the pods their groups
select) are left to the subnet and pod controllers, which the refresh updates
in the same step (`on_accept`) and which call `dependency_changed`; until
then such a load balancer stays behind the new generation, so a waiting
refresh keeps waiting. The periodic resync of every task is the safety net.

A load balancer whose members (backends and selected pods) outnumber the
backend ports of INNER keeps the ports it had, and its passes fail, saying
so, until a refresh brings it back within them: the refresh and every other
load balancer go on.

When a pass succeeds, `readiness.ReadinessWatch` decides whether the load
balancer is `ready` or still `pending` (its port not ovn-installed, haproxy
not running).
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass, replace

from lbagent.config import DEFAULT_INNER_PREFIX6, DEFAULT_RESYNC_RATE
from lbagent.desired.budget import MAX_SERVERS_PER_LB, ServerBudgetExceeded, servers_in
from lbagent.desired.ha import HighAvailability
from lbagent.desired.model import DesiredState, LoadBalancer
from lbagent.errors import LbAgentError, StaleGeneration
from lbagent.haproxy.handoff import HaproxyHandoff
from lbagent.haproxy.render import HaproxyConfig, render_config
from lbagent.metrics import RESYNC_CHECKS, writes_so_far
from lbagent.naming import interface_names, lb_id_from_netns, netns_name
from lbagent.ovnhost.host import HostLook, HostObservation, OvnHost
from lbagent.ovnhost.inventory import Inventory
from lbagent.state import Allocation, PersistedState, StateStore, desired_json
from lbagent.support.blocking import BlockingPool
from lbagent.support.coalesce import Coalescer
from lbagent.support.turns import in_turns
from lbagent.workers import connlog, plan
from lbagent.workers.allocator import AddressPair, ExhaustedError, PairAllocator, assign_ports, inner_prefix6_space
from lbagent.workers.lb_task import DONE, LbTask
from lbagent.workers.memo import IdentityMemo, digest, same_models
from lbagent.workers.readiness import ReadinessWatch
from lbagent.workers.traffic_probes import ProbeTarget, TrafficProbes

log = logging.getLogger(__name__)

# Load balancers whose host side is being converged at once. Each pass mostly
# waits on the namespace, iptables and OVSDB threads. With 128, a burst of 100
# goes as one wave whose ports, checks and reload are each one batch; with 32
# it went as four, each with its own port transaction and reload (P1 at N=100,
# nine interleaved pairs each: median 2.5x the floor against 2.9x; at N=1,000
# no worse). A thousand at once would finish all together at the very end
# instead of steadily. A slot is held for the host work only: haproxy checks
# the candidate meanwhile, even while the pass waits for its slot, and
# reloads after it.
PASS_SLOTS = 128
MAX_TEARDOWNS_SAVED = 4096  # teardowns one save of the state file stands for


class ReconcileError(LbAgentError):
    """A failed pass, remembering which generation it was for."""

    def __init__(self, generation: int, cause: BaseException):
        super().__init__(str(cause) or type(cause).__name__)
        self.generation = generation


@dataclass(slots=True)
class LbRuntime:
    """What the last pass of one load balancer observed, and which inputs it had."""

    observation: HostObservation | None = None
    own: str | None = None  # fingerprint of its own inputs at the last successful pass
    deps: str | None = None  # of its dependencies at the last successful pass
    running_deps: str | None = None  # of its dependencies at the start of the pass running now
    wanted: tuple[str, str] | None = None  # (own, deps) fingerprints of the last accepted state
    look: HostLook | None = None  # what a look needs of what the host part of its last pass converged
    unhealthy: dict[str, set[str]] | None = None  # the UDP members that pass left out
    # `OvnHost.snapshot` as a resync read it before a whole pass that then left it
    # the same: a resync that reads it again, inputs unchanged, stops there.
    baseline: bytes | None = None


class OvnWorker(ReadinessWatch):
    def __init__(
        self,
        host: OvnHost,
        haproxy,
        store: StateStore,
        resync_interval: float,
        resync_rate: float = DEFAULT_RESYNC_RATE,
        udp_health=None,
        connection_logs=None,
        requeue: Callable[[str], None] | None = None,
        inner_prefix6: str = DEFAULT_INNER_PREFIX6,
    ):
        self._host = host
        self._inner_prefix6 = inner_prefix6
        # How a load balancer whose own inputs changed gets its pass: the agent
        # queues its key (handled by `kick`); alone, the worker kicks it itself.
        self._requeue = requeue or self.kick
        # Called with every accepted desired state, under the lock and in the
        # same step that switches to it: the sibling controllers miss no change.
        self.on_accept: list[Callable[[DesiredState], None]] = []
        self.udp_health = udp_health  # UdpHealthChecker, or None: UDP members are then always live
        self.connection_logs = connection_logs  # ConnectionLogs, or None: no connection lines from conntrack
        self._store = store
        self._resync = resync_interval
        self._resync_rate = resync_rate
        self._derived = IdentityMemo()  # what is derived from the models of one load balancer
        self._lock = asyncio.Lock()
        self._pass_slots = asyncio.Semaphore(PASS_SLOTS)
        # Rendering is pure Python: one thread, not the default pool the state's saves use.
        self._renders = BlockingPool("render", 1)
        self._saves = Coalescer("state-saves", self._save_state, self._save_state_alone, OSError, MAX_TEARDOWNS_SAVED)
        self._handoff = HaproxyHandoff(haproxy)
        self._haproxy = haproxy
        self._haproxy_up = True  # as last seen by the readiness watch
        self._haproxy_starts: int | None = None  # masters started, as last seen by the readiness watch
        self._waiting_for_ovn: set[str] = set()  # passed load balancers whose port is not installed yet
        self.traffic: TrafficProbes | None = None
        self.ha_role: Callable[[str], str | None] = lambda lb_id: None
        self._ha_specs: tuple[DesiredState | None, dict] = (None, {})
        self._notifying: set[asyncio.Task] = set()
        # Our installed OVS ports, read now (the agent sets it); None: only passes observe them.
        self.installed_ports: Callable[[Collection[str]], Awaitable[set[str]]] | None = None
        self._changed = asyncio.Condition()
        self.desired: DesiredState | None = None
        self._desired_text: str | None = None  # the accepted body's JSON text, what the state file keeps
        self.allocations: dict[str, Allocation] = {}
        # Load balancers whose members did not all get a port, and why: their passes fail with it.
        self.port_shortages: dict[str, str] = {}
        self.tasks: dict[str, LbTask] = {}
        self.runtime: dict[str, LbRuntime] = {}
        self._netdev: bool | None = None

    # --- accepting desired state -------------------------------------------

    @property
    def generation(self) -> int | None:
        return self.desired.generation if self.desired else None

    async def resume(self, persisted: PersistedState, desired: DesiredState | None) -> None:
        """Start from what the state file and the host say, and converge to the
        persisted desired state (a complete one) if there is one."""
        self.allocations = {k: self._inside_prefix6(k, a) for k, a in persisted.allocations.items()}
        await self.adopt_from_host()
        if desired is not None:
            async with self._lock:
                self.allocations, self.port_shortages = await self._allocate(desired, frozenset())
                self._desired_text = await asyncio.to_thread(desired_json, persisted.desired)
                self.desired = desired
                self._accept(desired, frozenset())

    def _inside_prefix6(self, lb_id: str, allocation: Allocation) -> Allocation:
        """The allocation, without its IPv6 pair if that lies outside inner_prefix6
        (the prefix was changed): the next allocation gives it one inside."""
        if allocation.inner6 is None:
            return allocation
        prefix = ipaddress.IPv6Network(self._inner_prefix6)
        if ipaddress.IPv6Address(allocation.inner6) in prefix and ipaddress.IPv6Address(allocation.outer6) in prefix:
            return allocation
        log.info("lb=%s action=renumber inner6=%s prefix=%s", lb_id, allocation.inner6, prefix)
        return replace(allocation, inner6=None, outer6=None)

    async def adopt_from_host(self, max_salt: int = 16) -> list[str]:
        """Allocations of load balancers whose namespaces exist but which the
        state file does not know (it was lost or corrupt): read back from the
        kernel, so a later refresh renumbers nothing."""
        adopted = []
        inventory = await self._host.inventory()
        for netns in sorted(inventory.netns):
            lb_id = lb_id_from_netns(netns)
            if not lb_id or lb_id in self.allocations:
                continue
            found = await self._host.read_allocation(lb_id)
            if found is None:
                continue
            tag, inner, outer, ports, pair6 = found
            salt = next((n for n in range(max_salt) if interface_names(lb_id, n).tag == tag), None)
            if salt is None:
                continue
            inner6, outer6 = pair6 if pair6 is not None else (None, None)
            allocation = Allocation(inner, outer, salt, ports, inner6=inner6, outer6=outer6)
            self.allocations[lb_id] = self._inside_prefix6(lb_id, allocation)
            adopted.append(lb_id)
            log.info("lb=%s action=adopt inner=%s outer=%s ports=%d", lb_id, inner, outer, len(ports))
        return adopted

    async def apply(self, desired: DesiredState, raw: dict, raw_text: str | None = None) -> int:
        """Accept a complete desired state: allocate, persist, then start converging.
        `raw` is the body as decoded, `raw_text` the JSON text it came as (if known)."""
        async with self._lock:
            current = self.generation
            if current is not None and desired.generation < current:
                raise StaleGeneration(desired.generation, current)
            unchanged = self._unchanged(desired)
            allocations, shortages = await self._allocate(desired, unchanged)
            text = raw_text if raw_text is not None else await asyncio.to_thread(desired_json, raw)
            await asyncio.to_thread(self._store.save, PersistedState(allocations=allocations, desired_text=text))
            self.port_shortages = shortages
            self.allocations, self.desired, self._desired_text = allocations, desired, text
            await self._fingerprint(desired, unchanged)
            self._accept(desired, unchanged)
            return desired.generation

    def _unchanged(self, desired: DesiredState) -> frozenset[str]:
        """The load balancers of `desired` that are the very models of the state
        before, in a state whose subnets and pods are the very same too: all the
        last refresh derived for them still holds. With a thousand load
        balancers, deriving it again for each took 10 ms of every refresh."""
        previous = self.desired
        if previous is None or not (
            same_models(previous.subnets, desired.subnets) and same_models(previous.pods, desired.pods)
        ):
            return frozenset()
        before = {id(lb) for lb in previous.loadbalancers}
        return frozenset(lb.id for lb in desired.loadbalancers if id(lb) in before)

    async def _allocate(
        self, desired: DesiredState, unchanged: frozenset[str]
    ) -> tuple[dict[str, Allocation], dict[str, str]]:
        """The allocations of `desired`, and the load balancers whose members
        did not all get a port (which keep the ports they had)."""
        allocations = dict(self.allocations)
        shortages = {k: v for k, v in self.port_shortages.items() if k in unchanged}
        new = [lb for lb in desired.loadbalancers if lb.id not in allocations]
        # Files written before there were IPv6 pairs, or with a pair outside the prefix now.
        without6 = [lb for lb in desired.loadbalancers if lb.id in allocations and allocations[lb.id].inner6 is None]
        if new or without6:
            host_addresses = await self._host.host_addresses()
            pairs6 = PairAllocator(
                {k: AddressPair(a.inner6, a.outer6) for k, a in allocations.items() if a.inner6 and a.outer6},
                inner_prefix6_space(self._inner_prefix6),
            )
        if new:
            pairs = PairAllocator({k: AddressPair(a.inner, a.outer) for k, a in allocations.items()})
            used_tags = {interface_names(k, a.salt).tag for k, a in allocations.items()}
            async for lb in in_turns(new):
                pair, pair6 = pairs.allocate(lb.id, host_addresses), pairs6.allocate(lb.id, host_addresses)
                salt = self._free_salt(lb.id, used_tags)
                used_tags.add(interface_names(lb.id, salt).tag)
                allocations[lb.id] = Allocation(pair.inner, pair.outer, salt, inner6=pair6.inner, outer6=pair6.outer)
        for lb in without6:
            pair6 = pairs6.allocate(lb.id, host_addresses)
            allocations[lb.id] = replace(allocations[lb.id], inner6=pair6.inner, outer6=pair6.outer)
        # The unchanged have the same members as before, so the same ports.
        async for lb in in_turns(_changed(desired, unchanged)):
            old = allocations[lb.id]
            targets = self._targets(lb, desired.pods)
            try:
                ports = self._derived.get(
                    ("ports", lb.id),
                    (targets, old),
                    functools.partial(_ports_for, old.ports, targets),
                )
            except ExhaustedError as exc:
                shortages[lb.id] = str(exc)
                log.warning("lb=%s action=allocate_ports result=error error=%r", lb.id, str(exc))
                continue
            if ports != old.ports:
                allocations[lb.id] = replace(old, ports=ports)
        return allocations, shortages

    @staticmethod
    def _free_salt(lb_id: str, used_tags: set[str]) -> int:
        """The first salt whose interface-name tag no other load balancer has."""
        salt = 0
        while interface_names(lb_id, salt).tag in used_tags:
            salt += 1
        return salt

    async def _fingerprint(self, desired: DesiredState, unchanged: frozenset[str]) -> None:
        """Derive the fingerprints `_sync_tasks` compares, of the load balancers
        whose inputs changed, in turns: for a thousand new ones that is a third
        of a second of work, which `_sync_tasks` then finds done."""
        async for lb in in_turns(_changed(desired, unchanged)):
            self._own_fingerprint(lb.id)
            self._deps_fingerprint(lb.id)

    def _accept(self, desired: DesiredState, unchanged: frozenset[str]) -> None:
        """`desired` has just become `self.desired`."""
        self._sync_tasks(desired, unchanged)
        for accept in self.on_accept:
            accept(desired)

    def _sync_tasks(self, desired: DesiredState, unchanged: frozenset[str]) -> None:
        """Queue the load balancers that are new, deleted or whose own inputs
        changed; move the unchanged ones to the new generation without a pass.
        The fingerprints of those in `unchanged` are the last refresh's."""
        wanted = {lb.id for lb in desired.loadbalancers}
        for lb_id in wanted:
            task, runtime = self.tasks.get(lb_id), self.runtime.get(lb_id)
            if runtime is None or runtime.wanted is None or lb_id not in unchanged:
                runtime = self.runtime[lb_id] = runtime or LbRuntime()
                runtime.wanted = (self._own_fingerprint(lb_id), self._deps_fingerprint(lb_id))
            own, deps = runtime.wanted
            if task is None:
                task = self.tasks[lb_id] = LbTask(
                    lb_id, self.reconcile, self._pass_done, self.resync_interval, readiness=self.readiness
                )
                self._requeue(lb_id)  # its first kick starts it
            elif not task.passed or task.deleting or runtime.own != own:
                # Changed, or with no successful pass to stand on (failed, pending, being deleted).
                task.deleting = False
                self._requeue(lb_id)
            elif runtime.deps == deps:
                # Converged and nothing it uses changed: drift is the periodic resync's business.
                task.generation = task.attempted_generation = desired.generation
            # else only a dependency changed: its controller's handler calls dependency_changed.
        for lb_id, task in self.tasks.items():
            if lb_id not in wanted and not task.deleting:
                task.deleting = True
                task.state = "deleting"
                self._requeue(lb_id)

    # What follows is derived once per set of input objects: RefreshParser
    # reuses the models of unchanged entries, so a refresh that changes one
    # load balancer of a thousand recomputes one load balancer's worth.

    def _own_fingerprint(self, lb_id: str) -> str:
        """A load balancer's own inputs: its desired state and its allocation
        (whose backend ports follow the pods its groups select), or the lack
        of ports that keeps it from one."""
        lb, allocation = self._state().loadbalancer(lb_id), self.allocations[lb_id]
        shortage = self.port_shortages.get(lb_id)
        return self._derived.get(
            ("own", lb_id),
            (lb, allocation, shortage),
            lambda: digest(json.dumps([lb.canonical_json, allocation.json_text, *([shortage] if shortage else [])])),
        )

    def _deps_fingerprint(self, lb_id: str) -> str:
        """What a load balancer uses of others: its subnet and its groups' pod targets."""
        lb = self._state().loadbalancer(lb_id)
        subnet, targets = self._subnet_json(lb.network.subnet_id), self._targets(lb, self._state().pods)
        return self._derived.get(
            ("deps", lb_id),
            (subnet, targets),
            lambda: digest(
                json.dumps([subnet, {g: [t.values() for t in ts] for g, ts in targets.items()}], sort_keys=True)
            ),
        )

    def _subnet_json(self, subnet_id: str) -> dict:
        """The subnet as JSON: one per subnet object, not one per load balancer on it."""
        subnet = self._state().subnet(subnet_id)
        return self._derived.get(("subnet", subnet_id), (subnet,), lambda: subnet.model_dump(mode="json"))

    def _targets(self, lb: LoadBalancer, pods: list) -> dict[str, list[plan.Target]]:
        """The groups' members before ports; the pods matter only to a load balancer that selects some."""
        selects = any(group.pod_selector is not None for group in lb.backend_groups)
        return self._derived.get(
            ("targets", lb.id), (lb, pods if selects else None), lambda: plan.group_targets(lb, pods)
        )

    def dependency_changed(self, lb_id: str) -> None:
        """A subnet or pod this load balancer uses changed: kick it, unless a pass
        that sees the change already finished or is running (a refresh that also
        changed its own inputs has kicked it)."""
        task, runtime, lb = self.tasks.get(lb_id), self.runtime.get(lb_id), self._lb(lb_id)
        if task is None or runtime is None or lb is None:
            return  # gone, or going: its own key handles it
        deps = self._deps_fingerprint(lb_id)
        if (task.passed and deps == runtime.deps) or deps == runtime.running_deps:
            return
        task.kick()

    # --- readiness -------------------------------------------------------------

    def haproxy_changes_coming(self) -> bool:
        """Some pass has yet to hand its haproxy change over."""
        return self._handoff.coming()

    def state_of(self, lb_id: str) -> str | None:
        task = self.tasks.get(lb_id)
        return task.state if task is not None else None

    def ha_loadbalancers(self) -> dict[str, HighAvailability]:
        """Load balancer id -> its `ha`, for those that have one (derived once per state)."""
        desired = self.desired
        if self._ha_specs[0] is not desired:
            found = {lb.id: lb.ha for lb in desired.loadbalancers if lb.ha is not None} if desired else {}
            self._ha_specs = (desired, found)
        return self._ha_specs[1]

    def members(self, lb: LoadBalancer) -> dict[str, list]:
        """The groups' members with their ports; none while some lack a port."""
        if lb.id in self.port_shortages:
            return {}
        # Each status document asks for every load balancer's: derived once per inputs.
        targets, ports = self._targets(lb, self._state().pods), self.allocations[lb.id].ports
        return self._derived.get(("members", lb.id), (targets, ports), lambda: plan.members_by_group(targets, ports))

    def _state(self) -> DesiredState:
        """The accepted desired state, for what only its load balancers have
        (fingerprints, members, passes): there is one whenever they exist."""
        if self.desired is None:
            raise LbAgentError("no desired state accepted yet")
        return self.desired

    def _lb(self, lb_id: str) -> LoadBalancer | None:
        if self.desired is None:
            return None
        try:
            return self.desired.loadbalancer(lb_id)
        except KeyError:
            return None

    desired_loadbalancer = _lb  # the accepted model of one load balancer, None if it is not wanted

    def _probe_target(self, lb_id: str) -> ProbeTarget | None:
        """Where its traffic probe goes from and to (None: it is going, or has no address pair)."""
        lb, allocation = self._lb(lb_id), self.allocations.get(lb_id)
        if lb is None or allocation is None or self.desired is None:
            return None
        gateway = self.desired.subnet(lb.network.subnet_id).gateway  # validated: the subnet exists
        ifname = interface_names(lb_id, allocation.salt).ovn_ns
        return ProbeTarget(netns_name(lb_id), ifname, lb.network.mac, lb.network.ip, str(gateway))

    # --- one pass ------------------------------------------------------------

    async def reconcile(self, lb_id: str, resync: bool = False) -> int:
        """One pass; `resync`: the periodic one of a load balancer whose last pass
        succeeded (nothing asked for it), which may stop after its first look."""
        generation = self._state().generation
        lb = self._lb(lb_id)
        try:
            if lb is None:
                if await self._teardown(lb_id):
                    return DONE
                # Added again while it was being torn down (_teardown saw it, under the lock).
                lb = self._state().loadbalancer(lb_id)
            runtime = self.runtime[lb_id]
            own, runtime.running_deps = self._own_fingerprint(lb_id), self._deps_fingerprint(lb_id)
            if lb.enabled and lb_id in self.port_shortages:
                raise ExhaustedError(self.port_shortages[lb_id])
            if lb.enabled:
                inputs_kept = (own, runtime.running_deps) == (runtime.own, runtime.deps) and (
                    self._unhealthy(lb.id) == runtime.unhealthy
                )
                await self._converge(lb, resync and inputs_kept)
            else:
                await self._remove_data_path(lb_id)
                runtime.observation = None
            runtime.own, runtime.deps = own, runtime.running_deps
            return generation
        except Exception as exc:
            raise ReconcileError(generation, exc) from exc
        finally:
            if lb_id in self.runtime:
                self.runtime[lb_id].running_deps = None

    async def _converge(self, lb: LoadBalancer, resync: bool) -> None:
        """`resync`: the inputs are those of the last successful pass, and nothing
        asked for this one. It first reads the load balancer's data path at once
        (`OvnHost.snapshot`): the same as after a pass that found nothing to
        change, it stops there. Otherwise the whole pass runs, and if it leaves
        the data path as that first look found it, that look becomes the
        baseline: taken before the pass, it holds nothing the pass did not see."""
        runtime = self.runtime[lb.id]
        before = await self._snapshot(lb.id) if resync else None
        if before is not None:
            unchanged = before == runtime.baseline
            RESYNC_CHECKS.labels("unchanged" if unchanged else "changed").inc()
            if unchanged:
                # Its one piece outside the data path: a subscription that failed is tried again.
                await self._sync_connection_logs(lb)
                return
        runtime.baseline = None
        writes = writes_so_far()
        await self._converge_fully(lb)
        # Also no write meanwhile, by any pass: a repair that someone undid
        # before the second look would otherwise make their state the baseline.
        after = await self._snapshot(lb.id) if before is not None else None
        if after is not None and after == before and writes_so_far() == writes:
            runtime.baseline = before

    async def _snapshot(self, lb_id: str) -> bytes | None:
        """`OvnHost.snapshot` of the load balancer's last pass; None if there is
        none or the look failed (the whole pass then finds out why)."""
        look = self.runtime[lb_id].look
        if look is None:
            return None
        try:
            return await self._host.snapshot(look, functools.partial(self._haproxy.disk_stamp, lb_id))
        except (LbAgentError, OSError) as exc:  # the whole job failed
            log.debug("lb=%s action=snapshot result=error error=%r", lb_id, str(exc))
            return None

    async def _converge_fully(self, lb: LoadBalancer) -> None:
        members = self.members(lb)
        servers = servers_in(lb, {group_id: len(group) for group_id, group in members.items()})
        if servers > MAX_SERVERS_PER_LB:  # its pods grew past it: only this one fails
            raise ServerBudgetExceeded(servers, MAX_SERVERS_PER_LB)
        config = await self._config(lb, members)
        if await self._handoff.converge(lb.id, config, functools.partial(self._converge_host, lb, members)):
            log.info("lb=%s object=haproxy action=reload", lb.id)

    async def _config(self, lb: LoadBalancer, members: dict[str, list]) -> HaproxyConfig:
        """Rendered for each whole pass, which a converged load balancer's resyncs
        do not run: kept between passes, the texts (and the certificates of
        https listeners) of every load balancer would be held for the few
        passes that find drift with unchanged inputs."""
        allocation = self.allocations[lb.id]
        # On a thread: a load balancer at the server budget renders for tens
        # of milliseconds, which the event loop must not stand still for.
        pair6 = {"outer6": allocation.outer6 or "", "inner6": allocation.inner6 or ""} if lb.network.ip6 else {}
        return await self._renders.run(render_config, lb, allocation.outer, members, inner=allocation.inner, **pair6)

    async def _converge_host(self, lb: LoadBalancer, members: dict[str, list]) -> None:
        # The slots bound the host work only: haproxy checks candidates in bulk
        # and batches their reload, and a check must not hold up the next pass.
        async with self._pass_slots:
            await self._converge_host_part(lb, members)

    async def _converge_host_part(self, lb: LoadBalancer, members: dict[str, list]) -> None:
        allocation = self.allocations[lb.id]
        subnet = self._state().subnet(lb.network.subnet_id)
        if self._netdev is None:
            self._netdev = await self._host.bridge_is_netdev()
        if self.udp_health is not None:
            self.udp_health.sync(
                lb.id,
                netns_name(lb.id),
                [
                    (ls.id, ls.health_check, members.get(ls.backend_group_id, []))
                    for ls in plan.udp_listeners(lb)
                    if ls.health_check is not None
                ],
            )
        unhealthy = self._unhealthy(lb.id)
        spec = plan.host_spec(lb, subnet, allocation, members, self._netdev, unhealthy)
        self.runtime[lb.id].look, self.runtime[lb.id].unhealthy = spec.look(), unhealthy
        self.runtime[lb.id].observation = await self._host.converge(spec)
        await self._sync_connection_logs(lb)  # after converge: the namespace exists

    def _unhealthy(self, lb_id: str) -> dict[str, set[str]]:
        """The UDP members health checks have taken out, by listener (a pass's input
        that no fingerprint holds: a change of it kicks the pass)."""
        return self.udp_health.unhealthy(lb_id) if self.udp_health is not None else {}

    async def _sync_connection_logs(self, lb: LoadBalancer) -> None:
        if self.connection_logs is not None:
            await self.connection_logs.sync(lb.id, netns_name(lb.id), lb.network.ip, connlog.logged_listeners(lb))

    def resync_interval(self) -> float:
        """Seconds between two resync passes of one load balancer: the configured
        interval, stretched so that all of them together take at most
        `resync_rate` passes a second. A converged pass writes nothing but still
        reads every piece of its data path; with thousands of load balancers,
        checking each every 30 s would cost a large part of a core."""
        return max(self._resync, len(self.tasks) / self._resync_rate)

    def kick(self, lb_id: str) -> None:
        """Reconcile one load balancer now (the handler of its queue key; UDP health changes)."""
        task = self.tasks.get(lb_id)
        if task is not None:
            task.kick()

    async def _remove_data_path(self, lb_id: str) -> None:
        allocation = self.allocations.get(lb_id)
        if self.udp_health is not None:
            self.udp_health.forget(lb_id)
        if self.connection_logs is not None:  # its socket would keep the namespace alive
            self.connection_logs.forget(lb_id)
        await self._handoff.remove(lb_id)
        if allocation is not None:
            async with self._pass_slots:
                names = interface_names(lb_id, allocation.salt)
                await self._host.remove(lb_id, netns_name(lb_id), names, allocation.outer, allocation.outer6)

    async def _teardown(self, lb_id: str) -> bool:
        await self._remove_data_path(lb_id)
        async with self._lock:
            if self._lb(lb_id) is not None:
                return False
            self.allocations.pop(lb_id, None)
            self.tasks.pop(lb_id, None)
            self.runtime.pop(lb_id, None)
            self._waiting_for_ovn.discard(lb_id)
            self._forget_traffic(lb_id)
            self._derived.forget(lb_id)
        await self._saves.submit(None)
        log.info("lb=%s action=deleted", lb_id)
        return True

    async def _save_state(self, teardowns: list[None]) -> list[None]:
        """Persist the allocations that are left, once for every teardown that
        ended meanwhile: 2,500 of them one save each, under the lock, took as
        long as the rest of their removal."""
        async with self._lock:  # never interleaved with apply's save of a newer state
            state = PersistedState(allocations=dict(self.allocations), desired_text=self._desired_text)
            await asyncio.to_thread(self._store.save, state)
        return [None] * len(teardowns)

    async def _save_state_alone(self, teardown: None) -> None:
        await self._save_state([teardown])

    def _reply_rule_sources(self) -> Iterator[str]:
        """The OUTER addresses whose reply rules are in use: each allocation's, and
        its OUTER6 while its load balancer has an IPv6 VIP or is being removed
        (a load balancer that lost its VIP6 leaves that rule to garbage collection)."""
        for lb_id, allocation in self.allocations.items():
            yield allocation.outer
            lb = self._lb(lb_id)
            if allocation.outer6 and (lb is None or lb.network.ip6 is not None):
                yield allocation.outer6

    def in_use(self) -> Inventory:
        """The marked objects that known load balancers (desired or being deleted) use."""
        ids = set(self.tasks) | set(self.allocations)
        names = [interface_names(i, self.allocations[i].salt if i in self.allocations else 0) for i in ids]
        return Inventory(
            netns=frozenset(netns_name(i) for i in ids),
            links=frozenset(n for ns in names for n in (ns.ovn_host, ns.haproxy_host)),
            ovs_ports=frozenset(ns.ovn_host for ns in names),
            haproxy=frozenset(ids),
            reply_rules=frozenset(self._reply_rule_sources()),
        )

    # --- waiting and shutdown ------------------------------------------------

    def _pass_done(self, task: LbTask) -> None:
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def settled(self, generation: int) -> bool:
        """Every load balancer reached `generation` and serves, or failed at it; deletions finished."""
        for task in self.tasks.values():
            if task.deleting or task.state == "pending":
                return False
            reached = task.attempted_generation is not None and task.attempted_generation >= generation
            if not reached:
                return False
        return True

    def first_pass_done(self) -> bool:
        return self.desired is not None and all(t.passes > 0 or t.deleting for t in self.tasks.values())

    async def wait_settled(self, generation: int, timeout: float) -> bool:
        async with self._changed:
            try:
                async with asyncio.timeout(timeout):
                    await self._changed.wait_for(lambda: self.settled(generation))
                return True
            except TimeoutError:
                return False

    async def stop(self) -> None:
        await asyncio.gather(*(task.stop() for task in list(self.tasks.values())))
        await self._handoff.stop()
        if self.udp_health is not None:
            await self.udp_health.stop()
        if self.connection_logs is not None:
            self.connection_logs.stop()
        self._renders.shutdown()


def _ports_for(ports: dict[str, int], targets: dict[str, list[plan.Target]]) -> dict[str, int]:
    """The backend port map of `targets`, keeping the ports of members that stay."""
    return assign_ports(ports, plan.member_keys(targets))


def _changed(desired: DesiredState, unchanged: frozenset[str]) -> list[LoadBalancer]:
    """The load balancers of `desired` whose inputs changed: a refresh that
    changes one of a thousand walks one, and gives the event loop no turns."""
    return [lb for lb in desired.loadbalancers if lb.id not in unchanged]
