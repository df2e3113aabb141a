"""The high-availability benchmark's code path (`make bench-ha`, bench/ha.py) with one of each
and a few load balancers for H6.

Not a performance test: it keeps the benchmark working. Every figure must be
produced and sane; what high availability promises (one binding change per
failover, no split brain, nothing moved or failed by a restart, no refused
connection in a handover) is held to its target, the timings and the costs
are not.
"""

from __future__ import annotations

import json
import subprocess

from bench.ha import HaConfig, run_ha_benchmark
from bench.report import table


def test_the_ha_benchmark_runs_small_and_produces_sane_figures(tmp_path):
    config = HaConfig(crashes=1, restarts=1, handovers=1, cuts=0, h6_n=3, h6_window=2)
    results = run_ha_benchmark(config, tmp_path / "results-ha.json")

    assert not results.get("errors"), results.get("errors")
    (crash,) = results["h1"]["rounds"]
    assert 0 < crash["failover_seconds"] < 30 and crash["term_after"] == crash["term_before"] + 1, crash
    assert crash["binding_changes"] == 1 and crash["bindings"][-1].endswith(crash["took_over"]), crash
    assert results["h1"]["samples"] > 0 and results["h1"]["split_brain_moments"] == 0

    (restart,) = results["h3"]["rounds"]
    assert restart["term_after"] == restart["term_before"] and restart["binding_changes"] == 0, restart
    assert restart["outcomes"]["refused"] == restart["outcomes"]["broken"] == 0 < restart["outcomes"]["ok"], restart

    (handover,) = results["h5"]["rounds"]
    assert handover["result"] == "handed_over" and handover["outcomes"]["refused"] == 0, handover

    h6 = results["h6"]
    assert h6["n"] == 3 and not h6.get("out_of_contact"), h6
    assert h6["active_holds"] == 4 and h6["standby_holds"] == 0, h6
    assert 0 <= h6["active_cpu_percent"] < 100 and h6["nb_txn_per_second"] >= 0, h6
    assert "baseline" in h6  # a smaller N than 1,000: the table extrapolates, from a baseline

    rows = results["rows"]
    assert [row["figure"].split(" ")[0] for row in rows] == ["H1", "H2", "H2", "H3", "H5", "H6", "H6", "H6"]
    assert table(rows).count("\n") == len(rows) + 1
    written = json.loads((tmp_path / "results-ha.json").read_text())
    assert written["git"]["commit"] and written["machine"]["cpus"] and written["attempts"]
    # Nothing of the run is left on the machine.
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert results["prefix"] not in namespaces
