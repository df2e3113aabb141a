"""Integration-bridge ports of concurrent passes, observed and written together.

Every OVSDB transaction that adds ports makes ovs-vswitchd reconfigure the
bridge (all of its ports) and ovn-controller process the change; with a
thousand load balancers being built, one transaction per port cost OVS most
of a core. The ports of passes that arrive while the OVSDB thread is busy go
together in its next turn (`Coalescer`): one look at each, one transaction
for all that differ. If a shared turn fails, its ports are done one by one,
so a bad port fails only its own load balancer. An OVSDB that does not
answer (`OvsdbUnavailable`) fails the whole turn at once: no port caused it,
and a turn per port would only wait out the timeout once per port.

A turn that adds new ports also waits, at most `GATHER_LIMIT`, while other
passes that will add a port are still building its links (`building`):
with a thousand load balancers, ports turned over as fast as OVSDB answered
made a few hundred transactions, each a reconfiguration of a bridge growing
to a thousand ports, and ovs-vswitchd took the CPU the passes needed. The
last ports of a burst, or a port on its own, go at once.

Removals go together the same way: a refresh that dropped 2,500 load
balancers made 2,500 transactions, each a reconfiguration of the bridge.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from lbagent.errors import LbAgentError
from lbagent.ovnhost.errors import OvsdbError, OvsdbUnavailable
from lbagent.ovnhost.ovs import OvsClient, PortState, PortWant
from lbagent.support.blocking import BlockingPool
from lbagent.support.coalesce import Coalescer
from lbagent.support.waits import InFlight

MAX_PORTS = 200  # ports in one turn: an error in a shared transaction stays readable
I = TypeVar("I")  # noqa: E741 - an item
R = TypeVar("R")
GATHER_LIMIT = 0.25  # seconds a turn with new ports waits for the passes still building theirs


class _Unanswered(LbAgentError):
    """An OvsdbUnavailable on its way out of a turn. The Coalescer splits a
    turn that fails with an OvsdbError, and unavailability is one; wrapped in
    this, which is not, it reaches every port of the turn as it is."""

    def __init__(self, error: OvsdbUnavailable):
        super().__init__(str(error))
        self.error = error


class BridgePorts:
    def __init__(self, ovs: OvsClient, pool: BlockingPool, building: InFlight | None = None):
        self._ovs = ovs
        self._pool = pool  # the OVSDB thread
        self._building = building  # passes whose ports are still to come
        self._turns = Coalescer(
            "ovsdb-ports", self._converge_together, self._converge_alone, OvsdbError, MAX_PORTS, gather=self._gather
        )
        self._removals = Coalescer(
            "ovsdb-port-removals", self._delete_together, self._delete_alone, OvsdbError, MAX_PORTS
        )

    async def converge(self, name: str, external_ids: dict[str, str], reattach: bool = False) -> PortState | None:
        """`OvsClient.converge_ports` for one port, in a turn shared with others."""
        return await _answer_of(self._turns.submit(PortWant(name, external_ids, reattach)))

    async def delete(self, name: str) -> bool:
        """`OvsClient.delete_port`, in a turn shared with other removals; True if it was there."""
        return await _answer_of(self._removals.submit(name))

    async def _gather(self, wants: list[PortWant]) -> None:
        if self._building is not None and any(want.reattach for want in wants):
            await self._building.none_within(GATHER_LIMIT)

    async def _converge_together(self, wants: list[PortWant]) -> list[PortState | None]:
        return await self._on_ovsdb(self._ovs.converge_ports, wants)

    async def _converge_alone(self, want: PortWant) -> PortState | None:
        return (await self._converge_together([want]))[0]

    async def _delete_together(self, names: list[str]) -> list[bool]:
        return await self._on_ovsdb(self._ovs.delete_ports, names)

    async def _delete_alone(self, name: str) -> bool:
        return (await self._delete_together([name]))[0]

    async def _on_ovsdb(self, write: Callable[[list[I]], list[R]], items: list[I]) -> list[R]:
        """`write(items)` on the OVSDB thread; unavailability wrapped so the turn is not split."""
        try:
            return await self._pool.run(write, items)
        except OvsdbUnavailable as exc:
            raise _Unanswered(exc) from None


async def _answer_of(turn: Awaitable[R]) -> R:
    """A port's share of a turn, with an unavailable OVSDB raised as itself."""
    try:
        return await turn
    except _Unanswered as unanswered:
        raise unanswered.error from unanswered.error.__cause__
