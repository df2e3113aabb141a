"""OvnWorker and its sibling controllers on the agent's one work queue.

This module owns who is wired to whom, and nothing else:
- OvnWorker queues `loadbalancer/<id>` (`requeue_loadbalancers`), whose
  handler wakes that load balancer's task (the pass itself stays in the task,
  with its own backoff and resync);
- every desired state OvnWorker accepts reaches the subnet, pod and
  provider-network controllers in the same step, under its lock;
- the subnet and pod controllers wake load balancers through the
  OvnWorker's `dependency_changed`, which skips those a pass already covers;
- the dispatch table: one handler per kind of key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from lbagent.desired.model import DesiredState, ProviderNetwork
from lbagent.workers.dispatch import LOADBALANCER, POD, PROVIDER_NETWORK, SUBNET, Dispatcher, key
from lbagent.workers.ovn_worker import OvnWorker
from lbagent.workers.pods import PodController
from lbagent.workers.queue import WorkQueue
from lbagent.workers.subnets import SubnetController


class ProviderNetworks(Protocol):
    """What the controllers use of the `ProviderNetworkController`."""

    def update(self, networks: list[ProviderNetwork]) -> None: ...
    async def reconcile(self, name: str) -> None: ...


def requeue_loadbalancers(queue: WorkQueue[str]) -> Callable[[str], None]:
    """What OvnWorker calls for a load balancer that needs a pass."""
    return lambda lb_id: queue.add(key(LOADBALANCER, lb_id))


@dataclass
class Controllers:
    subnets: SubnetController
    pods: PodController
    provider_networks: ProviderNetworks
    dispatcher: Dispatcher

    def accept(self, desired: DesiredState) -> None:
        self.subnets.update(desired.subnets, desired.loadbalancers)
        self.pods.update(desired.pods, desired.loadbalancers)
        self.provider_networks.update(desired.provider_networks)


def wire(queue: WorkQueue[str], worker: OvnWorker, provider_networks: ProviderNetworks) -> Controllers:
    """The controllers of `worker`'s dependencies on `queue`, fed by every state `worker` accepts.

    `worker` is the `OvnWorker`, made with `requeue=requeue_loadbalancers(queue)`.
    """
    subnets = SubnetController(queue, worker.dependency_changed, worker.state_of)
    pods = PodController(queue, worker.dependency_changed)
    dispatcher = Dispatcher(
        {
            LOADBALANCER: worker.kick,
            SUBNET: subnets.reconcile,
            POD: pods.reconcile,
            PROVIDER_NETWORK: provider_networks.reconcile,
        }
    )
    controllers = Controllers(subnets, pods, provider_networks, dispatcher)
    worker.on_accept.append(controllers.accept)
    return controllers
