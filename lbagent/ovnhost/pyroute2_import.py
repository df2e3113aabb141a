"""pyroute2, imported without its package `__init__`.

pyroute2's `__init__` imports every part of the library to offer its names
at the top: NDB with sqlite3, IPDB, the wireless, devlink, IPVS, plan9 and
event sockets, 65 modules and 5 MB of the agent's resident memory. The
agent uses its netlink constants and message classes and `netns`, which
it imports from their own modules (its rtnetlink requests it encodes
itself: `rtnl_requests`, `rtnl_writes`). So the package is registered with its `__init__` not
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
        # A submodule not imported yet is imported alone, as the `__init__`
        # would have imported it, without the rest of the package.
        if importlib.util.find_spec(f"{self.__name__}.{name}") is not None:
            return importlib.import_module(f"{self.__name__}.{name}")
        with self._lock:
            if "_init_outcome" not in self.__dict__:
                self.__dict__["_init_outcome"] = None  # set first: the `__init__` may ask for names itself
                try:
                    self.__spec__.loader.exec_module(self)  # type: ignore[union-attr]
                except BaseException as exc:
                    self.__dict__["_init_outcome"] = exc
                    raise
        failed = self.__dict__["_init_outcome"]
        if failed is not None:
            raise ImportError(f"{self.__name__}'s __init__ failed: {failed!r}", name=self.__name__) from failed
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
