"""P5's reloads under load: a row at the small N and one of its own at the largest N."""

from bench.report import evaluate


def reloads(n: int, failed: int = 0, done: int = 20) -> dict:
    return {
        "n": n,
        "reloads_wanted": 20,
        "reloads": done,
        "failed": failed,
        "requests": 5000,
        "tool": "python",
        "rps": 500.0,
    }


def test_the_reloads_at_the_largest_n_are_a_row_of_their_own():
    rows = evaluate({"p5": reloads(10), "p5_largest": reloads(1000, failed=3)})
    by_figure = {row["figure"]: row for row in rows}
    assert by_figure["P5 failed requests during 20 reloads, N=10"]["result"] == "met"
    largest = by_figure["P5 failed requests during 20 reloads, N=1000"]
    assert (largest["measured"], largest["result"]) == ("3 of 5,000", "MISSED")


def test_reloads_that_did_not_all_happen_miss():
    (row,) = evaluate({"p5_largest": reloads(1000, done=12)})
    assert row["figure"] == "P5 failed requests during 12 reloads, N=1000" and row["result"] == "MISSED"
