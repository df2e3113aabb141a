"""pyroute2, imported without its package `__init__`.

pyroute2's `__init__` imports every part of the library to offer its names
at the top: NDB with sqlite3, IPDB, the wireless, devlink, IPVS, plan9 and
event sockets, 65 modules and 5 MB of the agent's resident memory. The
agent uses the netlink messages, `netns` and `IPRoute`, which it imports
from their own modules. So the package is registered with its `__init__` not
run: its submodules import as they always do, and the first name asked of
the package itself (`from pyroute2 import NDB`, in a test or a tool that
shares the process) runs the `__init__` then.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types

PACKAGE = "pyroute2"


class _InitOnDemand(types.ModuleType):
    """A package whose `__init__` runs when a name it defines is first asked for."""

    _lock = threading.RLock()

    def __getattr__(self, name: str) -> object:
        # A submodule not imported yet: the import system imports it when
        # the attribute is missing, without the rest of the package.
        if importlib.util.find_spec(f"{self.__name__}.{name}") is not None:
            raise AttributeError(name)
        with self._lock:
            if not self.__dict__.get("_init_ran"):
                self.__dict__["_init_ran"] = True
                self.__spec__.loader.exec_module(self)  # type: ignore[union-attr]
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from None


def register(name: str = PACKAGE) -> None:
    """Register package `name` with its `__init__` not run, unless it is imported already."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.submodule_search_locations is None:
        raise ModuleNotFoundError(f"No package named {name!r}", name=name)
    package = importlib.util.module_from_spec(spec)
    package.__class__ = _InitOnDemand
    sys.modules[name] = package
