"""The lease of one highly available load balancer, and what one host does about it.

A lease is a few `lbagent:*` keys in the `external_ids` of the load
balancer's logical switch port: the `term` (raised by every change of
holder), the `holder` (a host name), the `renewal` counter (raised by every
other change of the lease) and optional ones: `grace`, seconds a holder that
is restarting asks the others to wait, `handover`, the host the holder
offers the lease to, and `unwell`, set by a holder that cannot serve it.
A lease is written only when one of these changes, not to show the holder is
alive: that is the host's heartbeat, `beat`, a counter the holder raises
every `renew_interval` on a few of the ports it holds (its beacons, one for
each other host standing by for any of its leases; see `HaKeeper`), so the
upkeep of a thousand leases is a write of a few rows, not of a thousand.
This module owns their encoding and `decide`: given what this host observed
(on its own monotonic clock: another host's clock is never read, so skew
between hosts cannot cause a takeover), the single write it wants, if any.

The rules, for host H and one load balancer:
- H holds the lease: it marks it `unwell` when its copy of the load balancer
  is failing or its port has not been bound within `BIND_WITHIN` lease times
  (its ovn-controller is not there), so a standby takes over at once, clears
  a grace it asked for before a restart, and puts `requested-chassis` back on
  its own chassis if anyone moved it.
- Nobody ever held it: the preferred host takes it at once; the host at rank
  r waits r lease times from when it first saw the port, so the preferred one
  wins when it is there.
- Another host holds it: H takes it when it was offered to H, when H is
  preferred to the holder and `preempt` is on, when the holder says it is
  unwell, or when H has heard nothing from the holder (neither its heartbeat
  nor a change of the lease) for the lease time (or the grace the holder
  asked for, unless northd says the port is down: a host shutting down stops
  its ovn-controller after its agent); after unwell and silence, plus a short
  step per rank so the standbys do not all try at once. Always only with a
  copy that is built and not failing, a chassis name to bind to, and only
  while H is in contact with the Northbound database for the whole time it
  measured. A takeover after silence also checks the holder's heartbeat rows
  in the same transaction: a beat that lands before it undoes it.
Taking raises the term and moves `requested-chassis` in the same write;
every write is a compare-and-swap on the keys it was decided on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lbagent.desired.ha import HighAvailability
from lbagent.ovnhost.northbound import Guard, LeaseWrite, PortLease

TERM = "lbagent:term"
HOLDER = "lbagent:holder"
RENEWAL = "lbagent:renewal"
GRACE = "lbagent:grace"
HANDOVER = "lbagent:handover"
UNWELL = "lbagent:unwell"
BEAT = "lbagent:beat"  # the holder's heartbeat, not part of the lease
OPTIONAL = (GRACE, HANDOVER, UNWELL)
RANK_STEP = 0.25  # of a lease time, between the tries of two standbys of different rank
RENEWALS_PER_LEASE = 3  # heartbeats per lease time
BIND_WITHIN = 4  # lease times a new holder's port may take to be bound before it gives the lease up
NEVER = math.inf


def _int(value: str | None) -> int:
    try:
        return max(0, int(value or 0))
    except ValueError:  # not ours to judge: read as nothing
        return 0


def _seconds(value: str | None) -> float:
    try:
        seconds = float(value or 0)
    except ValueError:
        return 0.0
    return seconds if 0 <= seconds < 86400 else 0.0


@dataclass(frozen=True)
class Lease:
    term: int = 0
    holder: str = ""
    renewal: int = 0
    grace: float = 0.0
    handover: str = ""
    unwell: bool = False

    @classmethod
    def of(cls, port: PortLease) -> Lease:
        keys = port.keys
        return cls(
            _int(keys.get(TERM)),
            keys.get(HOLDER, ""),
            _int(keys.get(RENEWAL)),
            _seconds(keys.get(GRACE)),
            keys.get(HANDOVER, ""),
            UNWELL in keys,
        )

    @property
    def mark(self) -> tuple[int, int]:
        """What changes whenever the lease does."""
        return self.term, self.renewal

    def keys(self) -> dict[str, str]:
        keys = {TERM: str(self.term), HOLDER: self.holder, RENEWAL: str(self.renewal)}
        if self.grace:
            keys[GRACE] = f"{self.grace:g}"
        if self.handover:
            keys[HANDOVER] = self.handover
        if self.unwell:
            keys[UNWELL] = "true"
        return keys

    def renewed(self, grace: float = 0.0, handover: str = "", unwell: bool = False) -> Lease:
        return replace(self, renewal=self.renewal + 1, grace=grace, handover=handover, unwell=unwell)

    def taken_by(self, host: str) -> Lease:
        return Lease(term=self.term + 1, holder=host)


def lease_keys(port: PortLease) -> dict[str, str]:
    """The port's lease keys: its `lbagent:*` keys but the heartbeat, which moves on its own."""
    return {k: v for k, v in port.keys.items() if k != BEAT}


def write_for(port: PortLease, new: Lease, chassis: str | None = None, guards: tuple[Guard, ...] = ()) -> LeaseWrite:
    """The compare-and-swap turning the port's lease into `new` (and binding it to `chassis`);
    a new holder also drops the old one's heartbeat."""
    keys = new.keys()
    dropped = [k for k in port.keys if k in OPTIONAL and k not in keys]
    if BEAT in port.keys and new.holder != port.keys.get(HOLDER):
        dropped.append(BEAT)
    return LeaseWrite(
        port.name,
        expect=lease_keys(port),
        set_keys={k: v for k, v in keys.items() if port.keys.get(k) != v},
        delete_keys=tuple(sorted(dropped)),
        requested_chassis=chassis,
        unchecked=(BEAT,),
        guards=guards,
    )


def beat_write(port: PortLease) -> LeaseWrite:
    """The holder's heartbeat on one of its ports: `beat` raised by one, while the
    lease there is still as seen (a port taken meanwhile carries no beat of ours)."""
    return LeaseWrite(
        port.name, expect=lease_keys(port), set_keys={BEAT: str(_int(port.keys.get(BEAT)) + 1)}, unchecked=(BEAT,)
    )


@dataclass
class Watch:
    """What this host has seen of one lease, on its own clock."""

    first_seen: float  # when the port was first seen (contact regained counts as first)
    mark: tuple[int, int] | None = None
    changed_at: float = 0.0  # when `mark` last changed
    unbound_since: float | None = None  # holding, built, and the port not bound yet: since when

    def observe(self, lease: Lease, now: float) -> None:
        if lease.mark != self.mark:
            self.mark, self.changed_at = lease.mark, now


@dataclass(frozen=True)
class Heard:
    """What this host has heard of another host's heartbeat."""

    at: float = 0.0  # when its beat last moved (0: never)
    guards: tuple[Guard, ...] = ()  # its beats as seen then: a takeover checks they still are


NOT_HEARD = Heard()


@dataclass(frozen=True)
class Copy:
    """This host's copy of the load balancer, as the lease rules need it."""

    built: bool  # its pass succeeded at least once and it is not failing now
    failing: bool
    bound: bool | None = None  # its OVS port is ovn-installed (None: not known yet)


@dataclass(frozen=True)
class Decision:
    write: LeaseWrite | None
    kind: str  # "renew", "take", "offer", "bind", "unwell" or "" (nothing)
    why: str = ""
    # With the same inputs, the decision stays the same until then (its waits run out)...
    due: float = NEVER
    # ...or, waiting for the holder to fall silent, until this long after its last beat.
    beat_wait: float | None = None
    silent: float | None = None  # a takeover after silence: seconds the holder was silent


NOTHING = Decision(None, "")


def _wait(until: float) -> Decision:
    return Decision(None, "", due=until)


@dataclass(frozen=True)
class Timing:
    lease: float  # seconds without a heartbeat before a standby takes over

    @property
    def renew_interval(self) -> float:
        return self.lease / RENEWALS_PER_LEASE


def decide(
    me: str,
    chassis: str,
    ha: HighAvailability,
    port: PortLease,
    watch: Watch,
    copy: Copy,
    now: float,
    timing: Timing,
    offer_to: str = "",
    preempt: bool | None = None,
    heard: Heard = NOT_HEARD,
) -> Decision:
    """The one write host `me` wants for this lease now (see the module's docstring);
    `offer_to`: the host this holder offers the lease to ("" for none); `preempt`:
    `ha.preempt` unless this host gave the lease away on purpose; `heard`: the
    holder's heartbeat as this host has heard it."""
    lease = Lease.of(port)
    watch.observe(lease, now)
    if not chassis:
        return NOTHING  # nothing to bind to: taking would let every chassis claim the port
    if lease.holder == me:
        return _as_holder(port, lease, watch, copy, now, timing, chassis, offer_to)
    watch.unbound_since = None
    if not copy.built or copy.failing:
        return NOTHING

    def take(why: str, guards: tuple[Guard, ...] = (), silent: float | None = None) -> Decision:
        return Decision(write_for(port, lease.taken_by(me), chassis, guards), "take", why, silent=silent)

    if not lease.holder:
        until = watch.first_seen + ha.rank(me) * timing.lease
        return take("unheld") if now >= until else _wait(until)
    if lease.handover == me:
        return take(f"offered by {lease.holder}")
    if (ha.preempt if preempt is None else preempt) and ha.rank(me) < ha.rank(lease.holder):
        return take(f"preempting {lease.holder}")
    standbys = [host for host in ha.hosts if host != lease.holder]
    step = RANK_STEP * timing.lease * (standbys.index(me) if me in standbys else len(standbys))
    if lease.unwell:
        until = max(watch.changed_at, watch.first_seen) + step
        return take(f"{lease.holder} is unwell") if now >= until else _wait(until)
    heard_at = max(watch.changed_at, watch.first_seen, heard.at)
    grace = lease.grace if port.up is not False else 0.0
    wait = max(timing.lease, grace) + step
    if now < heard_at + wait:
        return Decision(None, "", due=heard_at + wait, beat_wait=wait)
    silent = now - heard_at
    return take(f"nothing heard from {lease.holder} for {silent:.2f}s", heard.guards, silent)


def _as_holder(
    port: PortLease,
    lease: Lease,
    watch: Watch,
    copy: Copy,
    now: float,
    timing: Timing,
    chassis: str,
    offer_to: str,
) -> Decision:
    rebind = chassis if port.requested_chassis != chassis else None
    if copy.built and copy.bound is False:
        watch.unbound_since = watch.unbound_since if watch.unbound_since is not None else now
    else:
        watch.unbound_since = None
    unbind_deadline = NEVER if watch.unbound_since is None else watch.unbound_since + BIND_WITHIN * timing.lease
    unwell = copy.failing or now >= unbind_deadline
    wanted = lease.renewed(handover=offer_to, unwell=unwell)
    if rebind is None and wanted.keys() == lease.renewed(lease.grace, lease.handover, lease.unwell).keys():
        return _wait(unbind_deadline if not unwell else NEVER)
    if rebind is not None:
        kind, why = "bind", f"requested-chassis was {port.requested_chassis or 'unset'}"
    elif unwell != lease.unwell:
        kind, why = ("unwell", "copy failing" if copy.failing else "port not bound") if unwell else ("renew", "well")
    elif offer_to != lease.handover:
        kind, why = ("offer", f"to {offer_to}") if offer_to else ("renew", "offer withdrawn")
    else:
        kind, why = "renew", "grace over"
    return Decision(write_for(port, wanted, rebind), kind, why)
