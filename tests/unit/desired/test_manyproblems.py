"""A body with very many problems: the first hundred listed, all of them counted, none converted in vain."""

from __future__ import annotations

import copy

import pytest

from lbagent.desired import manyproblems
from lbagent.desired.details import MAX_DETAILS
from lbagent.desired.manyproblems import validate
from lbagent.desired.model import parse_desired_state
from lbagent.errors import InvalidDesiredState
from tests.unit.samples import EXAMPLE


def refused(data) -> list[dict]:
    with pytest.raises(InvalidDesiredState) as exc:
        validate(data)
    return exc.value.details


@pytest.fixture
def few_listed(monkeypatch):
    """Bodies with more than 20 problems take the entry-by-entry path."""
    monkeypatch.setattr(manyproblems, "MAX_LISTED", 20)


def test_a_body_with_few_problems_gets_the_usual_details():
    body = copy.deepcopy(EXAMPLE)
    body["loadbalancers"][0]["listeners"][0]["listener_port"] = 0
    with pytest.raises(InvalidDesiredState) as usual:
        parse_desired_state(body)
    assert refused(body) == usual.value.details


def test_many_problems_list_the_first_hundred_and_count_them_all(few_listed):
    lb = copy.deepcopy(EXAMPLE["loadbalancers"][0])
    lb["listeners"] = [{}] * 3  # four required fields each
    body = {**copy.deepcopy(EXAMPLE), "generation": "7", "mtux": 1, "loadbalancers": [lb] * 10}
    details = refused(body)
    assert len(details) == MAX_DETAILS + 1
    assert details[:3] == [
        {"path": "/generation", "message": "must be a JSON integer (got '7')"},
        {"path": "/mtux", "message": "unknown field"},
        {"path": "/loadbalancers/0/listeners/0/id", "message": "required field is missing"},
    ]
    # 1 + 1 + 10 load balancers x 3 listeners x 4 fields
    assert details[-1] == {"path": "", "message": f"{122 - MAX_DETAILS} more problems are not listed"}


def test_an_entry_with_too_many_problems_to_list_is_one_detail(few_listed):
    lb = copy.deepcopy(EXAMPLE["loadbalancers"][0])
    lb["listeners"] = [{}] * 6
    details = refused({**copy.deepcopy(EXAMPLE), "loadbalancers": [lb]})
    assert details == [{"path": "/loadbalancers/0", "message": "24 problems in this object, too many to list"}]


def test_a_list_over_its_limit_is_one_problem_of_the_top_level(few_listed, monkeypatch):
    details = refused({"generation": 1, "subnets": [1] * 5000, **{f"x{i}": 1 for i in range(30)}})
    assert details[0] == {"path": "/subnets", "message": "must have at most 4096 entries"}
    assert details[1] == {"path": "/x0", "message": "unknown field"}
