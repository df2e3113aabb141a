"""Fixtures for functional tests: a private OVS/OVN sandbox and per-test VPCs.

This file owns the test-session sandbox (one for the whole session; starting
OVS + OVN takes about a second, but two sandboxes cannot run side by side), a
unique prefix per test and a VPC per test that is removed afterwards even
when the test fails. The topology itself lives in `devtools` so that the demo
builds exactly what the tests exercise.

Every test in this directory needs root and the OVS/OVN/iproute2 tools. Without
root the directory is skipped with the reason; as root, a missing tool stops
the run with an error (a skip would hide a broken set-up). Any other problem
(a sandbox that does not start, another sandbox running) is an error too.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from devtools.sandbox import MissingTools, OvnSandbox, required_tools, skip_reason, which
from devtools.topology import Vpc
from lbagent.ovnhost.netns import NamespaceExecutor

from agentproc import AgentProcess
from helpers import MAC, VIP
from neighbourlimits import kept_limits
from operatorproc import BACKENDS, ConfiguredAgent

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A conftest hook sees the whole session's items: touch only ours.
    try:
        reason = skip_reason(os.geteuid(), [tool for tool in required_tools() if which(tool) is None])
    except MissingTools as exc:
        raise pytest.UsageError(str(exc)) from None
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.functional)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory):
    """The session's private OVS + OVN; stopped at the end whatever happens."""
    # Kept short: unix socket paths under it must stay below 108 bytes.
    with OvnSandbox(tmp_path_factory.mktemp("ovn")) as sb:
        yield sb


@pytest.fixture
def prefix() -> str:
    """A unique short prefix for every object one test creates (`t` + 5 hex)."""
    return "t" + secrets.token_hex(3)[:5]


@pytest.fixture
def vpc(sandbox: OvnSandbox, prefix: str):
    """A VPC 198.18.0.0/24 (gateway .1) in the sandbox, removed after the test."""
    v = Vpc(sandbox, prefix)
    try:
        yield v
    finally:
        v.cleanup()


@pytest.fixture
async def executors():
    """The namespace and iptables threads of the kernel-only tests (no OVS), shut down afterwards."""
    ns, iptc = NamespaceExecutor("t-netns", 2), NamespaceExecutor("t-iptc", 1)
    yield ns, iptc
    ns.shutdown()
    iptc.shutdown()


@pytest.fixture
def neighbour_limits():
    """The neighbour table limits the test starts from (the kernel's defaults), the machine's put
    back after the test. List it before the agent fixtures: it is then torn down after them."""
    with kept_limits() as before:
        yield before


@pytest.fixture
def agent_factory(sandbox: OvnSandbox, prefix: str, tmp_path: Path):
    """Start `lbagent run --config FILE` against the sandbox, as systemd would.

    Every agent started here is stopped and `lbagent cleanup` removes what it
    created (namespaces, links, OVS ports, haproxy) after the test, pass or fail.
    Each agent names a unique host, so cleanup never claims another's objects.
    """
    agents: list[AgentProcess] = []

    def start(
        resync_interval: float = 30.0, extra_config: str = "", size_neighbour_tables: bool = False
    ) -> AgentProcess:
        base = tmp_path / f"agent{len(agents)}"
        agent = AgentProcess(
            base,
            sandbox.ovs_db,
            host=f"{prefix}-gw{len(agents)}",
            resync_interval=resync_interval,
            extra_config=extra_config,
            env=sandbox.env,
            size_neighbour_tables=size_neighbour_tables,
        )
        agents.append(agent)
        return agent.start()

    try:
        yield start
    finally:
        for agent in agents:
            agent.destroy()


@pytest.fixture
def web(vpc, prefix):
    """Two backends answering their names, a client, and the LSP of the load balancer."""
    vpc.add_host("a", "198.18.0.21", http_text="backend-a")
    vpc.add_host("b", "198.18.0.22", http_text="backend-b")
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-web"
    vpc.add_lb_port(lb_id, MAC, VIP)
    return lb_id, client


@pytest.fixture
def configured_agent(sandbox, prefix: str, tmp_path: Path):
    """Make (not start) a ConfiguredAgent against the sandbox; destroyed after the test whatever happens."""
    agents: list[ConfiguredAgent] = []

    def make(**kwargs) -> ConfiguredAgent:
        agent = ConfiguredAgent(
            tmp_path / f"agent{len(agents)}",
            sandbox.ovs_db,
            host=f"{prefix}-op{len(agents)}",
            env=sandbox.env,
            **kwargs,
        )
        agents.append(agent)
        return agent

    try:
        yield make
    finally:
        for agent in agents:
            agent.destroy()


@pytest.fixture
def served_vpc(vpc, prefix: str):
    """Two HTTP backends, a client and the OVN port of one load balancer: (lb_id, client)."""
    for name, address in BACKENDS.items():
        vpc.add_host(name, address, http_text=name)
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-op"
    vpc.add_lb_port(lb_id, MAC, VIP)
    return lb_id, client
