"""The kernel half of OvnHost on the real kernel, without OVS: namespaces,
veths, addresses, routes, NAT rules; converging twice writes nothing."""

import dataclasses
import logging
import os

import pytest

from lbagent.desired.members import Member
from lbagent.metrics import write_counts
from lbagent.ovnhost import devconf, iplib, iptables, links
from lbagent.ovnhost.host import HostSpec, OvnHost
from lbagent.ovnhost.links import LinkSpec
from lbagent.ovnhost.nat import NatPlan, nat_rules
from lbagent.ovnhost.netns import netns_exists
from lbagent.ovnhost.ovs import PortState

from helpers import kernel_lb, sh

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture
def lb():
    with kernel_lb("tk", {"169.254.0.101"}) as made:
        yield made


def spec(names, gateway="198.18.0.1", mtu=1442):
    return LinkSpec(
        names=names,
        mac="00:22:0a:00:00:12",
        vip="198.18.0.12",
        prefixlen=24,
        gateway=gateway,
        mtu=mtu,
        routes=(("198.19.0.0/16", "198.18.0.254"),),
        inner="169.254.0.100",
        outer="169.254.0.101",
        tx_checksum_off=True,
    )


def rules(names, backend="198.18.0.21"):
    return nat_rules(
        NatPlan(
            names.ovn_ns,
            names.haproxy_ns,
            "198.18.0.12",
            "169.254.0.100",
            "169.254.0.101",
            (80,),
            (Member("be-1", backend, 8000, 1, "off", False, 1025),),
        )
    )


async def converge(executors, netns, names, link_spec, nat):
    ns_exec, iptc_exec = executors
    host_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        if not netns_exists(netns):
            await ns_exec.create(netns)
        await ns_exec.run(netns, links.converge_namespace, link_spec, host_fd)
        await ns_exec.run(None, links.converge_host, link_spec)
        return await iptc_exec.run(netns, iptables.sync_nat, nat)
    finally:
        os.close(host_fd)


async def test_converge_builds_the_data_path_and_a_second_pass_writes_nothing(executors, lb, monkeypatch):
    lb_id, names, netns = lb
    await converge(executors, netns, names, spec(names), rules(names))
    assert_data_path(netns, names)

    before = write_counts()
    sysctls = []
    monkeypatch.setattr(devconf, "write_sysctl", lambda path, value, **_: sysctls.append(path) or False)
    assert await converge(executors, netns, names, spec(names), rules(names)) == 0
    assert write_counts() == before
    # The per-link settings come with the link lookups: no file under /proc/sys read.
    assert sysctls == []


def assert_data_path(netns, names):
    inside = sh(f"ip netns exec {netns} ip -br addr")
    assert "198.18.0.12/24" in inside and "169.254.0.100/16" in inside
    assert "default via 198.18.0.1" in sh(f"ip netns exec {netns} ip route")
    assert "198.19.0.0/16 via 198.18.0.254" in sh(f"ip netns exec {netns} ip route")
    assert "tx-checksumming: off" in sh(f"ip netns exec {netns} ethtool -k {names.ovn_ns}")
    assert_forwards(netns, names)
    for ns_end in (names.ovn_ns, names.haproxy_ns):  # nothing multicast from it into OVN
        assert sh(f"ip netns exec {netns} sysctl -n net.ipv6.conf.{ns_end}.disable_ipv6").strip() == "1"
        assert "inet6" not in sh(f"ip netns exec {netns} ip -6 addr show dev {ns_end}")
    host_addr = sh(f"ip -d addr show {names.haproxy_host}")
    assert "169.254.0.101/16" in host_addr and "noprefixroute" in host_addr
    assert f"169.254.0.100 dev {names.haproxy_host}" in sh("ip route")
    # haproxy's replies to real client addresses go back through this load balancer.
    table = links.reply_table("169.254.0.101")
    policy = sh("ip rule")
    assert f"from 169.254.0.101 lookup {table}" in policy
    assert "30999:\tnot from 169.254.0.0/16 goto 31999" in policy and "31999:\tfrom all nop" in policy
    assert f"default via 169.254.0.100 dev {names.haproxy_host}" in sh(f"ip route show table {table}")
    nat = sh(f"ip netns exec {netns} iptables-legacy-save -t nat")
    assert "--to-destination 169.254.0.101:80" in nat and "--to-destination 198.18.0.21:8000" in nat
    assert "-j SNAT --to-source 198.18.0.12" in nat and "--to-source 169.254" not in nat
    for name, kind in ((names.ovn_host, "veth"), (names.haproxy_host, "veth")):
        link = sh(f"ip -d link show {name}")
        assert kind in link and ",UP," in link
    assert "mtu 1442" in sh(f"ip link show {names.ovn_host}")
    ovn_ns = sh(f"ip netns exec {netns} ip link show {names.ovn_ns}")
    assert "mtu 1442" in ovn_ns and "00:22:0a:00:00:12" in ovn_ns and ",UP," in ovn_ns


def assert_forwards(netns, names):
    """Both directions route through the namespace: each end forwards IPv4 (whether
    the namespace's ip_forward or the link's own setting turned it on), and
    neither takes ICMP redirects (refused by `all` or by the link)."""
    for ns_end in (names.ovn_ns, names.haproxy_ns):
        keys = ("forwarding", "accept_redirects")
        settings = " ".join(f"net.ipv4.conf.{link}.{key}" for link in (ns_end, "all") for key in keys)
        forwarding, redirects, _, all_redirects = sh(f"ip netns exec {netns} sysctl -n {settings}").split()
        assert forwarding == "1" and "0" in (redirects, all_redirects), (ns_end, settings)


async def test_changes_and_drift_are_repaired(executors, lb):
    lb_id, names, netns = lb
    await converge(executors, netns, names, spec(names), rules(names))
    # Drift: an edited rule, a foreign rule in our chain, a deleted veth, a removed address.
    sh(f"ip netns exec {netns} iptables-legacy -t nat -A LBAGENT-PRE -j ACCEPT")
    sh(f"ip netns exec {netns} iptables-legacy -t nat -F LBAGENT-POST")
    sh(f"ip link del {names.haproxy_host}")
    sh("ip rule del priority 31000 from 169.254.0.101")
    sh(f"ip netns exec {netns} ip addr flush dev {names.ovn_ns}")
    sh(f"ip netns exec {netns} sysctl -qw net.ipv6.conf.{names.ovn_ns}.disable_ipv6=0")
    sh(f"ip netns exec {netns} sysctl -qw net.ipv4.ip_forward=0")
    changed = await converge(
        executors, netns, names, spec(names, gateway="198.18.0.254", mtu=1400), rules(names, backend="198.18.0.22")
    )
    assert changed > 0
    nat = sh(f"ip netns exec {netns} iptables-legacy-save -t nat")
    assert "-j ACCEPT" not in nat
    assert "198.18.0.22:8000" in nat and "198.18.0.21:8000" not in nat
    assert "--to-source 198.18.0.12" in nat
    assert "from 169.254.0.101 lookup" in sh("ip rule")
    assert "198.18.0.12/24" in sh(f"ip netns exec {netns} ip -br addr")
    routes = sh(f"ip netns exec {netns} ip route")
    assert "default via 198.18.0.254" in routes and "198.18.0.1 " not in routes
    assert "mtu 1400" in sh(f"ip netns exec {netns} ip link show {names.ovn_ns}")
    assert f"169.254.0.100 dev {names.haproxy_host}" in sh("ip route")
    assert sh(f"ip netns exec {netns} sysctl -n net.ipv6.conf.{names.ovn_ns}.disable_ipv6").strip() == "1"
    assert_forwards(netns, names)
    # Made again on the host, whose default has IPv6 on: turned off again.
    assert sh(f"sysctl -n net.ipv6.conf.{names.haproxy_host}.disable_ipv6").strip() == "1"


async def test_an_end_that_stopped_forwarding_alone_is_repaired(executors, lb):
    """ip_forward may still read 1: writing it again would change no link."""
    lb_id, names, netns = lb
    await converge(executors, netns, names, spec(names), rules(names))
    sh(f"ip netns exec {netns} sysctl -qw net.ipv4.ip_forward=1")
    sh(f"ip netns exec {netns} sysctl -qw net.ipv4.conf.{names.haproxy_ns}.forwarding=0")
    assert await converge(executors, netns, names, spec(names), rules(names)) == 0  # no NAT rule changed
    assert_forwards(netns, names)


async def test_passes_never_read_all_host_rules_unless_the_reply_path_is_wrong(executors, lb, monkeypatch):
    """Reading every policy rule costs O(load balancers): a cold pass and a
    converged pass do without; only a reply path still wrong after adding the
    rule (a stale rule from OUTER first) reads them, and repairs it."""
    lb_id, names, netns = lb
    dumps = []
    real_source_rules = iplib.Netlink.source_rules
    monkeypatch.setattr(
        iplib.Netlink,
        "source_rules",
        lambda self, priority, *family: dumps.append(priority) or real_source_rules(self, priority, *family),
    )
    await converge(executors, netns, names, spec(names), rules(names))
    await converge(executors, netns, names, spec(names), rules(names))
    assert dumps == []

    table = links.reply_table("169.254.0.101")
    sh(f"ip rule del priority 31000 from 169.254.0.101 lookup {table}")
    sh("ip rule add priority 31000 from 169.254.0.101 lookup main")
    await converge(executors, netns, names, spec(names), rules(names))
    assert dumps == [links.RULE_PRIORITY]
    policy = sh("ip rule")
    assert f"from 169.254.0.101 lookup {table}" in policy and "from 169.254.0.101 lookup main" not in policy


class NoWrites:
    async def run(self, *args):
        raise AssertionError("the iptables thread was asked to write")


async def test_nat_passes_skip_an_unchanged_table_and_repair_an_edited_one(executors, lb):
    """converge_nat reads the table as one kernel blob: traffic counters do not
    count as a change, an edited rule or a new wanted rule does."""
    lb_id, names, netns = lb
    ns_exec, iptc_exec = executors
    await converge(executors, netns, names, spec(names), rules(names))
    changes, state = await iptables.converge_nat(ns_exec, iptc_exec, netns, rules(names), None)
    assert changes == 0
    sh(f"ip netns exec {netns} ip link set lo up")
    sh(f"ip netns exec {netns} iptables-legacy -t nat -I OUTPUT -j ACCEPT -m comment --comment counted")
    changes, state = await iptables.converge_nat(ns_exec, iptc_exec, netns, rules(names), None)
    sh(
        f'ip netns exec {netns} python3 -c "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)'
        ".sendto(b'x', ('127.0.0.1', 9))\""
    )
    assert " 1 " in sh(f"ip netns exec {netns} iptables-legacy -t nat -L OUTPUT -v -n")  # counters moved
    before = write_counts()
    # Unchanged: read on the namespace threads only, the iptables thread is not even asked.
    assert await iptables.converge_nat(ns_exec, NoWrites(), netns, rules(names), state) == (0, state)
    assert write_counts() == before

    sh(f"ip netns exec {netns} iptables-legacy -t nat -F LBAGENT-POST")
    changes, repaired = await iptables.converge_nat(ns_exec, iptc_exec, netns, rules(names), state)
    assert changes > 0 and repaired == state  # the table is back exactly as it was
    assert "--to-source 198.18.0.12" in sh(f"ip netns exec {netns} iptables-legacy-save -t nat")
    changes, moved = await iptables.converge_nat(
        ns_exec, iptc_exec, netns, rules(names, backend="198.18.0.22"), repaired
    )
    assert changes > 0 and moved != repaired
    assert "198.18.0.22:8000" in sh(f"ip netns exec {netns} iptables-legacy-save -t nat")


class FakeOvs:
    """The integration bridge, as far as OvnHost asks: this module tests the kernel half."""

    def __init__(self):
        self.ports: dict[str, PortState] = {}
        self.wants = []

    def converge_ports(self, wants):
        self.wants += wants
        for want in wants:
            self.ports[want.name] = PortState("br-int", dict(want.external_ids))
        return [self.ports[want.name] for want in wants]


@pytest.fixture
async def ovn_host(executors):
    ns_exec, iptc_exec = executors
    host = OvnHost(FakeOvs(), ns_exec, iptc_exec)
    yield host
    host.ovsdb.shutdown()


def host_spec(lb_id, netns, names):
    return HostSpec(lb_id, netns, spec(names), tuple(rules(names)))


async def test_a_new_namespace_is_built_in_batches_and_a_second_pass_writes_nothing(ovn_host, lb, monkeypatch):
    """A namespace the pass has just made is built without a read or a
    request of its own per object; what it builds is what converge wants."""
    lb_id, names, netns = lb
    one_by_one = []
    real_request = iplib.Netlink._request  # every read and write one at a time goes through it
    monkeypatch.setattr(
        iplib.Netlink, "_request", lambda self, op, *a, **k: one_by_one.append(op) or real_request(self, op, *a, **k)
    )
    sysctls = []
    real_sysctl = devconf.write_sysctl

    def write_sysctl(path, value, read_first=True):
        sysctls.append((path, read_first))
        return real_sysctl(path, value, read_first)

    monkeypatch.setattr(devconf, "write_sysctl", write_sysctl)
    before = write_counts()
    await ovn_host.converge(host_spec(lb_id, netns, names))
    assert one_by_one == []
    assert write_counts()["netlink"] - before["netlink"] >= 16  # each batched request is counted (and logged)
    assert_data_path(netns, names)
    # Each file under /proc/sys/net costs a compare per namespace on the machine to open: the
    # build reads none, and its forwarding comes with the batch.
    assert sysctls == [
        ("net/ipv6/conf/default/disable_ipv6", False),
        (f"net/ipv6/conf/{names.haproxy_host}/disable_ipv6", False),
    ]

    before = write_counts()
    await ovn_host.converge(host_spec(lb_id, netns, names))
    assert write_counts() == before
    assert one_by_one and "add veth" not in one_by_one  # the second pass observed, step by step


async def test_a_build_stopped_by_a_leftover_link_is_finished_step_by_step(ovn_host, lb, caplog):
    lb_id, names, netns = lb
    # An earlier life's host end, in the way (its peer goes with it at cleanup).
    sh(f"ip link add {names.haproxy_host} type veth peer name x{names.tag}9")
    with caplog.at_level(logging.INFO, logger="lbagent.ovnhost.host"):
        await ovn_host.converge(host_spec(lb_id, netns, names))
    assert f"add veth {names.haproxy_ns}: EEXIST" in caplog.text and "result=partial" in caplog.text
    assert_data_path(netns, names)
    before = write_counts()
    await ovn_host.converge(host_spec(lb_id, netns, names))
    assert write_counts() == before


async def test_a_build_puts_its_reply_rule_before_a_stale_one(ovn_host, lb):
    lb_id, names, netns = lb
    sh("ip rule add priority 31000 from 169.254.0.101 lookup main")  # left by an earlier life
    await ovn_host.converge(host_spec(lb_id, netns, names))
    policy = sh("ip rule")
    assert f"from 169.254.0.101 lookup {links.reply_table('169.254.0.101')}" in policy
    assert "from 169.254.0.101 lookup main" not in policy


async def test_a_port_is_reattached_after_a_pass_that_failed_past_the_new_veths(ovn_host, lb, monkeypatch):
    """New veths need their OVS port added anew; a pass that fails after making
    them (here: its NAT rules) must not leave the next pass to forget that."""
    lb_id, names, netns = lb
    real_nat = iptables.sync_nat
    monkeypatch.setattr(
        iptables, "sync_nat", lambda *a: (_ for _ in ()).throw(iptables.IptablesError("iptables nat: injected"))
    )
    with pytest.raises(iptables.IptablesError):
        await ovn_host.converge(host_spec(lb_id, netns, names))
    monkeypatch.setattr(iptables, "sync_nat", real_nat)
    await ovn_host.converge(host_spec(lb_id, netns, names))
    await ovn_host.converge(host_spec(lb_id, netns, names))
    assert [w.reattach for w in ovn_host._ovs.wants] == [True, False]


async def test_a_build_finished_step_by_step_still_reattaches_the_port(ovn_host, lb, monkeypatch):
    lb_id, names, netns = lb

    def host_fails(spec):
        raise links.LinkNotFound("find link", 19, spec.names.haproxy_host)

    monkeypatch.setattr(links, "build_host", host_fails)
    await ovn_host.converge(host_spec(lb_id, netns, names))
    assert_data_path(netns, names)
    assert [w.reattach for w in ovn_host._ovs.wants] == [True]


@pytest.mark.parametrize("path", ["step by step", "batched build"])
async def test_a_subnet_default_route_takes_the_gateways_place(executors, ovn_host, lb, path):
    """A route to 0.0.0.0/0 in the subnet's routes would fight the gateway's
    default route pass after pass; it replaces it instead."""
    lb_id, names, netns = lb
    with_default = dataclasses.replace(
        spec(names), routes=(("0.0.0.0/0", "198.18.0.254"), ("198.19.0.0/16", "198.18.0.254"))
    )
    if path == "batched build":
        await ovn_host.converge(HostSpec(lb_id, netns, with_default, tuple(rules(names))))
    else:
        await converge(executors, netns, names, with_default, rules(names))
    routes = sh(f"ip netns exec {netns} ip route")
    assert "default via 198.18.0.254" in routes and "via 198.18.0.1 " not in routes
    before = write_counts()
    await converge(executors, netns, names, with_default, rules(names))
    assert write_counts() == before
