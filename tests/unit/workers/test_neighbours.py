"""NeighbourCapacity: what a desired state needs, the limits raised for it, errors in status."""

import logging

from lbagent.desired.model import parse_desired_state
from lbagent.ovnhost.neighbour_tables import Limits, read_limits
from lbagent.workers.neighbours import BASE_ENTRIES, PER_LOADBALANCER, NeighbourCapacity, entries_needed
from tests.unit.ovnhost.test_neighbour_tables import proc
from tests.unit.samples import lb_body, pod_body, selecting_lb, state


def desired(lbs, pods=()):
    body = state(1, lbs)
    body["pods"] = list(pods)
    return parse_desired_state(body)


async def run_here(fn, *args):
    return fn(*args)


def test_each_load_balancer_needs_its_own_entries_and_one_per_member():
    plain = desired([lb_body("lb-a", backends=("be-1", "be-2")), lb_body("lb-b", ip="198.18.0.13")])
    assert entries_needed(plain) == BASE_ENTRIES + 2 * PER_LOADBALANCER + 3
    pods = [
        pod_body("pod-1", "198.18.0.41"),
        pod_body("pod-2", "198.18.0.42"),
        pod_body("pod-3", "198.18.0.43", app="x"),
    ]
    selecting = desired([selecting_lb("lb-s", "198.18.0.14", "web")], pods)
    assert entries_needed(selecting) == BASE_ENTRIES + PER_LOADBALANCER + 2


async def test_the_limits_are_raised_for_the_accepted_state_and_a_converged_host_writes_nothing(tmp_path, caplog):
    v4, v6 = proc(tmp_path, "ipv4"), proc(tmp_path, "ipv6")
    capacity = NeighbourCapacity(True, run=run_here, root=tmp_path)
    wanted = desired([lb_body(f"lb-{i}", ip=f"198.18.0.{20 + i}") for i in range(3)])
    needed = entries_needed(wanted)
    with caplog.at_level(logging.INFO):
        await capacity.accommodate(wanted)
    assert read_limits("ipv4", tmp_path) == read_limits("ipv6", tmp_path) == Limits(needed, 2 * needed)
    assert capacity.status() == {
        "sizing": True,
        "entries_needed": needed,
        "limits": {family: {"soft": needed, "hard": 2 * needed} for family in ("ipv4", "ipv6")},
        "last_error": None,
    }
    assert "object=neighbour_tables action=size" in caplog.text

    caplog.clear()
    written = [(d / name).stat().st_mtime_ns for d in (v4, v6) for name in ("gc_thresh2", "gc_thresh3")]
    await capacity.accommodate(wanted)
    assert [(d / name).stat().st_mtime_ns for d in (v4, v6) for name in ("gc_thresh2", "gc_thresh3")] == written
    assert "neighbour_tables" not in caplog.text


async def test_without_sizing_the_limits_are_only_read_and_a_short_table_is_warned_of(tmp_path, caplog):
    proc(tmp_path, "ipv4")
    proc(tmp_path, "ipv6")
    capacity = NeighbourCapacity(False, run=run_here, root=tmp_path)
    many = desired([lb_body(f"lb-{i}", ip=f"198.18.0.{20 + i}") for i in range(40)])
    with caplog.at_level(logging.WARNING):
        await capacity.accommodate(many)
    assert read_limits("ipv4", tmp_path) == Limits(512, 1024)
    assert capacity.status()["limits"]["ipv4"] == {"soft": 512, "hard": 1024}
    assert "short=ipv4,ipv6" in caplog.text


async def test_a_table_that_cannot_be_sized_is_an_error_in_status_not_a_failure(tmp_path):
    proc(tmp_path, "ipv4")  # no ipv6: a kernel booted without it
    capacity = NeighbourCapacity(True, run=run_here, root=tmp_path)
    await capacity.accommodate(desired([lb_body("lb-a")]))
    status = capacity.status()
    assert list(status["limits"]) == ["ipv4"]
    assert "ipv6/neigh/default/gc_thresh2" in status["last_error"]
