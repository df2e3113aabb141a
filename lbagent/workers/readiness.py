"""`ReadinessWatch`: whether a load balancer whose pass succeeded carries traffic.

`ready` means the VIP carries traffic: a successful pass leaves a load
balancer `pending` while ovn-controller has not installed its OVS port
(`external_ids:ovn-installed`), then until its gateway answered through that
port (`traffic_probes`, when the agent probes), or, with listeners served by
haproxy, while haproxy is not running (`readiness`). `watch_readiness` turns
them `ready` without another pass: every READINESS_INTERVAL it reads whether haproxy runs
and, only while some load balancer waits for its port, which ports are
installed (one read of the local OVSDB replica); with nothing waiting and
haproxy as it was, a tick does nothing per load balancer. `watch_traffic`,
a loop of its own so that slow probes never hold up the rest, probes the
load balancers whose probe is due and turns them `ready` at their first
answer, or `pending` again when a confirmed one stops answering. A port that
loses ovn-installed later is seen by the next pass (the periodic resync). When a
master was started again (it died), the load balancers with haproxy
listeners stay `pending` until a pass, kicked at once, has re-applied their
files: a master that could not start on the files on disk starts without them.

For a load balancer with `ha`, only the host holding its lease waits for
ovn-installed: a standby's port is never bound, and it is ready once built.

It is part of `OvnWorker` (a mixin over the worker's tasks and runtime), kept
apart because when a load balancer is ready is a question of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lbagent.desired.model import LoadBalancer
    from lbagent.workers.lb_task import LbTask
    from lbagent.workers.traffic_probes import ProbeTarget, TrafficProbes

log = logging.getLogger("lbagent.workers.ovn_worker")  # its lines are the worker's

# Seconds between two looks at what keeps passed load balancers from serving.
READINESS_INTERVAL = 0.25
WAITING_FOR_OVN = "waiting for ovn-installed"
WAITING_FOR_TRAFFIC = "waiting for traffic: its gateway does not answer through its OVN port"
# Batches of traffic probes out at once: a port that does not answer yet costs its
# batch the probe's timeout, and the ports installed meanwhile need not wait for it.
PROBE_BATCHES = 4
HAPROXY_DOWN = "haproxy not running"
HAPROXY_RESTARTED = "haproxy restarted: waiting for a pass to re-apply its configuration"
WAITING_FOR_LEASE = "waiting to learn its role from the OVN Northbound database"


class ReadinessWatch:
    # Kept by OvnWorker, whose part this is.
    tasks: dict[str, LbTask]
    runtime: dict[str, Any]
    installed_ports: Callable[[Collection[str]], Awaitable[set[str]]] | None
    _haproxy: Any
    _haproxy_up: bool
    _haproxy_starts: Any
    _waiting_for_ovn: set[str]
    # Probes of the gateway through each active port (None: ovn-installed suffices); the agent sets it.
    traffic: TrafficProbes | None
    # This host's role for a load balancer with `ha` ("active", "standby",
    # "unknown"), None before it is known; the agent sets it.
    ha_role: Callable[[str], str | None]
    _notifying: set[asyncio.Task]

    def _lb(self, lb_id: str) -> LoadBalancer | None:
        raise NotImplementedError

    async def _notify(self) -> None:
        raise NotImplementedError

    def _probe_target(self, lb_id: str) -> ProbeTarget | None:
        raise NotImplementedError

    def readiness(self, lb_id: str) -> str | None:
        """What keeps a load balancer whose pass succeeded from carrying traffic (None: nothing)."""
        lb, runtime = self._lb(lb_id), self.runtime.get(lb_id)
        self._waiting_for_ovn.discard(lb_id)
        if lb is None or runtime is None or not lb.enabled:
            self._forget_traffic(lb_id)
            return None  # going, or disabled: nothing is meant to serve
        if not self._haproxy_up and any(ls.enabled and ls.kind.through_haproxy for ls in lb.listeners):
            error = self._haproxy_status().get("last_error")
            return f"{HAPROXY_DOWN}: {error}" if error else HAPROXY_DOWN
        # A standby's port is never bound (requested-chassis names the active
        # host): it is ready once built. Out of contact, it serves as it was.
        role = self._role_here(lb)
        if role is None:
            return WAITING_FOR_LEASE
        observation = runtime.observation
        if role != "active" or observation is None:
            self._forget_traffic(lb_id)  # its port is not bound here: nothing to probe
            return None
        if not observation.ovn_installed:
            self._waiting_for_ovn.add(lb_id)
            self._forget_traffic(lb_id)  # installed again, it is probed again
            return WAITING_FOR_OVN
        traffic = self.traffic
        if traffic is not None and not traffic.confirmed(lb_id):
            traffic.want(lb_id)
            return WAITING_FOR_TRAFFIC
        return None

    def carries_traffic(self, lb_id: str) -> bool:
        """Whether what is sent from the load balancer's namespace can reach its
        members: its port is installed and bound here (not a standby's) and,
        with traffic probes, its gateway answered through it (out of contact
        with the Northbound database, installed suffices)."""
        lb, runtime = self._lb(lb_id), self.runtime.get(lb_id)
        observation = runtime.observation if runtime is not None else None
        if lb is None or observation is None or not observation.ovn_installed:
            return False
        role = self._role_here(lb)
        if role == "unknown":
            # Out of contact it serves as it was, its traffic no longer probed:
            # a port ovn-controller has installed here is taken to be bound here.
            return True
        return role == "active" and (self.traffic is None or self.traffic.confirmed(lb_id))

    def _role_here(self, lb: LoadBalancer) -> str | None:
        """This host's role for the load balancer: "active" without `ha`."""
        return self.ha_role(lb.id) if lb.ha is not None else "active"

    def _forget_traffic(self, lb_id: str) -> None:
        if self.traffic is not None:
            self.traffic.forget(lb_id)

    def ha_role_changed(self, lb_id: str) -> None:
        """The lease moved to or from this host: readiness follows the role."""
        task = self.tasks.get(lb_id)
        if task is not None and task.set_waiting(self.readiness(lb_id)):
            log.info("lb=%s action=readiness state=%s reason=%r", lb_id, task.state, task.waiting)
            notify = asyncio.get_running_loop().create_task(self._notify())
            self._notifying.add(notify)  # a task nobody holds may be collected before it runs
            notify.add_done_callback(self._notifying.discard)

    def not_serving(self) -> str | None:
        """Why some passed load balancers do not serve yet (None: all that passed do)."""
        waiting = sorted(t.lb_id for t in self.tasks.values() if t.passed and t.state == "pending")
        if not waiting:
            return None
        reason = self.tasks[waiting[0]].waiting
        return f"{len(waiting)} load balancer(s) not serving yet, e.g. {waiting[0]}: {reason}"

    def haproxy_up(self) -> bool:
        """Whether the haproxy master runs, as the readiness watch last saw it."""
        return self._haproxy_up

    def _haproxy_status(self) -> dict:
        status = getattr(self._haproxy, "status", None)
        return status() if status is not None else {}

    async def check_readiness(self) -> int:
        """One look (see the module's docstring); how many load balancers changed state."""
        status = self._haproxy_status()
        up, starts = bool(status.get("running", True)), status.get("starts")
        haproxy_changed, self._haproxy_up = up != self._haproxy_up, up
        restarted = up and self._haproxy_starts is not None and starts != self._haproxy_starts
        self._haproxy_starts = starts
        if haproxy_changed:
            log.warning("object=haproxy action=observe running=%s", up)
        if restarted:
            self._haproxy_restarted()
        if up and (restarted or haproxy_changed):
            for task in self.tasks.values():
                if task.state == "error":
                    task.kick()  # its failure may have been haproxy's: retry now, not after its backoff
        again: set[str] = set(self.tasks) if haproxy_changed and not restarted else set()
        if self._waiting_for_ovn and self.installed_ports is not None:
            waiting: dict[str, str] = {}  # lb id -> its port
            for lb_id in list(self._waiting_for_ovn):
                runtime = self.runtime.get(lb_id)
                if runtime is None or runtime.observation is None:
                    self._waiting_for_ovn.discard(lb_id)
                else:
                    waiting[lb_id] = runtime.observation.ovs_port
            # Only the ports waited for are looked up: every port of the bridge
            # read four times a second made a P1 of 3,000 grow with N squared.
            installed = await self.installed_ports(set(waiting.values()))
            for lb_id, port in waiting.items():
                runtime = self.runtime.get(lb_id)
                if runtime is not None and runtime.observation is not None and runtime.observation.ovs_port == port:
                    if port in installed:
                        runtime.observation = replace(runtime.observation, ovn_installed=True)
                        again.add(lb_id)
        return await self._judge_again(again)

    async def _judge_again(self, lb_ids: Iterable[str]) -> int:
        """Readiness of these load balancers anew; how many changed state (waiters told if any did)."""
        changed = 0
        for lb_id in lb_ids:
            task = self.tasks.get(lb_id)
            if task is not None and task.set_waiting(self.readiness(lb_id)):
                changed += 1
                log.info("lb=%s action=readiness state=%s reason=%r", lb_id, task.state, task.waiting)
        if changed:
            await self._notify()
        return changed

    def _haproxy_restarted(self) -> None:
        """A new master runs: every load balancer it serves passes again before it is ready."""
        for lb_id, task in self.tasks.items():
            lb = self._lb(lb_id)
            if lb is not None and lb.enabled and any(ls.enabled and ls.kind.through_haproxy for ls in lb.listeners):
                task.set_waiting(HAPROXY_RESTARTED)
                task.kick()

    async def check_traffic(self) -> int:
        """Probe the load balancers whose probe is due; how many changed state."""
        traffic = self.traffic
        if traffic is None:
            return 0
        targets = {lb_id: target for lb_id in traffic.due() if (target := self._probe_target(lb_id)) is not None}
        if not targets:
            return 0
        gained, lost = await traffic.probe(targets)
        for lb_id in sorted(lost):
            log.warning("lb=%s action=probe_traffic result=lost reason=%r", lb_id, "its gateway stopped answering")
        return await self._judge_again(gained | lost)

    async def watch_traffic(self, interval: float = READINESS_INTERVAL, batches: int = PROBE_BATCHES) -> None:
        """Every `interval`, a batch of the probes due, without waiting for the batches still out
        (up to `batches` of them): an unanswered probe holds up only its own batch."""
        running: set[asyncio.Task] = set()
        try:
            while True:
                await asyncio.sleep(interval)
                if len(running) < batches:
                    batch = asyncio.create_task(self._check_traffic_logged())
                    running.add(batch)
                    batch.add_done_callback(running.discard)
        finally:
            for batch in running:
                batch.cancel()

    async def _check_traffic_logged(self) -> None:
        try:
            await self.check_traffic()
        except Exception as exc:  # the next batch probes again
            log.warning("action=probe_traffic result=error error=%r", str(exc))

    async def watch_readiness(self, interval: float = READINESS_INTERVAL) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_readiness()
            except Exception as exc:  # OVSDB reconnecting, say: the next tick looks again
                log.debug("action=readiness result=error error=%r", str(exc))
