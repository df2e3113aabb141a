"""The `ha` field of a load balancer, and what this host can serve of it."""

from __future__ import annotations

import copy

import pytest

from lbagent.desired.ha import HighAvailability, host_problems
from lbagent.desired.model import parse_desired_state
from lbagent.errors import InvalidDesiredState
from tests.unit.samples import EXAMPLE


def with_ha(ha):
    body = copy.deepcopy(EXAMPLE)
    body["loadbalancers"][0]["ha"] = ha
    return body


def test_a_load_balancer_names_its_hosts_in_priority_order():
    lb = parse_desired_state(with_ha({"hosts": ["gw-1", "gw-2", "gw-3"], "preempt": True})).loadbalancers[0]
    assert (lb.ha.hosts, lb.ha.preempt) == (["gw-1", "gw-2", "gw-3"], True)
    assert (lb.ha.rank("gw-1"), lb.ha.rank("gw-3"), lb.ha.rank("gone")) == (0, 2, 3)
    assert parse_desired_state(with_ha(None)).loadbalancers[0].ha is None


@pytest.mark.parametrize(
    ("ha", "path", "words"),
    [
        ({"hosts": ["gw-1"]}, "/loadbalancers/0/ha/hosts", "at least 2"),
        ({"hosts": [f"gw-{i}" for i in range(9)]}, "/loadbalancers/0/ha/hosts", "at most 8"),
        ({"hosts": ["gw-1", "gw-2", "gw-1"]}, "/loadbalancers/0/ha/hosts", "given more than once: gw-1"),
        ({"hosts": ["gw-1", "bad host"]}, "/loadbalancers/0/ha/hosts/1", ""),
        ({"hosts": ["gw-1", "gw-2"], "preempt": 1}, "/loadbalancers/0/ha/preempt", ""),
        ({"hosts": ["gw-1", "gw-2"], "extra": 1}, "/loadbalancers/0/ha/extra", ""),
    ],
)
def test_bad_ha_is_refused_at_its_path(ha, path, words):
    with pytest.raises(InvalidDesiredState) as caught:
        parse_desired_state(with_ha(ha))
    details = {d["path"]: d["message"] for d in caught.value.details}
    assert path in details, details
    assert words in details[path]


def test_this_host_must_be_listed_and_have_the_northbound_database():
    lbs = parse_desired_state(with_ha({"hosts": ["gw-1", "gw-2"]})).loadbalancers
    assert host_problems(lbs, "gw-2", nb_configured=True) == []
    assert host_problems(lbs, "gw-9", nb_configured=True)[0]["path"] == "/loadbalancers/0/ha/hosts"
    no_nb = host_problems(lbs, "gw-1", nb_configured=False)
    assert no_nb[0]["path"] == "/loadbalancers/0/ha" and "[ovn] nb" in no_nb[0]["message"]
    assert host_problems(parse_desired_state(EXAMPLE).loadbalancers, "gw-1", nb_configured=False) == []
    assert HighAvailability(hosts=["a", "b"]).preempt is False
