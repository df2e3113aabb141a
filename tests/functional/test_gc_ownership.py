"""Garbage collection and `lbagent cleanup` sweep only what carries this agent's
mark: a namespace named `lb-...` or a veth named like the agent's that someone
else made survives both, on the real kernel, next to a served load balancer."""

from __future__ import annotations

import os
import subprocess

from agentproc import wait_until
from helpers import VIP, wait_bound, web_lb
from lbstate import desired

URL = f"http://{VIP}:80/"
FOREIGN_TAG = "f0e1d2c3"  # h<tag>1 / h<tag>0: the agent's naming pattern exactly
ORPHAN_TAG = "a1b2c3d4"


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def netns_list() -> set[str]:
    return {line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.strip()}


def link_names() -> set[str]:
    return {line.split()[0].split("@")[0] for line in sh("ip", "-br", "link").splitlines() if line.strip()}


def alias(name: str) -> str:
    with open(f"/sys/class/net/{name}/ifalias") as f:
        return f.read().strip()


def test_foreign_lookalikes_survive_gc_and_cleanup(agent_factory, vpc, web, prefix):
    lb_id, client = web
    foreign_ns = f"lb-{prefix}-foreign"
    foreign_host, foreign_peer = f"h{FOREIGN_TAG}1", f"h{FOREIGN_TAG}0"
    orphan_ns = f"lb-{prefix}-orphan"
    orphan_host, orphan_peer = f"h{ORPHAN_TAG}1", f"h{ORPHAN_TAG}0"
    try:
        agent = agent_factory(resync_interval=0.5)
        assert agent.refresh(desired(1, web_lb(lb_id)))[0] == 200
        status = wait_bound(agent, lb_id)
        wait_until(lambda: client.curl(URL, timeout=2).strip() in {"backend-a", "backend-b"}, 30, "traffic")
        own_ns = status["netns"]
        own_links = {status["interfaces"]["ovn"][1], status["interfaces"]["haproxy"][1]}
        # The agent's own host ends carry its mark.
        assert {alias(name) for name in own_links} == {f"lbagent/{agent.host}"}

        # Someone else's objects, named like the agent's, made while it serves.
        sh("ip", "netns", "add", foreign_ns)
        sh("ip", "link", "add", foreign_host, "type", "veth", "peer", "name", foreign_peer)
        passes = agent.status()["agent"]["gc"]["passes"]
        wait_until(lambda: agent.status()["agent"]["gc"]["passes"] >= passes + 2, 30, "two garbage-collection passes")
        # Two passes: anything found orphaned on the first is swept on the second.
        assert foreign_ns in netns_list()
        assert {foreign_host, foreign_peer} <= link_names()
        assert own_ns in netns_list() and own_links <= link_names()
        assert client.curl(URL, timeout=5).strip() in {"backend-a", "backend-b"}

        # Objects of a load balancer the state file records but without marks
        # (made by an agent before marks existed) are adopted by its next pass.
        mark_file = f"/run/lbagent-netns/{agent.host}/{own_ns}"
        assert os.path.exists(mark_file)
        os.unlink(mark_file)
        sh("ip", "link", "set", status["interfaces"]["haproxy"][1], "alias", "")
        wait_until(
            lambda: os.path.exists(mark_file) and {alias(name) for name in own_links} == {f"lbagent/{agent.host}"},
            10,
            "the marks added back by a pass",
        )
        assert own_ns in netns_list() and own_links <= link_names()

        assert agent.stop() == 0
        # Orphans with the agent's marks that the state file no longer records
        # (their load balancer's removal was cut short): cleanup takes them too.
        sh("ip", "netns", "add", orphan_ns)
        with open(f"/run/lbagent-netns/{agent.host}/{orphan_ns}", "a"):
            pass
        sh("ip", "link", "add", orphan_host, "type", "veth", "peer", "name", orphan_peer)
        sh("ip", "link", "set", orphan_host, "alias", f"lbagent/{agent.host}")
        report = agent.cli("cleanup", "--yes").stdout
        assert orphan_ns in report and orphan_host in report, report
        assert orphan_ns not in netns_list() and not {orphan_host, orphan_peer} & link_names()
        assert not os.path.exists(f"/run/lbagent-netns/{agent.host}")
        assert own_ns in report, report
        assert own_ns not in netns_list()
        assert not own_links & link_names()
        assert foreign_ns in netns_list(), report
        assert {foreign_host, foreign_peer} <= link_names(), report
        assert foreign_ns not in report and foreign_host not in report and foreign_peer not in report
    finally:
        subprocess.run(["ip", "netns", "del", foreign_ns], capture_output=True)
        subprocess.run(["ip", "link", "del", foreign_host], capture_output=True)
        subprocess.run(["ip", "netns", "del", orphan_ns], capture_output=True)
        subprocess.run(["ip", "link", "del", orphan_host], capture_output=True)
