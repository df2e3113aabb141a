"""One read-only set of field names for every model that had the same fields set.

pydantic keeps, in each model, the set of the fields its input gave
(`__pydantic_fields_set__`). A host of 1,000 load balancers has about 9,000
models and a few dozen distinct such sets: 2.3 MB of sets, 216 to 472 bytes
each, that say the same thing again and again. The desired state's models
are frozen, so pydantic never changes the set of a model once it is
validated; `shared_fields_set` gives every model with the same fields the
same set, and that set refuses to be changed, so that code that changes one
(`model.__pydantic_fields_set__.add(...)`, for thousands of models at once)
fails at once instead. A copy of it (`model_copy`, `copy`, `pickle`) is an
ordinary set of its own, which pydantic may change. The refusal is Python's
only: C code that adds to a set directly (`set.add(shared, name)`,
pydantic-core's `validate_assignment`, which pydantic calls only for models
that are not frozen) would change it for every model that shares it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import NoReturn


class SharedFieldsSet(set[str]):
    """The fields set of many frozen models: read-only, copied as an ordinary set."""

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("the fields set of a frozen model is shared and read-only")

    add = discard = remove = pop = clear = update = _refuse
    intersection_update = difference_update = symmetric_difference_update = _refuse
    __ior__ = __iand__ = __isub__ = __ixor__ = _refuse

    def __copy__(self) -> set[str]:
        return set(self)

    def __deepcopy__(self, memo: dict[int, object]) -> set[str]:
        return set(self)

    def __reduce__(self) -> tuple[type, tuple[list[str]]]:
        return (set, (list(self),))


# Held only by the models: a set no model has any more goes, so bodies that
# each set other fields (they are untrusted) cannot make this grow for ever.
_shared: weakref.WeakValueDictionary[frozenset[str], SharedFieldsSet] = weakref.WeakValueDictionary()
_lock = threading.Lock()  # models are validated on the event loop and on worker threads


def shared_fields_set(fields: Iterable[str]) -> SharedFieldsSet:
    """The one shared set of these field names (a few dozen at a time: a body
    sets the same fields for most objects of a kind)."""
    key = frozenset(fields)
    shared = _shared.get(key)
    if shared is None:
        with _lock:
            shared = _shared.setdefault(key, SharedFieldsSet(key))
    return shared
