"""Every error the haproxy package raises derives from LbAgentError through HaproxyError."""

import ast
import importlib
from pathlib import Path

import pytest

import lbagent.haproxy
from lbagent.errors import LbAgentError
from lbagent.haproxy.errors import HaproxyAnswerError, HaproxyError
from lbagent.haproxy.live import LiveEditError

PACKAGE = Path(lbagent.haproxy.__file__).parent


def raised_classes(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every `raise Name(...)` in the module: new errors, not re-raises."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
            found.append((node.lineno, node.exc.func.id))
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda path: path.name)
def test_every_raised_error_is_a_haproxy_error(path):
    module = importlib.import_module(f"lbagent.haproxy.{path.stem}")
    for line, name in raised_classes(path):
        raised = getattr(module, name)
        assert issubclass(raised, HaproxyError), f"{path.name}:{line} raises {name}"


def test_the_hierarchy_reaches_lbagent_error():
    assert issubclass(HaproxyError, LbAgentError)
    assert issubclass(LiveEditError, HaproxyError)
    # Callers of send_command catch OSError for every way it fails.
    assert issubclass(HaproxyAnswerError, HaproxyError) and issubclass(HaproxyAnswerError, OSError)
