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
        # name -> kind -> (the inputs, compared by identity; the value). Not
        # their ids: a tuple of large ints for each value, 0.6 MB at 1,000
        # load balancers, to save a comparison of two or three references.
        self._values: dict[str, dict[str, tuple[tuple, object]]] = {}

    def get(self, key: tuple[str, str], inputs: tuple, compute: Callable[[], object]):
        kind, name = key
        kept = self._values.get(name)
        if kept is None:
            kept = self._values[name] = {}
        hit = kept.get(kind)
        if hit is not None and same_models(hit[0], inputs):
            return hit[1]
        value = compute()
        kept[kind] = (inputs, value)
        return value

    def forget(self, name: str) -> None:
        """Drop every value kept under `name` (a load balancer that is gone)."""
        self._values.pop(name, None)


def same_models(before: list | tuple, now: list | tuple) -> bool:
    """The very same objects, in the same order (the parser hands over the
    models of unchanged entries, so an unchanged list holds the same ones)."""
    return len(before) == len(now) and all(map(operator.is_, before, now))


def digest(text: str) -> str:
    """A fingerprint of `text` (BLAKE2b, 16 bytes in hex): a load balancer's inputs
    are kilobytes of JSON, and a thousand of them are compared, not read back."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
