"""Error details of a rejected body (api.md "Errors"): JSON paths and readable messages.

Turns pydantic's error locations into RFC 6901 pointers and its messages into
the validators' own voice, and never repeats input found under a field whose
value must not be shown (a private key). An answer lists at most MAX_DETAILS
problems and then says how many more it left out: a body of a million unknown
fields must not cost a million "did you mean" guesses, nor answer with more
text than it sent.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from lbagent.desired.fields import MAX_ECHO_LEN

Location = tuple[str | int, ...]

MAX_DETAILS = 100
# Longer than any path a valid body has (a label key is at most 317 characters).
MAX_PATH_LEN = 512


class _LeftOut(dict):
    """The last detail of a capped list: how many problems it does not show."""


def capped(details: Sequence[dict[str, str]], total: int | None = None) -> list[dict[str, str]]:
    """At most MAX_DETAILS of `details`, each path at most MAX_PATH_LEN long, then one
    detail (path "") saying how many of `total` (default: all of them) are left out.
    A list capped already is returned as it is."""
    if details and isinstance(details[-1], _LeftOut):
        return list(details)
    total = len(details) if total is None else total
    kept = [_short_path(detail) for detail in details[:MAX_DETAILS]]
    if total > len(kept):
        kept.append(_LeftOut(path="", message=f"{total - len(kept)} more problems are not listed"))
    return kept


def _short_path(detail: dict[str, str]) -> dict[str, str]:
    path = detail["path"]
    if len(path) <= MAX_PATH_LEN:
        return detail
    return {**detail, "path": path[: MAX_PATH_LEN - 3] + "..."}


def json_pointer(location: Iterable[str | int]) -> str:
    """RFC 6901 pointer for a location; "" is the whole document."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in location)


def preview(value: object) -> str:
    """A short, single-line rendering of an input value for an error message."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "an array"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = repr(value)
    if len(text) > MAX_ECHO_LEN:
        text = text[: MAX_ECHO_LEN - 3] + "..."
    return text


def clean_message(message: str) -> str:
    """pydantic's message in the validators' voice: no "Value error, " prefix, "must be" for "Input should be"."""
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if message.startswith("Input should be"):
        message = "must be" + message.removeprefix("Input should be")
    return message


# pydantic's words for JSON type mismatches name Python types and model classes.
_JSON_TYPE_MESSAGES = {
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "dict_type": "must be a JSON object",
    "list_type": "must be a JSON array",
    "int_type": "must be a JSON integer",
    "string_type": "must be a JSON string",
    "bool_type": "must be true or false",
}


def model_in(annotation: Any) -> type[BaseModel] | None:
    """The model class a field's annotation holds (itself, in a list, or optional), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in get_args(annotation):
        found = model_in(argument)
        if found is not None:
            return found
    return None


def _model_at(root: type[BaseModel], location: Location) -> type[BaseModel] | None:
    """The model class whose object sits at `location` in a body of type `root`."""
    model: type[BaseModel] | None = root
    for part in location:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if model else None
        if field is None:
            return None
        model = model_in(field.annotation)
    return model


def _unknown_field_message(root: type[BaseModel], location: Location) -> str:
    model = _model_at(root, location[:-1])
    not_yet: dict[str, str] = getattr(model, "NOT_YET_ACCEPTED", {})
    if str(location[-1]) in not_yet:
        return f"unknown field: this version does not accept {not_yet[str(location[-1])]} yet"
    guesses = difflib.get_close_matches(str(location[-1]), list(model.model_fields), n=1) if model else []
    return f"unknown field; did you mean {guesses[0]!r}?" if guesses else "unknown field"


def _message(kind: str, error: Any) -> str:
    if kind in _JSON_TYPE_MESSAGES:
        return _JSON_TYPE_MESSAGES[kind]
    if kind == "too_long":
        return f"must have at most {error['ctx']['max_length']} entries"
    return clean_message(error["msg"])


def _detail(error: Any, root: type[BaseModel], unechoed: frozenset[str]) -> dict[str, str]:
    location: Location = tuple(error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        return unknown_field_detail(root, location)
    if kind == "missing":
        return {"path": json_pointer(location), "message": "required field is missing"}
    message = _message(kind, error)
    if location and location[-1] == "[key]":  # pydantic's marker for a bad dict key
        location = location[:-1]
        message = f"invalid key: {message}"
    value = error["input"]
    # An object or array is worth naming only when a different type was expected.
    shown = kind in _JSON_TYPE_MESSAGES or not isinstance(value, (dict, list))
    if shown and not unechoed.intersection(part for part in location if isinstance(part, str)):
        message = f"{message} (got {preview(value)})"
    return {"path": json_pointer(location), "message": message}


def unknown_field_detail(root: type[BaseModel], location: Location) -> dict[str, str]:
    return {"path": json_pointer(location), "message": _unknown_field_message(root, location)}


def field_details(errors: Sequence[Any], root: type[BaseModel], unechoed: frozenset[str]) -> list[dict[str, str]]:
    """api.md error details for pydantic's `errors` of a validation of `root`.

    Paths are JSON pointers; input found under a field named in `unechoed` is
    never repeated in a message.
    """
    return [_detail(error, root, unechoed) for error in errors]


def error_details(exc: ValidationError, root: type[BaseModel], unechoed: frozenset[str]) -> list[dict[str, str]]:
    """`field_details` of a failed validation, capped (see `capped`)."""
    errors = exc.errors(include_url=False)
    return capped(field_details(errors[:MAX_DETAILS], root, unechoed), total=len(errors))
