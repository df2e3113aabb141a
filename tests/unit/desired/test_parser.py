"""RefreshParser: unchanged load balancers keep their validated model, and
nothing the full validation refuses gets through by being "unchanged"."""

from __future__ import annotations

import copy
import json

import pytest

from lbagent.desired.details import MAX_DETAILS, MAX_PATH_LEN
from lbagent.desired.model import parse_desired_state
from lbagent.desired.parser import DuplicateKeys, RefreshParser, decode
from lbagent.errors import InvalidDesiredState
from tests.unit.samples import EXAMPLE


def lb(index: int, **network) -> dict:
    entry = copy.deepcopy(EXAMPLE["loadbalancers"][0])
    entry["id"] = f"lb-{index}"
    entry["network"].update({"ip": f"198.18.0.{20 + index}", "mac": f"00:22:0a:00:00:{20 + index:02x}", **network})
    return entry


def state(generation: int, *lbs: dict, **changes) -> dict:
    body = copy.deepcopy(EXAMPLE)
    body.update(generation=generation, loadbalancers=list(lbs), **changes)
    return body


def details(exc: pytest.ExceptionInfo) -> list[dict]:
    return exc.value.details


def test_an_unchanged_load_balancer_keeps_its_model_and_a_changed_one_is_validated_again():
    parser = RefreshParser()
    first = parser.parse(state(1, lb(1), lb(2)))
    changed = lb(2)
    changed["backend_groups"][0]["backends"][0]["port"] = 8001
    second = parser.parse(state(2, lb(1), changed))
    assert second.loadbalancer("lb-1") is first.loadbalancer("lb-1")
    assert second.loadbalancer("lb-2") is not first.loadbalancer("lb-2")
    assert second.loadbalancer("lb-2").backend_groups[0].backends[0].port == 8001
    assert second == parse_desired_state(state(2, lb(1), changed))


@pytest.mark.parametrize("value", [True, 1.0, "1"])
def test_a_value_equal_in_python_but_not_in_json_is_validated_again(value):
    # True == 1 == 1.0 in Python: a comparison of decoded values would reuse
    # the model of {"weight": 1} for {"weight": true}, which strict validation refuses.
    parser = RefreshParser()
    parser.parse(state(1, lb(1)))
    sneaky = lb(1)
    sneaky["backend_groups"][0]["backends"][0]["weight"] = value
    with pytest.raises(InvalidDesiredState) as exc:
        parser.parse(state(2, sneaky))
    assert [d["path"] for d in details(exc)] == ["/loadbalancers/0/backend_groups/0/backends/0/weight"]


def test_rules_across_objects_still_see_a_reused_load_balancer():
    parser = RefreshParser()
    parser.parse(state(1, lb(1)))
    # lb-1 is byte for byte the same, but its address is no longer in its subnet.
    moved = [{**EXAMPLE["subnets"][0], "cidr": "198.18.1.0/24", "gateway": "198.18.1.1", "routes": []}]
    with pytest.raises(InvalidDesiredState) as exc:
        parser.parse(state(2, lb(1), subnets=moved))
    assert details(exc) == [
        {"path": "/loadbalancers/0/network/ip", "message": "must lie inside the subnet 198.18.1.0/24"}
    ]
    # ... and a new load balancer on its address collides with it.
    twin = lb(2, ip="198.18.0.21")
    with pytest.raises(InvalidDesiredState) as exc:
        parser.parse(state(3, lb(1), twin))
    assert details(exc) == [
        {
            "path": "/loadbalancers/1/network/ip",
            "message": "address 198.18.0.21 in subnet 'net-1' is already used at /loadbalancers/0/network/ip",
        }
    ]


def test_a_reused_load_balancers_own_problems_name_its_new_place():
    parser = RefreshParser()
    bad = lb(3)
    bad["listeners"].append({**bad["listeners"][0], "id": "lsn-2", "rules": []})  # the same port twice
    with pytest.raises(InvalidDesiredState) as first:
        parser.parse(state(1, bad))
    with pytest.raises(InvalidDesiredState) as moved:
        parser.parse(state(2, lb(1), bad))
    assert details(first) == [
        {
            "path": "/loadbalancers/0/listeners/1/listener_port",
            "message": "tcp port 80 is already used at /loadbalancers/0/listeners/0/listener_port",
        }
    ]
    assert details(moved) == [
        {
            "path": "/loadbalancers/1/listeners/1/listener_port",
            "message": "tcp port 80 is already used at /loadbalancers/1/listeners/0/listener_port",
        }
    ]


def test_a_refused_body_leaves_what_the_parser_knows():
    parser = RefreshParser()
    first = parser.parse(state(1, lb(1)))
    with pytest.raises(InvalidDesiredState):
        parser.parse(state(2, lb(1), {"id": "lb-2"}))
    assert parser.parse(state(3, lb(1))).loadbalancer("lb-1") is first.loadbalancer("lb-1")


def test_it_forgets_load_balancers_the_last_valid_body_did_not_have():
    parser = RefreshParser()
    first = parser.parse(state(1, lb(1)))
    parser.parse(state(2, lb(2)))
    assert parser.parse(state(3, lb(1))).loadbalancer("lb-1") is not first.loadbalancer("lb-1")


@pytest.mark.parametrize(
    "body",
    [[], {"generation": 1, "loadbalancers": {"lb-1": {}}}, {"generation": 1, "loadbalancers": ["lb-1", {"id": ["x"]}]}],
)
def test_bodies_of_the_wrong_shape_get_the_full_validations_answer(body):
    parser = RefreshParser()
    parser.parse(state(1, lb(1)))
    with pytest.raises(InvalidDesiredState) as exc:
        parser.parse(body)
    with pytest.raises(InvalidDesiredState) as direct:
        parse_desired_state(body)
    assert details(exc) == details(direct)


def test_unchanged_subnets_and_pods_are_reused_too_and_a_changed_one_is_not():
    pod = {"id": "p1", "namespace": "shop", "ip": "198.18.0.40", "labels": {"app": "web"}}
    parser = RefreshParser()
    first = parser.parse(state(1, lb(1), pods=[pod]))
    second = parser.parse(state(2, lb(1), pods=[pod, {**pod, "id": "p2", "ip": "198.18.0.41"}]))
    assert second.subnets[0] is first.subnets[0] and second.pods[0] is first.pods[0]
    moved = parser.parse(state(3, lb(1), pods=[{**pod, "ip": "198.18.0.42"}]))
    assert moved.pods[0] is not first.pods[0] and moved.pods[0].ip == "198.18.0.42"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_number_json_cannot_carry_makes_the_body_validated_whole(literal):
    # orjson writes NaN and the infinities as null: the text of this entry would
    # match the earlier one's, whose redirect was a valid null.
    parser = RefreshParser()
    first, comparable = decode(json.dumps(state(1, lb(1))).encode())
    assert comparable
    parser.parse(first, comparable)
    text = json.dumps(state(2, lb(1))).replace('"redirect": null', f'"redirect": {literal}', 1)
    body, comparable = decode(text.encode())
    assert not comparable
    with pytest.raises(InvalidDesiredState) as exc:
        parser.parse(body, comparable)
    assert [d["path"] for d in details(exc)] == ["/loadbalancers/0/listeners/0/redirect"]


def test_entries_orjson_cannot_encode_are_validated_again():
    parser = RefreshParser()
    parser.parse(state(1, lb(1)))
    huge = lb(1)
    huge["backend_groups"][0]["backends"][0]["port"] = 2**70
    with pytest.raises(InvalidDesiredState) as exc:
        parser.parse(state(2, huge))
    assert [d["path"] for d in details(exc)] == ["/loadbalancers/0/backend_groups/0/backends/0/port"]


def test_decode_answers_as_json_loads_does():
    assert decode(b'{"a": [1, 2.5, true, null]}') == ({"a": [1, 2.5, True, None]}, True)
    with pytest.raises(json.JSONDecodeError):
        decode(b'{"a": ')


@pytest.mark.parametrize(
    "text, paths",
    [
        (b'{"generation": 1, "generation": 2}', ["/generation"]),
        (b'{"a": [{"x": 1}, {"x": 1, "y/~": 2, "x": 3, "y/~": 4}], "a": 0}', ["/a", "/a/1/x", "/a/1/y~1~0"]),
        (b'[[{"k": 1, "k": 1}]]', ["/0/0/k"]),
    ],
)
def test_a_key_given_twice_in_one_object_is_refused_at_its_path(text, paths):
    with pytest.raises(DuplicateKeys) as exc:
        decode(text)
    assert exc.value.paths == paths
    assert isinstance(exc.value, ValueError)  # a decoding error, as json.loads raises


def test_only_the_first_hundred_repeats_get_a_path_and_all_are_counted():
    text = b"{" + b", ".join([b'"a": 0'] * 5001) + b"}"
    with pytest.raises(DuplicateKeys) as exc:
        decode(text)
    assert exc.value.paths == ["/a"] * 100
    assert exc.value.total == 5000


def test_the_same_key_in_different_objects_is_no_repeat():
    assert decode(b'{"a": {"id": 1}, "b": {"id": 2}, "id": [{"id": 3}]}') == (
        {"a": {"id": 1}, "b": {"id": 2}, "id": [{"id": 3}]},
        True,
    )


def test_a_repeat_deeper_than_python_recursion_is_still_found():
    depth = 900  # within the decoder's limit, beyond what a recursive walk would manage with pytest's frames
    text = b'{"a": ' * depth + b'{"k": 1, "k": 2}' + b"}" * depth
    with pytest.raises(DuplicateKeys) as exc:
        decode(text)
    assert exc.value.paths == ["/a" * depth + "/k"]


def test_details_are_capped_at_a_hundred_and_say_how_many_more_there_were():
    parser = RefreshParser()
    with pytest.raises(InvalidDesiredState) as exc:
        parser.parse({"generation": 1, **{f"extra{i}": 1 for i in range(250)}})
    assert len(details(exc)) == MAX_DETAILS + 1
    assert details(exc)[:2] == [
        {"path": "/extra0", "message": "unknown field"},
        {"path": "/extra1", "message": "unknown field"},
    ]
    assert details(exc)[-1] == {"path": "", "message": "150 more problems are not listed"}


def test_problems_across_objects_are_capped_too():
    many = [lb(1, ip="198.18.0.99") for _ in range(120)]  # one id and one address, 120 times
    for index, entry in enumerate(many):
        entry["network"]["mac"] = f"00:22:0a:00:01:{index:02x}"
    with pytest.raises(InvalidDesiredState) as exc:
        RefreshParser().parse(state(1, *many))
    assert len(details(exc)) == MAX_DETAILS + 1
    assert details(exc)[-1]["message"].endswith("more problems are not listed")


def test_a_path_longer_than_any_valid_one_is_cut():
    key = "k" * 100_000
    with pytest.raises(InvalidDesiredState) as exc:
        RefreshParser().parse({"generation": 1, key: 1})
    [detail] = details(exc)
    assert len(detail["path"]) == MAX_PATH_LEN and detail["path"].endswith("...")
