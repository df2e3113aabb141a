"""IdentityMemo keeps a value while the very same input objects come again."""

from lbagent.workers.memo import IdentityMemo, same_models


class Counted:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        return f"value {self.calls}"


def test_a_value_is_kept_while_the_same_objects_come_again_and_made_anew_for_equal_ones():
    memo, compute = IdentityMemo(), Counted()
    model, pods = {"id": "lb-1"}, None
    assert memo.get(("targets", "lb-1"), (model, pods), compute) == "value 1"
    assert memo.get(("targets", "lb-1"), (model, pods), compute) == "value 1"
    assert memo.get(("targets", "lb-1"), ({"id": "lb-1"}, pods), compute) == "value 2"  # equal, not the same
    assert memo.get(("targets", "lb-1"), ({"id": "lb-1"}, pods, "more"), compute) == "value 3"
    assert compute.calls == 3


def test_kinds_and_names_are_kept_apart_and_a_name_is_forgotten_whole():
    memo, compute = IdentityMemo(), Counted()
    model = object()
    assert memo.get(("own", "lb-1"), (model,), compute) == "value 1"
    assert memo.get(("deps", "lb-1"), (model,), compute) == "value 2"
    assert memo.get(("own", "lb-2"), (model,), compute) == "value 3"
    assert memo.get(("own", "lb-1"), (model,), compute) == "value 1"
    memo.forget("lb-1")
    assert memo.get(("own", "lb-1"), (model,), compute) == "value 4"
    assert memo.get(("deps", "lb-1"), (model,), compute) == "value 5"
    assert memo.get(("own", "lb-2"), (model,), compute) == "value 3"


def test_same_models_means_the_same_objects_in_the_same_order():
    a, b = object(), object()
    assert same_models([a, b], [a, b]) and same_models((a, None), (a, None))
    assert not same_models([a, b], [b, a]) and not same_models([a], [a, b])
    assert not same_models([[1]], [[1]])
