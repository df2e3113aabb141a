"""The benchmark's choice of the P1 run to report: the median ratio, a run that never converged counting as slowest."""

from bench.measure import median_run


def test_the_middle_ratio_is_the_figure():
    runs = [{"ratio": 3.1}, {"ratio": 2.4}, {"ratio": 2.8}]
    assert median_run(runs) is runs[2]


def test_a_run_that_did_not_converge_counts_as_the_slowest():
    runs = [{"ratio": None}, {"ratio": 2.4}, {"ratio": 2.8}]
    assert median_run(runs) is runs[2]
    assert median_run([{"ratio": 2.0}, {"ratio": None}])["ratio"] is None  # the upper of two
