"""The high-availability benchmark's arithmetic: the client's lines, failover and outage times,
binding changes and split-brain moments from samples, the extrapolation of H6, and the table."""

import asyncio
import socket

import pytest

from bench import ha_probe
from bench.ha_report import (
    Attempt,
    Sample,
    binding_changes,
    binding_sequence,
    evaluate,
    extrapolated,
    first_answer_after,
    outage,
    outcomes_between,
    parse_attempt,
    samples_between,
    split_brain_moments,
    spread,
    two_active_moments,
    unbound_seconds,
)
from bench.report import table


def test_a_probe_line_is_parsed_and_anything_else_is_skipped():
    assert parse_attempt("12.5000 12.5300 ok\n") == Attempt(12.5, 12.53, "ok")
    assert parse_attempt("12.5 13.5 refused") == Attempt(12.5, 13.5, "refused")
    for line in ("", "12.5 13", "12.5 13.5 maybe", "x 13.5 ok", "1 2 ok extra"):
        assert parse_attempt(line) is None, line


ATTEMPTS = [
    Attempt(9.90, 9.92, "ok"),  # answered before the kill
    Attempt(9.98, 10.20, "ok"),  # started before the kill, answered after: not through the standby
    Attempt(10.00, 11.00, "refused"),
    Attempt(10.02, 10.50, "broken"),
    Attempt(11.30, 11.33, "ok"),
    Attempt(11.32, 11.34, "ok"),
    Attempt(11.50, 12.80, "ok"),  # answered, but after a retransmission
]


def test_the_first_answer_counts_only_connections_started_after_the_moment():
    assert first_answer_after(ATTEMPTS, 10.0) == 11.33
    assert first_answer_after(ATTEMPTS, 9.0) == 9.92
    assert first_answer_after(ATTEMPTS, 12.0) is None


def test_the_outage_runs_from_the_first_failed_or_slow_connection_to_the_next_prompt_answer():
    assert outage(ATTEMPTS, 9.0) == pytest.approx(11.33 - 10.00)
    slow = [Attempt(1, 2.2, "ok"), Attempt(1.5, 1.6, "ok"), Attempt(2, 2.05, "ok")]
    assert outage(slow, 0) == pytest.approx(1.6 - 1)  # a SYN retransmitted is an outage too
    assert outage([Attempt(1, 1.1, "ok")], 0) is None  # nothing failed
    assert outage([Attempt(1, 2, "refused"), Attempt(1.1, 3, "ok")], 0) is None  # not answered promptly yet


def test_outcomes_are_counted_by_start_and_slow_answers_on_top():
    assert outcomes_between(ATTEMPTS, 10.0, 12.0) == {"ok": 3, "refused": 1, "broken": 1, "slow": 1}
    assert outcomes_between(ATTEMPTS, 0, 9.95) == {"ok": 1, "refused": 0, "broken": 0, "slow": 0}


def sample(at: float, chassis: str | None, **roles: tuple[str | None, int | None]) -> Sample:
    return Sample(at, chassis, {name.replace("_", "-"): role for name, role in roles.items()})


def test_binding_changes_skip_unbound_moments_and_count_every_flap():
    moved_once = [sample(0, "gw-1"), sample(1, None), sample(2, "gw-2"), sample(3, "gw-2")]
    assert binding_sequence(moved_once) == ["gw-1", "gw-2"]
    assert binding_changes(moved_once) == 1
    flapping = [sample(0, "gw-1"), sample(1, "gw-2"), sample(2, "gw-1"), sample(3, "gw-2")]
    assert binding_changes(flapping) == 3
    assert binding_changes([sample(0, "gw-1"), sample(1, "gw-1")]) == 0
    assert binding_changes([]) == 0
    assert unbound_seconds(moved_once) == 1.0


def test_a_window_of_samples_starts_from_the_state_before_it():
    samples = [sample(0, "gw-1"), sample(1, "gw-1"), sample(2, "gw-2"), sample(5, "gw-1")]
    assert [s.at for s in samples_between(samples, 1.5, 3)] == [1, 2]
    # The move happened right at the start of the window: still seen, from the state before it.
    assert binding_changes(samples_between(samples, 2, 3)) == 1


def test_split_brain_is_two_actives_of_one_term_and_other_terms_are_counted_apart():
    samples = [
        sample(0, "gw-1", gw_1=("active", 1), gw_2=("standby", 1)),
        sample(1, "gw-2", gw_1=("active", 1), gw_2=("active", 2)),  # the old one has not heard yet
        sample(2, "gw-2", gw_1=("active", 2), gw_2=("active", 2)),  # split brain
        sample(3, "gw-2", gw_1=("down", None), gw_2=("active", 2)),
        sample(4, "gw-2", gw_1=("unknown", 2), gw_2=("active", 2)),
    ]
    assert split_brain_moments(samples) == 1
    assert two_active_moments(samples) == 2


def test_spread_gives_p50_p99_and_max_or_nothing():
    assert spread([1.0, 2.0, 3.0]) == {"p50": 2.0, "p99": 2.98, "max": 3.0}
    assert spread([]) == {"p50": None, "p99": None, "max": None}


def h6(n: int, **figures: float) -> dict:
    base = {"nb_txn_per_second": 2.0, "active_cpu_percent": 1.0, "standby_cpu_percent": 0.5, "nb_cpu_percent": 0.2}
    measured = {**base, **figures}
    return {
        "n": n,
        "n_wanted": 1000,
        "baseline": base,
        "build_seconds": 40.0,
        "window_seconds": 30.0,
        "nb_txn_source": "entries of its RAFT log",
        "active_host": "gw-1",
        "standby_host": "gw-2",
        "active_holds": n + 1,
        "standby_holds": 0,
        **measured,
    }


def test_h6_at_a_smaller_n_is_a_line_through_the_baseline_and_the_measurement():
    measured = h6(200, active_cpu_percent=2.0)
    assert extrapolated(measured, "active_cpu_percent") == pytest.approx(1.0 + 1.0 * 1000 / 200)
    assert extrapolated(h6(1000, active_cpu_percent=4.0), "active_cpu_percent") == 4.0


def results() -> dict:
    rounds = [
        {"failover_seconds": 1.2, "client_outage_seconds": 1.3, "binding_changes": 1, "unbound_seconds": 0.0},
        {"failover_seconds": 1.4, "client_outage_seconds": 1.5, "binding_changes": 2, "unbound_seconds": 0.1},
    ]
    outcomes = {"ok": 100, "refused": 0, "broken": 0, "slow": 0}
    return {
        "config": {"lease_seconds": 1.5, "probe_interval": 0.02, "sample_interval": 0.05},
        "h1": {"rounds": rounds, "split_brain_moments": 0, "two_active_moments": 3, "samples": 80, "sample_ms_p50": 20},
        "h3": {
            "rounds": [
                {"term_before": 2, "term_after": 2, "binding_changes": 0, "outcomes": outcomes, "restart_seconds": 2}
            ]
        },
        "h4": {
            "answer_seconds": 1.4,
            "role_while_cut": "unknown",
            "active_while_cut_seconds": 6.5,
            "old_active_role": "standby",
            "binding_changes": 1,
            "standby_again_seconds": 0.3,
            "watched_seconds": 6,
        },
        "h5": {
            "rounds": [
                {"result": "handed_over", "moved_seconds": 0.6, "outcomes": {**outcomes, "broken": 1, "slow": 2}},
            ]
        },
        "h6": h6(200, active_cpu_percent=1.01),
    }


def test_the_table_has_a_verdict_per_figure():
    rows = {row["figure"]: row for row in evaluate(results())}
    verdicts = {figure.split(" ")[0] + " " + row["measured"]: row["result"] for figure, row in rows.items()}
    assert verdicts == {
        "H1 p50 1.30 s, p99 1.40 s, max 1.40 s": "met",
        "H2 0": "met",
        "H2 1, 2": "MISSED",  # a failover that moved the binding twice
        "H3 0 / 0 of 100": "met",
        "H4 1.40 s": "met",
        "H4 standby, 1": "met",
        "H5 0 refused at connect, 1 broken mid-request, of 101": "met",
        "H6 2.0/s": "n/a",  # one transaction a tick per host holding leases, whatever N
        "H6 1.1 % of one core (at N=200: 1.0 % of one core)": "met",
        "H6 0.5 % of one core (at N=200: 0.5 % of one core)": "met",
    }
    assert any("EXTRAPOLATED from N=200" in figure for figure in rows)
    rendered = table(list(rows.values()))
    assert rendered.count("\n") == len(rows) + 1


def test_a_phase_that_was_not_run_has_no_row_and_an_unbuilt_h6_is_missed():
    partial = results()
    del partial["h3"], partial["h4"], partial["h5"]
    partial["h6"] = {"n": 1000, "error": "not ready after 600 s"}
    figures = [row["figure"] for row in evaluate(partial)]
    assert [f.split(" ")[0] for f in figures] == ["H1", "H2", "H2", "H6"]
    assert evaluate(partial)[-1]["result"] == "MISSED"


# --------------------------------------------------------------------------
# the client, against servers on 127.0.0.1


async def serve(handler) -> tuple[asyncio.base_events.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_the_probe_tells_answered_from_refused_from_broken():
    async def answers(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nweb\n")
        writer.close()

    async def hangs_up(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    good, good_port = await serve(answers)
    bad, bad_port = await serve(hangs_up)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]  # bound, not listening: refused
        async with good, bad:
            assert await ha_probe.attempt("127.0.0.1", good_port) == "ok"
            assert await ha_probe.attempt("127.0.0.1", bad_port) == "broken"
            assert await ha_probe.attempt("127.0.0.1", closed_port) == "refused"


def test_h6_with_an_agent_out_of_contact_is_not_taken_for_a_cost():
    out = results()
    out["h6"].update(out_of_contact=["gw-1: after the window"], roles={"gw-1": {"unknown": 201}})
    [row] = [row for row in evaluate(out) if row["figure"].startswith("H6")]
    assert row["result"] == "MISSED" and row["measured"] == "not measured"
    assert "not settled: gw-1: after the window" in row["note"]
