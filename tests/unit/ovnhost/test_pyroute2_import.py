"""pyroute2 is imported without its package `__init__`, which runs when a name it defines is asked for."""

import subprocess
import sys
import threading
import types
from importlib.metadata import version

import pytest

from lbagent.ovnhost import pyroute2_import

LEAN = """
import sys
import lbagent.ovnhost.iplib, lbagent.ovnhost.netns, lbagent.ovnhost.conntrack
# Parts only the package's __init__ imports (not sqlite3: coverage, under `make test`, has it loaded).
# IPRoute too: the agent encodes its own requests (rtnl_requests, rtnl_writes).
FULL_ONLY = ("pyroute2.ndb.main", "pyroute2.ipdb", "pyroute2.iwutil", "pyroute2.plan9.client", "pyroute2.iproute.linux")
print(sorted(m for m in FULL_ONLY if m in sys.modules))
from pyroute2 import NDB, IPRoute
import pyroute2, pyroute2.iproute.linux
print(pyroute2.__version__, IPRoute is pyroute2.iproute.linux.IPRoute, NDB.__module__)
"""


def test_the_agent_imports_pyroute2_without_its_init_and_the_init_runs_when_asked():
    out = subprocess.run([sys.executable, "-c", LEAN], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["[]", f"{version('pyroute2')} True pyroute2.ndb.main"]


def test_a_pyroute2_imported_before_the_agent_is_left_as_it_is():
    code = "import pyroute2, lbagent.ovnhost, sys; print(type(sys.modules['pyroute2']).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "module"


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package `lean_probe_pkg` whose `__init__` counts its runs, with a submodule `part`."""
    root = tmp_path / "lean_probe_pkg"
    root.mkdir()
    (root / "__init__.py").write_text(
        "import builtins\n"
        "builtins.lean_probe_runs = getattr(builtins, 'lean_probe_runs', 0) + 1\n"
        "from lean_probe_pkg import part\n"
        "NAME = part.VALUE\n"
    )
    (root / "part.py").write_text("VALUE = 'from part'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("lean_probe_pkg", "lean_probe_pkg.part"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import builtins

    monkeypatch.setattr(builtins, "lean_probe_runs", 0, raising=False)
    yield builtins
    for name in ("lean_probe_pkg", "lean_probe_pkg.part"):
        sys.modules.pop(name, None)


def test_submodules_import_without_the_init(package):
    pyroute2_import.register("lean_probe_pkg")
    from lean_probe_pkg import part

    assert part.VALUE == "from part"
    assert package.lean_probe_runs == 0


def test_the_init_runs_once_for_the_first_name_asked_from_any_thread(package):
    pyroute2_import.register("lean_probe_pkg")
    import lean_probe_pkg

    found = []
    threads = [threading.Thread(target=lambda: found.append(lean_probe_pkg.NAME)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert found == ["from part"] * 8
    assert package.lean_probe_runs == 1
    with pytest.raises(AttributeError, match="has no attribute 'MISSING'"):
        _ = lean_probe_pkg.MISSING
    assert package.lean_probe_runs == 1


def test_a_submodule_asked_as_a_name_is_imported_alone(package):
    pyroute2_import.register("lean_probe_pkg")
    import lean_probe_pkg

    assert lean_probe_pkg.part.VALUE == "from part"
    assert package.lean_probe_runs == 0


def test_an_init_that_fails_says_so_to_every_later_asker(package, tmp_path):
    (tmp_path / "lean_probe_pkg" / "__init__.py").write_text("raise RuntimeError('no such library')\n")
    pyroute2_import.register("lean_probe_pkg")
    import lean_probe_pkg

    with pytest.raises(RuntimeError, match="no such library"):
        _ = lean_probe_pkg.NAME
    with pytest.raises(ImportError, match="__init__ failed: RuntimeError") as later:
        _ = lean_probe_pkg.OTHER
    assert isinstance(later.value.__cause__, RuntimeError)


def test_a_package_imported_already_is_not_registered_again(package):
    already = types.ModuleType("lean_probe_pkg")
    sys.modules["lean_probe_pkg"] = already
    pyroute2_import.register("lean_probe_pkg")
    assert sys.modules["lean_probe_pkg"] is already


def test_a_missing_package_or_a_plain_module_is_refused(package):
    with pytest.raises(ModuleNotFoundError):
        pyroute2_import.register("lean_probe_no_such_pkg")
    with pytest.raises(ModuleNotFoundError, match="No package named 'lean_probe_pkg.part'"):
        pyroute2_import.register("lean_probe_pkg.part")
