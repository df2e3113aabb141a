"""Provider networks on the real kernel and the sandbox's OVS, driven through
the controller directly: bridge, uplink port, addresses and routes moved and
given back, ovn-bridge-mappings merged next to a foreign entry, exclusion,
a vanished uplink, and removal by a restarted controller from what OVS recorded.

The uplink is a veth pair the test creates (no dummy module on these
machines) with 198.19.x addresses, a gateway route and a device route; what
the test checks it reads with `ip -j` and `ovs-vsctl`, never through the code
under test. The `uplink` and `foreign_mapping` fixtures and the `assert_*`
helpers are meant for an HTTP-driven test too (`agent_factory`, then a refresh
with `provider_networks`).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from dataclasses import dataclass

import pytest

from devtools.sandbox import link_names, run, wait_for
from lbagent.desired.model import ProviderNetwork
from lbagent.metrics import write_counts
from lbagent.ovnhost import provider_ovs
from lbagent.ovnhost.bridges import ProviderBridges, bridge_name
from lbagent.ovnhost.netns import NamespaceExecutor
from lbagent.ovnhost.ovs import OvsClient
from lbagent.workers.dispatch import PROVIDER_NETWORK, Dispatcher, kind_of
from lbagent.workers.provider_networks import ProviderNetworkController
from lbagent.workers.queue import WorkQueue

FOREIGN = "physnet-foreign:br-foreign"
MAPPINGS = "external_ids:ovn-bridge-mappings"
UPLINK_MTU = 1400
WAIT = 30.0


@dataclass(frozen=True)
class Uplink:
    """A host-namespace veth end with two addresses, a gateway route and a device route."""

    name: str
    peer: str
    octet: int

    @property
    def addresses(self) -> set[tuple]:  # (local, prefixlen, broadcast)
        o = self.octet
        return {(f"198.19.{o}.2", 26, f"198.19.{o}.63"), (f"198.19.{o}.70", 26, None)}

    @property
    def routes(self) -> set[tuple]:  # (dst, gateway, metric, protocol, scope)
        o = self.octet
        return {
            (f"198.19.{o}.128/26", f"198.19.{o}.1", 77, "static", None),
            (f"198.19.{o}.192/27", None, None, "boot", "link"),
        }


def ip_json(*args: str):
    return json.loads(run("ip", "-j", *args) or "[]")


def addresses_of(dev: str) -> set[tuple]:
    return {
        (a["local"], a["prefixlen"], a.get("broadcast"))
        for link in ip_json("addr", "show", "dev", dev)
        for a in link.get("addr_info", [])
        if a["family"] == "inet"
    }


def routes_of(dev: str) -> set[tuple]:
    """Main-table routes out of `dev`, except those the kernel derives from addresses."""
    return {
        (r["dst"], r.get("gateway"), r.get("metric"), r.get("protocol", "boot"), r.get("scope"))
        for r in ip_json("route", "show", "dev", dev)
        if r.get("protocol") != "kernel"
    }


def link_of(dev: str) -> dict:
    return ip_json("link", "show", "dev", dev)[0]


def mappings(sandbox) -> str:
    return sandbox.vsctl("--if-exists", "get", "Open_vSwitch", ".", MAPPINGS).strip().strip('"')


def ovs_bridge_exists(sandbox, bridge: str) -> bool:
    return (
        subprocess.run(
            ["ovs-vsctl", f"--db={sandbox.ovs_db}", "br-exists", bridge], env=sandbox.env, capture_output=True
        ).returncode
        == 0
    )


def assert_on_bridge(sandbox, uplink: Uplink, network: str) -> None:
    bridge = bridge_name(network)
    assert sandbox.vsctl("get", "Bridge", bridge, "datapath_type").strip().strip('"') == sandbox.vsctl(
        "get", "Bridge", "br-int", "datapath_type"
    ).strip().strip('"')
    assert sandbox.vsctl("port-to-br", uplink.name).strip() == bridge
    assert addresses_of(bridge) == uplink.addresses and addresses_of(uplink.name) == set()
    assert routes_of(bridge) == uplink.routes and routes_of(uplink.name) == set()
    assert link_of(bridge)["address"] == link_of(uplink.name)["address"]
    assert "UP" in link_of(bridge)["flags"]
    assert mappings(sandbox) == f"{FOREIGN},{network}:{bridge}"


def assert_given_back(sandbox, uplink: Uplink, network: str) -> None:
    bridge = bridge_name(network)
    assert not ovs_bridge_exists(sandbox, bridge)
    wait_for(lambda: bridge not in link_names(), 10, f"ovs-vswitchd to delete device {bridge}")
    assert addresses_of(uplink.name) == uplink.addresses
    assert routes_of(uplink.name) == uplink.routes
    assert "UP" in link_of(uplink.name)["flags"]
    assert mappings(sandbox) == FOREIGN


@pytest.fixture
def uplink(prefix):
    up = Uplink(f"{prefix}u0", f"{prefix}u1", int(prefix[1:3], 16))
    o = up.octet
    try:
        run("ip", "link", "add", up.name, "mtu", str(UPLINK_MTU), "type", "veth", "peer", "name", up.peer)
        run("ip", "link", "set", up.name, "up")
        run("ip", "addr", "add", f"198.19.{o}.2/26", "brd", "+", "dev", up.name)
        run("ip", "addr", "add", f"198.19.{o}.70/26", "dev", up.name)
        run(
            "ip",
            "route",
            "add",
            f"198.19.{o}.128/26",
            "via",
            f"198.19.{o}.1",
            "dev",
            up.name,
            "metric",
            "77",
            "proto",
            "static",
        )
        run("ip", "route", "add", f"198.19.{o}.192/27", "dev", up.name, "scope", "link")
        yield up
    finally:
        run("ip", "link", "del", up.name, check=False)  # takes the peer, addresses and routes along


@pytest.fixture
def foreign_mapping(sandbox):
    """`physnet-foreign:br-foreign` in ovn-bridge-mappings, as another tool would have set it."""
    before = mappings(sandbox)
    sandbox.vsctl("set", "Open_vSwitch", ".", f'{MAPPINGS}="{FOREIGN}"')
    try:
        yield FOREIGN
    finally:
        if before:
            sandbox.vsctl("set", "Open_vSwitch", ".", f'{MAPPINGS}="{before}"')
        else:
            sandbox.vsctl("remove", "Open_vSwitch", ".", "external_ids", "ovn-bridge-mappings")


@pytest.fixture
def network(sandbox, prefix):
    """The provider network's name; its bridge is deleted after the test whatever happened."""
    name = f"{prefix}pn"
    try:
        yield name
    finally:
        bridge = bridge_name(name)
        sandbox.vsctl("--if-exists", "del-br", bridge)
        try:
            wait_for(lambda: bridge not in link_names(), 10, f"device {bridge} to go")
        except TimeoutError:
            run("ip", "link", "del", bridge, check=False)


@pytest.fixture
async def make_controller(sandbox, prefix):
    """Controllers over the sandbox's OVS, each with its own OVSDB connection (like an agent)."""
    host = f"{prefix}-gw"
    executor = NamespaceExecutor("t-pn", 2)
    made: list[tuple[ProviderNetworkController, OvsClient]] = []

    async def make() -> ProviderNetworkController:
        ovs = OvsClient(sandbox.ovs_db, "br-int", host)
        await asyncio.to_thread(ovs.start)
        queue = WorkQueue("t-provider-networks", backoff_start=0.05, backoff_max=0.5, kind_of=kind_of)
        ctl = ProviderNetworkController(ProviderBridges(ovs), executor, host, resync_interval=3600, queue=queue)
        made.append((ctl, ovs))
        queue.start(Dispatcher({PROVIDER_NETWORK: ctl.reconcile}), workers=2)
        await ctl.start()
        return ctl

    try:
        yield make
    finally:
        for ctl, ovs in made:
            await ctl.stop()
            await ctl.queue.shutdown(timeout=30)
            await asyncio.to_thread(ovs.stop)
        executor.shutdown()


async def until(predicate, what: str, timeout: float = WAIT):
    """Poll `predicate` on the event loop (it reads controller state) within a bounded time."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not (result := predicate()):
        if loop.time() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)
    return result


def state_of(ctl, network: str) -> dict | None:
    return next((s for s in ctl.status() if s["name"] == network), None)


async def ready(ctl, network: str) -> dict:
    status = await until(
        lambda: (s := state_of(ctl, network)) and s["state"] in ("ready", "error") and s, f"{network} to be reconciled"
    )
    assert status["state"] == "ready", status
    return status


async def test_bridge_up_then_removed_by_a_restarted_controller(
    sandbox, uplink, foreign_mapping, network, make_controller
):
    first = await make_controller()
    first.update([ProviderNetwork(name=network, default_interface=uplink.name)])
    status = await ready(first, network)
    assert status == {
        "name": network,
        "state": "ready",
        "bridge": bridge_name(network),
        "interface": uplink.name,
        "mtu": UPLINK_MTU,
        "error": None,
        "retries": 0,
    }
    assert_on_bridge(sandbox, uplink, network)
    assert link_of(bridge_name(network))["mtu"] == UPLINK_MTU

    writes = write_counts()
    await first.reconcile(network)
    assert write_counts() == writes  # a pass over a converged network writes nothing

    # The agent restarts and the network is gone from the desired state: what
    # to give back comes from the bridge's external_ids, not from memory.
    await first.stop()
    await first.queue.shutdown(timeout=30)
    second = await make_controller()
    second.update([])
    await until(
        lambda: not ovs_bridge_exists(sandbox, bridge_name(network)) and second.status() == [],
        "the orphaned bridge to be removed",
    )
    assert_given_back(sandbox, uplink, network)


async def test_excluding_this_host_cleans_up(sandbox, uplink, foreign_mapping, network, make_controller):
    ctl = await make_controller()
    ctl.update([ProviderNetwork(name=network, default_interface=uplink.name)])
    await ready(ctl, network)
    assert_on_bridge(sandbox, uplink, network)

    ctl.update([ProviderNetwork(name=network, default_interface=uplink.name, exclude_hosts=[ctl.host])])
    status = await until(
        lambda: (s := state_of(ctl, network)) and s["state"] in ("excluded", "error") and s,
        "the excluded network to be cleaned up",
    )
    assert status == {
        "name": network,
        "state": "excluded",
        "bridge": None,
        "interface": None,
        "mtu": None,
        "error": None,
        "retries": 0,
    }
    assert_given_back(sandbox, uplink, network)


async def test_removing_a_network_whose_uplink_vanished_completes(
    sandbox, uplink, foreign_mapping, network, make_controller
):
    ctl = await make_controller()
    ctl.update([ProviderNetwork(name=network, default_interface=uplink.name)])
    await ready(ctl, network)
    run("ip", "link", "del", uplink.name)

    ctl.update([])
    await until(lambda: ctl.status() == [], "the removal to complete")
    assert not ovs_bridge_exists(sandbox, bridge_name(network))
    assert mappings(sandbox) == FOREIGN


async def test_a_missing_uplink_is_an_error_in_status(sandbox, foreign_mapping, network, prefix, make_controller):
    ctl = await make_controller()
    ctl.update([ProviderNetwork(name=network, default_interface=f"{prefix}nx")])
    status = await until(lambda: (s := state_of(ctl, network)) and s["state"] == "error" and s, "the error")
    assert f"interface {prefix}nx" in status["error"] and status["retries"] >= 1
    assert mappings(sandbox) == FOREIGN


async def test_a_concurrent_mapping_writer_loses_nothing(sandbox, foreign_mapping, network, prefix):
    """Another writer changes ovn-bridge-mappings between our read and our commit:
    the verified transaction is re-run on fresh data and keeps its entry."""
    late = f"{FOREIGN},physnet-late:br-late"

    class Interleaved(provider_ovs._SetBridgeMapping):
        interfered = 0

        def run_idl(self, txn):
            super().run_idl(txn)  # computed from what our IDL holds now...
            if not Interleaved.interfered:
                Interleaved.interfered += 1
                # ...and meanwhile someone else commits (our IDL thread is busy here, so it cannot know yet).
                sandbox.vsctl("set", "Open_vSwitch", ".", f'{MAPPINGS}="{late}"')

    client = OvsClient(sandbox.ovs_db, "br-int", f"{prefix}-gw")
    await asyncio.to_thread(client.start)
    try:
        cmd = Interleaved(client.api, network, bridge_name(network), True)
        await asyncio.to_thread(client._transact, "interleaved mapping update", cmd)
    finally:
        await asyncio.to_thread(client.stop)
    assert Interleaved.interfered == 1
    assert mappings(sandbox) == f"{late},{network}:{bridge_name(network)}"


def test_provider_network_driven_over_http(agent_factory, sandbox, uplink, foreign_mapping, network):
    agent = agent_factory(resync_interval=2.0)

    def network_status() -> dict | None:
        return next((n for n in agent.status()["provider_networks"] if n["name"] == network), None)

    spec = {"name": network, "default_interface": uplink.name}
    assert agent.refresh({"generation": 1, "provider_networks": [spec]})[0] == 200
    status = wait_for(
        lambda: (s := network_status()) and s["state"] == "ready" and s, WAIT, f"{network} ready in the agent's status"
    )
    assert status["bridge"] == bridge_name(network) and status["interface"] == uplink.name
    assert_on_bridge(sandbox, uplink, network)
    # This host excluded: everything is given back.
    excluded = {**spec, "exclude_hosts": [agent.host]}
    assert agent.refresh({"generation": 2, "provider_networks": [excluded]})[0] == 200
    wait_for(lambda: not ovs_bridge_exists(sandbox, bridge_name(network)), WAIT, "the bridge to go")
    assert_given_back(sandbox, uplink, network)
    # Back again, then removed from the desired state.
    assert agent.refresh({"generation": 3, "provider_networks": [spec]})[0] == 200
    wait_for(lambda: ovs_bridge_exists(sandbox, bridge_name(network)), WAIT, "the bridge to come back")
    assert agent.refresh({"generation": 4, "provider_networks": []})[0] == 200
    wait_for(lambda: not ovs_bridge_exists(sandbox, bridge_name(network)), WAIT, "the bridge to go again")
    assert_given_back(sandbox, uplink, network)
