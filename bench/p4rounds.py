"""P4's rounds: the agent's leg and its reference legs, one after the other, again and again.

The VM's speed drifts by a tenth or more within a minute, so two legs run a
minute apart differ by as much as lbagent's own hops cost. Each round runs
every leg once, back to back; a round's ratio compares legs that ran within
seconds of each other, and the figure is the median of the rounds' ratios.
`summary` folds a leg's rounds into one entry of results["p4"] (every round
kept under "rounds"); `paired_ratio` is the figure.
"""

from __future__ import annotations

import statistics
from typing import Any


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One leg's entry: its rounds' totals, the median rate, the mean cores busy, every round."""
    cores: dict[str, list[float]] = {}
    for figures in rounds:
        for role, busy in figures.get("cpu_cores", {}).items():
            cores.setdefault(role, []).append(busy)
    return {
        "tool": rounds[0]["tool"],
        "seconds": round(sum(r["seconds"] for r in rounds), 2),
        "requests": sum(r["requests"] for r in rounds),
        "errors": sum(r["errors"] for r in rounds),
        "rps": statistics.median(r["rps"] for r in rounds),
        "cpu_cores": {role: round(statistics.fmean(busy), 2) for role, busy in cores.items()},
        "rounds": rounds,
    }


def round_ratios(leg: dict[str, Any], reference: dict[str, Any]) -> list[float]:
    """leg / reference in each round both ran (a leg without rounds: one ratio of their rates)."""
    pairs = list(zip(leg.get("rounds", [leg]), reference.get("rounds", [reference])))
    return [mine["rps"] / theirs["rps"] for mine, theirs in pairs if theirs["rps"]]


def paired_ratio(leg: dict[str, Any], reference: dict[str, Any]) -> float | None:
    """The median of the rounds' ratios; None when no round of the reference served anything."""
    ratios = round_ratios(leg, reference)
    return statistics.median(ratios) if ratios else None
