"""What one host writes about one lease (lbagent.workers.lease.decide)."""

from __future__ import annotations

import pytest

from lbagent.desired.ha import HighAvailability
from lbagent.ovnhost.northbound import Guard, PortLease
from lbagent.workers.lease import (
    BEAT,
    BIND_WITHIN,
    GRACE,
    HANDOVER,
    HOLDER,
    NEVER,
    RANK_STEP,
    RENEWAL,
    TERM,
    UNWELL,
    Copy,
    Heard,
    Lease,
    Timing,
    Watch,
    beat_write,
    decide,
    write_for,
)

HA = HighAvailability(hosts=["gw-1", "gw-2", "gw-3"])
TIMING = Timing(1.5)
BUILT = Copy(built=True, failing=False)
PORT = "iface/lb/a"


def held(holder: str, term: int = 3, renewal: int = 7, chassis: str = "", **extra: str) -> PortLease:
    keys = {TERM: str(term), HOLDER: holder, RENEWAL: str(renewal), **extra}
    return PortLease(PORT, keys, chassis or f"ch-{holder}")


def run(me: str, port: PortLease, watch: Watch, now: float, copy: Copy = BUILT, ha=HA, offer: str = ""):
    return decide(me, f"ch-{me}", ha, port, watch, copy, now, TIMING, offer)


def test_a_lease_reads_back_the_keys_it_writes_and_tolerates_foreign_values():
    lease = Lease(term=4, holder="gw-2", renewal=9, grace=30.0, handover="gw-3")
    assert Lease.of(PortLease(PORT, lease.keys())) == lease
    assert Lease.of(PortLease(PORT, {TERM: "x", RENEWAL: "-3", GRACE: "1e9"})) == Lease()


def test_the_preferred_host_takes_an_unheld_lease_at_once_and_binds_its_chassis():
    decision = run("gw-1", PortLease(PORT), Watch(first_seen=10.0), now=10.0)
    assert decision.kind == "take"
    assert decision.write.requested_chassis == "ch-gw-1"
    assert decision.write.expect == {}
    assert decision.write.set_keys == {TERM: "1", HOLDER: "gw-1", RENEWAL: "0"}


def test_a_later_host_waits_its_rank_in_lease_times_before_taking_an_unheld_lease():
    watch = Watch(first_seen=10.0)
    assert run("gw-2", PortLease(PORT), watch, now=11.4).write is None
    assert run("gw-2", PortLease(PORT), watch, now=11.5).kind == "take"
    assert run("gw-3", PortLease(PORT), Watch(first_seen=10.0), now=12.9).write is None


def test_no_copy_built_no_take():
    waiting = Copy(built=False, failing=False)
    assert run("gw-1", PortLease(PORT), Watch(first_seen=0.0), now=100.0, copy=waiting).write is None


def test_the_holder_writes_nothing_while_its_lease_is_as_it_wants_it():
    decision = run("gw-1", held("gw-1"), Watch(first_seen=0.0), now=10.45)
    assert decision.write is None
    assert decision.due == NEVER  # with the same inputs, nothing to reconsider


def test_a_holder_puts_requested_chassis_back_when_someone_moved_it():
    watch = Watch(first_seen=0.0)
    decision = run("gw-1", held("gw-1", chassis="elsewhere"), watch, now=10.1)
    assert decision.kind == "bind"
    assert decision.write.requested_chassis == "ch-gw-1"


def test_a_failing_holder_says_it_is_unwell_once_and_well_again_when_it_recovers():
    failing = Copy(built=False, failing=True)
    decision = run("gw-1", held("gw-1"), Watch(first_seen=0.0), now=50.0, copy=failing)
    assert (decision.kind, decision.write.set_keys) == ("unwell", {RENEWAL: "8", UNWELL: "true"})
    unwell = held("gw-1", renewal=8, **{UNWELL: "true"})
    assert run("gw-1", unwell, Watch(first_seen=0.0), now=50.1, copy=failing).write is None
    recovered = run("gw-1", unwell, Watch(first_seen=0.0), now=60.0)
    assert recovered.write.delete_keys == (UNWELL,)


def test_a_holder_whose_port_is_never_bound_says_it_is_unwell_after_bind_within_leases():
    unbound = Copy(built=True, failing=False, bound=False)
    watch = Watch(first_seen=0.0)
    waiting = run("gw-1", held("gw-1"), watch, now=10.0, copy=unbound)
    assert waiting.write is None and waiting.due == 10.0 + BIND_WITHIN * TIMING.lease
    assert run("gw-1", held("gw-1"), watch, now=waiting.due - 0.01, copy=unbound).write is None
    assert run("gw-1", held("gw-1"), watch, now=waiting.due, copy=unbound).kind == "unwell"


def test_a_standby_takes_an_unwell_lease_without_waiting_for_silence_ranks_apart():
    port = held("gw-1", **{UNWELL: "true"})
    assert run("gw-2", port, Watch(first_seen=100.0), now=100.0).why == "gw-1 is unwell"
    watch = Watch(first_seen=100.0)
    later = run("gw-3", port, watch, now=100.0)
    assert later.write is None and later.due == 100.0 + RANK_STEP * TIMING.lease
    assert run("gw-3", port, watch, now=later.due).kind == "take"


def test_a_restarted_holder_clears_the_grace_at_once():
    watch = Watch(first_seen=0.0)
    decision = run("gw-1", held("gw-1", **{GRACE: "30"}), watch, now=10.1)
    assert decision.write.delete_keys == (GRACE,)


def test_a_standby_takes_over_after_a_lease_time_without_renewal_on_its_own_clock():
    watch = Watch(first_seen=0.0)
    assert run("gw-2", held("gw-1"), watch, now=100.0).write is None  # first sight: the clock starts
    assert run("gw-2", held("gw-1"), watch, now=101.4).write is None
    assert run("gw-2", held("gw-1", renewal=8), watch, now=101.45).write is None  # renewed: starts again
    decision = run("gw-2", held("gw-1", renewal=8), watch, now=102.95)
    assert decision.kind == "take"
    assert decision.write.expect == held("gw-1", renewal=8).keys
    assert decision.write.set_keys == {TERM: "4", HOLDER: "gw-2", RENEWAL: "0"}
    assert decision.write.requested_chassis == "ch-gw-2"
    assert decision.silent == pytest.approx(1.5)


def test_the_holders_heartbeat_keeps_its_lease_and_a_takeover_after_silence_checks_it():
    port, watch = held("gw-1"), Watch(first_seen=0.0)
    beacon = (Guard("iface/lb/0", BEAT, "41"),)
    run("gw-2", port, watch, now=100.0)
    kept = decide("gw-2", "ch-gw-2", HA, port, watch, BUILT, 101.6, TIMING, heard=Heard(101.0, beacon))
    assert kept.write is None and kept.due == 102.5  # a lease time after the beat
    taken = decide("gw-2", "ch-gw-2", HA, port, watch, BUILT, 102.5, TIMING, heard=Heard(101.0, beacon))
    assert taken.kind == "take" and taken.write.guards == beacon
    offered = run("gw-2", held("gw-1", **{HANDOVER: "gw-2"}), Watch(first_seen=0.0), now=100.0)
    assert offered.write.guards == ()  # only a silence needs the holder's word that it is silent


def test_beats_count_up_on_the_holders_port_and_leave_with_the_holder():
    port = held("gw-1", **{BEAT: "41"})
    beat = beat_write(port)
    assert (beat.set_keys, beat.expect, beat.unchecked) == ({BEAT: "42"}, held("gw-1").keys, (BEAT,))
    assert beat_write(held("gw-1")).set_keys == {BEAT: "1"}
    taken = write_for(port, Lease.of(port).taken_by("gw-2"), "ch-gw-2")
    assert taken.delete_keys == (BEAT,) and taken.expect == held("gw-1").keys
    assert write_for(port, Lease.of(port).renewed(grace=30.0)).delete_keys == ()


def test_standbys_further_down_wait_a_step_longer():
    watch = Watch(first_seen=0.0)
    run("gw-3", held("gw-1"), watch, now=100.0)
    assert run("gw-3", held("gw-1"), watch, now=101.8).write is None  # gw-2 tries first
    assert run("gw-3", held("gw-1"), watch, now=101.9).kind == "take"


def test_a_grace_asked_by_a_restarting_holder_is_waited_out():
    watch = Watch(first_seen=0.0)
    port = held("gw-1", **{GRACE: "30"})
    run("gw-2", port, watch, now=100.0)
    assert run("gw-2", port, watch, now=129.9).write is None
    assert run("gw-2", port, watch, now=130.0).kind == "take"


def test_an_offered_lease_is_taken_at_once_by_a_ready_host_only():
    port = held("gw-1", **{HANDOVER: "gw-2"})
    assert run("gw-2", port, Watch(first_seen=100.0), now=100.0).kind == "take"
    assert run("gw-3", port, Watch(first_seen=100.0), now=100.0).write is None
    not_ready = Copy(built=False, failing=False)
    assert run("gw-2", port, Watch(first_seen=100.0), now=100.0, copy=not_ready).write is None


def test_the_holder_offers_and_withdraws_with_a_renewal():
    watch = Watch(first_seen=0.0)
    offer = run("gw-1", held("gw-1"), watch, now=10.1, offer="gw-2")
    assert (offer.kind, offer.write.set_keys) == ("offer", {RENEWAL: "8", HANDOVER: "gw-2"})
    withdraw = run("gw-1", held("gw-1", **{HANDOVER: "gw-2"}), watch, now=10.1)
    assert withdraw.write.delete_keys == (HANDOVER,)


@pytest.mark.parametrize(
    ("preempt", "me", "taken"), [(True, "gw-1", True), (False, "gw-1", False), (True, "gw-3", False)]
)
def test_preempt_takes_back_only_for_a_preferred_host(preempt, me, taken):
    ha = HighAvailability(hosts=["gw-1", "gw-2", "gw-3"], preempt=preempt)
    decision = run(me, held("gw-2"), Watch(first_seen=100.0), now=100.0, ha=ha)
    assert (decision.kind == "take") is taken


def test_a_holder_removed_from_the_hosts_is_taken_over_like_any_silent_one():
    ha = HighAvailability(hosts=["gw-2", "gw-3"])
    watch = Watch(first_seen=0.0)
    run("gw-2", held("gw-1"), watch, now=10.0, ha=ha)
    assert run("gw-2", held("gw-1"), watch, now=11.5, ha=ha).kind == "take"


def test_write_for_deletes_only_the_optional_keys_it_drops():
    port = held("gw-1", **{GRACE: "30", HANDOVER: "gw-2"})
    write = write_for(port, Lease.of(port).taken_by("gw-2"), "ch-gw-2")
    assert write.delete_keys == (GRACE, HANDOVER)
    assert write.set_keys == {TERM: "4", HOLDER: "gw-2", RENEWAL: "0"}
