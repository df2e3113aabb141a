"""The provider-network controller: the desired provider networks, made real on this host.

It owns *which* networks need a pass and what status says about them: the
agent's shared `WorkQueue` gets the key `provider_network/<name>` of the
networks that changed or went away on `update`, and of every network (plus
our bridges that no network claims any more) on a jittered periodic resync; a
failed pass is retried with backoff and its error shown. The queue is started
and stopped by its owner, with a dispatcher that calls `reconcile(name)`.
What a pass does is `ProviderBridges`' business (blocking netlink and OVSDB
work, run on a host-namespace thread).

Nothing is removed before the first `update`, which carries the complete
desired state: until then the controller does not know what is an orphan.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import Protocol

from lbagent.desired.model import ProviderNetwork
from lbagent.ovnhost.bridges import BridgeReport, bridge_name
from lbagent.support.waits import wait_event
from lbagent.workers.dispatch import PROVIDER_NETWORK, key
from lbagent.workers.lb_task import JITTER
from lbagent.workers.queue import WorkQueue

log = logging.getLogger(__name__)


class Bridges(Protocol):
    """What the controller needs from the host side (`lbagent.ovnhost.bridges.ProviderBridges`)."""

    def ensure(self, network: str, interface: str) -> BridgeReport: ...

    def remove(self, network: str) -> bool: ...

    def owned_networks(self) -> set[str]: ...


class Executor(Protocol):
    async def run(self, netns: str | None, fn, *args): ...


class ProviderNetworkController:
    def __init__(
        self, bridges: Bridges, executor: Executor, host: str, resync_interval: float, *, queue: WorkQueue[str]
    ):
        self.host = host
        self.queue = queue
        self._bridges = bridges
        self._executor = executor
        self._resync_interval = resync_interval
        self._desired: dict[str, ProviderNetwork] | None = None  # None: the complete state is not known yet
        self._removing: set[str] = set()  # not desired, bridge possibly still here
        self._results: dict[str, dict] = {}  # name -> outcome of the last pass over its current spec
        self._resync_now = asyncio.Event()
        self._resync_task: asyncio.Task | None = None

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        self._resync_task = asyncio.create_task(self._resync_loop(), name="provider-networks-resync")

    async def stop(self) -> None:
        """Stop the periodic resync (the queue's owner lets running passes finish); bridges stay."""
        if self._resync_task is not None:
            self._resync_task.cancel()
            await asyncio.gather(self._resync_task, return_exceptions=True)
            self._resync_task = None

    # --- desired state -------------------------------------------------------------

    def update(self, networks: list[ProviderNetwork]) -> None:
        """The complete list of provider networks; queues those that changed or went away."""
        new = {n.name: n for n in networks}
        old, self._desired = self._desired, new
        self._removing -= set(new)
        if old is None:
            self._resync_now.set()  # the first complete state: every network, and our orphans
            return
        gone = set(old) - set(new)
        self._removing |= gone
        for name in sorted(gone | {name for name, net in new.items() if old.get(name) != net}):
            self._results.pop(name, None)
            self.queue.add(key(PROVIDER_NETWORK, name))

    async def resync(self) -> None:
        """Queue every desired network and every bridge of ours that no network claims."""
        if self._desired is None:
            return
        try:
            owned = await self._executor.run(None, self._bridges.owned_networks)
        except Exception as exc:  # the desired ones still get their pass (and report the same error)
            log.warning("object=provider_networks action=resync result=error error=%r", str(exc))
            owned = set()
        self._removing |= set(owned) - set(self._desired)
        for name in sorted(set(self._desired) | self._removing):
            self.queue.add(key(PROVIDER_NETWORK, name))

    async def _resync_loop(self) -> None:
        while True:
            delay = self._resync_interval * random.uniform(1 - JITTER, 1 + JITTER)
            await wait_event(self._resync_now, delay)
            self._resync_now.clear()
            await self.resync()

    # --- one pass ------------------------------------------------------------------

    async def reconcile(self, name: str) -> None:
        """One level-triggered pass over network `name` (the handler of its queue key)."""
        if self._desired is None:
            return
        network = self._desired.get(name)
        interface = network.interface_for(self.host) if network is not None else None
        if interface is not None:
            report = await self._executor.run(None, self._bridges.ensure, name, interface)
            if report.changed:
                log.info(
                    "object=provider_network network=%s action=ensure bridge=%s interface=%s mtu=%d",
                    name,
                    report.bridge,
                    interface,
                    report.mtu,
                )
            outcome = {"state": "ready", "bridge": report.bridge, "interface": interface, "mtu": report.mtu}
        else:
            if await self._executor.run(None, self._bridges.remove, name):
                log.info(
                    "object=provider_network network=%s action=remove reason=%s",
                    name,
                    "excluded" if network is not None else "deleted",
                )
            outcome = {"state": "excluded", "bridge": None, "interface": None, "mtu": None}
        if network is None:
            self._removing.discard(name)
            self._results.pop(name, None)
        elif self._desired.get(name) is network:  # else it changed meanwhile and runs again
            self._results[name] = outcome

    # --- status --------------------------------------------------------------------

    def status(self) -> list[dict]:
        desired = self._desired or {}
        return [self._status_of(name, desired.get(name)) for name in sorted(set(desired) | self._removing)]

    def _status_of(self, name: str, network: ProviderNetwork | None) -> dict:
        interface = network.interface_for(self.host) if network is not None else None
        has_bridge = interface is not None or network is None  # being removed: it may still be there
        entry = {
            "name": name,
            "state": "pending",
            "bridge": bridge_name(name) if has_bridge else None,
            "interface": interface,
            "mtu": None,
            **self._results.get(name, {}),
        }
        queue_key = key(PROVIDER_NETWORK, name)
        error = self.queue.last_error(queue_key)
        if error is not None:
            entry["state"] = "error"
        entry["error"] = error
        entry["retries"] = self.queue.retries(queue_key)
        return entry
