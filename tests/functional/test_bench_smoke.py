"""The benchmark's code path (`make bench`, bench/run.py) at N=3 with short durations.

Not a performance test: it keeps the benchmark working. Every figure must be
produced and sane, the IPv6 leg's (dual-stack load balancers) included; only
P5 (no request may fail during reloads) and the P2 write counts (a converged
agent writes nothing) are held to their targets, the others depend on the
machine.
"""

from __future__ import annotations

import math

from bench.report import table
from bench.run import BenchConfig, run_benchmark
from devtools.procs import pid_alive


def test_benchmark_runs_at_small_n_and_produces_sane_figures(sandbox, prefix, tmp_path):
    config = BenchConfig(
        ns=[3],
        p3_small=2,
        p2_seconds=3,  # longer than the longest jittered resync interval: each load balancer resyncs in it
        p2_every=2,
        changes=2,
        reloads=2,
        wrk_seconds=1,
        connections=4,
        p4_rounds=2,
        converge_timeout=120,
        policy_rules=False,
        p1_runs=2,
        output=tmp_path / "results.json",
    )
    # Its own short working directory under /var/tmp (haproxy's sockets live there), removed afterwards.
    results = run_benchmark(config, sandbox=sandbox, prefix=prefix)

    (p1,) = results["p1"]
    assert p1["n"] == 3 and p1["floor_seconds"] > 0 and p1["agent_seconds"] > 0, p1
    assert p1["ovn_installed_seconds"] is not None and p1["ratio"] > 0
    # Two floor/agent pairs; the figure is the upper-median one, and the row says so.
    assert len(p1["runs"]) == 2 and p1["ratio"] == max(run["ratio"] for run in p1["runs"]), p1

    p2 = results["p2"]
    assert p2["writes"] == {"netlink": 0, "iptables": 0, "ovsdb": 0}, p2
    assert p2["reloads"] == 0 and 0 <= p2["cpu_percent"] < 100, p2
    # Each load balancer resynced in the window, and each resync stopped after its first look.
    assert p2["passes"] >= 3 and p2["resync_checks"]["unchanged"] >= 3 and p2["resync_checks"]["changed"] == 0, p2
    assert p2["resync_interval"] == 2 and p2["cpu_ms_per_pass"] > 0, p2
    drift = results["drift"]
    assert drift["n"] == 3 and 0 < drift["seconds"] < 120 and drift["resync_interval"] == 2, drift

    assert sorted(entry["n"] for entry in results["p3"]) == [2, 3]
    for entry in results["p3"]:
        assert entry["missed"] == 0 and len(entry["latencies"]) == 2, entry
        assert 0 < entry["p50"] <= entry["p99"] < 60, entry
        assert 0 < entry["poll_ms"] < 1000, entry
        # Backend changes of tcp listeners go to haproxy live; the agent's log says when.
        assert 0 < entry["agent_p50"] <= entry["agent_p99"] < 60, entry

    p4 = results["p4"]
    # The agent, direct, the two proxies in the load balancer's namespace, OVN's own load balancer.
    for leg in ("loadbalancer", "direct", "ns_haproxy", "nginx_stream", "ovn_lb"):
        assert p4[leg]["rps"] > 0 and p4[leg]["errors"] == 0, (leg, p4[leg])
    for leg in ("ns_haproxy", "nginx_stream"):  # each counted as its own process, and stopped
        assert p4[leg]["cpu_cores"][leg] > 0 and not pid_alive(p4[leg]["pid"]), (leg, p4[leg])
    for leg in ("loadbalancer", "ns_haproxy", "nginx_stream"):  # run back to back, round after round
        assert [r["rps"] > 0 for r in p4[leg]["rounds"]] == [True, True], (leg, p4[leg])

    p5 = results["p5"]
    assert p5["reloads"] == 2 and p5["requests"] > 0, p5
    assert p5["failed"] == 0, p5
    live = p5["live"]  # the same scale-out and -in without a reload
    assert live["reloads"] == 2 and live["requests"] > 0 and live["failed"] == 0, live

    largest = results["p5_largest"]  # the reloads again at the largest N
    assert largest["n"] == 3 and largest["reloads"] == 2 and largest["failed"] == 0, largest

    v6 = results["ipv6"]  # dual-stack load balancers, IPv6 backends and an IPv6 client
    assert "error" not in v6 and v6["n"] == 3, v6
    assert v6["p1"]["agent_seconds"] > 0 and len(v6["p1"]["runs"]) == 2, v6["p1"]
    assert v6["p1"]["agent_seconds"] == max(v6["p1"]["runs"]), v6["p1"]  # the upper median of two
    p3v6 = v6["p3"]
    assert p3v6["n"] == 2 and p3v6["missed"] == 0 and len(p3v6["latencies"]) == 2, p3v6
    assert 0 < p3v6["p50"] <= p3v6["p99"] < 60 and 0 < p3v6["agent_p50"] < 60, p3v6
    assert v6["p4"]["rps"] > 0 and v6["p4"]["errors"] == 0, v6["p4"]

    p6 = results["p6"]
    assert 10 < p6["rss_mb"] < 1000, p6

    rows = results["rows"]
    assert {row["result"] for row in rows} <= {"met", "MISSED"}
    assert all(not math.isnan(float(entry["p99"])) for entry in results["p3"])
    rendered = table(rows)
    assert rendered.count("\n") == len(rows) + 1 and "P5 failed requests" in rendered
    figures = [row["figure"] for row in rows]
    assert "P5 failed requests during 2 reloads, N=3" in figures, figures
    assert sum(figure.startswith("P4 HTTP req/s via load balancer vs") for figure in figures) == 2, figures
    for figure in (
        "P1 dual-stack cold convergence, N=3",
        "P3 IPv6 backend change → traffic, N=2",
        "P4 IPv6 client HTTP req/s via load balancer, N=2",
    ):
        assert figure in figures, figures
    assert results["machine"]["commit"] != "unknown", results["machine"]
    assert "median of 2 runs" in rows[0]["note"], rows[0]
    assert (tmp_path / "results.json").exists()
    # Nothing of the run is left: its agents' load balancers, namespaces and links went with it.
    assert results["left_after_delete"] == {"3": [], "2": []}


def test_the_scale_run_times_lbagent_cleanup_with_every_load_balancer_in_place(sandbox, prefix, tmp_path):
    """`make bench-scale`'s code path at N=1 and 2: P1 and the memory after it at each N, the first
    agent's load balancers deleted by a refresh, the last one's by `lbagent cleanup` alone."""
    config = BenchConfig(
        ns=[1, 2],
        converge_timeout=120,
        policy_rules=False,
        p1_runs=1,
        ipv6=False,
        scale=True,
        output=tmp_path / "results-scale.json",
    )
    results = run_benchmark(config, sandbox=sandbox, prefix=prefix)

    assert [entry["n"] for entry in results["p1"]] == [1, 2]
    for entry in results["p1"]:
        assert entry["agent_seconds"] > 0 and entry["floor_seconds"] > 0 and 10 < entry["rss_mb"] < 1000, entry
    assert results["p6"]["n"] == 2 and results["p6"]["rss_mb"] == results["p1"][1]["rss_mb"]
    assert results["left_after_delete"] == {"1": []}  # the first agent's, by a refresh
    cleanup = results["cleanup"]  # the second agent stopped with both load balancers in place
    assert cleanup["n"] == 2 and 0 < cleanup["seconds"] < 120 and cleanup["left"] == [], cleanup
    # Only P1 and what follows from it: no traffic legs, no loop stall leg.
    assert results["p3"] == [] and not {"p2", "p4", "p5", "loop_stall", "ipv6"} & results.keys(), sorted(results)
    figures = [row["figure"] for row in results["rows"]]
    assert "P8 lbagent cleanup of N=2 load balancers, the agent stopped" in figures, figures
    assert (tmp_path / "results-scale.json").exists()
