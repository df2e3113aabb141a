"""How `make test`'s two pytest-xdist workers share the suite.

The tests on the machine's one OVS sandbox, and those that look at what is
machine-wide (links, namespaces, neighbour limits, processes), run one after
another on one worker, as they would without xdist. The unit tests and the
high-availability tests, whose multi-host sandbox puts nothing in the
machine's namespace and takes no lock, run on the other worker meanwhile.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

# Modules on the multi-host sandbox alone (no `sandbox` fixture, nothing machine-wide checked).
BESIDE_THE_SANDBOX = frozenset({"tests/functional/test_ha.py", "tests/functional/test_bench_ha_smoke.py"})


def worker_group(nodeid: str) -> str:
    """The group a test runs in: each group's tests run on one worker, in collection order."""
    if nodeid.startswith("tests/unit/"):
        return "unit"
    if nodeid.split("::", 1)[0] in BESIDE_THE_SANDBOX:
        return "multihost"
    return "sandbox"


class ByWorkerGroup(LoadScopeScheduling):
    """pytest-xdist's scope scheduling, a scope being a `worker_group` (its `--dist loadgroup`
    marks do not reach pytest 9.2's node ids)."""

    def _split_scope(self, nodeid: str) -> str:
        return worker_group(nodeid)


def pytest_xdist_make_scheduler(config, log):
    return ByWorkerGroup(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test beside the sandbox that uses it would wait for the other worker's sandbox and time out."""
    wrong = [item.nodeid for item in items if worker_group(item.nodeid) != "sandbox" and "sandbox" in item.fixturenames]
    if wrong:
        raise pytest.UsageError(f"these tests use the single-host sandbox but run beside it: {wrong}")
