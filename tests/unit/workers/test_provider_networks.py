"""Provider networks without a host: the controller over fake bridges, and
`ProviderBridges` over an in-memory OVS and netlink (what moves where, what
is recorded, what a converged pass writes), plus the mapping merge."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from lbagent.desired.model import ProviderNetwork
from lbagent.ovnhost import bridges as bridges_mod
from lbagent.ovnhost.bridges import (
    INTERFACE_KEY,
    MOVED_ADDRESSES_KEY,
    NETWORK_KEY,
    BridgeReport,
    Moved,
    ProviderBridgeError,
    ProviderBridges,
    in_scope_order,
)
from lbagent.ovnhost.errors import OvsdbError
from lbagent.ovnhost.inventory import OWNER_KEY
from lbagent.ovnhost.iplib import Address, Link, MovableRoute
from lbagent.ovnhost.ovs import PortState
from lbagent.ovnhost.provider_ovs import BridgeMappingConflict, BridgeState, merge_bridge_mapping, parse_bridge_mappings
from lbagent.workers.dispatch import PROVIDER_NETWORK, Dispatcher, kind_of
from lbagent.workers.provider_networks import ProviderNetworkController
from lbagent.workers.queue import WorkQueue

HOST = "gw-1"
WAIT = 5.0


def net(name="physnet1", default="eth1", custom=None, exclude=()):
    return ProviderNetwork(
        name=name,
        default_interface=default,
        custom_interfaces=[{"interface": i, "hosts": h} for i, h in (custom or {}).items()],
        exclude_hosts=list(exclude),
    )


# --- ovn-bridge-mappings -----------------------------------------------------------


def test_parse_bridge_mappings_keeps_order_and_skips_junk():
    assert parse_bridge_mappings("a:br-a, b:br-b,,junk") == [("a", "br-a"), ("b", "br-b")]
    assert parse_bridge_mappings("") == []


def test_merge_bridge_mapping_adds_and_removes_only_our_entry():
    foreign = "physnet-foreign:br-foreign"
    added = merge_bridge_mapping(foreign, "physnet1", "br-physnet1")
    assert added == "physnet-foreign:br-foreign,physnet1:br-physnet1"
    assert merge_bridge_mapping(added, "physnet1", "br-physnet1") == added
    assert merge_bridge_mapping(added, "physnet1", "br-physnet1", present=False) == foreign
    assert merge_bridge_mapping(foreign, "physnet1", "br-physnet1", present=False) == foreign
    assert merge_bridge_mapping("", "p", "br-p") == "p:br-p"
    assert merge_bridge_mapping("p:br-p", "p", "br-p", present=False) == ""


def test_merge_bridge_mapping_never_overwrites_someone_elses_entry():
    with pytest.raises(BridgeMappingConflict, match="physnet1 to br-theirs"):
        merge_bridge_mapping("physnet1:br-theirs", "physnet1", "br-physnet1")
    # Removing ours leaves theirs.
    assert merge_bridge_mapping("physnet1:br-theirs", "physnet1", "br-physnet1", present=False) == "physnet1:br-theirs"


# --- records and ordering --------------------------------------------------------------


def test_moved_record_round_trips_through_external_ids():
    moved = Moved(
        frozenset({Address("198.18.1.2", 24, "198.18.1.255"), Address("198.18.2.2", 24, None, True)}),
        frozenset(
            {MovableRoute("198.18.5.0/24", "198.18.1.1", metric=50, proto=4), MovableRoute("0.0.0.0/0", "198.18.1.1")}
        ),
    )
    assert Moved.from_external_ids(moved.external_ids()) == moved
    assert moved.external_ids() == Moved.from_external_ids(moved.external_ids()).external_ids()  # stable text
    assert Moved.from_external_ids({}) == Moved()
    with pytest.raises(ProviderBridgeError, match="unreadable"):
        Moved.from_external_ids({MOVED_ADDRESSES_KEY: '[{"nope": 1}]'})


def test_routes_are_added_narrow_scope_first():
    universe = MovableRoute("198.18.5.0/24", "198.18.1.1")
    link = MovableRoute("198.18.6.0/24", scope=253)
    host = MovableRoute("198.18.7.1/32", scope=254)
    assert in_scope_order({universe, link, host}) == [host, link, universe]


# --- ProviderBridges over an in-memory host --------------------------------------------


class FakeNetlink:
    """Links, addresses and routes of a host namespace, with kernel-like route keys."""

    def __init__(self):
        self.links: dict[str, Link] = {}
        self.addrs: dict[int, set[Address]] = {}
        self.routes: dict[int, set[MovableRoute]] = {}
        self.writes = 0

    def open(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def add(self, name, mac="02:00:00:00:00:01", mtu=1500, up=True) -> Link:
        link = Link(len(self.links) + 10, name, "veth", mac, mtu, up, 0)
        self.links[name] = link
        self.addrs[link.index], self.routes[link.index] = set(), set()
        return link

    def drop(self, name):
        link = self.links.pop(name)
        del self.addrs[link.index], self.routes[link.index]

    def link(self, name):
        return self.links.get(name)

    def addresses(self, index):
        return set(self.addrs[index])

    def movable_routes(self, index):
        return set(self.routes[index])

    def set_link(self, link, *, up=None, **_):
        self.writes += 1
        self.links[link.name] = dataclasses.replace(link, up=up)

    def add_address(self, link, addr):
        self.writes += 1
        self.addrs[link.index].add(addr)

    def delete_address(self, link, addr):
        self.writes += 1
        self.addrs[link.index] = {
            a for a in self.addrs[link.index] if (a.address, a.prefixlen) != (addr.address, addr.prefixlen)
        }
        if not self.addrs[link.index]:
            self.routes[link.index].clear()  # the kernel flushes a link's routes with its last address

    def replace_movable_route(self, link, route):
        self.writes += 1
        for routes in self.routes.values():  # same key (dst, metric) anywhere: replaced
            routes -= {r for r in routes if (r.dst, r.metric) == (route.dst, route.metric)}
        self.routes[link.index].add(route)

    def delete_movable_route(self, link, route):
        self.writes += 1
        self.routes[link.index].discard(route)


class FakeOvs:
    owner = "lbagent/" + HOST
    bridge = "br-int"

    def __init__(self, nl: FakeNetlink, datapath="netdev"):
        self.nl = nl
        self.datapath = datapath
        self.bridges: dict[str, BridgeState] = {}
        self.ports: dict[str, str] = {}  # port -> bridge
        self.mappings = "physnet-foreign:br-foreign"
        self.writes = 0
        self.create_devices = True

    def datapath_type(self):
        return self.datapath

    def observe_bridge(self, name):
        return self.bridges.get(name)

    def owned_bridges(self):
        return {n: dict(b.external_ids) for n, b in self.bridges.items() if b.external_ids.get(OWNER_KEY) == self.owner}

    def observe_port(self, name):
        return PortState(self.ports[name]) if name in self.ports else None

    def ensure_bridge(self, name, datapath_type, external_ids, hwaddr, mtu, observed):
        if observed is not None and observed.matches(datapath_type, external_ids, hwaddr, mtu):
            return False
        self.writes += 1
        ids = {**(observed.external_ids if observed else {}), **external_ids}
        self.bridges[name] = BridgeState(name, datapath_type, ids, hwaddr, mtu)
        if self.create_devices and self.nl.link(name) is None:
            self.nl.add(name, mac=hwaddr, mtu=mtu, up=False)
        return True

    def update_bridge_external_ids(self, name, changes):
        ids = dict(self.bridges[name].external_ids)
        new = {k: v for k, v in {**ids, **changes}.items() if v is not None}
        if new == ids:
            return False
        self.writes += 1
        self.bridges[name] = dataclasses.replace(self.bridges[name], external_ids=new)
        return True

    def attach_port(self, bridge, port, external_ids, observed):
        if self.ports.get(port) == bridge:
            return False
        self.writes += 1
        self.ports[port] = bridge
        return True

    def delete_port(self, name):
        self.writes += 1
        return self.ports.pop(name, None) is not None

    def delete_bridge(self, name):
        self.writes += 1
        self.bridges.pop(name)
        self.ports = {p: b for p, b in self.ports.items() if b != name}
        if self.nl.link(name):
            self.nl.drop(name)
        return True

    def set_bridge_mapping(self, physnet, bridge, present=True):
        new = merge_bridge_mapping(self.mappings, physnet, bridge, present)
        changed, self.mappings = new != self.mappings, new
        self.writes += changed
        return changed


ADDR = Address("198.18.1.2", 24, "198.18.1.255")
EXTRA_ADDR = Address("198.18.2.2", 24, None, True)
LINK_LOCAL = Address("169.254.10.1", 16)
ROUTE = MovableRoute("198.18.5.0/24", "198.18.1.1", metric=50, proto=4)
DEVICE_ROUTE = MovableRoute("198.18.6.0/24", scope=253)


@pytest.fixture
def host():
    nl = FakeNetlink()
    ovs = FakeOvs(nl)
    eth1 = nl.add("eth1", mac="02:00:00:00:00:e1", mtu=9000)
    nl.addrs[eth1.index] |= {ADDR, EXTRA_ADDR, LINK_LOCAL}
    nl.routes[eth1.index] |= {ROUTE, DEVICE_ROUTE}
    return nl, ovs, ProviderBridges(ovs, nl.open, device_timeout=0.05)


def total_writes(nl, ovs):
    return nl.writes + ovs.writes


def test_ensure_moves_addresses_and_routes_and_records_them(host):
    nl, ovs, bridges = host
    report = bridges.ensure("physnet1", "eth1")
    assert report == BridgeReport("br-physnet1", "eth1", 9000, True)
    eth1, br = nl.links["eth1"], nl.links["br-physnet1"]
    assert nl.addrs[eth1.index] == {LINK_LOCAL}  # link-local stays where it is
    assert nl.addrs[br.index] == {ADDR, EXTRA_ADDR}
    assert nl.routes[br.index] == {ROUTE, DEVICE_ROUTE} and not nl.routes[eth1.index]
    assert br.up and br.mac == eth1.mac
    state = ovs.bridges["br-physnet1"]
    assert state.datapath_type == "netdev" and state.mtu_request == 9000
    assert state.external_ids[OWNER_KEY] == ovs.owner and state.external_ids[NETWORK_KEY] == "physnet1"
    assert state.external_ids[INTERFACE_KEY] == "eth1"
    assert Moved.from_external_ids(state.external_ids) == Moved(
        frozenset({ADDR, EXTRA_ADDR}), frozenset({ROUTE, DEVICE_ROUTE})
    )
    assert ovs.ports == {"eth1": "br-physnet1"}
    assert ovs.mappings == "physnet-foreign:br-foreign,physnet1:br-physnet1"
    assert bridges.owned_networks() == {"physnet1"}

    before = total_writes(nl, ovs)
    assert bridges.ensure("physnet1", "eth1").changed is False
    assert total_writes(nl, ovs) == before  # a converged pass writes nothing


def test_ensure_repairs_drift_from_the_record(host):
    nl, ovs, bridges = host
    bridges.ensure("physnet1", "eth1")
    br = nl.links["br-physnet1"]
    nl.addrs[br.index].clear()  # e.g. ovs-vswitchd re-created the device
    nl.routes[br.index].clear()
    assert bridges.ensure("physnet1", "eth1").changed
    assert nl.addrs[br.index] == {ADDR, EXTRA_ADDR} and nl.routes[br.index] == {ROUTE, DEVICE_ROUTE}


def test_remove_gives_everything_back_and_keeps_foreign_mappings(host):
    nl, ovs, bridges = host
    bridges.ensure("physnet1", "eth1")
    assert bridges.remove("physnet1") is True
    eth1 = nl.links["eth1"]
    assert nl.addrs[eth1.index] == {ADDR, EXTRA_ADDR, LINK_LOCAL}
    assert nl.routes[eth1.index] == {ROUTE, DEVICE_ROUTE}
    assert "br-physnet1" not in nl.links and not ovs.bridges and not ovs.ports
    assert ovs.mappings == "physnet-foreign:br-foreign"
    assert bridges.remove("physnet1") is False  # nothing left: nothing written
    assert bridges.owned_networks() == set()


def test_remove_completes_when_the_uplink_vanished(host):
    nl, ovs, bridges = host
    bridges.ensure("physnet1", "eth1")
    nl.drop("eth1")
    assert bridges.remove("physnet1") is True
    assert not ovs.bridges and "br-physnet1" not in nl.links
    assert ovs.mappings == "physnet-foreign:br-foreign"


def test_a_new_uplink_gets_the_bridge_after_the_old_one_got_its_own_back(host):
    nl, ovs, bridges = host
    bridges.ensure("physnet1", "eth1")
    eth2 = nl.add("eth2", mac="02:00:00:00:00:e2")
    other = Address("198.18.9.2", 24)
    nl.addrs[eth2.index].add(other)
    report = bridges.ensure("physnet1", "eth2")
    assert report.interface == "eth2" and report.changed
    eth1, br = nl.links["eth1"], nl.links["br-physnet1"]
    assert nl.addrs[eth1.index] == {ADDR, EXTRA_ADDR, LINK_LOCAL} and nl.routes[eth1.index] == {ROUTE, DEVICE_ROUTE}
    assert nl.addrs[br.index] == {other} and not nl.routes[br.index]
    assert ovs.ports == {"eth2": "br-physnet1"}
    assert Moved.from_external_ids(ovs.bridges["br-physnet1"].external_ids) == Moved(frozenset({other}))


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda nl, ovs: setattr(ovs, "datapath", None), "integration bridge br-int not found"),
        (lambda nl, ovs: nl.drop("eth1"), "interface eth1 of provider network physnet1 not found"),
        (lambda nl, ovs: ovs.ports.update(eth1="br-other"), "already a port of bridge br-other"),
        (
            lambda nl, ovs: ovs.bridges.update({"br-physnet1": BridgeState("br-physnet1", "netdev", {})}),
            "not managed by this agent",
        ),
        (lambda nl, ovs: setattr(ovs, "create_devices", False), "did not create device br-physnet1"),
    ],
)
def test_ensure_refuses_what_it_cannot_do(host, setup, message):
    nl, ovs, bridges = host
    setup(nl, ovs)
    with pytest.raises(ProviderBridgeError, match=message):
        bridges.ensure("physnet1", "eth1")


def test_remove_leaves_a_foreign_bridge_alone(host):
    nl, ovs, bridges = host
    ovs.bridges["br-physnet1"] = BridgeState("br-physnet1", "netdev", {})
    ovs.mappings = "physnet1:br-physnet1"
    assert bridges.remove("physnet1") is False
    assert "br-physnet1" in ovs.bridges and ovs.mappings == "physnet1:br-physnet1"


def test_a_conflicting_mapping_is_an_error_not_an_overwrite(host):
    nl, ovs, bridges = host
    ovs.mappings = "physnet1:br-theirs"
    with pytest.raises(OvsdbError, match="not overwriting"):
        bridges.ensure("physnet1", "eth1")
    assert ovs.mappings == "physnet1:br-theirs"


# --- the controller over fake bridges ----------------------------------------------------


class InlineExecutor:
    async def run(self, netns, fn, *args):
        assert netns is None  # provider bridges live in the host namespace
        return fn(*args)


class FakeBridges:
    def __init__(self, owned=()):
        self.calls: list[tuple] = []
        self.owned = set(owned)
        self.fail: dict[str, str] = {}
        self.changed = asyncio.Event()
        self.gate: asyncio.Event | None = None

    def _record(self, *call):
        self.calls.append(call)
        self.changed.set()
        if call[1] in self.fail:
            raise ProviderBridgeError(self.fail[call[1]])

    def ensure(self, network, interface):
        self._record("ensure", network, interface)
        return BridgeReport(f"br-{network}", interface, 1500, True)

    def remove(self, network):
        self._record("remove", network)
        self.owned.discard(network)
        return True

    def owned_networks(self):
        return set(self.owned)

    async def wait(self, predicate, what):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while not predicate():
            self.changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise AssertionError(f"timed out waiting for {what}; calls: {self.calls}")
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                pass


@pytest.fixture
async def controller():
    """A controller on a queue that is already being served, as the agent starts its shared queue first."""
    made = []

    def make(owned=(), resync_interval=3600.0):
        fake = FakeBridges(owned)
        queue = WorkQueue("pn-test", backoff_start=0.01, backoff_max=0.02, kind_of=kind_of)
        ctl = ProviderNetworkController(fake, InlineExecutor(), HOST, resync_interval, queue=queue)
        queue.start(Dispatcher({PROVIDER_NETWORK: ctl.reconcile}), workers=2)
        made.append(ctl)
        return ctl, fake

    yield make
    for ctl in made:
        await ctl.stop()
        await ctl.queue.shutdown(timeout=WAIT)


async def apply(ctl, fake, networks, passes: int) -> list:
    """Update to `networks`, wait for `passes` passes and a settled queue; those passes, sorted."""
    fake.calls.clear()
    ctl.update(networks)
    await fake.wait(lambda: len(fake.calls) >= passes, f"{passes} passes")
    await settled(ctl)
    return sorted(fake.calls)


async def settled(ctl):
    """Until the queue has nothing waiting, delayed or running."""
    for _ in range(1000):
        stats = ctl.queue.stats()
        if not (stats["depth"] or stats["delayed"] or stats["processing"]):
            return
        await asyncio.sleep(0)
    raise AssertionError(f"queue never settled: {ctl.queue.stats()}")


async def test_networks_become_ready_with_this_hosts_interface(controller):
    ctl, fake = controller()
    await ctl.start()
    networks = [net("physnet1"), net("physnet2", default="eth3", custom={"eth2": [HOST, "gw-9"]})]
    assert await apply(ctl, fake, networks, 2) == [("ensure", "physnet1", "eth1"), ("ensure", "physnet2", "eth2")]
    assert ctl.status() == [
        {
            "name": "physnet1",
            "state": "ready",
            "bridge": "br-physnet1",
            "interface": "eth1",
            "mtu": 1500,
            "error": None,
            "retries": 0,
        },
        {
            "name": "physnet2",
            "state": "ready",
            "bridge": "br-physnet2",
            "interface": "eth2",
            "mtu": 1500,
            "error": None,
            "retries": 0,
        },
    ]


async def test_pending_before_the_first_pass_and_nothing_removed_before_the_first_update(controller):
    ctl, fake = controller(owned={"old"})
    await ctl.resync()  # the desired state is not known: no orphans yet
    assert fake.calls == [] and ctl.status() == []
    ctl.update([net("physnet1")])
    assert ctl.status()[0]["state"] == "pending"
    await ctl.start()
    await fake.wait(lambda: len(fake.calls) >= 2, "the first resync")
    await settled(ctl)
    assert sorted(fake.calls) == [("ensure", "physnet1", "eth1"), ("remove", "old")]
    assert [s["name"] for s in ctl.status()] == ["physnet1"]


async def test_excluded_host_and_removed_network_are_cleaned_up(controller):
    ctl, fake = controller()
    await ctl.start()
    await apply(ctl, fake, [net("a"), net("b")], 2)
    assert await apply(ctl, fake, [net("a", exclude=[HOST])], 2) == [("remove", "a"), ("remove", "b")]
    assert ctl.status() == [
        {"name": "a", "state": "excluded", "bridge": None, "interface": None, "mtu": None, "error": None, "retries": 0}
    ]


async def test_a_network_without_an_interface_for_this_host_counts_as_excluded(controller):
    ctl, fake = controller()
    await ctl.start()
    assert await apply(ctl, fake, [net("a", default=None, custom={"eth2": ["gw-other"]})], 1) == [("remove", "a")]
    assert ctl.status()[0]["state"] == "excluded"


async def test_unchanged_networks_are_not_queued_again(controller):
    ctl, fake = controller()
    await ctl.start()
    await apply(ctl, fake, [net("a"), net("b")], 2)
    assert await apply(ctl, fake, [net("a"), net("b", default="eth7")], 1) == [("ensure", "b", "eth7")]


async def test_failures_show_in_status_and_are_retried_until_they_succeed(controller):
    ctl, fake = controller()
    fake.fail["a"] = "interface eth1 of provider network a not found"
    await ctl.start()
    ctl.update([net("a")])
    await fake.wait(lambda: len(fake.calls) >= 2, "a retry")
    status = ctl.status()[0]
    assert status["state"] == "error" and status["error"] == "interface eth1 of provider network a not found"
    assert status["retries"] >= 1 and status["bridge"] == "br-a"
    del fake.fail["a"]
    await fake.wait(lambda: ctl.status()[0]["state"] == "ready", "recovery")
    assert ctl.status()[0]["error"] is None and ctl.status()[0]["retries"] == 0


async def test_a_failed_removal_stays_visible_until_it_completes(controller):
    ctl, fake = controller()
    await ctl.start()
    await apply(ctl, fake, [net("a")], 1)
    fake.fail["a"] = "OVSDB down"
    ctl.update([])
    await fake.wait(lambda: ctl.status() and ctl.status()[0]["state"] == "error", "the failed removal")
    assert ctl.status()[0]["bridge"] == "br-a"
    del fake.fail["a"]
    await fake.wait(lambda: ctl.status() == [], "the removal to complete")


async def test_periodic_resync_queues_every_network(controller):
    ctl, fake = controller(resync_interval=0.02)
    ctl.update([net("a")])
    await ctl.start()
    await fake.wait(lambda: len(fake.calls) >= 3, "repeated resyncs")
    assert set(fake.calls) == {("ensure", "a", "eth1")}


async def test_resync_survives_an_unreadable_ovs(controller):
    ctl, fake = controller()
    fake.owned_networks = lambda: (_ for _ in ()).throw(OvsdbError("not connected to OVSDB"))
    ctl.update([net("a")])
    await ctl.start()
    await fake.wait(lambda: fake.calls, "the desired network's pass")
    assert fake.calls == [("ensure", "a", "eth1")]


async def test_a_result_for_a_spec_that_changed_meanwhile_is_not_reported(controller):
    ctl, fake = controller()
    ctl.update([net("a")])
    original = ctl._desired["a"]
    # The pass reads spec 1, and the spec changes before it finishes.
    fake.ensure = lambda network, interface: (
        ctl.update([net("a", default="eth9")]),
        BridgeReport("br-a", interface, 1500, False),
    )[1]
    await ctl.reconcile("a")
    assert ctl._desired["a"] is not original
    assert ctl.status()[0]["state"] == "pending" and ctl.status()[0]["interface"] == "eth9"
    assert ctl.queue.depth == 1  # and it runs again


async def test_reconcile_before_any_desired_state_does_nothing(controller):
    ctl, fake = controller()
    await ctl.reconcile("a")
    assert fake.calls == []


def test_bridge_name():
    assert bridges_mod.bridge_name("physnet1") == "br-physnet1"
