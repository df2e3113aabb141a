"""`RefreshParser`: parses POST /v1/refresh bodies, validating only what changed.

The region controller sends the complete desired state every time, so a
change to one backend of one load balancer arrives with a thousand load
balancers that did not change. Validating each of them again (pydantic, the
regular expressions of every field, the cross-field rules) made the answer to
such a POST grow with the host's size. The parser remembers, per load
balancer id, the JSON text of the last valid body's entry and the model it
validated to; an entry whose JSON text is the same is replaced by that model
before validation, which pydantic accepts as it is.

Comparing JSON text rather than decoded values matters: `1`, `1.0` and `true`
compare equal in Python, and only `1` is a valid port. Identical text is the
same input, so it validates to the same model; the rules that span several
objects (unique addresses, the subnet an address lies in) are still checked
on the whole state every time.
"""

from __future__ import annotations

import json

from lbagent.model import DesiredState, LoadBalancer, parse_desired_state


class RefreshParser:
    def __init__(self) -> None:
        self._known: dict[str, tuple[str, LoadBalancer]] = {}  # id -> (JSON text, its model)

    def parse(self, body: object) -> DesiredState:
        """`parse_desired_state(body)`, reusing the models of unchanged load balancers."""
        entries = body.get("loadbalancers") if isinstance(body, dict) else None
        if not isinstance(entries, list):
            return self._remember(parse_desired_state(body), [])
        texts = [_text(entry) for entry in entries]
        reused = [self._model_for(entry, text) for entry, text in zip(entries, texts)]
        state = parse_desired_state({**body, "loadbalancers": reused})
        return self._remember(state, texts)

    def _model_for(self, entry: object, text: str | None) -> object:
        lb_id = entry.get("id") if isinstance(entry, dict) else None
        known = self._known.get(lb_id) if isinstance(lb_id, str) else None
        if known is not None and text is not None and known[0] == text:
            return known[1]
        return entry

    def _remember(self, state: DesiredState, texts: list[str | None]) -> DesiredState:
        # Only the last valid body's entries: the memory never outgrows one state.
        self._known = {lb.id: (text, lb) for lb, text in zip(state.loadbalancers, texts) if text is not None}
        return state


def _text(entry: object) -> str | None:
    """The entry's JSON text, or None when it has none worth comparing (not an object)."""
    if not isinstance(entry, dict):
        return None
    try:
        return json.dumps(entry, separators=(",", ":"), allow_nan=True)
    except (TypeError, ValueError, RecursionError):
        return None
