"""The one table of listener types agrees with the model, and the model enforces it."""

import copy
import typing

import pytest

from lbagent.desired.listener_types import KINDS, OPTION_TYPES, ListenerType
from lbagent.desired.model import Listener, parse_desired_state
from lbagent.errors import InvalidDesiredState
from tests.unit.samples import EXAMPLE

# A value of each restricted option that would be valid on a type that may carry it.
SAMPLE_VALUES = {
    "sticky_session": {"type": "insert"},
    "redirect": {"code": 301, "scheme": "https"},
    "rules": [{"id": "r1", "path": "/a", "backend_group_id": "bg-1"}],
    "http2": True,
    "certificates": [],  # empty is allowed anywhere; see the https-only check below
}


def test_the_table_names_every_listener_type_of_the_model():
    assert set(typing.get_args(ListenerType)) == set(KINDS)
    assert typing.get_args(Listener.model_fields["listener_type"].annotation) == typing.get_args(ListenerType)


def test_every_restricted_option_is_a_listener_field():
    assert set(OPTION_TYPES) <= set(Listener.model_fields)


def _body_with(listener_type: str, option: str, value) -> dict:
    body = copy.deepcopy(EXAMPLE)
    listener = {
        "id": "lsn-x",
        "listener_type": listener_type,
        "listener_port": 9999,
        "backend_group_id": body["loadbalancers"][0]["backend_groups"][0]["id"],
        option: value,
    }
    body["loadbalancers"][0]["listeners"] = [listener]
    return body


@pytest.mark.parametrize(
    "option,listener_type",
    [
        (option, name)
        for option, types in OPTION_TYPES.items()
        if option != "certificates"
        for name in KINDS
        if name not in types
    ],
)
def test_an_option_on_a_type_that_may_not_carry_it_is_refused_at_its_path(option, listener_type):
    with pytest.raises(InvalidDesiredState) as caught:
        parse_desired_state(_body_with(listener_type, option, SAMPLE_VALUES[option]))
    assert f"/loadbalancers/0/listeners/0/{option}" in {d["path"] for d in caught.value.details}


def test_ports_collide_per_transport():
    assert {name: kind.transport for name, kind in KINDS.items()} == {
        "tcp": "tcp",
        "http": "tcp",
        "https": "tcp",
        "udp": "udp",
    }
    assert [name for name, kind in KINDS.items() if not kind.through_haproxy] == ["udp"]
