"""P4's rounds: a leg's rounds folded into one entry, and the figure as the median of paired ratios."""

import pytest

from bench import p4rounds
from bench.common import BenchConfig
from bench.legs import TrafficLegs
from bench.report import p4_rows


def run(rps: float, errors: int = 0, **cores: float) -> dict:
    return {"tool": "wrk", "seconds": 10.0, "requests": int(rps * 10), "errors": errors, "rps": rps, "cpu_cores": cores}


def test_a_legs_rounds_fold_into_one_entry_that_keeps_them():
    rounds = [run(900, haproxy=0.5), run(1000, errors=2, haproxy=0.7), run(800, haproxy=0.6, agent=0.1)]

    entry = p4rounds.summary(rounds)

    assert entry["rps"] == 900 and entry["errors"] == 2 and entry["requests"] == 27000 and entry["seconds"] == 30.0
    assert entry["cpu_cores"] == {"haproxy": 0.6, "agent": 0.1} and entry["rounds"] == rounds


def test_the_figure_pairs_legs_run_in_the_same_round():
    # The VM's speed changes from round to round; within a round the legs ran seconds apart.
    mine = p4rounds.summary([run(900), run(300), run(100)])
    theirs = p4rounds.summary([run(1000), run(500), run(100)])

    assert mine["rps"] / theirs["rps"] == pytest.approx(0.6)  # the medians' ratio mixes rounds
    assert p4rounds.round_ratios(mine, theirs) == pytest.approx([0.9, 0.6, 1.0])
    assert p4rounds.paired_ratio(mine, theirs) == pytest.approx(0.9)


def test_legs_without_rounds_and_references_without_traffic():
    assert p4rounds.paired_ratio({"rps": 450.0}, {"rps": 500.0}) == pytest.approx(0.9)
    assert p4rounds.paired_ratio(p4rounds.summary([run(900)]), p4rounds.summary([run(0)])) is None


def test_the_row_gives_each_rounds_ratio():
    lb = p4rounds.summary([run(950), run(850), run(900)])
    reference = p4rounds.summary([run(1000), run(1000), run(1000)])
    rows = p4_rows({"n": 10, "loadbalancer": lb, "direct": {"rps": 2000.0}, "ns_haproxy": reference})

    assert rows[0][1:4] == ("900 (0.90× 1,000)", "≥ 0.9× haproxy in its namespace", True)
    assert rows[0][4].startswith("median of 3 rounds: 0.95, 0.85, 0.90; direct 2,000")
    assert rows[1][3] is False and rows[1][4].startswith("not run;")


class Rounds(TrafficLegs):
    """The rounds alone: each leg's load says which leg ran, in order; `failing` legs raise."""

    def __init__(self, rounds: int, failing: tuple[str, ...] = ()):
        self.config = BenchConfig(p4_rounds=rounds, output=None)
        self.results = {"p4": {}}
        self.ran: list[str] = []
        self.failing = failing

    def _p4_load(self, label, targets, more=None):
        leg = label.split(",")[0]
        self.ran.append(leg)
        if leg in self.failing:
            raise RuntimeError(f"{leg} exited")
        return run(1000)


def legs(*names: str) -> dict:
    return {name: ([("198.18.0.4", 80)], {}) for name in names}


def test_every_other_round_runs_the_legs_in_reverse_order():
    rounds = Rounds(3)
    figures = rounds._run_rounds(legs("loadbalancer", "ns_haproxy", "nginx_stream"))
    forward, backward = ["loadbalancer", "ns_haproxy", "nginx_stream"], ["nginx_stream", "ns_haproxy", "loadbalancer"]
    assert rounds.ran == forward + backward + forward
    assert {leg: len(runs) for leg, runs in figures.items()} == {"loadbalancer": 3, "ns_haproxy": 3, "nginx_stream": 3}


def test_a_reference_that_fails_is_not_measured_and_the_agents_leg_raises():
    rounds = Rounds(2, failing=("ns_haproxy",))
    running = legs("loadbalancer", "ns_haproxy", "nginx_stream")
    figures = rounds._run_rounds(running)
    assert set(figures) == set(running) == {"loadbalancer", "nginx_stream"}
    assert rounds.results["p4"]["ns_haproxy"] == {"rps": 0.0, "error": "ns_haproxy exited"}
    with pytest.raises(RuntimeError, match="loadbalancer exited"):
        Rounds(1, failing=("loadbalancer",))._run_rounds(legs("loadbalancer"))
