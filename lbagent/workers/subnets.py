"""The subnet controller: a subnet change reaches exactly the load balancers on it.

A load balancer's mask, gateway, MTU and extra routes come from its subnet.
This controller owns the subnets of the accepted desired state, which load
balancers sit on each, and what status says about them. `update` compares
every subnet with its previous version (cidr, gateway, MTU, routes: the whole
model) and puts `subnet/<id>` on the shared work queue for each one that
changed or went away; `reconcile(id)`, that key's handler, kicks the load
balancers on the subnet through the callable it was given. A new subnet needs
no key: a load balancer can only be on it if it is new or its own spec
changed, and those are queued by OvnWorker.

Status per subnet (`status()`): `state` is `error` when its key failed or any
load balancer on it failed its last pass (`error` says how many, and which),
`pending` while its change waits in the queue or any load balancer on it has
not finished a pass, `ready` otherwise (also with no load balancers on it).
"""

from __future__ import annotations

from collections.abc import Callable

from lbagent.desired.model import LoadBalancer, Subnet
from lbagent.workers.dispatch import SUBNET, key
from lbagent.workers.queue import WorkQueue

NAMED_IN_ERROR = 3  # failing load balancers named in a subnet's error; the rest are counted


class SubnetController:
    def __init__(self, queue: WorkQueue[str], kick: Callable[[str], None], lb_state: Callable[[str], str | None]):
        self._queue = queue
        self._kick = kick  # wakes one load balancer (OvnWorker.dependency_changed)
        self._lb_state = lb_state
        self._subnets: dict[str, Subnet] | None = None  # None: no complete desired state yet
        self._loadbalancers: dict[str, list[str]] = {}  # subnet id -> ids of the load balancers on it

    def update(self, subnets: list[Subnet], loadbalancers: list[LoadBalancer]) -> None:
        """The complete desired subnets and load balancers; queues the subnets that changed or went away."""
        new = {subnet.id: subnet for subnet in subnets}
        old, self._subnets = self._subnets, new
        self._loadbalancers = {}
        for lb in loadbalancers:
            self._loadbalancers.setdefault(lb.network.subnet_id, []).append(lb.id)
        if old is None:
            return  # the first complete state: every load balancer is new and gets its own pass
        for subnet_id in sorted(old):
            if new.get(subnet_id) != old[subnet_id]:
                self._queue.add(key(SUBNET, subnet_id))

    async def reconcile(self, subnet_id: str) -> None:
        """Kick every load balancer on the subnet now (those of the current desired state)."""
        for lb_id in self._loadbalancers.get(subnet_id, ()):
            self._kick(lb_id)

    def status(self) -> list[dict]:
        return [self._status_of(subnet) for subnet in (self._subnets or {}).values()]

    def _status_of(self, subnet: Subnet) -> dict:
        queue_key = key(SUBNET, subnet.id)
        lb_ids = self._loadbalancers.get(subnet.id, [])
        states = {lb_id: self._lb_state(lb_id) for lb_id in lb_ids}
        failing = [lb_id for lb_id, state in states.items() if state == "error"]
        error = self._queue.last_error(queue_key)
        if error is None and failing:
            named = ", ".join(failing[:NAMED_IN_ERROR]) + (", …" if len(failing) > NAMED_IN_ERROR else "")
            error = f"{len(failing)} of {len(lb_ids)} load balancers on this subnet failed their last pass: {named}"
        if error is not None:
            state = "error"
        elif self._queue.is_pending(queue_key) or any(s != "ready" for s in states.values()):
            state = "pending"
        else:
            state = "ready"
        return {
            "id": subnet.id,
            "state": state,
            "loadbalancers": len(lb_ids),
            "cidr": subnet.cidr,
            "gateway": subnet.gateway,
            "mtu": subnet.mtu,
            "routes": [route.model_dump(mode="json") for route in subnet.routes],
            "retries": self._queue.retries(queue_key),
            "error": error,
        }
