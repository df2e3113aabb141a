"""The load balancer documents say why a load balancer is not ready, and how each backend fares."""

import json
from datetime import UTC, datetime, timedelta

import pytest

from lbagent.api.status import StatusReporter, health_by_loadbalancer, loadbalancer_status
from lbagent.desired.model import parse_desired_state
from lbagent.haproxy.health import reason_of
from lbagent.haproxy.sockets import parse_show_stat
from lbagent.ovnhost.host import HostObservation
from lbagent.workers import plan
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


# --- per-backend health: backup, reason, since --------------------------------

SHOW_STAT_HEADER = "# pxname,svname,status,weight,check_status,check_code,lastchg,"


def show_stat(*rows: str) -> str:
    return "\n".join([SHOW_STAT_HEADER, *rows]) + "\n"


@pytest.mark.parametrize(
    "status,check_status,check_code,reason",
    [
        ("UP", "L7OK", "200", "ok"),
        ("UP", "L4OK", "", "ok"),
        ("DOWN", "L4CON", "", "connect_refused"),
        ("DOWN", "* L4TOUT", "", "timeout"),
        ("DOWN", "L7TOUT", "", "timeout"),
        ("DOWN", "L7STS", "503", "bad_status:503"),
        ("DOWN", "L7RSP", "", "bad_response"),
        ("MAINT", "L7OK", "200", "disabled"),
        ("DRAIN", "L7OK", "200", "draining"),
        ("no check", "", "", None),
    ],
)
def test_haproxys_check_status_becomes_the_health_reason(status, check_status, check_code, reason):
    states = parse_show_stat(show_stat(f"be:lb-1:l,be-1,{status},1,{check_status},{check_code},42,"))
    health = health_by_loadbalancer(states)["lb-1"]["be-1"]
    assert reason_of(health) == reason


def test_a_server_haproxy_drains_is_draining():
    states = parse_show_stat(show_stat("be:lb-1:l,be-1,DRAIN,1,L7OK,200,42,"))
    assert health_by_loadbalancer(states)["lb-1"]["be-1"] == "draining"


def test_backends_show_backup_reason_and_since():
    body = lb_body("lb-1", backends=("main", "spare"))
    body["backend_groups"][0]["backends"][1]["backup"] = True
    lb = parse_desired_state(state(1, [body])).loadbalancer("lb-1")
    targets = plan.group_targets(lb, [])
    members = plan.members_by_group(targets, {"main": 1025, "spare": 1026})
    stat = show_stat("be:lb-1:lsn-1,main,DOWN,1,L7STS,503,60,", "be:lb-1:lsn-1,spare,UP,1,L4OK,,5,")
    before = datetime.now(UTC)
    health = health_by_loadbalancer(parse_show_stat(stat))["lb-1"]
    document = loadbalancer_status(task("ready"), lb, None, None, "lb-lb-1", None, health, members)
    main, spare = document["backends"]
    assert (main["backup"], main["health"], main["health_reason"]) == (False, "down", "bad_status:503")
    assert (spare["backup"], spare["health"], spare["health_reason"]) == (True, "up", "ok")
    since = datetime.fromisoformat(main["health_since"])
    assert before - timedelta(seconds=62) <= since <= datetime.now(UTC) - timedelta(seconds=59)
    assert json.loads(json.dumps(document))["backends"][0]["health"] == "down"


def test_a_backend_haproxy_does_not_know_has_no_reason():
    lb = parse_desired_state(state(1, [lb_body("lb-1")])).loadbalancer("lb-1")
    members = plan.members_by_group(plan.group_targets(lb, []), {"be-1": 1025})
    document = loadbalancer_status(task("ready"), lb, None, None, "lb-lb-1", None, {}, members)
    backend = document["backends"][0]
    assert (backend["health"], backend["health_reason"], backend["health_since"]) == ("unknown", None, None)
