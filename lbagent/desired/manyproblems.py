"""The first problems of a body with very many, found at a cost that does not grow with their number.

pydantic counts the problems of a validation at once, but lists them only all
together: a body of a million unknown fields or empty objects costs seconds
in `ValidationError.errors()` alone, for an answer that shows a hundred of
them. `validate` hands a body with at most MAX_LISTED problems to the usual
details; beyond that it validates the body again entry by entry (the top
level without its unknown fields and entries, then each subnet, provider
network, pod and load balancer on its own) until it has MAX_DETAILS problems,
and takes their number from the first validation. An entry that alone has
more than MAX_LISTED problems is one detail at its path.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ValidationError

from lbagent.desired.details import MAX_DETAILS, capped, field_details, json_pointer, model_in, unknown_field_detail
from lbagent.desired.model import UNECHOED_FIELDS, DesiredState
from lbagent.errors import InvalidDesiredState

# pydantic lists this many problems in a few tens of milliseconds.
MAX_LISTED = 10_000

Details = list[dict[str, str]]


def validate(data: object) -> DesiredState:
    """`DesiredState.model_validate(data)`; InvalidDesiredState with capped details when it fails."""
    try:
        return DesiredState.model_validate(data)
    except ValidationError as exc:
        if exc.error_count() <= MAX_LISTED or not isinstance(data, dict):
            details = field_details(exc.errors(include_url=False)[:MAX_DETAILS], DesiredState, UNECHOED_FIELDS)
            raise InvalidDesiredState(capped(details, total=exc.error_count())) from None
        details, covered = _first_problems(data)
        # An object summed up in one detail takes its problems out of the "more" of the last one.
        raise InvalidDesiredState(capped(details, total=exc.error_count() - covered + len(details))) from None


def _problems_of(model: type[BaseModel], value: object, prefix: str, room: int) -> tuple[Details, int]:
    """At most `room` details of validating `value` as `model`, their paths under
    `prefix`, and how many problems they stand for."""
    try:
        model.model_validate(value)
    except ValidationError as exc:
        count = exc.error_count()
        if count > MAX_LISTED:
            return [{"path": prefix, "message": f"{count} problems in this object, too many to list"}], count
        listed = field_details(exc.errors(include_url=False)[:room], model, UNECHOED_FIELDS)
        return [{**detail, "path": prefix + detail["path"]} for detail in listed], len(listed)
    except InvalidDesiredState:
        pass  # rules across objects: reported only once every field is well formed
    return [], 0


def _entry_lists(data: dict[str, Any]) -> dict[str, type[BaseModel]]:
    """The top-level lists of objects in `data` within their length limit (a longer
    one is a single problem of the top level), by name, with their entries' model."""
    lists = {}
    for name, field in DesiredState.model_fields.items():
        model = model_in(field.annotation)
        value = data.get(name)
        if model is not None and isinstance(value, list) and len(value) <= _max_length(field.metadata):
            lists[name] = model
    return lists


def _max_length(metadata: list[Any]) -> float:
    return min(
        (item.max_length for item in metadata if getattr(item, "max_length", None) is not None), default=math.inf
    )


def _first_problems(data: dict[str, Any]) -> tuple[Details, int]:
    """The first MAX_DETAILS problems of `data` (an object with too many to list
    is one detail), and how many problems they stand for."""
    entries = _entry_lists(data)
    # The top level alone: its own fields, without its unknown ones and the entries looked at below.
    top = {key: value for key, value in data.items() if key in DesiredState.model_fields and key not in entries}
    found, covered = _problems_of(DesiredState, top, "", MAX_DETAILS)
    unknown = (key for key in data if key not in DesiredState.model_fields)
    for key in unknown:
        if len(found) >= MAX_DETAILS:
            return found, covered
        found.append(unknown_field_detail(DesiredState, (key,)))
        covered += 1
    for name, model in entries.items():
        for index, entry in enumerate(data[name]):
            if len(found) >= MAX_DETAILS:
                return found, covered
            details, count = _problems_of(model, entry, json_pointer((name, index)), MAX_DETAILS - len(found))
            found += details
            covered += count
    return found, covered
