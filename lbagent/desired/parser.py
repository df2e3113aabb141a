"""`RefreshParser`: parses POST /v1/refresh bodies, validating only what changed.

The region controller sends the complete desired state every time, so a
change to one backend of one load balancer arrives with a thousand load
balancers that did not change. Validating each of them again (pydantic, the
regular expressions of every field, the cross-field rules) made the answer to
such a POST grow with the host's size. The parser remembers, per load
balancer, subnet and pod id, the JSON text of the last valid body's entry and
the model it validated to; an entry whose JSON text is the same is replaced by
that model before validation, which pydantic accepts as it is. The models of
unchanged entries are therefore the same objects from one state to the next,
which lets the worker skip what it derived from them (see OvnWorker).

Comparing JSON text rather than decoded values matters: `1`, `1.0` and `true`
compare equal in Python, and only `1` is a valid port. Identical text is the
same input, so it validates to the same model; the rules that span several
objects (unique addresses, the subnet an address lies in) are still checked
on the whole state every time. The text is orjson's (a tenth of the cost of
the standard encoder), which writes NaN and the infinities as `null`: `decode`
says whether a body holds any (the standard decoder accepts them), and such a
body is validated whole. Integers beyond 64 bits and strings with lone
surrogates, which orjson does not encode, are never reused either.
"""

from __future__ import annotations

import json
import math

import orjson
from pydantic import BaseModel

from lbagent.desired.model import DesiredState, parse_desired_state

# The lists whose entries are reused, each keyed by its entries' "id".
REUSED_LISTS = ("loadbalancers", "subnets", "pods")


class RefreshParser:
    def __init__(self) -> None:
        # list name -> entry id -> (the entry's JSON text, its model)
        self._known: dict[str, dict[str, tuple[bytes, BaseModel]]] = {name: {} for name in REUSED_LISTS}

    def parse(self, body: object, comparable: bool = True) -> DesiredState:
        """`parse_desired_state(body)`, reusing the models of unchanged entries;
        `comparable=False` (see `decode`) validates every entry."""
        if not isinstance(body, dict) or not comparable:
            return parse_desired_state(body)
        texts: dict[str, list[bytes | None]] = {}
        reusing = dict(body)
        for name in REUSED_LISTS:
            entries = body.get(name)
            if isinstance(entries, list):
                texts[name] = [_text(entry) for entry in entries]
                reusing[name] = [self._model_for(name, entry, text) for entry, text in zip(entries, texts[name])]
        state = parse_desired_state(reusing)
        # Only the last valid body's entries: the memory never outgrows one state.
        self._known = {
            name: {
                model.id: (text, model)
                for model, text in zip(getattr(state, name), texts.get(name, ()))
                if text is not None
            }
            for name in REUSED_LISTS
        }
        return state

    def _model_for(self, name: str, entry: object, text: bytes | None) -> object:
        entry_id = entry.get("id") if isinstance(entry, dict) else None
        known = self._known[name].get(entry_id) if isinstance(entry_id, str) else None
        if known is not None and text is not None and known[0] == text:
            return known[1]
        return entry


def decode(raw: bytes) -> tuple[object, bool]:
    """`json.loads(raw)` (its errors included), and whether every number in it is
    finite, which makes its entries' texts comparable (see the module docstring)."""
    finite = True

    def number(text: str) -> float:
        nonlocal finite
        value = float(text)
        finite = finite and math.isfinite(value)  # 1e400 is a float literal too
        return value

    def constant(name: str) -> float:
        nonlocal finite
        finite = False
        return float(name)  # "NaN", "Infinity", "-Infinity", as json.loads gives them

    return json.loads(raw, parse_float=number, parse_constant=constant), finite


def _text(entry: object) -> bytes | None:
    """The entry's JSON text, or None when it has none worth comparing (not an
    object, or holding what orjson does not encode)."""
    if not isinstance(entry, dict):
        return None
    try:
        return orjson.dumps(entry)
    except TypeError:  # orjson.JSONEncodeError: integers beyond 64 bits, lone surrogates, nesting
        return None
