"""HaKeeper: several hosts' keepers over one in-memory Northbound database."""

from __future__ import annotations

import asyncio

import pytest

from lbagent.desired.ha import HighAvailability
from lbagent.ovnhost.errors import OvsdbUnavailable
from lbagent.ovnhost.northbound import Guard, LeaseWrite, PortLease, PortsRead
from lbagent.workers.ha import ACTIVE, STANDBY, UNKNOWN, HaKeeper, copy_state
from lbagent.workers.lease import BEAT, GRACE, HOLDER, TERM, UNWELL, Copy, Timing

PORT = "iface/lb/lb-1"
HA = HighAvailability(hosts=["gw-1", "gw-2"])
LEASE = 1.5


class FakeNorthbound:
    """The ports' lbagent keys and requested-chassis; commits are compare-and-swap."""

    def __init__(self):
        self.ports_by_name = {PORT: PortLease(PORT)}
        self.transactions = 0
        self.reads = 0
        self.guarded = True  # False: guards are ignored, as if there were none

    def view(self, client) -> NorthboundView:
        return NorthboundView(self, client)

    def commit(self, writes: list[LeaseWrite]) -> list[bool]:
        self.transactions += 1
        applied = []
        for write in writes:
            port = self.ports_by_name.get(write.port)
            if port is None or {k: v for k, v in port.keys.items() if k not in write.unchecked} != write.expect:
                applied.append(False)
                continue
            if self.guarded and not all(self._holds(guard) for guard in write.guards):
                applied.append(False)
                continue
            keys = {k: v for k, v in {**port.keys, **write.set_keys}.items() if k not in write.delete_keys}
            chassis = port.requested_chassis if write.requested_chassis is None else write.requested_chassis
            self.ports_by_name[write.port] = PortLease(write.port, keys, chassis)
            applied.append(True)
        return applied

    def _holds(self, guard: Guard) -> bool:
        port = self.ports_by_name.get(guard.port)
        return port is not None and port.keys.get(guard.key) == guard.value


class NorthboundView:
    """One host's client: it can lose contact on its own."""

    def __init__(self, db: FakeNorthbound, name: str):
        self.db = db
        self.name = name
        self.reachable = True
        self.is_connected = False
        self.closed = False
        self.watched: frozenset[str] = frozenset()
        self.unanswered: set[str] = set()

    def generation(self):
        self.db.reads += 1  # a new number each time: the keeper reads the ports again
        return self.db.reads

    def connect(self):
        if not self.reachable:
            raise OvsdbUnavailable(f"{self.name}: unreachable")
        self.is_connected = True

    def connected(self):
        return self.is_connected and self.reachable

    def watch(self, names):
        self._check()
        self.watched = frozenset(names)

    def read(self, names):
        # A port watched since less than a round trip: as the real replica says of it.
        pending = frozenset(n for n in names if n in self.unanswered)
        return PortsRead(self.ports([n for n in names if n not in pending]), pending)

    def ports(self, names):
        self._check()
        return {n: self.db.ports_by_name[n] for n in names if n in self.db.ports_by_name}

    def commit(self, writes):
        self._check()
        return self.db.commit(writes)

    def probe(self):
        self.commit([])

    def close(self):
        self.closed = True

    def _check(self):
        if not self.reachable:
            raise OvsdbUnavailable(f"{self.name}: unreachable")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class Host:
    def __init__(self, db: FakeNorthbound, clock: Clock, name: str, ha=HA, grace: float = 30.0):
        self.nb = db.view(name)
        self.copy = Copy(built=True, failing=False, bound=True)
        self.roles: list[str] = []
        self.ha = ha
        self.present = False  # the load balancer stays here once its `ha` is gone
        self.chassis = f"ch-{name}"
        self.keeper = HaKeeper(
            self.nb,
            name,
            lambda: self.chassis,
            Timing(LEASE),
            grace,
            lambda: {"lb-1": self.ha} if self.ha is not None else {},
            lambda lb_id: self.copy,
            present=lambda lb_id: self.present,
            on_role=lambda lb_id: self.roles.append(self.keeper.role(lb_id)),
            clock=clock,
        )


@pytest.fixture
def world():
    db, clock = FakeNorthbound(), Clock()
    return db, clock, Host(db, clock, "gw-1"), Host(db, clock, "gw-2")


async def tick_all(clock: Clock, *hosts: Host, seconds: float = 0.0, step: float = 0.15) -> None:
    """Every host ticks every `step` of the lease clock for `seconds`."""
    end = clock.now + seconds
    while True:
        for host in hosts:
            await host.keeper.tick()
        if clock.now >= end:
            return
        clock.now = min(end, clock.now + step)


def holder(db: FakeNorthbound) -> tuple[str, str]:
    port = db.ports_by_name[PORT]
    return port.keys.get(HOLDER, ""), port.requested_chassis


async def test_the_preferred_host_takes_a_new_lease_and_the_other_stands_by(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=3)
    assert holder(db) == ("gw-1", "ch-gw-1")
    assert (gw1.keeper.role("lb-1"), gw2.keeper.role("lb-1")) == (ACTIVE, STANDBY)
    assert gw2.keeper.status("lb-1")["active_host"] == "gw-1"
    assert gw1.roles == [ACTIVE]  # took it in its first tick
    assert gw2.roles == [STANDBY]


async def test_the_replica_watches_the_ports_of_the_load_balancers_with_ha_alone(world):
    db, clock, gw1, _ = world
    lb2 = "iface/lb/lb-2"
    db.ports_by_name[lb2] = PortLease(lb2)
    await tick_all(clock, gw1, seconds=0.3)
    assert gw1.nb.watched == {PORT} and gw1.keeper.role("lb-1") == ACTIVE

    gw1.keeper._loadbalancers = lambda: {"lb-1": HA, "lb-2": HA}
    await tick_all(clock, gw1, seconds=0.3)
    assert gw1.nb.watched == {PORT, lb2} and gw1.keeper.role("lb-2") == ACTIVE

    gw1.keeper._loadbalancers = dict  # both gone: offered away, then nothing watched
    await tick_all(clock, gw1, seconds=0.3)
    assert gw1.nb.watched == frozenset()


async def test_a_port_whose_watch_is_unanswered_is_not_taken_for_missing(world):
    db, clock, gw1, _ = world
    await tick_all(clock, gw1, seconds=0.3)
    lb2 = "iface/lb/lb-2"
    db.ports_by_name[lb2] = PortLease(lb2)
    gw1.nb.unanswered.add(lb2)  # watched from this tick on; its row not in the replica yet
    gw1.keeper._loadbalancers = lambda: {"lb-1": HA, "lb-2": HA}
    before = db.transactions
    await tick_all(clock, gw1, seconds=0.3)
    assert gw1.keeper.role("lb-2") is None  # not "standby: no logical switch port"
    assert HOLDER not in db.ports_by_name[lb2].keys and gw1.keeper.role("lb-1") == ACTIVE
    assert db.transactions > before  # the other leases carry on meanwhile

    gw1.nb.unanswered.clear()
    await tick_all(clock, gw1, seconds=0.3)
    assert gw1.keeper.role("lb-2") == ACTIVE and db.ports_by_name[lb2].keys[HOLDER] == "gw-1"


async def test_one_heartbeat_on_one_beacon_keeps_every_lease_and_leases_are_not_rewritten(world):
    db, clock, gw1, gw2 = world
    lb2 = "iface/lb/lb-2"
    db.ports_by_name[lb2] = PortLease(lb2)
    gw1.keeper._loadbalancers = gw2.keeper._loadbalancers = lambda: {"lb-1": HA, "lb-2": HA}
    await tick_all(clock, gw1, seconds=0)
    leases = {name: dict(port.keys) for name, port in db.ports_by_name.items()}
    before = db.transactions
    await tick_all(clock, gw1, gw2, seconds=10)
    assert holder(db)[0] == "gw-1" and db.ports_by_name[lb2].keys[HOLDER] == "gw-1"
    assert gw2.keeper.role("lb-1") == gw2.keeper.role("lb-2") == STANDBY
    beats = int(db.ports_by_name[PORT].keys[BEAT])
    assert beats >= 10 / (LEASE / 3)  # at least three beats per lease time
    assert db.transactions - before == beats  # one transaction per beat, and nothing else written
    assert BEAT not in db.ports_by_name[lb2].keys  # the first port by name is gw-2's beacon
    assert {k: v for k, v in db.ports_by_name[PORT].keys.items() if k != BEAT} == leases[PORT]
    assert db.ports_by_name[lb2].keys == leases[lb2]


async def test_a_silent_holder_is_taken_over_after_the_lease_time(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    last_beat = gw2.keeper._heard["gw-1"].at  # as gw-2 heard it, on its clock
    assert last_beat > gw2.keeper._roles["lb-1"].watch.changed_at  # heard since the lease last moved
    # gw-1 is dead from now on: only gw-2 ticks.
    await tick_all(clock, gw2, seconds=last_beat + LEASE - 0.05 - clock.now)
    assert holder(db)[0] == "gw-1"
    await tick_all(clock, gw2, seconds=0.2)
    assert holder(db) == ("gw-2", "ch-gw-2")
    assert db.ports_by_name[PORT].keys[TERM] == "2"
    assert gw2.keeper.role("lb-1") == ACTIVE
    assert LEASE <= gw2.keeper.status("lb-1")["last_failover_s"] <= LEASE + 0.2
    # The old holder, back, sees the newer term and stands by; it takes nothing back.
    await tick_all(clock, gw1, gw2, seconds=3)
    assert (gw1.keeper.role("lb-1"), holder(db)[0]) == (STANDBY, "gw-2")


async def test_a_stopping_holder_asks_for_grace_and_a_restart_moves_nothing(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    await gw1.keeper.stop()
    assert db.ports_by_name[PORT].keys[GRACE] == "30"
    await tick_all(clock, gw2, seconds=20)  # the agent restarts meanwhile
    assert holder(db)[0] == "gw-1"
    again = Host(db, clock, "gw-1")
    await tick_all(clock, again, gw2, seconds=2)
    assert holder(db)[0] == "gw-1"
    assert GRACE not in db.ports_by_name[PORT].keys
    assert again.keeper.role("lb-1") == ACTIVE
    assert db.ports_by_name[PORT].keys[TERM] == "1"


async def test_a_holder_that_never_comes_back_is_taken_over_after_the_grace(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    await gw1.keeper.stop()
    await tick_all(clock, gw2, seconds=29)
    assert holder(db)[0] == "gw-1"
    await tick_all(clock, gw2, seconds=2)
    assert holder(db)[0] == "gw-2"


async def test_a_standby_out_of_contact_never_takes_over_and_waits_a_lease_after_contact(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    gw2.nb.reachable = False
    await tick_all(clock, gw2, seconds=5)  # gw-1 died meanwhile, but gw-2 cannot tell
    assert gw2.keeper.role("lb-1") == UNKNOWN
    assert holder(db)[0] == "gw-1"
    gw2.nb.reachable = True
    await tick_all(clock, gw2, seconds=1.4)
    assert holder(db)[0] == "gw-1"
    await tick_all(clock, gw2, seconds=0.3)
    assert holder(db)[0] == "gw-2"


async def test_an_active_host_out_of_contact_says_unknown_and_steps_down_on_return(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    gw1.nb.reachable = False
    await tick_all(clock, gw1, gw2, seconds=3)
    assert gw1.keeper.role("lb-1") == UNKNOWN
    assert not gw1.keeper.in_contact()
    assert holder(db)[0] == "gw-2"
    gw1.nb.reachable = True
    await tick_all(clock, gw1, gw2, seconds=1)
    assert gw1.keeper.role("lb-1") == STANDBY
    assert gw1.keeper.role_counts() == {ACTIVE: 0, STANDBY: 1, UNKNOWN: 0}


async def test_a_failing_copy_gives_the_lease_up_to_a_working_one(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    gw1.copy = Copy(built=False, failing=True)
    await tick_all(clock, gw1, gw2, seconds=2.5)
    assert holder(db)[0] == "gw-2"


async def test_a_standby_without_a_built_copy_never_takes_over(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    gw2.copy = Copy(built=False, failing=False)
    await tick_all(clock, gw2, seconds=10)
    assert holder(db)[0] == "gw-1"


async def test_preempt_brings_the_lease_back_to_the_preferred_host():
    db, clock = FakeNorthbound(), Clock()
    preempting = HighAvailability(hosts=["gw-1", "gw-2"], preempt=True)
    gw1, gw2 = Host(db, clock, "gw-1", preempting), Host(db, clock, "gw-2", preempting)
    gw1.copy = Copy(built=False, failing=False)  # gw-1 is still building
    await tick_all(clock, gw1, gw2, seconds=3)
    assert holder(db)[0] == "gw-2"
    gw1.copy = Copy(built=True, failing=False)
    await tick_all(clock, gw1, gw2, seconds=0.5)
    assert holder(db)[0] == "gw-1"


async def test_a_handover_moves_the_lease_to_the_next_ready_host(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    asked = asyncio.ensure_future(gw1.keeper.handover(None, timeout=10))
    await asyncio.sleep(0)
    await tick_all(clock, gw1, gw2, seconds=0.5)
    assert await asked == [{"id": "lb-1", "result": "handed_over", "active_host": "gw-2"}]
    assert holder(db)[0] == "gw-2"
    assert await gw1.keeper.handover(["lb-1", "nope"], timeout=1) == [
        {"id": "lb-1", "result": "not_active", "active_host": "gw-2"},
        {"id": "nope", "result": "not_ha"},
    ]


async def test_a_handover_nobody_takes_is_withdrawn(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    gw2.copy = Copy(built=False, failing=False)
    asked = asyncio.ensure_future(gw1.keeper.handover(["lb-1"], timeout=10))
    await asyncio.sleep(0)
    await tick_all(clock, gw1, gw2, seconds=4)
    assert await asked == [{"id": "lb-1", "result": "not_taken", "active_host": "gw-1"}]
    await tick_all(clock, gw1, seconds=0.6)
    assert "lbagent:handover" not in db.ports_by_name[PORT].keys
    assert holder(db)[0] == "gw-1"


async def test_a_missing_port_leaves_the_host_standing_by_and_an_unreachable_nb_is_retried(world):
    db, clock, gw1, _ = world
    del db.ports_by_name[PORT]
    await tick_all(clock, gw1, seconds=1)
    assert gw1.keeper.status("lb-1")["role"] == STANDBY
    gw1.nb.reachable = False
    gw1.nb.is_connected = False
    await gw1.keeper.tick()
    assert "unreachable" in gw1.keeper.last_error
    gw1.ha = None
    await gw1.keeper.tick()
    assert gw1.keeper.role("lb-1") is None


def test_copy_state_reads_a_task_and_its_observation():
    class Task:
        passed, state = True, "pending"

    class Runtime:
        class observation:  # noqa: N801 - stands for a HostObservation
            ovn_installed = False

    assert copy_state(None) == Copy(built=False, failing=False)
    assert copy_state(Task()) == Copy(built=True, failing=False, bound=None)
    assert copy_state(Task(), Runtime()) == Copy(built=True, failing=False, bound=False)
    Task.state = "error"
    assert copy_state(Task()) == Copy(built=False, failing=True)


async def test_a_grace_is_cut_short_when_northd_says_the_port_is_down(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    await gw1.keeper.stop()  # a host shutting down: its agent first, then its ovn-controller
    port = db.ports_by_name[PORT]
    db.ports_by_name[PORT] = PortLease(PORT, port.keys, port.requested_chassis, up=False)
    await tick_all(clock, gw2, seconds=LEASE + 0.5)
    assert holder(db)[0] == "gw-2"


async def test_a_holder_whose_port_never_binds_gives_the_lease_up(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    gw1.copy = Copy(built=True, failing=False, bound=False)  # its ovn-controller is gone
    await tick_all(clock, gw1, gw2, seconds=4 * LEASE - 0.5)
    assert holder(db)[0] == "gw-1"
    await tick_all(clock, gw1, gw2, seconds=LEASE + 1)
    assert holder(db)[0] == "gw-2"


async def test_no_chassis_name_no_take(world):
    db, clock, gw1, _ = world
    gw1.chassis = ""
    await tick_all(clock, gw1, seconds=3)
    assert holder(db) == ("", "")


async def test_a_handed_over_load_balancer_is_not_preempted_back():
    db, clock = FakeNorthbound(), Clock()
    preempting = HighAvailability(hosts=["gw-1", "gw-2"], preempt=True)
    gw1, gw2 = Host(db, clock, "gw-1", preempting), Host(db, clock, "gw-2", preempting)
    await tick_all(clock, gw1, gw2, seconds=1)
    asked = asyncio.ensure_future(gw1.keeper.handover(["lb-1"], timeout=10))
    await asyncio.sleep(0)
    await tick_all(clock, gw1, gw2, seconds=0.5)
    assert (await asked)[0]["result"] == "handed_over"
    await tick_all(clock, gw1, gw2, seconds=5)
    assert holder(db)[0] == "gw-2"


async def test_a_held_load_balancer_removed_here_is_offered_on_at_once(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    gw1.ha = None  # the region controller took gw-1 out: the load balancer is gone from it
    await tick_all(clock, gw1, gw2, seconds=0.3)
    assert holder(db)[0] == "gw-2"  # well before a lease time


async def test_a_held_load_balancer_that_loses_ha_releases_the_lease_and_keeps_its_binding(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, seconds=1)
    gw1.ha, gw1.present = None, True
    await tick_all(clock, gw1, seconds=0.3)
    assert db.ports_by_name[PORT].keys == {}
    assert db.ports_by_name[PORT].requested_chassis == "ch-gw-1"


async def test_out_of_contact_from_the_start_is_unknown_and_said_so():
    db, clock = FakeNorthbound(), Clock()
    gw1 = Host(db, clock, "gw-1")
    gw1.nb.reachable = False
    await gw1.keeper.tick()
    assert gw1.keeper.role("lb-1") == UNKNOWN
    assert gw1.roles == [UNKNOWN]  # readiness hears of it: the host serves as it was


async def test_a_handover_whose_outcome_is_not_known_says_so(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    gw2.copy = Copy(built=False, failing=False)
    asked = asyncio.ensure_future(gw1.keeper.handover(["lb-1"], timeout=10))
    await asyncio.sleep(0)
    await tick_all(clock, gw1, seconds=0.3)
    gw1.nb.reachable = False
    await tick_all(clock, gw1, seconds=4)
    assert (await asked)[0]["result"] == "unknown"


class SilentNorthbound(NorthboundView):
    """Connected as far as the session knows, but no transaction is answered (a partition
    the probes have not noticed yet)."""

    silent = False

    def commit(self, writes):
        if self.silent:
            raise OvsdbUnavailable("no answer within 1.5s")
        return super().commit(writes)


async def test_a_holder_whose_heartbeats_go_unanswered_says_unknown_within_a_lease(world):
    db, clock, gw1, gw2 = world
    gw1.nb.__class__ = SilentNorthbound
    await tick_all(clock, gw1, gw2, seconds=1)
    gw1.nb.silent = True
    failed, started = 0, clock.now
    while gw1.keeper.role("lb-1") != UNKNOWN and clock.now - started < 3:
        clock.now += 0.15
        try:
            await gw1.keeper.tick()  # as the loop does: a failed heartbeat is logged, the next tick comes
        except OvsdbUnavailable:
            failed += 1
    assert gw1.keeper.role("lb-1") == UNKNOWN and failed >= 1
    assert clock.now - started <= LEASE + 0.6  # a lease after the first unanswered heartbeat
    assert not gw1.keeper.in_contact()
    assert gw1.roles.count(UNKNOWN) == 1  # said once, not flapping each tick
    gw1.nb.silent = False
    await tick_all(clock, gw1, gw2, seconds=1)
    assert gw1.keeper.role("lb-1") in (ACTIVE, STANDBY) and gw1.keeper.in_contact()


def test_an_error_naming_thousands_of_writes_is_cut_short():
    from lbagent.workers.ha import MAX_ERROR_CHARS, _short

    text = _short(RuntimeError("x" * 50_000))
    assert len(text) < MAX_ERROR_CHARS + 40 and text.endswith("(50000 characters)")


async def test_an_unchanged_replica_is_not_read_again(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    read = []
    real = gw2.nb.ports
    gw2.nb.ports = lambda names: read.append(names) or real(names)
    gw2.nb.generation = lambda: 42  # nothing arrives from the server
    await gw2.keeper.tick()
    await gw2.keeper.tick()
    assert len(read) == 1
    gw2.nb.generation = lambda: 43  # a beat arrived
    await gw2.keeper.tick()
    assert len(read) == 2


def three_hosts(names: list[str]) -> tuple[FakeNorthbound, Clock, list[Host]]:
    """Three hosts, each serving load balancers `names` with `ha` on all three."""
    db, clock = FakeNorthbound(), Clock()
    ha = HighAvailability(hosts=["gw-1", "gw-2", "gw-3"])
    hosts = [Host(db, clock, name) for name in ("gw-1", "gw-2", "gw-3")]
    for host in hosts:
        host.keeper._loadbalancers = lambda: {name: ha for name in names}
    db.ports_by_name = {f"iface/lb/{name}": PortLease(f"iface/lb/{name}") for name in names}
    return db, clock, hosts


async def test_a_holder_beats_on_one_beacon_per_standby_and_keeps_it_when_a_port_sorts_before():
    db, clock, hosts = three_hosts(["lb-b", "lb-c"])
    await tick_all(clock, *hosts, seconds=2)
    beating = sorted(name for name, port in db.ports_by_name.items() if BEAT in port.keys)
    assert beating == ["iface/lb/lb-b"]  # the first held port lists both standbys
    assert hosts[0].keeper._beacons == {"gw-2": "iface/lb/lb-b", "gw-3": "iface/lb/lb-b"}
    db.ports_by_name["iface/lb/lb-a"] = PortLease("iface/lb/lb-a")
    for host in hosts:
        host.keeper._loadbalancers = lambda: {
            name: HighAvailability(hosts=["gw-1", "gw-2", "gw-3"]) for name in ["lb-a", "lb-b", "lb-c"]
        }
    await tick_all(clock, *hosts, seconds=2)
    assert db.ports_by_name["iface/lb/lb-a"].keys[HOLDER] == "gw-1"
    assert BEAT not in db.ports_by_name["iface/lb/lb-a"].keys  # a standby may not serve it yet: the beacon stays
    assert {host.keeper.role(lb) for host in hosts[1:] for lb in ("lb-a", "lb-b", "lb-c")} == {STANDBY}


async def test_a_beacon_taken_over_moves_to_the_next_held_port_and_nothing_else_moves():
    db, clock, hosts = three_hosts(["lb-a", "lb-b"])
    await tick_all(clock, *hosts, seconds=2)
    asked = asyncio.ensure_future(hosts[0].keeper.handover(["lb-a"], timeout=10))
    await asyncio.sleep(0)
    await tick_all(clock, *hosts, seconds=1)
    assert (await asked)[0]["result"] == "handed_over"
    await tick_all(clock, *hosts, seconds=5)
    assert db.ports_by_name["iface/lb/lb-a"].keys[HOLDER] == "gw-2"
    assert db.ports_by_name["iface/lb/lb-b"].keys[HOLDER] == "gw-1"  # gw-1's beats moved to lb-b in time
    assert db.ports_by_name["iface/lb/lb-b"].keys[TERM] == "1"
    assert hosts[0].keeper._beacons == {"gw-2": "iface/lb/lb-b", "gw-3": "iface/lb/lb-b"}


async def test_a_failing_copy_marks_the_lease_unwell_and_a_standby_takes_it_at_once(world):
    db, clock, gw1, gw2 = world
    await tick_all(clock, gw1, gw2, seconds=1)
    gw1.copy = Copy(built=False, failing=True)
    await tick_all(clock, gw1, gw2, seconds=0.3)  # the holder still beats: only `unwell` can tell
    assert holder(db)[0] == "gw-2"
    assert UNWELL not in db.ports_by_name[PORT].keys


async def lagging_standby_takeover(guarded: bool) -> str:
    """gw-2's replica stops following while gw-1 keeps beating: gw-2 hears silence
    and takes over, on a view older than the beat the server has."""
    db, clock = FakeNorthbound(), Clock()
    db.guarded = guarded
    gw1, gw2 = Host(db, clock, "gw-1"), Host(db, clock, "gw-2")
    await tick_all(clock, gw1, gw2, seconds=1)
    frozen = dict(db.ports_by_name)
    gw2.nb.ports = lambda names: {n: frozen[n] for n in names if n in frozen}
    await tick_all(clock, gw1, gw2, seconds=2 * LEASE)
    return holder(db)[0]


async def test_a_takeover_after_silence_is_undone_by_a_beat_it_did_not_see():
    assert await lagging_standby_takeover(guarded=True) == "gw-1"
    assert await lagging_standby_takeover(guarded=False) == "gw-2"  # what the guards prevent


async def test_a_lease_whose_inputs_did_not_change_is_decided_again_only_when_due(monkeypatch):
    import lbagent.workers.ha as ha_module

    db, clock, (gw1, gw2, gw3) = three_hosts(["lb-a", "lb-b"])
    await tick_all(clock, gw1, gw2, gw3, seconds=1)
    calls: list[tuple[str, str]] = []
    real = ha_module.decide

    def counted(me, chassis, ha, port, *args, **kw):
        calls.append((me, port.name))
        return real(me, chassis, ha, port, *args, **kw)

    monkeypatch.setattr(ha_module, "decide", counted)
    await tick_all(clock, gw1, gw2, seconds=3)
    # lb-a carries the beats: its row changes, so it is looked at again; lb-b's does not.
    assert calls.count(("gw-1", "iface/lb/lb-b")) == 0
    # Nor does a standby: each beat it hears moves its wait on, without deciding again.
    assert calls.count(("gw-2", "iface/lb/lb-b")) == 0
    assert {port.keys[HOLDER] for port in db.ports_by_name.values()} == {"gw-1"}
    gw1.copy = Copy(built=False, failing=True)  # a changed input is decided at once
    await tick_all(clock, gw1, seconds=0)
    assert calls.count(("gw-1", "iface/lb/lb-b")) == 1 and UNWELL in db.ports_by_name["iface/lb/lb-b"].keys
    gw1.copy = Copy(built=True, failing=False, bound=True)
    gw1.keeper._beat_at = clock.now + 1000  # gw-1 stops beating: gw-2 looks again once its wait runs out
    await tick_all(clock, gw1, seconds=0)
    before = calls.count(("gw-2", "iface/lb/lb-b"))
    await tick_all(clock, gw1, gw2, seconds=LEASE + 0.3)
    assert db.ports_by_name["iface/lb/lb-b"].keys[HOLDER] == "gw-2"
    # Looked at on each change of the lease (unwell, well again) and when the wait ran out: not every tick.
    assert calls.count(("gw-2", "iface/lb/lb-b")) - before <= 4
