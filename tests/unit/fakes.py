"""The fakes unit tests share: a host, an haproxy manager, an agent and its worker, a controller harness."""

from __future__ import annotations

import asyncio

from lbagent.errors import InvalidDesiredState, StaleGeneration
from lbagent.ovnhost.host import HostObservation
from lbagent.workers.dispatch import Dispatcher, kind_of
from lbagent.workers.queue import WorkQueue


class FakeWorker:
    def __init__(self):
        self.settle = True
        self.tasks = {}
        self.generation = None

    async def wait_settled(self, generation, timeout):
        return self.settle


class FakeAgent:
    def __init__(self):
        self.accepted = []
        self.texts = []  # the body text each accepted refresh would persist verbatim (None: re-encoded)
        self.worker = FakeWorker()
        self.haproxy = FakeHaproxy()
        self.ready_reason = "no complete desired state yet"
        self.gauges_updated = 0
        self.host_problems = []  # details refresh refuses with, as for `ha` this host cannot serve
        self.handover_results = None  # what ha_handover answers (None: no [ovn] nb)
        self.handovers = []
        self.neighbours = {"sizing": True, "entries_needed": None, "limits": {}, "last_error": None}

    def neighbour_status(self):
        return self.neighbours

    async def wait_settled(self, generation, timeout):
        return await self.worker.wait_settled(generation, timeout)

    @property
    def generation(self):
        return self.worker.generation

    def loadbalancer_tasks(self):
        return list(self.worker.tasks.values())

    def haproxy_status(self):
        return self.haproxy.status()

    async def refresh(self, desired, raw, raw_text=None):
        if self.host_problems:
            raise InvalidDesiredState(self.host_problems)
        if self.accepted and desired.generation < self.accepted[-1]:
            raise StaleGeneration(desired.generation, self.accepted[-1])
        self.accepted.append(desired.generation)
        self.texts.append(raw_text)
        return desired.generation

    def results(self, generation):
        return {"generation": generation, "loadbalancers": []}

    async def status(self):
        return {"agent": {"generation": self.accepted[-1] if self.accepted else None}, "loadbalancers": []}

    async def loadbalancer_status(self, lb_id):
        return {"id": lb_id} if lb_id == "known" else None

    def not_ready_reason(self):
        return self.ready_reason

    def update_gauges(self):
        self.gauges_updated += 1

    def ha_role_counts(self):
        return {"active": 1, "standby": 2, "unknown": 0} if self.handover_results is not None else {}

    async def ha_handover(self, lb_ids, timeout):
        self.handovers.append(lb_ids)
        return self.handover_results


class FakeHost:
    def __init__(self):
        self.converged = []
        self.removed = []
        self.fail = set()
        self.not_installed = set()  # lb ids whose OVS port ovn-controller has not installed (yet)
        self.ports = {}  # lb id -> its OVS port, as the last converge left it
        self.installed_asked: list[set[str] | None] = []  # the ports each installed_ports call named (None: all)
        self.looks = {}  # lb id -> what a snapshot of its data path reads now (a converge sets b"as wanted")
        self.snapshots = 0

    async def host_addresses(self):
        return {"169.254.0.101"}

    async def bridge_is_netdev(self):
        return True

    async def converge(self, spec):
        if spec.lb_id in self.fail:
            raise RuntimeError(f"boom {spec.lb_id}")
        self.converged.append(spec)
        self.looks[spec.lb_id] = b"as wanted"
        self.ports[spec.lb_id] = spec.links.names.ovn_host
        return HostObservation(spec.links.names.ovn_host, spec.lb_id not in self.not_installed)

    async def snapshot(self, spec, also):
        self.snapshots += 1
        return self.looks.get(spec.lb_id, b"nothing") + b"|" + also()

    async def installed_ports(self, among=None):
        self.installed_asked.append(None if among is None else set(among))
        return {
            port
            for lb_id, port in self.ports.items()
            if lb_id not in self.not_installed and (among is None or port in among)
        }

    async def remove(self, lb_id, netns, names, outer, outer6=None):
        self.removed.append(lb_id)


class FakeHaproxy:
    """Prepares (checks) a change, and applies it only once it is queued; reports counts like the manager."""

    def __init__(self):
        self.configs = {}
        self.prepared = []  # lb ids, in order
        self.dropped = []
        self.counts = {"reloads": 0, "failed_reloads": 0, "starts": 1, "running": True}

    def status(self):
        return dict(self.counts)

    def disk_stamp(self, lb_id):
        return (self.configs.get(lb_id) or "").encode()

    async def apply(self, lb_id, text, files=None):
        reloaded = await self.submit(lb_id, text, files)
        return False if reloaded is None else await reloaded

    async def submit(self, lb_id, text, files=None):
        prepared = await self.prepare(lb_id, text, files)
        return None if prepared is None else self.queue(prepared)

    async def prepare(self, lb_id, text, files=None):
        if self.configs.get(lb_id) == text:
            return None
        self.prepared.append(lb_id)
        return lb_id, text

    def queue(self, prepared):
        lb_id, text = prepared
        if text is None:
            self.configs.pop(lb_id, None)
        else:
            self.configs[lb_id] = text
        done = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done

    async def drop(self, prepared):
        self.dropped.append(prepared[0])


class KickHarness:
    def __init__(self, kind: str, make):
        """`make(queue, kick)` builds the controller; its `reconcile` handles the keys of `kind`."""
        self.kicks: list[str] = []
        self.queue = WorkQueue(f"t-{kind}", backoff_start=0.01, backoff_max=0.02, kind_of=kind_of)
        self.ctl = make(self.queue, self.kicks.append)
        self.queue.start(Dispatcher({kind: self.ctl.reconcile}))

    async def refresh(self, *desired) -> list[str]:
        """`ctl.update(*desired)`, then the queue handles what it queued; the load balancers kicked, sorted."""
        self.kicks.clear()
        self.ctl.update(*desired)
        await drained(self.queue)
        return sorted(self.kicks)

    async def stop(self) -> None:
        await self.queue.shutdown(timeout=5)


async def drained(queue: WorkQueue) -> None:
    """Until nothing is waiting, delayed or running."""
    for _ in range(1000):
        if not any(queue.stats()[k] for k in ("depth", "delayed", "processing")):
            return
        await asyncio.sleep(0)  # a yield, not a timed sleep
    raise AssertionError(f"queue not drained: {queue.stats()}")
