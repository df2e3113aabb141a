"""The test environment itself works: OVN carries ping and HTTP between VPC hosts,
and a VPC leaves nothing behind once cleaned up."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools.sandbox import NETDEV_DEVICE, OvnSandbox, SandboxBusy, link_names, pid_alive, run
from devtools.topology import Vpc


def _netns_names() -> set[str]:
    return {ns["name"] for ns in json.loads(run("ip", "-j", "netns", "list") or "[]")}


def _lsp_names(sandbox: OvnSandbox) -> set[str]:
    return set(sandbox.nbctl("--bare", "--columns=name", "list", "Logical_Switch_Port").split())


def _ovn_names(sandbox: OvnSandbox, table: str) -> set[str]:
    return set(sandbox.nbctl("--bare", "--columns=name", "list", table).split())


def test_two_hosts_ping_and_http_through_ovn(vpc: Vpc) -> None:
    a = vpc.add_host("a", "198.18.0.21", http_text="hello from a")
    b = vpc.add_host("b", "198.18.0.22", http_text="hello from b")

    assert "reply from 198.18.0.22" in a.ping(b.ip)
    assert "reply from 198.18.0.1" in a.ping(vpc.gateway)
    assert a.curl(f"http://{b.ip}:8000/") == "hello from b\n"
    assert b.curl(f"http://{a.ip}:8000/") == "hello from a\n"


def test_a_dual_stack_vpc_carries_http_over_both_families_and_through_its_router(
    sandbox: OvnSandbox, prefix: str
) -> None:
    vpc = Vpc(sandbox, prefix, cidr6="2001:db8:0:1::/64", gateway6="2001:db8:0:1::1")
    try:
        vpc.add_subnet("198.18.1.0/24", "198.18.1.1", "2001:db8:0:2::/64", "2001:db8:0:2::1")
        a = vpc.add_host("a", "198.18.0.21", ip6="2001:db8:0:1::21")
        b = vpc.add_host("b", "198.18.0.22", ip6="2001:db8:0:1::22")
        c = vpc.add_host("c", "198.18.1.23", subnet=1, ip6="2001:db8:0:2::23")
        b.start_http("hello from b", echo=True)
        c.start_http("hello from c", echo=True)

        def peer(host, url: str) -> str:
            return json.loads(host.curl(url).splitlines()[1])["peer"]

        # The server shows each client in its own family, an IPv4 one not as ::ffff:a.b.c.d.
        assert peer(a, "http://[2001:db8:0:1::22]:8000/") == a.ip6
        assert peer(a, f"http://{b.ip}:8000/") == a.ip
        assert peer(a, "http://[2001:db8:0:2::23]:8000/") == a.ip6  # routed by the router's IPv6 port
    finally:
        vpc.cleanup()


def test_cleanup_leaves_nothing_with_the_prefix(sandbox: OvnSandbox, vpc: Vpc, prefix: str) -> None:
    host = vpc.add_host("a", "198.18.0.21", http_text="bye")
    vpc.add_lb_port("lb-" + prefix, "00:22:0a:00:00:12", "198.18.0.12")
    pid = host.http_pid
    assert host.netns in _netns_names()
    assert host.host_if in link_names()

    vpc.cleanup()
    vpc.cleanup()  # idempotent

    assert not {n for n in _netns_names() if n.startswith(prefix)}
    assert not {n for n in link_names() if n.startswith(prefix)}
    assert not {n for n in _lsp_names(sandbox) if prefix in n}
    assert not {n for n in _ovn_names(sandbox, "Logical_Switch") if n.startswith(prefix)}
    assert not {n for n in _ovn_names(sandbox, "Logical_Router") if n.startswith(prefix)}
    assert host.host_if not in sandbox.vsctl("list-ports", "br-int").split()
    assert pid is not None and not pid_alive(pid)


def test_second_sandbox_is_refused_and_harmless(
    sandbox: OvnSandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LBAGENT_SANDBOX_WAIT", "0")  # queueing behind ourselves would wait forever
    other = OvnSandbox(tmp_path / "other")
    with pytest.raises(SandboxBusy, match="make demo-down"):
        other.start()
    other.stop()  # must not remove the running sandbox's devices

    assert NETDEV_DEVICE in link_names()
    assert sandbox.vsctl("br-exists", "br-int") == ""
