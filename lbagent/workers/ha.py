"""`HaKeeper`: this host's side of the leases of its highly available load balancers.

Every `tick` it reads the lease of each load balancer with `ha` from the
Northbound replica, asks `lease.decide` what to write, and commits all the
writes of the tick in one transaction. A lease whose port, copy and offer
are as at the last decision, and none of whose waits has run out, is not
decided again. It owns each load balancer's role as this host sees it
(`active`, `standby`, or `unknown` while the Northbound database is out of
reach: the data path then keeps serving as it was), the handovers asked for
through the API, the grace a stopping agent asks for, and the host's
heartbeat.

The heartbeat shows that the host holding leases is alive, for all of them
at once: every renewal interval it raises `lbagent:beat` on its beacons, one
port for each other host that stands by for any of its leases (the first
port it holds, by name, whose load balancer lists that host; a beacon stays
while it is held, so a load balancer added later does not move it). The
upkeep of a thousand leases is thus a transaction of one or two rows, and
every standby's replica receives those rows only. A standby hears a host
when a beat moves on any port that host holds; its silence clock for a
lease restarts on that, or on the lease's own keys moving, and its takeover
after silence checks the beats it heard in the same transaction.

Restarts are not failures: `stop` renews every lease this host holds with a
`grace` of `restart_grace` seconds in one transaction, and standbys wait that
long before taking over; the agent that starts again finds itself the holder
and renews (which clears the grace). A crashed host writes no grace: its
standbys take over after the lease time. The data path is the same on every
host (warm standby); what moves traffic is `requested-chassis`, written in
the same transaction that takes the lease, so ovn-controller binds the port
on the new holder's chassis and releases it on the old one.

A host that loses the Northbound database stops measuring: when contact
comes back, every lease is watched from that moment on, as if new. A standby
out of contact can never take over (its writes cannot commit), and one that
just regained it waits a full lease time first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from lbagent.desired.ha import HighAvailability
from lbagent.errors import LbAgentError
from lbagent.metrics import HA_FAILOVERS, HA_RENEW_SECONDS
from lbagent.naming import iface_id
from lbagent.ovnhost.northbound import Guard, LeaseWrite, NorthboundClient, PortLease, PortsRead
from lbagent.support.blocking import BlockingPool
from lbagent.workers.lease import (
    BEAT,
    HOLDER,
    NOT_HEARD,
    Copy,
    Decision,
    Heard,
    Lease,
    Timing,
    Watch,
    beat_write,
    decide,
    write_for,
)

log = logging.getLogger(__name__)

ACTIVE, STANDBY, UNKNOWN = "active", "standby", "unknown"
ROLES = (ACTIVE, STANDBY, UNKNOWN)
TICKS_PER_LEASE = 10
RECONNECT_INTERVAL = 2.0  # seconds between two tries to reach an unreachable Northbound database
MAX_ERROR_CHARS = 500  # an OVSDB error names every write of its transaction: thousands of them


def _short(exc: BaseException) -> str:
    text = str(exc)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + f"... ({len(text)} characters)"


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class _Role:
    """What this host knows of one load balancer's lease."""

    watch: Watch
    port_name: str = ""
    role: str | None = None  # None until the first tick that concerns it
    ha: HighAvailability | None = None  # as last wanted
    gave_away: bool = False  # handed over on request: no preempting it back
    active_host: str = ""
    term: int = 0
    since: str = field(default_factory=_now_iso)
    last_failover_s: float | None = None
    offers: list[str] = field(default_factory=list)  # hosts still to offer a handover to, the current first
    offer_deadline: float = 0.0
    # What the last decision was made on, and until when it holds (None: decide again).
    inputs: tuple | None = None
    due: float = 0.0
    beat_wait: float | None = None
    holder: str = ""  # the lease's holder at the last decision

    def rewatch(self, now: float) -> None:
        """Watch the lease afresh from `now`: nothing seen before counts."""
        self.watch, self.inputs = Watch(first_seen=now), None

    def document(self) -> dict:
        return {
            "role": self.role,
            "active_host": self.active_host or None,
            "term": self.term,
            "since": self.since,
            "last_failover_s": self.last_failover_s,
        }


class HaKeeper:
    def __init__(
        self,
        nb: NorthboundClient,
        host: str,
        chassis: Callable[[], str],
        timing: Timing,
        restart_grace: float,
        loadbalancers: Callable[[], dict[str, HighAvailability]],
        copy_of: Callable[[str], Copy],
        present: Callable[[str], bool] = lambda lb_id: False,
        on_role: Callable[[str], None] = lambda lb_id: None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._nb = nb
        self._pool = BlockingPool("ovn-nb", 1)
        self.host = host
        self._chassis = chassis  # read once connected: it may come from the local OVSDB
        self.timing = timing
        self._restart_grace = restart_grace
        self._loadbalancers = loadbalancers
        self._copy_of = copy_of
        self._present = present  # the load balancer is still wanted here (without `ha`)
        self._on_role = on_role
        self._clock = clock
        self._roles: dict[str, _Role] = {}
        self._in_contact = False
        # Since when this host's lease transactions go unanswered (a partition the
        # session has not noticed yet: its probes take seconds): None while they commit.
        self._unanswered_since: float | None = None
        self._last_read: tuple[object, tuple[str, ...], PortsRead] | None = None
        self._names_for: dict[str, HighAvailability] | None = None  # the load balancers `_names` are of
        self._names: tuple[str, ...] = ()
        self._watching: frozenset[str] | None = None  # the ports the replica was last told to watch
        self._next_connect = 0.0
        self._heard: dict[str, Heard] = {}  # other holders' heartbeats
        self._heard_beats: dict[str, dict[str, str | None]] = {}  # holder -> its ports -> beat, as last seen
        self._heard_in: dict[str, PortLease] | None = None  # the read they were taken from
        self._beacons: dict[str, str] = {}  # other host -> the port this host beats on for it
        self._beat_at: float | None = None
        self._ticked = asyncio.Condition()
        self.last_error: str | None = None

    @property
    def tick_interval(self) -> float:
        return self.timing.lease / TICKS_PER_LEASE

    # --- what others read ---------------------------------------------------

    def role(self, lb_id: str) -> str | None:
        """This host's role for the load balancer; None if it has no `ha` (or is not known yet)."""
        found = self._roles.get(lb_id)
        return found.role if found is not None else None

    def status(self, lb_id: str) -> dict | None:
        found = self._roles.get(lb_id)
        return found.document() if found is not None else None

    def role_counts(self) -> dict[str, int]:
        counts = dict.fromkeys(ROLES, 0)
        for found in self._roles.values():
            if found.role is not None:
                counts[found.role] += 1
        return counts

    def in_contact(self) -> bool:
        return self._in_contact and self._unanswered_since is None

    # --- the loop -----------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception as exc:  # noqa: BLE001 - the next tick tries again
                self.last_error = _short(exc)
                log.warning("object=ha action=tick result=error error=%r", _short(exc))
            await asyncio.sleep(self.tick_interval)

    async def tick(self) -> None:
        """One look at every lease, and one transaction for what it decided."""
        try:
            await self._tick()
        finally:
            async with self._ticked:  # handovers waiting for their outcome look again
                self._ticked.notify_all()

    async def _tick(self) -> None:
        wanted = self._loadbalancers()
        gone = {lb_id: state for lb_id, state in self._roles.items() if lb_id not in wanted}
        for lb_id in gone:
            del self._roles[lb_id]
        if not await self._contact(self._clock()):
            now = self._clock()
            for lb_id in wanted:
                self._set_role(lb_id, self._role_of(lb_id, now), UNKNOWN, None, "out of contact with the Northbound")
            return
        leaving = {lb_id: state for lb_id, state in gone.items() if state.role == ACTIVE}
        names = self._port_names(wanted, leaving)
        await self._watch(names)
        if not wanted and not leaving:
            return
        read = await self._read(names)
        ports = read.ports
        now = self._clock()  # after the read: what it saw is at least this recent
        self._listen(ports, now)
        chassis = self._chassis()
        decided: list[tuple[str, PortLease, Decision]] = []
        held: list[tuple[PortLease, HighAvailability]] = []
        roles = self._roles
        for lb_id, ha in wanted.items():  # a thousand times a tick: what the loop does shows
            state = roles.get(lb_id) or self._role_of(lb_id, now)
            state.ha = ha
            port = ports.get(state.port_name)
            if port is None:
                if state.port_name not in read.pending:  # else: its row may be on its way
                    self._set_role(lb_id, state, STANDBY, Lease(), "no logical switch port")
                continue
            if port.keys.get(HOLDER) == self.host:
                held.append((port, ha))
            if state.offers:
                self._expire_offer(lb_id, state, ha, now)
            decision = self._decide(lb_id, state, ha, port, chassis, now)
            if decision is None:
                continue  # as at the last decision
            if decision.write is not None:
                decided.append((lb_id, port, decision))  # its role follows from what commits
            else:
                self._set_role(lb_id, state, None, Lease.of(port), "")
        for lb_id, state in leaving.items():
            port = ports.get(iface_id(lb_id))
            if port is None:
                continue
            write = self._leaving(lb_id, state, port)
            if write is not None:
                decided.append((lb_id, port, write))
        beats = self._beats(held, decided, now)
        try:
            if decided or beats:
                await self._commit(decided, beats, now)
            elif self._unanswered_since is not None:  # nothing to write: ask whether it answers again
                await self._answered(self._nb.probe, now)
        finally:
            self._unknown_while_unanswered(wanted, self._clock())

    def _decide(
        self, lb_id: str, state: _Role, ha: HighAvailability, port: PortLease, chassis: str, now: float
    ) -> Decision | None:
        """`lease.decide` for one lease; None when its inputs are those of the last
        decision and it is not due again yet (the replica keeps an unchanged port
        the same object)."""
        copy, offer, preempt = self._copy_of(lb_id), self._offer(state), ha.preempt and not state.gave_away
        last = state.inputs
        if last is not None and last[0] is port and last[1] is ha and last[2:] == (copy, chassis, offer, preempt):
            if now < state.due:
                return None
            # Waiting for the holder to fall silent: every beat heard since moved the wait on.
            if state.beat_wait is not None and now < self._heard.get(state.holder, NOT_HEARD).at + state.beat_wait:
                return None
        state.holder = port.keys.get(HOLDER, "")
        heard = self._heard.get(state.holder, NOT_HEARD)
        decision = decide(self.host, chassis, ha, port, state.watch, copy, now, self.timing, offer, preempt, heard)
        if decision.write is None:
            state.inputs, state.due = (port, ha, copy, chassis, offer, preempt), decision.due
            state.beat_wait = decision.beat_wait
        else:  # what commits decides what comes next
            state.inputs = None
        return decision

    def _listen(self, ports: dict[str, PortLease], now: float) -> None:
        """Hear the other holders' heartbeats: a host is heard when a beat moves, or
        appears, on a port it holds (a port first seen with a beat is not a move)."""
        if ports is self._heard_in:
            return  # the same read: nothing moved
        self._heard_in = ports
        beats: dict[str, dict[str, str | None]] = {}
        for port in ports.values():
            holder = port.keys.get(HOLDER, "")
            if holder not in ("", self.host):
                beats.setdefault(holder, {})[port.name] = port.keys.get(BEAT)
        heard = {}
        for holder, seen in beats.items():
            before = self._heard_beats.get(holder, {})
            moved = any(name in before and before[name] != beat for name, beat in seen.items() if beat is not None)
            at = now if moved else self._heard.get(holder, NOT_HEARD).at
            guards = tuple(Guard(name, BEAT, beat) for name, beat in sorted(seen.items()) if beat is not None)
            heard[holder] = Heard(at, guards)
        self._heard, self._heard_beats = heard, beats

    def _beats(
        self, held: list[tuple[PortLease, HighAvailability]], decided: list[tuple[str, PortLease, Decision]], now: float
    ) -> list[LeaseWrite]:
        """This host's heartbeat, when due: a beat on each of its beacons, in the write
        the tick has for that port already if it has one."""
        interval = self.timing.renew_interval * 0.8  # a little early rather than a tick late
        if not held or (self._beat_at is not None and now - self._beat_at < interval):
            return []
        self._beat_at = now
        beacons = {port.name: port for port in self._beacons_of(held)}
        for index, (lb_id, port, decision) in enumerate(decided):
            write = decision.write
            if port.name in beacons and write is not None and decision.kind in ("renew", "offer", "bind", "unwell"):
                beat = beat_write(beacons.pop(port.name)).set_keys
                decided[index] = (
                    lb_id,
                    port,
                    replace(decision, write=replace(write, set_keys={**write.set_keys, **beat})),
                )
        return [beat_write(port) for _, port in sorted(beacons.items())]

    def _beacons_of(self, held: list[tuple[PortLease, HighAvailability]]) -> list[PortLease]:
        """The ports to beat on: one for each other host of the held leases' `ha.hosts`."""
        by_name = {port.name: (port, ha) for port, ha in held}
        chosen: dict[str, str] = {}
        for host in sorted({host for _, ha in held for host in ha.hosts if host != self.host}):
            kept = self._beacons.get(host)
            if kept is not None and kept in by_name and host in by_name[kept][1].hosts:
                chosen[host] = kept
                continue
            # A port with a beat already first: after a restart, the beacon the standby knows.
            chosen[host] = min((BEAT not in port.keys, port.name) for port, ha in held if host in ha.hosts)[1]
        self._beacons = chosen
        return [by_name[name][0] for name in sorted(set(chosen.values()))]

    def _port_names(self, wanted: dict[str, HighAvailability], leaving: dict[str, _Role]) -> tuple[str, ...]:
        """The ports to read (the same tuple while the load balancers are the same)."""
        if leaving or self._names_for is not wanted:
            self._names_for = None if leaving else wanted
            self._names = tuple(iface_id(lb_id) for lb_id in [*wanted, *leaving])
        return self._names

    async def _watch(self, names: tuple[str, ...]) -> None:
        """Have the replica hold these ports alone (a set of names that changes is told again)."""
        watched = frozenset(names)
        if watched != self._watching:
            await self._pool.run(self._nb.watch, watched)
            self._watching = watched

    async def _read(self, names: tuple[str, ...]) -> PortsRead:
        """The ports, from the replica; the last read again while the replica has not
        changed since (most ticks: a standby's replica changes at each renewal only,
        and reading a thousand rows out of python-ovs is most of a tick's cost)."""
        generation = self._nb.generation()
        last = self._last_read
        if last is not None and last[0] == generation and (last[1] is names or last[1] == names):
            return last[2]
        read = await self._pool.run(self._nb.read, names)
        self._last_read = (generation, names, read)
        return read

    def _unknown_while_unanswered(self, wanted: dict[str, HighAvailability], now: float) -> None:
        """Transactions unanswered for a lease time: a standby may hold the lease by
        now, so this host no longer claims to know its role."""
        if not self._unanswered_for_a_lease(now):
            return
        for lb_id in wanted:
            self._set_role(lb_id, self._role_of(lb_id, now), UNKNOWN, None, "lease transactions unanswered")

    def _unanswered_for_a_lease(self, now: float) -> bool:
        return self._unanswered_since is not None and now - self._unanswered_since >= self.timing.lease

    def _answered_again(self, now: float) -> None:
        """As after a reconnection: what was seen while unanswered does not count."""
        self._unanswered_since = None
        for state in self._roles.values():
            state.rewatch(now)

    def _leaving(self, lb_id: str, state: _Role, port: PortLease) -> Decision | None:
        """A load balancer this host held is no longer one of its `ha` ones: gone from
        here, it is offered to the next host at once (not after a lease time); still
        here without `ha`, the lease keys go and requested-chassis keeps naming us."""
        lease = Lease.of(port)
        if lease.holder != self.host:
            return None
        if self._present(lb_id):
            release = LeaseWrite(port.name, dict(port.keys), delete_keys=tuple(sorted(port.keys)))
            return Decision(release, "release", "ha removed")
        hosts = state.ha.hosts if state.ha is not None else []
        after = [h for h in hosts[hosts.index(self.host) + 1 :] + hosts if h != self.host] if self.host in hosts else []
        if not after:
            return None
        return Decision(write_for(port, lease.renewed(handover=after[0])), "offer", f"to {after[0]}: removed here")

    async def _contact(self, now: float) -> bool:
        """Whether the Northbound replica is live; connects when it is time to try."""
        if not self._nb.connected() and now >= self._next_connect:
            try:
                await self._pool.run(self._nb.connect)
                self.last_error = None
            except LbAgentError as exc:
                self._next_connect = now + RECONNECT_INTERVAL
                self.last_error = _short(exc)
                log.warning("object=ha action=connect result=error error=%r", _short(exc))
        connected = self._nb.connected()
        if connected and not self._in_contact:
            # Nothing seen while out of contact counts: every lease is watched anew.
            for state in self._roles.values():
                state.rewatch(now)
            self._heard, self._heard_beats, self._heard_in = {}, {}, None
            log.info("object=ha action=contact in_contact=true")
        elif not connected and self._in_contact:
            log.warning("object=ha action=contact in_contact=false")
        self._in_contact = connected
        return connected

    def _role_of(self, lb_id: str, now: float) -> _Role:
        found = self._roles.get(lb_id)
        if found is None:
            found = self._roles[lb_id] = _Role(Watch(first_seen=now), port_name=iface_id(lb_id))
        return found

    async def _answered(self, call: Callable, now: float, *args):
        """`call(*args)` on the pool, a transaction: whether it was answered tells
        whether this host is in contact."""
        started = time.monotonic()
        try:
            result = await self._pool.run(call, *args)
        except LbAgentError:
            if self._unanswered_since is None:
                self._unanswered_since = now
            raise
        finally:  # a transaction that failed slowly is what a failover follows: it counts
            HA_RENEW_SECONDS.observe(time.monotonic() - started)
        if self._unanswered_since is not None:
            self._answered_again(now)
        return result

    async def _commit(
        self, decided: list[tuple[str, PortLease, Decision]], beats: list[LeaseWrite], now: float
    ) -> None:
        writes = [decision.write for _, _, decision in decided if decision.write is not None]
        applied = await self._answered(self._nb.commit, now, writes + beats)
        for (lb_id, port, decision), done in zip(decided, applied):
            state = self._roles.get(lb_id)
            if state is None or decision.write is None:
                continue
            if not done:  # someone else's write came first: the next tick reads it
                self._set_role(lb_id, state, None, Lease.of(port), "")
                continue
            new = Lease.of(PortLease(port.name, {**port.keys, **decision.write.set_keys}))
            if decision.kind == "take":
                if decision.silent is not None:
                    state.last_failover_s = round(decision.silent, 3)
                    HA_FAILOVERS.inc()
                state.watch.observe(new, now)
                state.offers = []
            self._set_role(lb_id, state, None, new, decision.why)

    def _set_role(self, lb_id: str, state: _Role, role: str | None, lease: Lease | None, why: str) -> None:
        if lease is not None:
            state.active_host, state.term = lease.holder, lease.term
            if role is None and self._unanswered_for_a_lease(self._clock()):
                role = UNKNOWN  # what the replica says may be old news by now
            role = role or (ACTIVE if lease.holder == self.host else STANDBY)
        role = role or UNKNOWN
        if role == state.role:
            return
        state.role, state.since = role, _now_iso()
        log.info(
            "lb=%s object=ha action=role role=%s term=%d active_host=%s why=%r",
            lb_id,
            state.role,
            state.term,
            state.active_host or "-",
            why,
        )
        self._on_role(lb_id)

    # --- handover -----------------------------------------------------------

    @staticmethod
    def _offer(state: _Role) -> str:
        return state.offers[0] if state.offers and state.role == ACTIVE else ""

    def _expire_offer(self, lb_id: str, state: _Role, ha: HighAvailability, now: float) -> None:
        """An offer no standby took within two lease times goes to the next host."""
        if state.offers and now >= state.offer_deadline:
            log.warning("lb=%s object=ha action=handover result=not_taken host=%s", lb_id, state.offers[0])
            state.offers.pop(0)
            state.offer_deadline = now + 2 * self.timing.lease

    async def handover(self, lb_ids: list[str] | None, timeout: float) -> list[dict]:
        """Offer each load balancer this host holds (all of them if `lb_ids` is None)
        to the hosts after it in its `ha.hosts`, one by one, until one takes it;
        one result per load balancer, once each is settled or `timeout` ran out."""
        wanted = self._loadbalancers()
        ids = lb_ids if lb_ids is not None else sorted(i for i, s in self._roles.items() if s.role == ACTIVE)
        results: dict[str, dict] = {}
        now = self._clock()
        for lb_id in ids:
            state, ha = self._roles.get(lb_id), wanted.get(lb_id)
            if ha is None or state is None:
                results[lb_id] = {"id": lb_id, "result": "not_ha"}
            elif state.role != ACTIVE:
                results[lb_id] = {"id": lb_id, "result": "not_active", "active_host": state.active_host or None}
            else:
                at = ha.hosts.index(self.host)
                state.offers = [h for h in ha.hosts[at + 1 :] + ha.hosts[:at] if h != self.host]
                state.offer_deadline = now + 2 * self.timing.lease
                state.gave_away = True  # from the offer on: preempting would take it straight back
        deadline = time.monotonic() + timeout  # the caller's seconds, not the lease clock
        pending = [i for i in ids if i not in results]
        while pending and time.monotonic() < deadline:
            async with self._ticked:
                try:
                    await asyncio.wait_for(self._ticked.wait(), max(0.01, deadline - time.monotonic()))
                except TimeoutError:
                    break
            pending = [i for i in pending if self._handover_open(i)]
        for lb_id in ids:
            if lb_id not in results:
                results[lb_id] = self._handover_result(lb_id)
        return [results[lb_id] for lb_id in ids]

    def _handover_open(self, lb_id: str) -> bool:
        state = self._roles.get(lb_id)
        return state is not None and state.role == ACTIVE and bool(state.offers)

    def _handover_result(self, lb_id: str) -> dict:
        state = self._roles.get(lb_id)
        if state is None:
            return {"id": lb_id, "result": "not_ha"}
        state.offers = []
        if state.role == STANDBY and state.active_host not in ("", self.host):
            return {"id": lb_id, "result": "handed_over", "active_host": state.active_host}
        state.gave_away = False
        if state.role == UNKNOWN:  # out of contact meanwhile: whether it moved is not known here
            return {"id": lb_id, "result": "unknown", "active_host": None}
        return {"id": lb_id, "result": "not_taken", "active_host": self.host}

    # --- stopping -----------------------------------------------------------

    async def stop(self) -> None:
        """Ask standbys to wait `restart_grace` for every lease this host holds
        (one transaction), then disconnect."""
        try:
            if self._nb.connected():
                await self._grace_held()
        except LbAgentError as exc:
            log.warning("object=ha action=grace result=error error=%r", str(exc))
        finally:
            await self._pool.run(self._nb.close)
            await asyncio.to_thread(self._pool.shutdown)

    async def _grace_held(self) -> None:
        held = [lb_id for lb_id, state in self._roles.items() if state.role == ACTIVE]
        if not held:
            return
        ports = await self._pool.run(self._nb.ports, [iface_id(lb_id) for lb_id in held])
        writes = []
        for port in ports.values():
            lease = Lease.of(port)
            if lease.holder == self.host:
                writes.append(write_for(port, lease.renewed(grace=self._restart_grace)))
        applied = await self._pool.run(self._nb.commit, writes)
        log.info("object=ha action=grace leases=%d seconds=%g", sum(applied), self._restart_grace)


def copy_state(task, runtime=None) -> Copy:
    """The lease rules' view of a load balancer's task (None: no task yet) and of
    what its last pass observed."""
    if task is None:
        return Copy(built=False, failing=False)
    failing = task.state == "error"
    observation = getattr(runtime, "observation", None)
    bound = observation.ovn_installed if observation is not None else None
    return Copy(built=task.passed and not failing, failing=failing, bound=bound)
