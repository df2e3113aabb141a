"""The ports of concurrent passes share OVSDB transactions, on the sandbox's
real ovsdb-server; a port that fails a shared transaction fails alone.

What the tests check they read with `ovs-vsctl`, never through the code under
test. The ports have no network device behind them: only the database matters
here (ovs-vswitchd logs that it cannot open them).
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from lbagent.ovnhost.bridgeports import BridgePorts
from lbagent.ovnhost.errors import OvsdbError
from lbagent.ovnhost.inventory import LB_KEY, OWNER_KEY
from lbagent.ovnhost.ovs import OvsClient
from lbagent.support.blocking import BlockingPool


@pytest.fixture
async def bridge(sandbox, prefix):
    ovs = OvsClient(sandbox.ovs_db, "br-int", f"{prefix}-gw")
    await asyncio.to_thread(ovs.start)
    pool = BlockingPool("t-ovsdb", 1)
    transactions: list[str] = []
    real_transact = ovs._transact

    def counted(what, *commands, **kwargs):
        transactions.append(what)
        return real_transact(what, *commands, **kwargs)

    ovs._transact = counted
    other_bridge = f"{prefix}-br"
    try:
        yield BridgePorts(ovs, pool), transactions, other_bridge
    finally:
        for port in sandbox.vsctl("list-ports", "br-int").split():
            if port.startswith(prefix):
                sandbox.vsctl("--if-exists", "del-port", "br-int", port)
        sandbox.vsctl("--if-exists", "del-br", other_bridge)
        await asyncio.to_thread(ovs.stop)
        pool.shutdown()


def external_ids(sandbox, port: str) -> str:
    return sandbox.vsctl("get", "Interface", port, "external_ids")


async def test_concurrent_writes_share_transactions(sandbox, prefix, bridge, caplog):
    ports, transactions, _ = bridge
    names = [f"{prefix}p{i}" for i in range(12)]
    with caplog.at_level(logging.INFO, logger="lbagent.changes"):
        seen = await asyncio.gather(
            *(ports.converge(name, {"iface-id": f"iface/lb/{name}", LB_KEY: name}) for name in names)
        )
    for name in names:  # one shared transaction, each change logged for its own load balancer
        assert f"lb={name} object=ovsdb action=add port {name}" in caplog.text
    assert [s.on_bridge for s in seen] == ["br-int"] * len(names)
    assert seen[0].external_ids["iface-id"] == f"iface/lb/{names[0]}"
    assert transactions == [f"write {len(names)} ports"]  # all waiting at once: one transaction
    on_bridge = set(sandbox.vsctl("list-ports", "br-int").split())
    assert set(names) <= on_bridge
    ids = external_ids(sandbox, names[-1])
    assert f'"iface/lb/{names[-1]}"' in ids and OWNER_KEY in ids


async def test_a_failing_write_fails_alone_and_the_others_land(sandbox, prefix, bridge):
    ports, transactions, other_bridge = bridge
    names = [f"{prefix}q{i}" for i in range(6)]
    bad = f"{prefix}bad"
    # An interface of that name already exists (in a bond on another bridge):
    # a port of the same name cannot be added, and fails the transaction it is in.
    sandbox.vsctl(
        "add-br",
        other_bridge,
        "--",
        "set",
        "Bridge",
        other_bridge,
        "datapath_type=netdev",
        "--",
        "add-bond",
        other_bridge,
        f"{prefix}bond",
        bad,
        f"{prefix}i2",
    )
    outcomes = await asyncio.gather(
        *(ports.converge(name, {"iface-id": f"iface/lb/{name}"}) for name in names[:3]),
        ports.converge(bad, {"iface-id": "iface/lb/bad"}),
        *(ports.converge(name, {"iface-id": f"iface/lb/{name}"}) for name in names[3:]),
        return_exceptions=True,
    )
    assert isinstance(outcomes[3], OvsdbError) and f"add port {bad}" in str(outcomes[3])
    assert all(o.on_bridge == "br-int" for i, o in enumerate(outcomes) if i != 3)
    assert transactions[0] == f"write {len(names) + 1} ports"  # the shared one, then each alone
    assert len(transactions) == len(names) + 2
    on_bridge = set(sandbox.vsctl("list-ports", "br-int").split())
    assert set(names) <= on_bridge and bad not in on_bridge


async def test_a_port_as_wanted_is_not_written_and_one_to_reattach_is_added_anew(sandbox, prefix, bridge):
    ports, transactions, _ = bridge
    name = f"{prefix}r"
    wanted = {"iface-id": f"iface/lb/{name}"}
    first = await ports.converge(name, wanted)
    before = len(transactions)
    assert await ports.converge(name, wanted) == first
    assert len(transactions) == before
    uuid = sandbox.vsctl("get", "Port", name, "_uuid")
    again = await ports.converge(name, wanted, reattach=True)
    assert transactions[before:] == [f"delete port {name}", f"add port {name}"]
    assert again.on_bridge == "br-int" and sandbox.vsctl("get", "Port", name, "_uuid") != uuid


async def test_ports_to_reattach_together_are_deleted_in_one_transaction(sandbox, prefix, bridge):
    ports, transactions, _ = bridge
    names = [f"{prefix}s{i}" for i in range(3)]
    await asyncio.gather(*(ports.converge(name, {"iface-id": f"iface/lb/{name}"}) for name in names))
    uuids = {name: sandbox.vsctl("get", "Port", name, "_uuid") for name in names}
    before = len(transactions)
    await asyncio.gather(*(ports.converge(name, {"iface-id": f"iface/lb/{name}"}, reattach=True) for name in names))
    assert transactions[before:] == ["delete 3 ports", "write 3 ports"]
    assert all(sandbox.vsctl("get", "Port", name, "_uuid") != uuids[name] for name in names)
