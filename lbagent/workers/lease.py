"""The lease of one highly available load balancer, and what one host does about it.

A lease is a few `lbagent:*` keys in the `external_ids` of the load
balancer's logical switch port: the `term` (raised by every change of
holder), the `holder` (a host name), the `renewal` counter (raised by every
renewal) and two optional ones: `grace`, seconds a holder that is restarting
asks the others to wait, and `handover`, the host the holder offers the lease
to. This module owns their encoding and `decide`: given what this host
observed (on its own monotonic clock: another host's clock is never read, so
skew between hosts cannot cause a takeover), the single write it wants, if any.

The rules, for host H and one load balancer:
- H holds the lease: it renews it every `renew_interval`, unless its copy of
  the load balancer is failing or its port has not been bound within
  `BIND_WITHIN` lease times (its ovn-controller is not there: then a standby
  takes over), and puts `requested-chassis` back on its own chassis if
  anyone moved it.
- Nobody ever held it: the preferred host takes it at once; the host at rank
  r waits r lease times from when it first saw the port, so the preferred one
  wins when it is there.
- Another host holds it: H takes it when it was offered to H, when H is
  preferred to the holder and `preempt` is on, or when H has seen no renewal
  for the lease time (or the grace the holder asked for, unless northd says
  the port is down: a host shutting down stops its ovn-controller after its
  agent), plus a short step per rank so the standbys do not all try at once;
  always only with a copy that is built and not failing, a chassis name to
  bind to, and only while H is in contact with the Northbound database for
  the whole time it measured.
Taking raises the term and moves `requested-chassis` in the same write;
every write is a compare-and-swap on the keys it was decided on.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lbagent.desired.ha import HighAvailability
from lbagent.ovnhost.northbound import LeaseWrite, PortLease

TERM = "lbagent:term"
HOLDER = "lbagent:holder"
RENEWAL = "lbagent:renewal"
GRACE = "lbagent:grace"
HANDOVER = "lbagent:handover"
RANK_STEP = 0.25  # of a lease time, between the tries of two standbys of different rank
RENEWALS_PER_LEASE = 3
BIND_WITHIN = 4  # lease times a new holder's port may take to be bound before it gives the lease up


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

    @classmethod
    def of(cls, port: PortLease) -> Lease:
        keys = port.keys
        return cls(
            _int(keys.get(TERM)),
            keys.get(HOLDER, ""),
            _int(keys.get(RENEWAL)),
            _seconds(keys.get(GRACE)),
            keys.get(HANDOVER, ""),
        )

    @property
    def mark(self) -> tuple[int, int]:
        """What changes whenever the holder shows it is alive."""
        return self.term, self.renewal

    def keys(self) -> dict[str, str]:
        keys = {TERM: str(self.term), HOLDER: self.holder, RENEWAL: str(self.renewal)}
        if self.grace:
            keys[GRACE] = f"{self.grace:g}"
        if self.handover:
            keys[HANDOVER] = self.handover
        return keys

    def renewed(self, grace: float = 0.0, handover: str = "") -> Lease:
        return replace(self, renewal=self.renewal + 1, grace=grace, handover=handover)

    def taken_by(self, host: str) -> Lease:
        return Lease(term=self.term + 1, holder=host)


def write_for(port: PortLease, new: Lease, chassis: str | None = None) -> LeaseWrite:
    """The compare-and-swap turning the port's lease into `new` (and binding it to `chassis`)."""
    keys = new.keys()
    return LeaseWrite(
        port.name,
        expect=dict(port.keys),
        set_keys={k: v for k, v in keys.items() if port.keys.get(k) != v},
        delete_keys=tuple(sorted(k for k in port.keys if k in (GRACE, HANDOVER) and k not in keys)),
        requested_chassis=chassis,
    )


@dataclass
class Watch:
    """What this host has seen of one lease, on its own clock."""

    first_seen: float  # when the port was first seen (contact regained counts as first)
    mark: tuple[int, int] | None = None
    changed_at: float = 0.0  # when `mark` last changed
    renewed_at: float | None = None  # when this host last wrote the lease
    unbound_since: float | None = None  # holding, built, and the port not bound yet: since when

    def observe(self, lease: Lease, now: float) -> None:
        if lease.mark != self.mark:
            self.mark, self.changed_at = lease.mark, now


@dataclass(frozen=True)
class Copy:
    """This host's copy of the load balancer, as the lease rules need it."""

    built: bool  # its pass succeeded at least once and it is not failing now
    failing: bool
    bound: bool | None = None  # its OVS port is ovn-installed (None: not known yet)


@dataclass(frozen=True)
class Decision:
    write: LeaseWrite | None
    kind: str  # "renew", "take", "offer", "bind" or "" (nothing)
    why: str = ""


NOTHING = Decision(None, "")


@dataclass(frozen=True)
class Timing:
    lease: float  # seconds without a renewal before a standby takes over

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
) -> Decision:
    """The one write host `me` wants for this lease now (see the module's docstring);
    `offer_to`: the host this holder offers the lease to ("" for none); `preempt`:
    `ha.preempt` unless this host gave the lease away on purpose."""
    lease = Lease.of(port)
    watch.observe(lease, now)
    if not chassis:
        return NOTHING  # nothing to bind to: taking would let every chassis claim the port
    if lease.holder == me:
        return _as_holder(port, lease, watch, copy, now, timing, chassis, offer_to)
    watch.unbound_since = None
    if not copy.built or copy.failing:
        return NOTHING
    take = Decision(write_for(port, lease.taken_by(me), chassis), "take")
    if not lease.holder:
        waited = now - watch.first_seen
        return replace(take, why="unheld") if waited >= ha.rank(me) * timing.lease else NOTHING
    if lease.handover == me:
        return replace(take, why=f"offered by {lease.holder}")
    if (ha.preempt if preempt is None else preempt) and ha.rank(me) < ha.rank(lease.holder):
        return replace(take, why=f"preempting {lease.holder}")
    silent = now - max(watch.changed_at, watch.first_seen)
    standbys = [host for host in ha.hosts if host != lease.holder]
    grace = lease.grace if port.up is not False else 0.0
    wait = max(timing.lease, grace) + RANK_STEP * timing.lease * standbys.index(me)
    if silent >= wait:
        return replace(take, why=f"no renewal from {lease.holder} for {silent:.2f}s")
    return NOTHING


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
    unbindable = watch.unbound_since is not None and now - watch.unbound_since >= BIND_WITHIN * timing.lease
    if (copy.failing or unbindable) and rebind is None:
        return NOTHING  # let a standby with a working copy, and an ovn-controller, take over
    renewed = lease.renewed(handover=offer_to)
    if lease.handover != offer_to:
        kind, why = ("offer", f"to {offer_to}") if offer_to else ("renew", "offer withdrawn")
        return Decision(write_for(port, renewed, rebind), kind, why)
    # A little early rather than a tick late: ticks come every tenth of a lease.
    due = watch.renewed_at is None or now - watch.renewed_at >= timing.renew_interval * 0.8
    if rebind is not None or due or lease.grace:
        return Decision(write_for(port, renewed, rebind), "bind" if rebind is not None else "renew")
    return NOTHING
