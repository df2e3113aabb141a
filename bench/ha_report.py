"""The high-availability benchmark's arithmetic and its table: what the client saw, what the
samples of the binding and of the agents' roles say, and the verdicts of `make bench-ha`.

Everything here is pure (lists in, figures out), so that it is unit-tested
without a sandbox; bench/ha.py measures and calls it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.report import percentile

OUTCOMES = ("ok", "refused", "broken")


@dataclass(frozen=True)
class Attempt:
    """One new connection of the client (bench/ha_probe.py): when it started and ended, how it went."""

    start: float
    end: float
    outcome: str


def parse_attempt(line: str) -> Attempt | None:
    """A line of bench/ha_probe.py, or None for anything else (a partial line at exit)."""
    parts = line.split()
    if len(parts) != 3 or parts[2] not in OUTCOMES:
        return None
    try:
        return Attempt(float(parts[0]), float(parts[1]), parts[2])
    except ValueError:
        return None


def first_answer_after(attempts: Iterable[Attempt], moment: float) -> float | None:
    """When the first connection started at or after `moment` was answered (None: none yet)."""
    ends = [a.end for a in attempts if a.outcome == "ok" and a.start >= moment]
    return min(ends) if ends else None


def outage(attempts: Iterable[Attempt], since: float) -> float | None:
    """The outage the client saw after `since`: from the start of its first connection that failed
    or was slow to the end of the first one after that which was answered promptly (None: no such
    connection, or no answer yet). Read it once the connections of the outage have ended."""
    ordered = sorted((a for a in attempts if a.start >= since), key=lambda a: a.start)
    hit = next((a for a in ordered if not _prompt(a)), None)
    if hit is None:
        return None
    answered = [a.end for a in ordered if a.start >= hit.start and _prompt(a)]
    return min(answered) - hit.start if answered else None


def _prompt(attempt: Attempt) -> bool:
    return attempt.outcome == "ok" and attempt.end - attempt.start <= SLOW_SECONDS


SLOW_SECONDS = 1.0  # an answered connection that took longer had its SYN (or its answer) retransmitted


def outcomes_between(attempts: Iterable[Attempt], start: float, end: float) -> dict[str, int]:
    """How the connections started in [start, end] went, by outcome; `slow`: answered, but late."""
    counts = dict.fromkeys((*OUTCOMES, "slow"), 0)
    for a in attempts:
        if start <= a.start <= end:
            counts[a.outcome] += 1
            counts["slow"] += a.outcome == "ok" and a.end - a.start > SLOW_SECONDS
    return counts


@dataclass(frozen=True)
class Sample:
    """One look at the load balancer: the chassis SB binds its port to, and each agent's (role, term)."""

    at: float
    chassis: str | None
    roles: dict[str, tuple[str | None, int | None]] = field(default_factory=dict)


def samples_between(samples: Sequence[Sample], start: float, end: float) -> list[Sample]:
    """The samples of [start, end], led by the last one before `start`: the state the window began in."""
    before = [s for s in samples if s.at < start]
    inside = [s for s in samples if start <= s.at <= end]
    return before[-1:] + inside


def binding_sequence(samples: Iterable[Sample]) -> list[str]:
    """The chassis the port was bound to, in order, each stay once; moments unbound are left out
    (an unbound moment between two chassis is one move, not two)."""
    sequence: list[str] = []
    for sample in samples:
        if sample.chassis is not None and (not sequence or sequence[-1] != sample.chassis):
            sequence.append(sample.chassis)
    return sequence


def binding_changes(samples: Iterable[Sample]) -> int:
    """How many times the binding moved from one chassis to another."""
    return max(0, len(binding_sequence(samples)) - 1)


def unbound_seconds(samples: Sequence[Sample]) -> float:
    """How long, by the samples, the port was bound to no chassis."""
    total = 0.0
    for sample, following in zip(samples, samples[1:]):
        if sample.chassis is None:
            total += following.at - sample.at
    return total


def split_brain_moments(samples: Iterable[Sample]) -> int:
    """Samples in which two or more hosts said `active` for the same term."""
    moments = 0
    for sample in samples:
        terms = [term for role, term in sample.roles.values() if role == "active"]
        moments += len(terms) != len(set(terms))
    return moments


def two_active_moments(samples: Iterable[Sample]) -> int:
    """Samples in which two or more hosts said `active`, whatever their terms."""
    return sum([role for role, _ in sample.roles.values()].count("active") > 1 for sample in samples)


def spread(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p99 and max of `values` (None when there are none)."""
    if not values:
        return {"p50": None, "p99": None, "max": None}
    return {
        "p50": round(percentile(list(values), 0.5), 3),
        "p99": round(percentile(list(values), 0.99), 3),
        "max": round(max(values), 3),
    }


# --------------------------------------------------------------------------
# verdicts


def _row(figure: str, measured: str, target: str, met: bool | None, note: str = "") -> dict[str, Any]:
    result = "n/a" if met is None else ("met" if met else "MISSED")
    return {"figure": figure, "measured": measured, "target": target, "result": result, "note": note}


def _s(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per figure of H1-H6 that was measured."""
    rows: list[dict[str, Any]] = []
    for phase in (_h1_h2_rows, _h3_rows, _h4_rows, _h5_rows, _h6_rows):
        rows += phase(results)
    return rows


def _h1_h2_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rounds = results.get("h1", {}).get("rounds", [])
    if not rounds:
        return []
    lease = results["config"]["lease_seconds"]
    times = [r["failover_seconds"] for r in rounds if r["failover_seconds"] is not None]
    stats = spread(times)
    outage = spread([r["client_outage_seconds"] for r in rounds if r.get("client_outage_seconds") is not None])
    unanswered = len(rounds) - len(times)
    changes = [r["binding_changes"] for r in rounds]
    split = results["h1"]["split_brain_moments"]
    return [
        _row(
            f"H1 failover after a crash of the active host ({len(rounds)} crashes)",
            f"p50 {_s(stats['p50'])}, p99 {_s(stats['p99'])}, max {_s(stats['max'])}",
            f"every crash answered (lease {lease:g} s)",
            unanswered == 0,
            f"kill to the first answer through the standby, a new connection every "
            f"{results['config']['probe_interval'] * 1000:.0f} ms; the client's outage (first failed to first "
            f"answered connection) p50 {_s(outage['p50'])}, max {_s(outage['max'])}"
            + (f"; {unanswered} never answered" if unanswered else ""),
        ),
        _row(
            "H2 moments two hosts said active for one term",
            str(split),
            "0",
            split == 0,
            f"{results['h1']['samples']} samples of SB and both agents, every "
            f"{results['config']['sample_interval'] * 1000:.0f} ms (a sample takes "
            f"{results['h1']['sample_ms_p50']:.0f} ms p50); two hosts active for different terms in "
            f"{results['h1']['two_active_moments']}",
        ),
        _row(
            "H2 binding changes per failover",
            ", ".join(str(c) for c in changes),
            "exactly 1 each",
            all(c == 1 for c in changes),
            f"port unbound {sum(r['unbound_seconds'] for r in rounds):.2f} s in all, by the samples",
        ),
    ]


def _h3_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rounds = results.get("h3", {}).get("rounds", [])
    if not rounds:
        return []
    failovers = sum(r["term_after"] != r["term_before"] or r["binding_changes"] != 0 for r in rounds)
    failed = sum(r["outcomes"]["refused"] + r["outcomes"]["broken"] for r in rounds)
    answered = sum(r["outcomes"]["ok"] for r in rounds)
    restart = spread([r["restart_seconds"] for r in rounds])
    return [
        _row(
            f"H3 failovers / failed requests over {len(rounds)} restarts of the active agent",
            f"{failovers} / {failed} of {answered + failed}",
            "0 / 0",
            failovers == 0 and failed == 0,
            f"SIGTERM to its lease renewed without grace: p50 {_s(restart['p50'])}, max {_s(restart['max'])}",
        )
    ]


def _h4_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    h4 = results.get("h4")
    if not h4:
        return []
    return [
        _row(
            "H4 underlay of the active host cut: the standby answers after",
            _s(h4["answer_seconds"]),
            "answered",
            h4["answer_seconds"] is not None,
            _cut_note(h4),
        ),
        _row(
            "H4 after healing: old active standby, binding changes",
            f"{h4['old_active_role']}, {h4['binding_changes']}",
            "standby, 1",
            h4["old_active_role"] == "standby" and h4["binding_changes"] == 1,
            f"standby again {_s(h4['standby_again_seconds'])} after the heal; watched "
            f"{h4['watched_seconds']:.0f} s after it",
        ),
    ]


def _cut_note(h4: dict[str, Any]) -> str:
    seconds = h4.get("active_while_cut_seconds")
    if seconds is None:
        return f"the cut host went on saying 'active' for the {h4.get('cut_seconds', 0):.0f} s it was cut off"
    return f"the cut host said 'active' until {seconds:.1f} s after the cut, then {h4['role_while_cut']!r}"


def _h5_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    rounds = results.get("h5", {}).get("rounds", [])
    if not rounds:
        return []
    refused = sum(r["outcomes"]["refused"] for r in rounds)
    broken = sum(r["outcomes"]["broken"] for r in rounds)
    total = sum(r["outcomes"][outcome] for r in rounds for outcome in OUTCOMES)
    results_seen = sorted({r["result"] for r in rounds})
    return [
        _row(
            f"H5 failed new connections over {len(rounds)} planned handovers under load",
            f"{refused} refused at connect, {broken} broken mid-request, of {total}",
            "0 refused",
            refused == 0 and results_seen == ["handed_over"],
            f"{1 / results['config']['probe_interval']:.0f} new connections/s, "
            f"{sum(r['outcomes']['slow'] for r in rounds)} answered after > {SLOW_SECONDS:g} s; "
            "lbagent ha handover said "
            + ", ".join(results_seen)
            + f"; binding moved {_s(spread([r['moved_seconds'] for r in rounds])['max'])} max after the command",
        )
    ]


def extrapolated(h6: dict[str, Any], key: str) -> float:
    """`key` of H6 at its wanted N: measured there, or a straight line through the baseline (one
    load balancer) and the measurement (n more) when a smaller n was built."""
    measured = h6[key]
    if h6["n"] == h6["n_wanted"] or "baseline" not in h6:
        return measured
    base = h6["baseline"][key]
    return base + (measured - base) * h6["n_wanted"] / h6["n"]


def _h6_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    h6 = results.get("h6")
    if not h6:
        return []
    if "error" in h6:
        figure = f"H6 cost of {h6.get('n')} HA load balancers per host"
        return [_row(figure, "not measured", "< 5 %", False, h6["error"])]
    if h6.get("out_of_contact"):
        figure = f"H6 cost of {h6['n']} HA load balancers per host"
        why = f"not settled: {'; '.join(h6['out_of_contact'])} (roles {h6['roles']})"
        return [_row(figure, "not measured", "< 5 %", False, why)]
    n, wanted = h6["n"], h6["n_wanted"]
    label = f"N={n}" if n == wanted else f"N={wanted} EXTRAPOLATED from N={n}"
    note = f"built on both hosts in {h6['build_seconds']:.0f} s; {h6['window_seconds']:.0f} s idle window"
    if n != wanted:
        note += f"; a straight line through N=1 and N={n}"

    def measured(key: str, unit: str) -> str:
        value = f"{extrapolated(h6, key):.1f}{unit}"
        return value if n == wanted else f"{value} (at N={n}: {h6[key]:.1f}{unit})"

    holding = sum(h6[f"{who}_holds"] > 0 for who in ("active", "standby"))
    rows = [
        _row(
            # A host's heartbeat (with any lease writes) is one transaction a tick: this grows with the
            # hosts holding leases, not with N, and is not extrapolated.
            f"H6 NB transactions/s on the central, N={n} (as measured)",
            f"{h6['nb_txn_per_second']:.1f}/s",
            "–",
            None,
            note + f"; {holding} hosts holding leases (with one load balancer: "
            f"{h6['baseline']['nb_txn_per_second']:.1f}/s)"
            * ("baseline" in h6)
            + f"; counted as {h6['nb_txn_source']}; NB ovsdb-server CPU"
            + (f" at N={wanted}" if n != wanted else "")
            + f" {measured('nb_cpu_percent', ' %')}",
        )
    ]
    for who in ("active", "standby"):
        percent = extrapolated(h6, f"{who}_cpu_percent")
        rows.append(
            _row(
                f"H6 {who} agent CPU, {label}",
                measured(f"{who}_cpu_percent", " % of one core"),
                "< 5 %",
                percent < 5.0,
                f"{h6[f'{who}_host']} held {h6[f'{who}_holds']} of {n + 1}",
            )
        )
    return rows
