"""A dual-stack load balancer's NAT rules on the real kernel, without OVS: the
IPv6 rules land in the legacy ip6tables tables (what python-iptables writes,
so what `ip6tables-legacy-save` shows), converge to no writes, are repaired
when edited, leave the IPv6 tables of an IPv4-only load balancer alone, and
carry IPv6 traffic through the DNAT."""

import os
import secrets
import select
import subprocess
import sys

import pytest

from lbagent.desired.members import Member
from lbagent.metrics import write_counts
from lbagent.ovnhost import iptables
from lbagent.ovnhost.nat import NatPlan, UdpAcl, UdpListener, nat_rules
from lbagent.ovnhost.netns import delete_netns

from helpers import sh

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

VIP6, INNER6, OUTER6 = "2001:db8:1::12", "fd4c:4241::100", "fd4c:4241::101"
CLIENT6 = "2001:db8:1::2"
MEMBERS = (
    Member("be-1", "198.18.0.21", 8000, 1, "off", False, 1025),
    Member("be-6", "2001:db8:2::21", 8080, 1, "off", False, 1026),
    Member("be-7", "2001:db8:2::22", 8080, 2, "off", False, 1027),
)
WAIT_SECONDS = 10


@pytest.fixture
def prefix():
    """A unique prefix for this test's namespaces and links; all are removed afterwards."""
    tag = "t6" + secrets.token_hex(3)
    made: list[str] = []
    yield tag, made
    for netns in made:
        if os.path.exists(f"/run/netns/{netns}"):
            delete_netns(netns)


def plan(tag: str, dual: bool = True, members=MEMBERS) -> NatPlan:
    v6 = dict(vip6=VIP6, inner6=INNER6, outer6=OUTER6) if dual else {}
    return NatPlan(
        f"o{tag}",
        f"h{tag}",
        "198.18.0.12",
        "169.254.0.100",
        "169.254.0.101",
        (80,),
        members,
        udp=(UdpListener(53, members, source_hash=True, acl=UdpAcl("white", ("198.18.0.0/24", "2001:db8:1::/64"))),),
        **v6,
    )


async def fresh_namespace(executors, prefix) -> str:
    tag, made = prefix
    netns = f"lb-{tag}{len(made)}"
    made.append(netns)
    await executors[0].create(netns)
    return netns


def save(netns: str, tool: str, table: str) -> str:
    return "\n".join(line for line in sh(f"ip netns exec {netns} {tool} -t {table}").splitlines() if line[:1] != "#")


def ip6_tables(netns: str) -> set[str]:
    return set(sh(f"ip netns exec {netns} cat /proc/net/ip6_tables_names").split())


async def test_dual_stack_rules_converge_in_the_ip6_tables_and_are_repaired(executors, prefix):
    ns_exec, iptc_exec = executors
    tag, _ = prefix
    netns = await fresh_namespace(executors, prefix)
    rules = nat_rules(plan(tag))

    changes, state = await iptc_exec.run(netns, iptables.write_nat, rules)
    assert changes > 0
    nat6 = save(netns, "ip6tables-legacy-save", "nat")
    assert f"-d {VIP6}/128 -i o{tag} -p tcp -m tcp --dport 80" in nat6
    assert f"-j DNAT --to-destination [{OUTER6}]:80" in nat6
    assert f"-d {INNER6}/128 -i h{tag} -p tcp -m tcp --dport 1026" in nat6
    assert "-j DNAT --to-destination [2001:db8:2::21]:8080" in nat6
    assert f"-o o{tag}" in nat6 and f"-j SNAT --to-source {VIP6}" in nat6
    assert "--hmark-src-prefix 128" in nat6 and "udp/53" in nat6
    assert "198.18." not in nat6 and "169.254." not in nat6
    filter6 = save(netns, "ip6tables-legacy-save", "filter")
    assert "-s 2001:db8:1::/64" in filter6 and f"--ctorigdst {VIP6}" in filter6 and "-j DROP" in filter6
    nat4 = save(netns, "iptables-legacy-save", "nat")
    assert "--to-destination 198.18.0.21:8000" in nat4 and "--hmark-src-prefix 32" not in nat4  # one IPv4 member
    assert "2001:db8" not in nat4 and "fd4c" not in nat4
    assert await iptc_exec.run(netns, iptables.observed_backend_ports) == {"be-1": 1025, "be-6": 1026, "be-7": 1027}

    before = write_counts()
    assert await iptc_exec.run(netns, iptables.sync_nat, rules) == 0
    assert write_counts() == before
    assert await iptables.converge_nat(ns_exec, iptc_exec, netns, rules, state) == (0, state)

    # An edited IPv6 rule, a foreign one in our IPv6 chain, an emptied IPv6 chain:
    # the digest of the ip6 tables sees each, the next pass puts them back.
    sh(f"ip netns exec {netns} ip6tables-legacy -t nat -R LBAGENT-PRE 1 -p tcp --dport 81 -j ACCEPT")
    assert await ns_exec.run(netns, iptables.nat_state, rules) != state
    sh(f"ip netns exec {netns} ip6tables-legacy -t nat -A LBAGENT-PRE -j ACCEPT")
    sh(f"ip netns exec {netns} ip6tables-legacy -t nat -F LBAGENT-POST")
    changes, repaired = await iptables.converge_nat(ns_exec, iptc_exec, netns, rules, state)
    assert changes == 4  # the edited rule out and in again, the foreign one out, SNAT in again
    # the same rules, the edited one now last in its chain
    assert sorted(save(netns, "ip6tables-legacy-save", "nat").splitlines()) == sorted(nat6.splitlines())
    assert await iptables.converge_nat(ns_exec, iptc_exec, netns, rules, repaired) == (0, repaired)
    sh(f"ip netns exec {netns} ip6tables-legacy -t filter -F LBAGENT-ACL")
    changes, refiltered = await iptables.converge_nat(ns_exec, iptc_exec, netns, rules, repaired)
    assert changes == 2 and refiltered == repaired  # the list appended again in order: as it was
    assert save(netns, "ip6tables-legacy-save", "filter") == filter6


async def test_an_ipv4_only_plan_leaves_the_ip6_tables_without_rules(executors, prefix):
    ns_exec, iptc_exec = executors
    tag, _ = prefix
    ipv4_only = nat_rules(plan(tag, dual=False))

    untouched = await fresh_namespace(executors, prefix)
    await iptc_exec.run(untouched, iptables.write_nat, ipv4_only)
    assert ip6_tables(untouched) == set()  # an IPv4-only namespace gets no ip6tables state

    netns = await fresh_namespace(executors, prefix)
    await iptc_exec.run(netns, iptables.write_nat, nat_rules(plan(tag)))
    assert ip6_tables(netns) == {"nat", "filter"}
    changes, state = await iptc_exec.run(netns, iptables.write_nat, ipv4_only)
    assert changes > 0
    for table in ("nat", "filter"):
        assert "-A " not in save(netns, "ip6tables-legacy-save", table)
        assert "LBAGENT" not in save(netns, "ip6tables-legacy-save", table)
    assert "--to-destination 198.18.0.21:8000" in save(netns, "iptables-legacy-save", "nat")
    assert await iptc_exec.run(netns, iptables.sync_nat, ipv4_only) == 0
    assert await iptables.converge_nat(ns_exec, iptc_exec, netns, ipv4_only, state) == (0, state)
    # The empty ip6 nat table is still read for drift: a rule written into it is taken out.
    sh(f"ip netns exec {netns} ip6tables-legacy -t nat -N LBAGENT-PRE")
    changes, again = await iptables.converge_nat(ns_exec, iptc_exec, netns, ipv4_only, state)
    assert changes == 1 and again == state


SERVER = """
import socket, sys
server = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((sys.argv[1], int(sys.argv[2])))
server.listen()
print("listening", flush=True)
while True:
    conn, peer = server.accept()
    conn.sendall(f"{peer[0]} -> {conn.getsockname()[0]}".encode())
    conn.close()
"""


@pytest.fixture
def serve():
    """Start a TCP server that answers "<client address> -> <its address>"; stopped afterwards."""
    started: list[subprocess.Popen] = []

    def start(netns: str, address: str, port: int) -> None:
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-c", SERVER, address, str(port)],
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(server)
        assert server.stdout is not None
        ready, _, _ = select.select([server.stdout], [], [], WAIT_SECONDS)
        assert ready and server.stdout.readline().strip() == "listening"

    yield start
    for server in started:
        server.kill()
        server.wait(timeout=WAIT_SECONDS)


def fetch(netns: str, address: str, port: int, source: str = "::") -> str:
    """What the server said, and whom the client thinks it talked to."""
    connect = (
        "import socket; "
        f"s = socket.create_connection(('{address}', {port}), {WAIT_SECONDS}, ('{source}', 0)); "
        "print(s.recv(200).decode(), s.getpeername()[0])"
    )
    return sh(f'ip netns exec {netns} {sys.executable} -c "{connect}"').strip()


async def test_ipv6_traffic_through_the_dnat_and_snat(executors, prefix, serve):
    """client/member --(o<tag>)-- load balancer namespace --(h<tag>)-- "host" with OUTER6.
    A connection to [VIP6]:80 is DNATed to [OUTER6]:80 with the client's address
    kept; haproxy's connection to [INNER6]:mapped_port is DNATed to the IPv6
    member and leaves towards it from the VIP."""
    _, iptc_exec = executors
    tag, made = prefix
    netns = await fresh_namespace(executors, prefix)
    vpc, host = f"c-{tag}", f"s-{tag}"
    for name in (vpc, host):
        made.append(name)
        sh(f"ip netns add {name}")
    sh(f"ip link add o{tag} netns {netns} type veth peer name c{tag} netns {vpc}")
    sh(f"ip link add h{tag} netns {netns} type veth peer name s{tag} netns {host}")
    member = "2001:db8:1::21"  # be-6's port on INNER6 leads here (plan below)
    for ns, dev, addresses, gateway in (
        (netns, f"o{tag}", (VIP6,), None),
        (netns, f"h{tag}", (INNER6,), None),
        (vpc, f"c{tag}", (CLIENT6, member), None),
        (host, f"s{tag}", (OUTER6,), INNER6),
    ):
        for address in addresses:
            sh(f"ip netns exec {ns} ip addr add {address}/64 dev {dev} nodad")
        sh(f"ip netns exec {ns} ip link set {dev} up")
        if gateway:
            sh(f"ip netns exec {ns} ip -6 route add default via {gateway}")
    sh(f"ip netns exec {netns} sysctl -qw net.ipv6.conf.all.forwarding=1")
    members = (
        Member("be-4", "198.18.0.21", 8000, 1, "off", False, 1025),
        Member("be-6", member, 8080, 1, "off", False, 1026),
    )
    await iptc_exec.run(netns, iptables.write_nat, nat_rules(plan(tag, members=members)))

    serve(host, OUTER6, 80)
    assert fetch(vpc, VIP6, 80, source=CLIENT6) == f"{CLIENT6} -> {OUTER6} {VIP6}"
    serve(vpc, member, 8080)
    assert fetch(host, INNER6, 1026) == f"{VIP6} -> {member} {INNER6}"
