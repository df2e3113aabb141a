"""The IPv6 half of a dual-stack load balancer's links on the real kernel, without OVS: the VIP
and gateway routes in the namespace, the inner/outer pair, the route to INNER6 and the reply path
from OUTER6, built in a new namespace in batches or converged step by step; a second pass writes nothing,
drift is repaired, and a load balancer that loses its IPv6 VIP loses all of it."""

import os
import socket

import pytest

from lbagent.metrics import write_counts
from lbagent.ovnhost import links
from lbagent.ovnhost.host import HostSpec, OvnHost
from lbagent.ovnhost.links import Ipv6Spec, LinkSpec
from lbagent.ovnhost.netns import netns_exists

from helpers import kernel_lb, sh

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

OUTER, INNER = "169.254.0.103", "169.254.0.102"
INNER6, OUTER6 = "fd4c:4241:ffff::2", "fd4c:4241:ffff::3"
IPV6 = Ipv6Spec("2001:db8::12", 64, "2001:db8::1", INNER6, OUTER6)


class FakeOvs:
    """The integration bridge, as far as OvnHost asks: this module tests the kernel half."""

    def converge_ports(self, wants):
        return [None for _ in wants]

    def delete_ports(self, names):
        return [False for _ in names]


@pytest.fixture
async def host(executors):
    ns_exec, iptc_exec = executors
    ovn_host = OvnHost(FakeOvs(), ns_exec, iptc_exec)
    yield ovn_host, ns_exec
    ovn_host.ovsdb.shutdown()


@pytest.fixture
def lb():
    with kernel_lb("t6", {OUTER, OUTER6}) as made:
        yield made


def spec(names, ipv6: Ipv6Spec | None = IPV6) -> LinkSpec:
    return LinkSpec(
        names=names,
        mac="00:22:0a:00:00:13",
        vip="198.18.0.13",
        prefixlen=24,
        gateway="198.18.0.1",
        mtu=1442,
        routes=(("198.19.0.0/16", "198.18.0.254"), ("2001:db8:1::/64", "2001:db8::fe")),
        inner=INNER,
        outer=OUTER,
        tx_checksum_off=False,
        ipv6=ipv6,
    )


def assert_ipv6_path(netns: str, names) -> None:
    vip = sh(f"ip netns exec {netns} ip -6 addr show dev {names.ovn_ns}")
    assert "2001:db8::12/64" in vip and "tentative" not in vip, vip
    pair = sh(f"ip netns exec {netns} ip -6 addr show dev {names.haproxy_ns}")
    assert f"{INNER6}/64" in pair and "tentative" not in pair, pair
    routes = sh(f"ip netns exec {netns} ip -6 route")
    assert "default via 2001:db8::1" in routes and "2001:db8:1::/64 via 2001:db8::fe" in routes, routes
    assert sh(f"ip netns exec {netns} sysctl -n net.ipv6.conf.all.forwarding").strip() == "1"
    for key in ("accept_ra", "router_solicitations", "accept_dad"):  # no solicitations into OVN
        assert sh(f"ip netns exec {netns} sysctl -n net.ipv6.conf.{names.ovn_ns}.{key}").strip() == "0"
    host_end = sh(f"ip -6 addr show dev {names.haproxy_host}")
    assert f"{OUTER6}/64" in host_end and "noprefixroute" in host_end, host_end
    assert f"{INNER6} dev {names.haproxy_host}" in sh("ip -6 route")
    table = links.reply_table(OUTER)
    policy = sh("ip -6 rule")
    assert f"from {OUTER6} lookup {table}" in policy, policy
    assert "not from fc00::/7 goto 31999" in policy and "31999:\tfrom all nop" in policy, policy
    assert f"default via {INNER6} dev {names.haproxy_host}" in sh(f"ip -6 route show table {table}")
    # The pair carries traffic, and haproxy's replies to an IPv6 client leave through INNER6.
    assert_refused_through_the_pair()
    assert f"via {INNER6} dev {names.haproxy_host}" in sh(f"ip -6 route get 2001:db8:5::1 from {OUTER6}")


def assert_refused_through_the_pair() -> None:
    """A datagram from OUTER6 to a closed port of INNER6 comes back as the namespace's
    port-unreachable: the pair carries IPv6 both ways."""
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
        sock.bind((OUTER6, 0))
        sock.connect((INNER6, 9))
        sock.settimeout(5)
        sock.send(b"lbagent")
        with pytest.raises(ConnectionRefusedError):
            sock.recv(64)


async def test_a_dual_stack_namespace_is_built_and_a_second_pass_writes_nothing(host, lb, monkeypatch):
    ovn_host, _ = host
    lb_id, names, netns = lb
    stepwise = []
    real_open = links.Netlink.open
    monkeypatch.setattr(links.Netlink, "open", lambda: stepwise.append(1) or real_open())
    await ovn_host.converge(HostSpec(lb_id, netns, spec(names), ()))
    # Built in the batches that build an IPv4-only one: nothing converged step by step.
    assert stepwise == []
    monkeypatch.setattr(links.Netlink, "open", real_open)
    assert_ipv6_path(netns, names)
    before = write_counts()
    await ovn_host.converge(HostSpec(lb_id, netns, spec(names), ()))
    assert write_counts() == before


async def test_ipv6_drift_is_repaired_step_by_step(host, lb):
    ovn_host, ns_exec = host
    lb_id, names, netns = lb
    await ns_exec.create(netns)  # made elsewhere: the pass converges step by step
    await ovn_host.converge(HostSpec(lb_id, netns, spec(names), ()))
    assert_ipv6_path(netns, names)

    sh(f"ip netns exec {netns} ip -6 addr del 2001:db8::12/64 dev {names.ovn_ns}")
    sh(f"ip netns exec {netns} ip -6 route del 2001:db8:1::/64")
    sh(f"ip -6 addr del {OUTER6}/64 dev {names.haproxy_host}")
    sh(f"ip -6 rule del priority 31000 from {OUTER6}")
    sh(f"ip netns exec {netns} ip -6 addr add 2001:db8::99/64 dev {names.ovn_ns} nodad")
    await ovn_host.converge(HostSpec(lb_id, netns, spec(names), ()))
    assert_ipv6_path(netns, names)
    assert "2001:db8::99" not in sh(f"ip netns exec {netns} ip -6 addr")


async def test_a_load_balancer_that_loses_its_ipv6_vip_loses_its_ipv6_objects(host, lb):
    ovn_host, ns_exec = host
    lb_id, names, netns = lb
    await ovn_host.converge(HostSpec(lb_id, netns, spec(names), ()))
    assert_ipv6_path(netns, names)
    await ovn_host.converge(HostSpec(lb_id, netns, spec(names, ipv6=None), ()))
    for ns_end in (names.ovn_ns, names.haproxy_ns):
        assert "inet6" not in sh(f"ip netns exec {netns} ip -6 addr show dev {ns_end}")
    assert "inet6" not in sh(f"ip -6 addr show dev {names.haproxy_host}")
    assert sh(f"ip netns exec {netns} ip -6 route") == ""
    # The policy rule is not tied to a link: it goes with garbage collection (or removal).
    assert await ns_exec.run(None, links.delete_reply_rules, {OUTER6}) == [OUTER6]
    policy = sh("ip -6 rule")
    assert OUTER6 not in policy
    if not any(":" in source for source in await ns_exec.run(None, links.reply_rule_sources)):
        assert "goto 31999" not in policy and "31999:" not in policy, policy  # the family's last took them


async def test_removal_deletes_the_ipv6_reply_rule(host, lb):
    ovn_host, _ = host
    lb_id, names, netns = lb
    await ovn_host.converge(HostSpec(lb_id, netns, spec(names), ()))
    await ovn_host.remove(lb_id, netns, names, OUTER, OUTER6)
    assert not netns_exists(netns)
    assert OUTER6 not in sh("ip -6 rule") and OUTER not in sh("ip rule")
