"""Models with the same fields set share one read-only set; copies get their own."""

import copy
import gc
import pickle

import pytest

from lbagent.desired import fieldsets
from lbagent.desired.fieldsets import SharedFieldsSet, shared_fields_set
from lbagent.desired.model import HealthCheck


def test_models_with_the_same_fields_set_share_one_set():
    first = HealthCheck.model_validate({"type": "http", "rise": 4})
    second = HealthCheck.model_validate({"rise": 1, "type": "tcp"})
    other = HealthCheck.model_validate({"type": "http"})

    assert first.__pydantic_fields_set__ is second.__pydantic_fields_set__
    assert first.__pydantic_fields_set__ == {"type", "rise"}
    assert other.__pydantic_fields_set__ == {"type"}
    assert isinstance(HealthCheck(fall=2).__pydantic_fields_set__, SharedFieldsSet)  # made in code too


def test_the_shared_set_refuses_to_change():
    shared = HealthCheck.model_validate({"rise": 4}).__pydantic_fields_set__
    for change in (
        lambda: shared.add("fall"),
        lambda: shared.discard("rise"),
        lambda: shared.remove("rise"),
        lambda: shared.pop(),
        lambda: shared.clear(),
        lambda: shared.update({"fall"}),
        lambda: shared.intersection_update(set()),
        lambda: shared.difference_update({"rise"}),
        lambda: shared.symmetric_difference_update({"fall"}),
    ):
        with pytest.raises(TypeError, match="shared and read-only"):
            change()
    with pytest.raises(TypeError, match="shared and read-only"):
        shared |= {"fall"}
    assert HealthCheck.model_validate({"rise": 1}).__pydantic_fields_set__ == {"rise"}


def test_what_was_given_is_still_told_apart_from_defaults():
    check = HealthCheck.model_validate({"type": "http", "fall": 3})

    assert check.model_dump(exclude_unset=True) == {"type": "http", "fall": 3}
    assert check.model_dump_json(exclude_unset=True) == '{"type":"http","fall":3}'
    assert check.model_fields_set == {"type", "fall"}


def test_copies_have_an_ordinary_set_of_their_own():
    check = HealthCheck.model_validate({"rise": 4})
    shared = check.__pydantic_fields_set__

    updated = check.model_copy(update={"fall": 1})
    assert updated.__pydantic_fields_set__ == {"rise", "fall"}
    assert shared == {"rise"}
    for twin in (copy.copy(check), copy.deepcopy(check), pickle.loads(pickle.dumps(check))):
        assert twin == check
        assert type(twin.__pydantic_fields_set__) is set
        assert twin.__pydantic_fields_set__ == {"rise"}
    assert type(copy.copy(shared)) is set
    assert type(pickle.loads(pickle.dumps(shared))) is set


def test_a_set_no_model_holds_is_let_go():
    # Bodies are untrusted: each may set another combination of fields.
    check = HealthCheck.model_validate({"udp_request": "a", "udp_expect": "b", "timeout": 2})
    key = frozenset(check.__pydantic_fields_set__)
    assert fieldsets._shared[key] is check.__pydantic_fields_set__

    del check
    gc.collect()

    assert key not in fieldsets._shared
    assert shared_fields_set(key) == key
