"""`IdentityMemo`: what a refresh derived for a load balancer, kept while its inputs are the same objects.

A refresh reuses the validated models of entries whose JSON text did not change
(lbagent.desired.parser), so identity of the inputs is a cheap and exact test.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Callable


class IdentityMemo:
    """Values computed from some objects, kept while the same objects (by identity,
    not equality: comparing a model costs what recomputing from it costs) come again."""

    def __init__(self) -> None:
        # name -> kind -> (the inputs, kept alive so their ids stay theirs; their ids; the value)
        self._values: dict[str, dict[str, tuple[tuple, tuple[int, ...], object]]] = {}

    def get(self, key: tuple[str, str], inputs: tuple, compute: Callable[[], object]):
        kind, name = key
        kept = self._values.get(name)
        if kept is None:
            kept = self._values[name] = {}
        ids = tuple(map(id, inputs))
        hit = kept.get(kind)
        if hit is not None and hit[1] == ids:
            return hit[2]
        value = compute()
        kept[kind] = (inputs, ids, value)
        return value

    def forget(self, name: str) -> None:
        """Drop every value kept under `name` (a load balancer that is gone)."""
        self._values.pop(name, None)


def same_models(before: list, now: list) -> bool:
    """The very same objects, in the same order (the parser hands over the
    models of unchanged entries, so an unchanged list holds the same ones)."""
    return len(before) == len(now) and all(map(operator.is_, before, now))


def digest(text: str) -> str:
    """A fingerprint of `text` (BLAKE2b, 16 bytes in hex): a load balancer's inputs
    are kilobytes of JSON, and a thousand of them are compared, not read back."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
