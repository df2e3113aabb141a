"""Integration-bridge ports of concurrent passes, observed and written together.

Every OVSDB transaction that adds ports makes ovs-vswitchd reconfigure the
bridge (all of its ports) and ovn-controller process the change; with a
thousand load balancers being built, one transaction per port cost OVS most
of a core. The ports of passes that arrive while the OVSDB thread is busy go
together in its next turn (`Coalescer`): one look at each, one transaction
for all that differ. If a shared turn fails, its ports are done one by one,
so a bad port fails only its own load balancer.
"""

from __future__ import annotations

from lbagent.blocking import BlockingPool
from lbagent.coalesce import Coalescer
from lbagent.ovnhost.errors import OvsdbError
from lbagent.ovnhost.ovs import OvsClient, PortState, PortWant

MAX_PORTS = 200  # ports in one turn: an error in a shared transaction stays readable


class BridgePorts:
    def __init__(self, ovs: OvsClient, pool: BlockingPool):
        self._ovs = ovs
        self._pool = pool  # the OVSDB thread
        self._turns = Coalescer("ovsdb-ports", self._converge_together, self._converge_alone, OvsdbError,
                                MAX_PORTS)

    async def converge(self, name: str, external_ids: dict[str, str], reattach: bool = False) -> PortState | None:
        """`OvsClient.converge_ports` for one port, in a turn shared with others."""
        return await self._turns.submit(PortWant(name, external_ids, reattach))

    async def _converge_together(self, wants: list[PortWant]) -> list[PortState | None]:
        return await self._pool.run(self._ovs.converge_ports, wants)

    async def _converge_alone(self, want: PortWant) -> PortState | None:
        return (await self._converge_together([want]))[0]
