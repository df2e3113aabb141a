"""The IPv6 leg's pure parts: its addresses and bodies, the medians it compares, its rows."""

from bench.common import SUBNET6, ip6_of, lb_body
from bench.measure import median_run
from bench.report import evaluate, ipv6_rows, median_seconds
from bench.traffic import http_url


def test_hosts_and_vips_get_addresses_in_the_ipv6_prefix():
    assert ip6_of("198.18.0.21") == "2001:db8:0:1::21" and SUBNET6["cidr6"] == "2001:db8:0:1::/64"
    assert SUBNET6["cidr"] == "198.18.0.0/16"  # the same subnet, one prefix more
    assert "ip6" not in lb_body("p", 0)["network"]
    assert [lb_body("p", i, dual_stack=True)["network"]["ip6"] for i in (0, 255)] == [
        "2001:db8:0:1::4:1",
        "2001:db8:0:1::4:100",
    ]


def test_an_ipv6_url_has_its_address_in_brackets():
    assert http_url("198.18.4.1", 80) == "http://198.18.4.1:80/"
    assert http_url("2001:db8:0:1::4:1", 80) == "http://[2001:db8:0:1::4:1]:80/"


def test_the_median_run_by_any_key_counts_a_run_without_it_as_the_slowest():
    runs = [{"agent_seconds": 2.0}, {"agent_seconds": None}, {"agent_seconds": 1.0}]
    assert median_run(runs, key="agent_seconds") == {"agent_seconds": 2.0}
    assert median_run([{"ratio": 3.0}, {"ratio": 1.0}]) == {"ratio": 3.0}  # the upper one of two


def test_median_seconds_of_runs_either_recorded_or_bare():
    assert median_seconds({"agent_seconds": 4.0}) == 4.0
    assert median_seconds({"agent_seconds": 9.0, "runs": [{"agent_seconds": s} for s in (3.0, 1.0, 2.0)]}) == 2.0
    assert median_seconds({"runs": [1.0, None]}) is None  # the upper of two did not converge


def results(ds_runs=(1.2, 1.1, 1.3), v6_rps=950.0, **ipv6) -> dict:
    ipv4_runs = [{"agent_seconds": s, "floor_seconds": 0.5, "ratio": s / 0.5} for s in (1.0, 0.9, 1.1)]
    p3 = {"n": 10, "changes": 20, "missed": 0, "p50": 0.1, "p99": 0.2, "post_p50": 0.02, "latencies": []}
    return {
        "p1": [{"n": 100, "agent_seconds": 1.1, "floor_seconds": 0.5, "runs": ipv4_runs}],
        "p3": [{**p3, "p99": 0.15}],
        "p4": {"n": 10, "loadbalancer": {"rps": 1000.0}, "direct": {"rps": 2000.0}},
        "ipv6": {
            "n": 100,
            "p1": {"n": 100, "agent_seconds": sorted(ds_runs)[1], "runs": list(ds_runs)},
            "p3": p3,
            "p4": {"rps": v6_rps, "tool": "wrk", "connections": 32, "errors": 0},
            **ipv6,
        },
    }


def by_figure(rows) -> dict:
    return {row[0]: row for row in rows}


def test_the_ipv6_rows_hold_each_figure_to_the_ipv4_one_of_the_same_run():
    rows = by_figure(ipv6_rows(results()))
    p1 = rows["P1 dual-stack cold convergence, N=100"]
    assert p1[1:4] == ("1.2 s (1.20× IPv4 1.0 s)", "≤ 1.3× IPv4 P1", True)  # median against median
    assert "median of 3 runs (1.2 s, 1.1 s, 1.3 s)" in p1[4]
    p3 = rows["P3 IPv6 backend change → traffic, N=10"]
    assert p3[1:4] == ("p50 100 ms, p99 200 ms", "p99 < 1 s", True) and "IPv4 backend p99 150 ms" in p3[4]
    p4 = rows["P4 IPv6 client HTTP req/s via load balancer, N=10"]
    assert p4[1:4] == ("950 (0.95× IPv4 1,000)", "≥ 0.9× IPv4 client", True)


def test_a_slower_ipv6_leg_misses_its_goals():
    rows = by_figure(ipv6_rows(results(ds_runs=(1.4, 1.5, 1.6), v6_rps=850.0)))
    assert rows["P1 dual-stack cold convergence, N=100"][3] is False
    assert rows["P4 IPv6 client HTTP req/s via load balancer, N=10"][3] is False


def test_a_leg_that_stopped_says_why_in_every_row_it_left_unmeasured():
    stopped = results()
    stopped["ipv6"] = {"n": 100, "error": "RuntimeError: POST /v1/refresh answered 422"}
    rows = [row for row in evaluate(stopped) if "IPv6" in row["figure"] or "dual-stack" in row["figure"]]
    assert len(rows) == 3 and {row["result"] for row in rows} == {"MISSED"}
    assert all(row["measured"] == "not measured" and "answered 422" in row["note"] for row in rows), rows


def test_dual_stack_load_balancers_that_did_not_converge_miss():
    not_converged = results()
    not_converged["ipv6"]["p1"] = {"n": 100, "agent_seconds": None, "ready_at_timeout": 40, "runs": [None]}
    row = by_figure(ipv6_rows(not_converged))["P1 dual-stack cold convergence, N=100"]
    assert row[1:4] == ("not converged: 40 of 100 ready", "≤ 1.3× IPv4 P1", False)


def test_without_the_ipv6_leg_there_are_no_ipv6_rows():
    plain = results()
    del plain["ipv6"]
    assert not [row for row in evaluate(plain) if "IPv6" in row["figure"] or "dual-stack" in row["figure"]]
