"""`Agent`: wires configuration, OVS, namespaces, haproxy, the supervisor and the API.

It owns the start-up order (state first, then OVS, then haproxy, then the
shared work queue, then the load balancer tasks and the sibling controllers),
shutdown, which stops the agent's own tasks and threads but leaves the data
path serving, and the few facts the API and the metrics read (the status
documents are assembled from them by `lbagent.api.status`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from lbagent.config import Config
from lbagent.desired.ha import host_problems
from lbagent.desired.model import DesiredState, parse_desired_state
from lbagent.desired.own_prefix import own_prefix_problems
from lbagent.errors import InvalidDesiredState
from lbagent.haproxy.manager import HaproxyManager
from lbagent.haproxy.render import server_name
from lbagent.metrics import set_lb_states, set_vips, track_queue
from lbagent.naming import interface_names, netns_name
from lbagent.ovnhost.bridges import ProviderBridges
from lbagent.ovnhost.host import OvnHost
from lbagent.ovnhost.netns import NamespaceExecutor
from lbagent.ovnhost.northbound import NorthboundClient
from lbagent.ovnhost.ovs import OvsClient
from lbagent.state import PersistedState, StateFileError, StateStore, private_dir
from lbagent.support.blocking import BlockingPool
from lbagent.support.heap import TICK_INTERVAL, TRIM_INTERVAL, HeapKeeper
from lbagent.workers.connlog import ConnectionLogs
from lbagent.workers.controllers import requeue_loadbalancers, wire
from lbagent.workers.dispatch import LOADBALANCER, kind_of
from lbagent.workers.gc import GarbageCollector
from lbagent.workers.ha import HaKeeper, copy_state
from lbagent.workers.lb_task import LbTask
from lbagent.workers.lease import Timing
from lbagent.workers.linkwatch import LinkWatch
from lbagent.workers.neighbours import NeighbourCapacity
from lbagent.workers.ovn_worker import OvnWorker
from lbagent.workers.provider_networks import ProviderNetworkController
from lbagent.workers.queue import WorkQueue
from lbagent.workers.traffic_probes import PROBE_CLOSERS, TrafficProbes, arp_probe
from lbagent.workers.udp_health import UdpHealthChecker

log = logging.getLogger(__name__)

NAMESPACE_THREADS = 4
HAPROXY_SUPERVISE_INTERVAL = 1.0
QUEUE_WORKERS = 4  # a provider-network pass may take seconds; kicks must not wait behind two of them
QUEUE_STOP_TIMEOUT = 30.0  # seconds a running handler may take to finish on stop


@dataclass(frozen=True)
class LoadBalancerView:
    """What the agent knows of one load balancer, for its status document."""

    task: Any  # its LbTask: state, generation, errors, retries
    lb: Any  # its desired model (None while deleting)
    allocation: Any  # its address pair and ports (None before allocation)
    names: Any  # its interface names (None before allocation)
    netns: str
    observation: Any  # what its last pass observed (None before one)
    members: dict = field(default_factory=dict)
    udp_health: dict[str, str] = field(default_factory=dict)  # server name -> health word
    ha: dict | None = None  # its lease as this host sees it (None without `ha`)


class Agent:
    def __init__(self, config: Config):
        self.config = config
        self.host_name = config.agent.host
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.store = StateStore(config.agent.state_dir)
        self.ovs = OvsClient(config.ovs.db, config.ovs.integration_bridge, config.agent.host)
        self.namespaces = NamespaceExecutor("netns", NAMESPACE_THREADS)
        self.iptc = NamespaceExecutor("iptc", 1)
        self.haproxy = HaproxyManager(config.haproxy.binary, config.agent.run_dir, **config.haproxy_options())
        self.host = OvnHost(self.ovs, self.namespaces, self.iptc)
        self.queue: WorkQueue[str] = WorkQueue("controllers", kind_of=kind_of)
        self.worker = OvnWorker(
            self.host,
            self.haproxy,
            self.store,
            config.agent.resync_interval,
            config.agent.resync_rate,
            requeue=requeue_loadbalancers(self.queue),
            inner_prefix6=config.agent.inner_prefix6,
        )
        self.probe_sockets = BlockingPool("probe-close", PROBE_CLOSERS)
        self.worker.udp_health = UdpHealthChecker(self.namespaces, self.worker.kick, self.worker.carries_traffic)
        self.worker.connection_logs = ConnectionLogs(self.namespaces, self.haproxy.access_log)
        self.worker.installed_ports = self.installed_ports
        if config.agent.probe_traffic:
            self.worker.traffic = TrafficProbes(
                functools.partial(arp_probe, self.namespaces, self.probe_sockets), self.worker.resync_interval
            )
        self.provider_networks = ProviderNetworkController(
            ProviderBridges(self.ovs),
            self.namespaces,
            config.agent.host,
            config.agent.resync_interval,
            queue=self.queue,
        )
        self.controllers = wire(self.queue, self.worker, self.provider_networks)
        # A pass under way, or a load balancer queued for one (retries waiting
        # out their backoff are not coming soon; a task kicked in this very loop
        # step is missed, and its change at worst reloads on its own).
        self.haproxy.expect_changes_while(
            lambda: self.worker.haproxy_changes_coming() or self.queue.unfinished_of(LOADBALANCER) > 0
        )
        self._chassis = config.ovn.chassis  # "" until read from OVS at start
        self.ha = self._ha_keeper() if config.ovn.nb else None
        self.gc = GarbageCollector(self.host, self.haproxy, config.agent.gc_max_deletions_per_pass)
        self.link_watch = LinkWatch(
            lambda: ((lb_id, a.salt) for lb_id, a in self.worker.allocations.items()), self.worker.kick
        )
        self.gc_stats = {"passes": 0, "skipped": 0, "deleted": 0}
        self.neighbours = NeighbourCapacity(config.agent.size_neighbour_tables)
        self.state_error: str | None = None
        self.heap = HeapKeeper(self._quiet)
        self._background: list[asyncio.Task] = []

    def _ha_keeper(self) -> HaKeeper:
        ovn = self.config.ovn
        keeper = HaKeeper(
            NorthboundClient(ovn.nb, timeout=ovn.lease_seconds),
            self.host_name,
            lambda: self._chassis,
            Timing(ovn.lease_seconds),
            ovn.restart_grace,
            self.worker.ha_loadbalancers,
            lambda lb_id: copy_state(self.worker.tasks.get(lb_id), self.worker.runtime.get(lb_id)),
            present=lambda lb_id: self.worker.desired_loadbalancer(lb_id) is not None,
            on_role=self.worker.ha_role_changed,
        )
        self.worker.ha_role = keeper.role
        return keeper

    async def start(self) -> None:
        private_dir(self.config.agent.run_dir)
        self.store.prepare()
        persisted, desired = self._load_state()
        if desired is not None:
            await self.neighbours.accommodate(desired)
        await asyncio.to_thread(self.ovs.start)
        if self.ha is not None and not self._chassis:
            self._chassis = await asyncio.to_thread(self.ovs.system_id)
        await self.haproxy.start()
        self.heap.freeze_start()  # before any pass: what they make stays young
        self._start_queue()
        await self.worker.resume(persisted, desired)  # which also feeds the controllers
        await self.provider_networks.start()
        self.link_watch.start()  # the load balancers resumed: a deleted veth of theirs is rebuilt at once
        self._background.append(asyncio.create_task(self._supervise_haproxy(), name="haproxy-supervisor"))
        self._background.append(asyncio.create_task(self.worker.watch_readiness(), name="readiness"))
        if self.worker.traffic is not None:
            self._background.append(asyncio.create_task(self.worker.watch_traffic(), name="traffic-probes"))
        self._background.append(asyncio.create_task(self._collect_garbage(), name="gc"))
        self._background.append(asyncio.create_task(self._keep_heap(), name="heap"))
        self._background.append(asyncio.create_task(self._trim_heap(), name="heap-trim"))
        if self.ha is not None:
            self._background.append(asyncio.create_task(self.ha.run(), name="ha"))
        log.info("action=started host=%s generation=%s", self.config.agent.host, self.worker.generation)

    def _start_queue(self) -> None:
        dispatcher = self.controllers.dispatcher
        self.queue.start(dispatcher, QUEUE_WORKERS)
        for kind in dispatcher.kinds:
            track_queue(kind, functools.partial(self.queue.depth_of, kind))

    def _load_state(self) -> tuple[PersistedState, DesiredState | None]:
        try:
            persisted = self.store.load()
        except StateFileError as exc:
            moved = self.store.quarantine()
            self.state_error = f"{exc}; moved aside to {moved}"
            log.error("action=load_state result=error error=%r", self.state_error)
            return PersistedState(), None
        if persisted.desired is None:
            return persisted, None
        try:
            desired = parse_desired_state(persisted.desired)
            self.check_host(desired)
            return persisted, desired
        except InvalidDesiredState as exc:
            self.state_error = f"persisted desired state no longer valid: {exc}"
            log.error("action=load_state result=error error=%r", self.state_error)
            return PersistedState(None, persisted.allocations), None

    async def _supervise_haproxy(self) -> None:
        while True:
            await asyncio.sleep(HAPROXY_SUPERVISE_INTERVAL)
            try:
                await self.haproxy.supervise_once()
            except Exception as exc:  # keep supervising; the error is in status
                log.warning("object=haproxy action=supervise result=error error=%r", str(exc))

    def _quiet(self) -> bool:
        desired = self.worker.desired
        return desired is not None and self.worker.settled(desired.generation)

    async def _keep_heap(self) -> None:
        while True:
            await asyncio.sleep(TICK_INTERVAL)
            self.heap.tick()

    async def _trim_heap(self) -> None:
        while True:
            await asyncio.sleep(TRIM_INTERVAL)
            try:
                await asyncio.to_thread(self.heap.trim)
            except Exception as exc:  # next interval tries again
                log.warning("object=heap action=trim result=error error=%r", str(exc))

    async def _collect_garbage(self) -> None:
        while True:
            await asyncio.sleep(self.config.agent.resync_interval * random.uniform(0.8, 1.2))
            # Nothing is swept before the complete desired state is known and
            # the first pass over it has finished.
            if self.startup_reason() is not None:
                self.gc_stats["skipped"] += 1
                continue
            try:
                deleted = await self.gc.run_once(self.worker.in_use)
                self.gc_stats["passes"] += 1
                self.gc_stats["deleted"] += len(deleted)
            except Exception as exc:  # next interval tries again
                log.warning("action=gc result=error error=%r", str(exc))

    async def stop(self) -> None:
        """Stop the agent itself; namespaces, rules, ports and haproxy keep serving."""
        self.link_watch.stop()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.ha is not None:
            await self.ha.stop()  # asks the standbys to wait while this agent restarts
        await self.provider_networks.stop()
        await self.queue.shutdown(timeout=QUEUE_STOP_TIMEOUT)
        await self.worker.stop()
        await asyncio.to_thread(self.ovs.stop)
        self.namespaces.shutdown()
        self.probe_sockets.shutdown()
        self.iptc.shutdown()
        self.host.ovsdb.shutdown()

    # --- API-facing ------------------------------------------------------------

    def check_host(self, desired: DesiredState) -> None:
        """InvalidDesiredState if this agent cannot serve `desired` (`ha` without
        [ovn] nb, or naming other hosts only; IPv6 addresses in its own prefix)."""
        problems = host_problems(desired.loadbalancers, self.host_name, self.ha is not None)
        problems += own_prefix_problems(desired, self.config.agent.inner_prefix6)
        if problems:
            raise InvalidDesiredState(problems)

    async def refresh(self, desired: DesiredState, raw: dict, raw_text: str | None = None) -> int:
        self.check_host(desired)
        generation = await self.worker.apply(desired, raw, raw_text)
        # Room for its neighbour entries, while its first passes have only begun
        # (a state refused as stale or invalid sizes nothing).
        await self.neighbours.accommodate(desired)  # which also feeds the controllers
        self.state_error = None
        return generation

    def not_ready_reason(self) -> str | None:
        """Why /readyz answers 503: the start-up is not over, haproxy is not
        running, or some load balancer does not carry traffic yet (its OVS port
        not installed by ovn-controller)."""
        reason = self.startup_reason()
        if reason is not None:
            return reason
        haproxy = self.haproxy.status()
        if not haproxy.get("running"):
            error = haproxy.get("last_error")
            return f"haproxy not running: {error}" if error else "haproxy not running"
        return self.worker.not_serving()

    def startup_reason(self) -> str | None:
        """Why the agent cannot yet tell what it manages (garbage collection waits for this)."""
        if self.worker.desired is None:
            return "no complete desired state yet (none persisted, no refresh received)"
        if not self.worker.first_pass_done():
            return "first reconcile pass not finished"
        return None

    async def wait_settled(self, generation: int, timeout: float) -> bool:
        """Until every load balancer reached `generation` or failed at it; False when `timeout` ran out."""
        return await self.worker.wait_settled(generation, timeout)

    # What the status documents (lbagent.api.status) and the metrics collector read.

    @property
    def generation(self) -> int | None:
        return self.worker.generation

    def synced(self) -> bool:
        desired = self.worker.desired
        return desired is not None and self.worker.settled(desired.generation)

    def haproxy_status(self) -> dict:
        return self.haproxy.status()

    def resync_interval(self) -> float:
        return self.worker.resync_interval()

    def neighbour_status(self) -> dict:
        return self.neighbours.status()

    def queue_stats(self) -> dict:
        return self.queue.stats_by_kind(self.controllers.dispatcher.kinds)

    def subnet_status(self) -> list:
        return self.controllers.subnets.status()

    def provider_network_status(self) -> list:
        return self.provider_networks.status()

    def pod_status(self) -> dict:
        return self.controllers.pods.status()

    def loadbalancer_ids(self) -> list[str]:
        return sorted(self.worker.tasks)

    def loadbalancer_tasks(self) -> list[LbTask]:
        return list(self.worker.tasks.values())

    def loadbalancer_view(self, lb_id: str) -> LoadBalancerView | None:
        worker = self.worker
        task = worker.tasks.get(lb_id)
        if task is None:
            return None
        allocation = worker.allocations.get(lb_id)
        lb = worker.desired.loadbalancer(lb_id) if worker.desired and not task.deleting else None
        runtime = worker.runtime.get(lb_id)
        return LoadBalancerView(
            task=task,
            lb=lb,
            allocation=allocation,
            names=interface_names(lb_id, allocation.salt) if allocation else None,
            netns=netns_name(lb_id),
            observation=runtime.observation if runtime else None,
            members=worker.members(lb) if lb is not None and allocation is not None else {},
            udp_health={server_name(key): word for key, word in worker.udp_health.health(lb_id).items()},
            ha=self.ha.status(lb_id) if self.ha is not None else None,
        )

    def ha_status(self) -> dict | None:
        """The agent's side of high availability (None without [ovn] nb)."""
        if self.ha is None:
            return None
        return {
            "nb": self.config.ovn.nb,
            "chassis": self._chassis or None,
            "in_contact": self.ha.in_contact(),
            "lease_seconds": self.config.ovn.lease_seconds,
            "last_error": self.ha.last_error,
        }

    def ha_role_counts(self) -> dict[str, int]:
        return self.ha.role_counts() if self.ha is not None else {}

    async def ha_handover(self, lb_ids: list[str] | None, timeout: float) -> list[dict] | None:
        """Hand load balancers this host holds to their next hosts (None without [ovn] nb)."""
        return await self.ha.handover(lb_ids, timeout) if self.ha is not None else None

    async def server_states(self, backend_prefix: str = "") -> dict[tuple[str, str], str]:
        return await self.haproxy.server_states(backend_prefix)

    async def installed_ports(self, among: Collection[str] | None = None) -> set[str]:
        return await self.host.ovsdb.run(self.ovs.installed_ports, among)

    def update_gauges(self) -> None:
        set_lb_states(t.state for t in self.worker.tasks.values())
        desired = self.worker.desired
        set_vips(lb.network.ip6 is not None for lb in (desired.loadbalancers if desired is not None else []))
