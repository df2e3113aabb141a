"""`RefreshParser`: parses POST /v1/refresh bodies, validating only what changed.

The region controller sends the complete desired state every time, so a
change to one backend of one load balancer arrives with a thousand load
balancers that did not change. Validating each of them again (pydantic, the
regular expressions of every field, the cross-field rules) made the answer to
such a POST grow with the host's size. The parser remembers, per load
balancer, subnet and pod id, a digest of the JSON text of the last valid
body's entry (BLAKE2b, 16 bytes) and the model it validated to; an entry whose
JSON text has the same digest is replaced by
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

`decode` refuses a key that appears twice in one object: the standard decoder
keeps the last, so the same text could mean one thing to the agent and
another to whoever wrote or reviewed it. The parser also refuses a state that
expands to more haproxy servers than the budget allows
(lbagent.desired.budget), and caps the details of every refusal
(lbagent.desired.details.capped) at a cost that does not grow with their
number (lbagent.desired.manyproblems).
"""

from __future__ import annotations

import hashlib
import json
import math

import orjson
from pydantic import BaseModel

from lbagent.desired.budget import budget_problems
from lbagent.desired.details import MAX_DETAILS, capped, json_pointer
from lbagent.desired.manyproblems import validate
from lbagent.desired.model import DesiredState
from lbagent.errors import InvalidDesiredState

# The lists whose entries are reused, each keyed by its entries' "id".
REUSED_LISTS = ("loadbalancers", "subnets", "pods")


class RefreshParser:
    def __init__(self) -> None:
        # list name -> entry id -> (a digest of the entry's JSON text, its model)
        self._known: dict[str, dict[str, tuple[bytes, BaseModel]]] = {name: {} for name in REUSED_LISTS}

    def parse(self, body: object, comparable: bool = True) -> DesiredState:
        """`parse_desired_state(body)`, reusing the models of unchanged entries;
        `comparable=False` (see `decode`) validates every entry. A valid state
        over the server budget is refused too; details are capped."""
        try:
            return self._parse(body, comparable)
        except InvalidDesiredState as exc:
            raise InvalidDesiredState(capped(exc.details)) from None

    def _parse(self, body: object, comparable: bool) -> DesiredState:
        if not isinstance(body, dict) or not comparable:
            return _within_budget(validate(body))
        texts: dict[str, list[bytes | None]] = {}
        reusing = dict(body)
        for name in REUSED_LISTS:
            entries = body.get(name)
            if isinstance(entries, list):
                texts[name] = [_text(entry) for entry in entries]
                reusing[name] = [self._model_for(name, entry, text) for entry, text in zip(entries, texts[name])]
        state = _within_budget(validate(reusing))
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


def _within_budget(state: DesiredState) -> DesiredState:
    problems = budget_problems(state)
    if problems:
        raise InvalidDesiredState(problems)
    return state


class DuplicateKeys(ValueError):
    """A JSON text with a key that appears twice in one object; `paths` are the
    JSON pointers of every such key, in the order of the text."""

    def __init__(self, paths: list[str], total: int | None = None) -> None:
        self.total = len(paths) if total is None else total
        # The keys themselves only in `paths`: they may be any length.
        super().__init__(f"{self.total} key(s) given more than once in their object")
        self.paths = paths


class _Repeated(Exception):
    """Raised by the decoder's object hook at the first repeated key."""


def _unique_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise _Repeated
    return obj


class _Pairs(list):
    """A decoded object as its (key, value) pairs, repeats kept."""


def _repeated_keys(raw: bytes) -> tuple[list[str], int]:
    """The pointers of the first MAX_DETAILS repeated keys of a text known to be
    JSON, and how many there are (iterative: the text nests as deep as the
    decoder allows, deeper than Python recursion). Pointers past the first
    hundred are never built: the answer lists no more."""
    found: list[str] = []
    total = 0
    pending: list[tuple[tuple[str | int, ...], object]] = [((), json.loads(raw, object_pairs_hook=_Pairs))]
    while pending:
        location, node = pending.pop()
        children: list[tuple[tuple[str | int, ...], object]] = []
        if isinstance(node, _Pairs):
            seen: set[str] = set()
            for key, value in node:
                if key in seen:
                    total += 1
                    if len(found) < MAX_DETAILS:
                        found.append(json_pointer((*location, key)))
                seen.add(key)
                children.append(((*location, key), value))
        elif isinstance(node, list):
            children = [((*location, index), value) for index, value in enumerate(node)]
        pending.extend(reversed(children))
    return found, total


def decode(raw: bytes) -> tuple[object, bool]:
    """`json.loads(raw)` (its errors included), and whether every number in it is
    finite, which makes its entries' texts comparable (see the module docstring).
    A key repeated within one object raises DuplicateKeys."""
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

    try:
        body = json.loads(raw, parse_float=number, parse_constant=constant, object_pairs_hook=_unique_object)
    except _Repeated:
        raise DuplicateKeys(*_repeated_keys(raw)) from None
    return body, finite


def _text(entry: object) -> bytes | None:
    """A digest of the entry's JSON text (what is kept of a thousand entries
    between two bodies: 16 bytes each, not kilobytes), or None when it has none
    worth comparing (not an object, or holding what orjson does not encode)."""
    if not isinstance(entry, dict):
        return None
    try:
        return hashlib.blake2b(orjson.dumps(entry), digest_size=16).digest()
    except TypeError:  # orjson.JSONEncodeError: integers beyond 64 bits, lone surrogates, nesting
        return None
