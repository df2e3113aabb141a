"""The load balancer documents say why a load balancer is not ready."""

from lbagent.api.status import StatusReporter, loadbalancer_status
from lbagent.desired.model import parse_desired_state
from lbagent.ovnhost.host import HostObservation
from lbagent.workers.lb_task import LbTask
from tests.unit.samples import lb_body, state


class Source:
    def __init__(self, tasks):
        self.tasks = tasks

    def loadbalancer_tasks(self):
        return list(self.tasks)


def task(state_word, waiting=None, passed=True, last_error=None):
    t = LbTask("lb-1", None, None, lambda: 30.0)
    t.state, t.waiting, t.passed, t.last_error = state_word, waiting, passed, last_error
    return t


def test_the_reason_of_each_state():
    assert task("ready").reason is None
    assert task("pending", "waiting for ovn-installed").reason == "waiting for ovn-installed"
    assert task("pending", passed=False).reason == "not reconciled yet at the accepted generation"
    assert task("error", passed=False, last_error="boom").reason == "boom"
    assert task("deleting").reason == "being deleted"


def test_documents_and_wait_results_carry_the_reason():
    lb = parse_desired_state(state(1, [lb_body("lb-1")])).loadbalancer("lb-1")
    waiting = task("pending", "waiting for ovn-installed")
    document = loadbalancer_status(waiting, lb, None, None, "lb-lb-1", HostObservation("o1", False), {}, {})
    assert (document["state"], document["reason"], document["ovn_installed"]) == (
        "pending",
        "waiting for ovn-installed",
        False,
    )
    assert document["listeners"][0]["state"] == "pending"
    results = StatusReporter(Source([waiting])).results(1)
    assert results["loadbalancers"][0]["reason"] == "waiting for ovn-installed"


def test_documents_name_the_certificates_that_have_expired():
    from tests.unit.desired.test_pem import DAY, NOW, pair, with_certificates

    expired = pair("p256", not_before=NOW - 10 * DAY, not_after=NOW - 2 * DAY)
    lb = parse_desired_state(with_certificates(pair("rsa2048"), expired)).loadbalancers[0]
    document = loadbalancer_status(task("ready"), lb, None, None, "lb-lb-1", None, {}, {})
    assert [w["path"] for w in document["certificate_warnings"]] == ["/listeners/1/certificates/1/certificate"]
    assert document["certificate_warnings"][0]["message"].startswith("certificate expired at ")
    gone = loadbalancer_status(task("deleting"), None, None, None, "lb-lb-1", None, {}, {})
    assert gone["certificate_warnings"] == []
