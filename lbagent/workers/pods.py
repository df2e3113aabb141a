"""The pod controller: a pod change reaches exactly the load balancers it concerns.

It owns the pods of the accepted desired state, which load balancers' groups
select each of them (and as what: address, port, weight), the load balancers
still to be told about a pod change, and what status says about pods.

`update` compares every pod with its previous version, by id. A load balancer
is concerned by a pod that was added, removed or changed when the targets its
groups take from that pod differ between the two versions: it selected the
old one, or selects the new one, or selects it differently (a new address, a
named port that moved). A change no selector sees (a label nobody selects on,
a pod that was and stays not ready) concerns nobody and queues nothing.
Otherwise `pod/<id>` goes on the shared work queue and the concerned load
balancers are remembered until `reconcile(id)`, that key's handler, kicks
them. Members that did not change keep their ports on INNER: ports are the
OvnWorker's allocation, which keeps the port of every key that stays.
"""

from __future__ import annotations

from collections.abc import Callable

from lbagent.desired.model import LoadBalancer, Pod
from lbagent.workers import plan
from lbagent.workers.dispatch import POD, key
from lbagent.workers.queue import WorkQueue

# pod id -> load balancer id -> the (group id, target) pairs its groups take from that pod
Selections = dict[str, dict[str, tuple[tuple[str, plan.Target], ...]]]


def selections(pods: list[Pod], loadbalancers: list[LoadBalancer]) -> Selections:
    """Which load balancers select which pods, as what; each pod is matched only
    against the selectors of its own namespace."""
    selectors: dict[str, list[tuple[str, str, object]]] = {}
    for lb in loadbalancers:
        for group in lb.backend_groups:
            if group.pod_selector is not None:
                selectors.setdefault(group.pod_selector.namespace, []).append((lb.id, group.id, group.pod_selector))
    found: dict[str, dict[str, list]] = {}
    for pod in pods:
        for lb_id, group_id, selector in selectors.get(pod.namespace, ()):
            for target in plan.selected_pods(selector, [pod]):
                found.setdefault(pod.id, {}).setdefault(lb_id, []).append((group_id, target))
    return {pod_id: {lb_id: tuple(pairs) for lb_id, pairs in by_lb.items()} for pod_id, by_lb in found.items()}


class PodController:
    def __init__(self, queue: WorkQueue[str], kick: Callable[[str], None]):
        self._queue = queue
        self._kick = kick  # wakes one load balancer (OvnWorker.dependency_changed)
        self._pods: dict[str, Pod] | None = None  # None: no complete desired state yet
        self._selected: Selections = {}
        self._concerned: dict[str, set[str]] = {}  # pod id -> load balancers its key is to kick

    def update(self, pods: list[Pod], loadbalancers: list[LoadBalancer]) -> None:
        """The complete desired pods and load balancers; queues the pods whose change concerns any."""
        new, selected = {pod.id: pod for pod in pods}, selections(pods, loadbalancers)
        old, before = self._pods, self._selected
        self._pods, self._selected = new, selected
        if old is None:
            return  # the first complete state: every load balancer is new and gets its own pass
        for pod_id in sorted(old.keys() | new.keys()):
            if old.get(pod_id) == new.get(pod_id):
                continue
            was, now = before.get(pod_id, {}), selected.get(pod_id, {})
            concerned = {lb_id for lb_id in was.keys() | now.keys() if was.get(lb_id) != now.get(lb_id)}
            if concerned:
                self._concerned.setdefault(pod_id, set()).update(concerned)
                self._queue.add(key(POD, pod_id))

    async def reconcile(self, pod_id: str) -> None:
        """Kick the load balancers the pod's changes since its last handling concern."""
        for lb_id in sorted(self._concerned.pop(pod_id, ())):
            self._kick(lb_id)

    def status(self) -> dict:
        pods = self._pods or {}
        items = [
            {
                "id": pod.id,
                "namespace": pod.namespace,
                "name": pod.name,
                "ip": pod.ip,
                "ready": pod.ready,
                "loadbalancers": len(self._selected.get(pod.id, {})),
                "pending": self._queue.is_pending(key(POD, pod.id)),
            }
            for pod in sorted(pods.values(), key=lambda pod: pod.id)
        ]
        return {"count": len(pods), "ready": sum(1 for pod in pods.values() if pod.ready), "items": items}
