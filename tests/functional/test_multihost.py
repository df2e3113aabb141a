"""The multi-host sandbox works: one load balancer port on two gateway hosts, served by the host
that `requested-chassis` names, through a host crash and an underlay cut; the hosts' namespaces are
private to each; and stopping leaves nothing on the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.multihost import MultiHost, MultiHostError, SimHost
from devtools.procs import CommandError, link_names, pid_alive, run, wait_for
from devtools.programs import HTTPD_CODE
from devtools.sandbox import INTEGRATION_BRIDGE, NETDEV_DEVICE, OvnSandbox
from devtools.topology import Vpc, VpcHost, lb_port_name

from helpers import MAC, VIP

HOSTS = ["gw-1", "gw-2", "cl"]
LB_NS = "lb-same-name"  # what each gateway's agent would call the load balancer's namespace
LB_PORT = 8000


def _machine_netns() -> set[str]:
    return {ns["name"] for ns in json.loads(run("ip", "-j", "netns", "list") or "[]")}


def _mount_points_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as mountinfo:
        return [line.split()[4] for line in mountinfo if line.split()[4].startswith(str(path))]


def _pids_mentioning(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return [pid for pid in pids if pid_alive(pid)]


@pytest.fixture
def multihost(tmp_path_factory: pytest.TempPathFactory, prefix: str) -> Iterator[MultiHost]:
    # A short base: unix socket paths below it must stay under 108 bytes.
    with MultiHost(tmp_path_factory.mktemp("mh"), prefix, HOSTS) as mh:
        yield mh


def _serve_lb_port(host: SimHost, lsp: str) -> None:
    """What a gateway's agent builds: a namespace whose veth carries the load balancer's MAC and IP,
    its OVS port bound to `lsp`, and a server answering the host's name."""
    host.run("ip", "netns", "add", LB_NS)
    host.run("ip", "link", "add", "lbport", "type", "veth", "peer", "name", "eth0", "netns", LB_NS)
    for argv in (
        ("ip", "link", "set", "eth0", "address", MAC),
        ("ip", "addr", "add", f"{VIP}/24", "dev", "eth0"),
        ("ip", "link", "set", "lo", "up"),
        ("ip", "link", "set", "eth0", "up"),
        ("ethtool", "-K", "eth0", "tx", "off"),
    ):
        host.in_netns(LB_NS, *argv)
    host.run("ip", "link", "set", "lbport", "up")
    host.vsctl(
        "add-port", INTEGRATION_BRIDGE, "lbport", "--", "set", "Interface", "lbport", f"external_ids:iface-id={lsp}"
    )
    host.popen(["ip", "netns", "exec", LB_NS, sys.executable, "-c", HTTPD_CODE, host.name, str(LB_PORT)])
    wait_for(
        lambda: (
            host.in_netns(LB_NS, "curl", "-sS", "--max-time", "1", f"http://127.0.0.1:{LB_PORT}/") == f"{host.name}\n"
        ),
        10,
        f"the server in {LB_NS} on {host.name}",
    )


def _answer(client: VpcHost) -> str:
    try:
        return client.curl(f"http://{VIP}:{LB_PORT}/", timeout=2).strip()
    except CommandError:
        return ""


def _wait_for_answer(client: VpcHost, expected: str, timeout: float = 30) -> None:
    wait_for(lambda: _answer(client) == expected, timeout, f"the client to get an answer from {expected}")


def _request(multihost: MultiHost, lsp: str, host: SimHost) -> None:
    multihost.central.nbctl("lsp-set-options", lsp, f"requested-chassis={host.chassis}")


def test_the_requested_chassis_serves_the_port_through_crash_and_partition(multihost: MultiHost, prefix: str) -> None:
    gw1, gw2 = multihost.host("gw-1"), multihost.host("gw-2")
    vpc = multihost.vpc()
    client = vpc.add_host("client", "198.18.0.31", on="cl")
    lsp = vpc.add_lb_port(f"{prefix}-ha", MAC, VIP)
    assert lsp == lb_port_name(f"{prefix}-ha")
    _request(multihost, lsp, gw1)
    for host in (gw1, gw2):
        _serve_lb_port(host, lsp)
    wait_for(lambda: gw1.port_binding_chassis(lsp) == gw1.chassis, 30, f"{lsp} bound on gw-1")
    _wait_for_answer(client, "gw-1")

    _request(multihost, lsp, gw2)
    _wait_for_answer(client, "gw-2")
    assert gw2.port_binding_chassis(lsp) == gw2.chassis

    gw2.crash()
    assert not _answer(client)
    _request(multihost, lsp, gw1)
    _wait_for_answer(client, "gw-1")

    gw1.cut_underlay()
    wait_for(lambda: not _answer(client), 10, "the client's answers to stop")
    gw1.heal_underlay()
    _wait_for_answer(client, "gw-1", timeout=60)


def _northbound_from(host: SimHost, multihost: MultiHost) -> str:
    nb = multihost.central.nb_remote
    return host.run("ovn-nbctl", f"--db={nb}", "--timeout=3", "get", "NB_Global", ".", "nb_cfg", timeout=10)


def test_hosts_reach_the_clustered_northbound_over_their_underlay_only(multihost: MultiHost) -> None:
    gw1, gw2 = multihost.host("gw-1"), multihost.host("gw-2")
    assert "Role: leader" in multihost.central.appctl("ovnnb_db", "cluster/status", "OVN_Northbound")
    assert _northbound_from(gw1, multihost).strip().isdigit()

    gw1.cut_underlay()
    with pytest.raises(CommandError):
        _northbound_from(gw1, multihost)
    assert _northbound_from(gw2, multihost).strip().isdigit()
    gw1.heal_underlay()
    wait_for(lambda: _northbound_from(gw1, multihost), 30, "gw-1 to reach the northbound database again")


def test_a_revived_host_serves_again(multihost: MultiHost, prefix: str) -> None:
    gw1 = multihost.host("gw-1")
    vpc = multihost.vpc()
    client = vpc.add_host("client", "198.18.0.31", on="cl")
    lsp = vpc.add_lb_port(f"{prefix}-rv", MAC, VIP)
    _request(multihost, lsp, gw1)
    _serve_lb_port(gw1, lsp)
    _wait_for_answer(client, "gw-1")

    gw1.crash()
    assert LB_NS in gw1.netns_list()  # a dead host's namespaces stay, as its disk would
    assert not _answer(client)
    gw1.revive()
    gw1.popen(["ip", "netns", "exec", LB_NS, sys.executable, "-c", HTTPD_CODE, "gw-1 again", str(LB_PORT)])
    _wait_for_answer(client, "gw-1 again")


def test_each_host_has_its_own_namespaces_of_the_same_name(multihost: MultiHost) -> None:
    gw1, gw2 = multihost.host("gw-1"), multihost.host("gw-2")
    gw1.run("ip", "netns", "add", LB_NS)
    # The agent creates its namespaces through pyroute2, not iproute2.
    gw2.run(sys.executable, "-c", f"from pyroute2 import netns; netns.create({LB_NS!r})")
    gw1.in_netns(LB_NS, "ip", "link", "add", "only-on-gw1", "type", "veth", "peer", "name", "its-peer")

    assert LB_NS in gw1.netns_list() and LB_NS in gw2.netns_list()
    assert "only-on-gw1" in gw1.in_netns(LB_NS, "ip", "link", "show")
    assert "only-on-gw1" not in gw2.in_netns(LB_NS, "ip", "link", "show")
    assert LB_NS not in _machine_netns()
    assert LB_NS not in multihost.host("cl").netns_list()


def test_a_process_started_on_a_host_runs_in_its_namespaces_and_directory(multihost: MultiHost) -> None:
    gw1 = multihost.host("gw-1")
    gw1.run("ip", "netns", "add", LB_NS)
    script = "pwd; ls /run/netns; ip -o link show ul0 | wc -l"
    proc = gw1.popen(["sh", "-c", script], cwd=gw1.base, stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=10)

    assert out.decode().split() == [str(gw1.base), LB_NS, "1"]


def test_it_runs_beside_the_single_host_sandbox(sandbox: OvnSandbox, vpc: Vpc, multihost: MultiHost) -> None:
    mh_vpc = multihost.vpc()
    a = mh_vpc.add_host("a", "198.18.0.21", on="gw-1", http_text="multi a")
    b = mh_vpc.add_host("b", "198.18.0.22", on="gw-2")
    local_a = vpc.add_host("a", "198.18.0.21", http_text="single a")
    local_b = vpc.add_host("b", "198.18.0.22")

    assert b.curl(f"http://{a.ip}:8000/") == "multi a\n"
    assert local_b.curl(f"http://{local_a.ip}:8000/") == "single a\n"
    assert sandbox.vsctl("br-exists", INTEGRATION_BRIDGE) == ""


def test_two_multi_host_sandboxes_run_at_once(
    multihost: MultiHost, tmp_path_factory: pytest.TempPathFactory, prefix: str
) -> None:
    with MultiHost(tmp_path_factory.mktemp("mh"), f"{prefix}x", ["gw-1", "cl"]) as other:
        answers = []
        for sandbox in (multihost, other):
            vpc = sandbox.vpc()  # the same addresses in both
            server = vpc.add_host("a", "198.18.0.21", on="gw-1", http_text=sandbox.prefix)
            client = vpc.add_host("c", "198.18.0.31", on="cl")
            answers.append(client.curl(f"http://{server.ip}:8000/").strip())

    assert answers == [prefix, f"{prefix}x"]


def test_stop_leaves_nothing_on_the_machine(tmp_path_factory: pytest.TempPathFactory, prefix: str) -> None:
    base = tmp_path_factory.mktemp("mh")
    links_before = link_names()
    mh = MultiHost(base, prefix, HOSTS)
    mh.start()
    try:
        gw1, gw2 = mh.host("gw-1"), mh.host("gw-2")
        host = mh.vpc().add_host("a", "198.18.0.21", on="gw-1", http_text="a")
        gw2.run("ip", "netns", "add", LB_NS)
        agent = gw2.popen(["ip", "netns", "exec", LB_NS, "sleep", "3600"])
        assert not {n for n in link_names() - links_before if n.startswith(prefix) or n in {NETDEV_DEVICE, "br-phy"}}
        pids = [agent.pid, host.http_pid] + [d.pid() for h in mh.hosts.values() for d in h.daemons]
        pids += [d.pid() for d in mh.central.daemons]
        gw1.crash()  # its VPC host's OVS port goes without an ovs-vswitchd to wait for
    finally:
        MultiHost.restore(base).stop()  # as another process would
    mh.stop()  # idempotent

    _assert_nothing_left(base, prefix, links_before)
    assert not [pid for pid in pids if pid is not None and pid_alive(pid)]


def test_a_start_that_fails_halfway_leaves_nothing(
    tmp_path_factory: pytest.TempPathFactory, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path_factory.mktemp("mh")
    links_before = link_names()
    mh = MultiHost(base, prefix, HOSTS)
    started = SimHost.start_daemons

    def second_host_fails(host: SimHost) -> None:
        started(host)
        if host.name == "gw-2":
            raise RuntimeError("gw-2 does not come up")

    monkeypatch.setattr(SimHost, "start_daemons", second_host_fails)
    with pytest.raises(MultiHostError, match="gw-2 does not come up") as failed:
        mh.start()

    assert "ovs-vswitchd.log" in str(failed.value)  # the logs' tails, as they go with the directories

    _assert_nothing_left(base, prefix, links_before)


def _assert_nothing_left(base: Path, prefix: str, links_before: set[str]) -> None:
    assert not {n for n in _machine_netns() if n.startswith(f"{prefix}-")}
    assert not {n for n in link_names() - links_before if n.startswith(prefix) or n in {NETDEV_DEVICE, "br-phy"}}
    assert not _pids_mentioning(str(base))
    assert not _mount_points_under(base)
    assert sorted(p.name for p in base.iterdir()) == []
