"""The event-loop stall figure: its bodies are the largest the limits accept, and its row says what was measured."""

from bench import loopstall
from bench.report import evaluate
from lbagent.desired.budget import MAX_SERVERS_PER_LB, servers_of
from lbagent.desired.parser import RefreshParser, decode


def test_the_budget_body_is_accepted_and_exactly_at_the_budget():
    body = loopstall.bodies()["one load balancer at the server budget"]
    state = RefreshParser().parse(*decode(body))
    assert servers_of(state.loadbalancers[0]) == MAX_SERVERS_PER_LB


async def test_the_stall_is_measured_while_a_body_is_posted():
    body = loopstall.bodies()["one load balancer at the server budget"]
    stall = await loopstall.take_in({"one": body})
    [figure] = stall["bodies"]
    assert figure["status"] == 202 and figure["health_answers"] >= 1
    assert stall["worst_gap_ms"] == figure["worst_gap_ms"] > 0


def stall(worst: float, status: int = 202) -> dict:
    return {
        "worst_gap_ms": worst,
        "bodies": [{"body": "b", "bytes": 2**20, "status": status, "post_seconds": 1.5, "worst_gap_ms": worst}],
    }


def test_the_report_has_a_row_met_below_the_target_and_missed_above_or_when_refused():
    [row] = evaluate({"loop_stall": stall(40.0)})
    assert (row["measured"], row["target"], row["result"]) == ("40 ms", "< 100 ms", "met")
    assert "b: 1.0 MiB answered in 1500 ms, worst /healthz gap 40 ms" in row["note"]
    assert evaluate({"loop_stall": stall(140.0)})[0]["result"] == "MISSED"
    assert evaluate({"loop_stall": stall(10.0, status=400)})[0]["result"] == "MISSED"
    assert evaluate({"loop_stall": {"error": "OSError: no"}})[0]["result"] == "n/a"
