"""The floor of P1: what building N load balancers' kernel objects costs at the least.

One minimal in-process client makes, for every load balancer, what the agent
makes in the kernel (see ../shared/design.md and lbagent/ovnhost/links.py):

- a named network namespace;
- two veth pairs, created with their final MAC, MTU and state and the
  namespace ends placed in the namespace in the same request;
- inside: the VIP on the OVN-side end, INNER/16 on the haproxy-side end, the
  default route via the subnet gateway, TX checksum offload off (userspace
  datapath), IPv4 forwarding on both ends, and the nat table (two owned
  chains, the jumps, a DNAT per listener and per backend, the SNAT, all with
  comments) in one python-iptables commit, the rules built by the agent's
  own `nat_rules` and `iptables.build_rule`;
- on the host: OUTER/16 noprefixroute, the route to INNER/32, the reply table
  (two routes) and its policy rule, plus the two shared skip rules once.

It reads nothing back and decides nothing. Requests are encoded by the
agent's own batch client (`lbagent.ovnhost.rtnl_batch`: pyroute2's message
classes without its per-request machinery, a fraction of `IPBatch`'s cost)
and sent as two batches per load balancer, one write each: one on the host's
netlink socket, one on the namespace's (opened while the thread is inside it,
so it acts there without entering again); interface indexes are chosen up
front so a batch can name the links it creates. One setns() out of each new
namespace.
The OVS ports are added in one OVSDB transaction for all load balancers,
timed separately (`ovs_seconds`): the floor the agent is held to is the kernel part.

Everything carries the run's prefix (namespace names, link names) or lives
in ranges the agent does not use (reply tables 0x4C43xxxx, rule priorities
32099-32199), and `remove_floor` deletes it again.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass

from pyroute2 import IPRoute
from pyroute2 import netns as pyroute_netns

from lbagent.desired.members import Member
from lbagent.ovnhost import (
    ethtool,  # the SIOCETHTOOL ioctl, no fork: acts in the socket's namespace
    iptables,
)
from lbagent.ovnhost.iplib import KernelRoute
from lbagent.ovnhost.iptc_import import iptc
from lbagent.ovnhost.nat import CHAIN_HOOKS, NatPlan, nat_rules
from lbagent.ovnhost.rtnl_batch import RtnlBatch
from lbagent.ovnhost.rtnl_socket import open_socket

CLONE_NEWNET = 0x40000000
RULE_PRIORITY = 32100
SKIP_PRIORITY = RULE_PRIORITY - 1
SKIP_TARGET = RULE_PRIORITY + 99
TABLE_BASE = 0x4C430000  # the agent uses 0x4C42xxxx
PAIR_BASE = int(ipaddress.IPv4Address("169.254.200.1"))
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class FloorLb:
    """One load balancer's kernel objects, as the floor makes them."""

    netns: str
    ovn_ns: str
    ovn_host: str
    haproxy_ns: str
    haproxy_host: str
    mac: str
    vip: str
    prefixlen: int
    gateway: str
    mtu: int
    inner: str
    outer: str
    table: int
    listener_ports: tuple[int, ...]
    members: tuple[tuple[str, str, int, int], ...]  # (key, address, port, mapped port)


def plan_floor(prefix: str, lbs: list[dict], subnet: dict, host_addresses: set[str]) -> list[FloorLb]:
    """FloorLb for every load balancer of a desired state (`lbs`: api.md bodies)."""
    net = ipaddress.IPv4Network(subnet["cidr"])
    planned = []
    cursor = PAIR_BASE
    for index, lb in enumerate(lbs):
        while {str(ipaddress.IPv4Address(cursor)), str(ipaddress.IPv4Address(cursor + 1))} & host_addresses:
            cursor += 2
        inner, outer = str(ipaddress.IPv4Address(cursor)), str(ipaddress.IPv4Address(cursor + 1))
        cursor += 2
        tag = f"{prefix[:6]}{index:05x}"  # <= 11 characters, + 2 below: <= 13 of the 15 allowed
        members, port = [], 1025
        for group in lb["backend_groups"]:
            for backend in group["backends"]:
                members.append((backend["id"], backend["address"], backend["port"], port))
                port += 1
        planned.append(
            FloorLb(
                netns=f"{prefix}-f{index}",
                ovn_ns=f"{tag}o0",
                ovn_host=f"{tag}o1",
                haproxy_ns=f"{tag}h0",
                haproxy_host=f"{tag}h1",
                mac=lb["network"]["mac"],
                vip=lb["network"]["ip"],
                prefixlen=net.prefixlen,
                gateway=subnet["gateway"],
                mtu=subnet.get("mtu", 1500),
                inner=inner,
                outer=outer,
                table=TABLE_BASE + index,
                listener_ports=tuple(listener["listener_port"] for listener in lb["listeners"]),
                members=tuple(members),
            )
        )
    return planned


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns")


def _in_thread(fn, *args):
    """Run fn on a fresh thread (namespace switches must never touch the caller's thread)."""
    box: dict = {}

    def work() -> None:
        try:
            box["result"] = fn(*args)
        except BaseException as exc:  # re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=work, name="bench-floor")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")


def build_floor(lbs: list[FloorLb], tx_checksum_off: bool) -> float:
    """Make every load balancer's kernel objects; return the seconds it took."""
    return _in_thread(_build, lbs, tx_checksum_off)


def _build(lbs: list[FloorLb], tx_checksum_off: bool) -> float:
    host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    _warm_up_iptc(host_fd)
    started = time.perf_counter()
    try:
        batch = RtnlBatch()  # encodes requests, sends them in one write, reads every answer
        host = open_socket()
        try:
            # Interface indexes chosen by us, so that a whole batch can name
            # links it creates itself: no lookups, no waiting between requests.
            next_index = max(_host_indexes()) + 1000
            batch.add_skip_rules("169.254.0.0", 16, SKIP_PRIORITY, SKIP_TARGET)
            batch.send(host)
            for lb in lbs:
                _build_one(batch, host, host_fd, lb, next_index, tx_checksum_off)
                next_index += 2
        finally:
            host.close()
    finally:
        os.close(host_fd)
    return time.perf_counter() - started


WARM_UP_PLAN = NatPlan(
    "lo", "lo", "127.0.0.1", "127.0.0.2", "127.0.0.3", (1,), (Member("warm-up", "127.0.0.1", 1, 1, "off", False, 2),)
)


def _warm_up_iptc(host_fd: int) -> None:
    """Load python-iptables' modules once, in a scratch namespace.

    The first rule that jumps to a user chain makes python-iptables open four
    sockets that it never closes. Opened in a load balancer's namespace they
    would keep it alive after its deletion (and its veths with it); opened
    in an unnamed scratch namespace they keep only that, empty, until exit.
    """
    if _libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    try:
        table = iptc.Table(iptc.Table.NAT, autocommit=False)
        table.refresh()
        try:
            for chain in CHAIN_HOOKS:
                table.create_chain(chain)
            for rule in nat_rules(WARM_UP_PLAN):
                iptables.build_rule(rule)
        finally:
            table.close()
    finally:
        _setns(host_fd)


def _host_indexes() -> list[int]:
    return [int(open(f"/sys/class/net/{name}/ifindex").read()) for name in os.listdir("/sys/class/net")]


NS_OVN_INDEX, NS_HAPROXY_INDEX, LO_INDEX = 2, 3, 1


def _build_one(
    batch: RtnlBatch, host: socket.socket, host_fd: int, lb: FloorLb, index: int, tx_checksum_off: bool
) -> None:
    # The namespace: this thread enters it, makes what must be made from inside
    # (nat table, the sockets), and comes back once.
    if _libc.unshare(CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    try:
        pyroute_netns.attach(lb.netns, "thread-self")
        inside = open_socket()  # bound to the namespace for good
        ioctl_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        _write_nat(lb)
        ns_fd = os.open(f"/run/netns/{lb.netns}", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        _setns(host_fd)
    o1, h1 = index, index + 1
    try:
        # Host side, one batch: both pairs (host ends up, the namespace ends
        # made in the namespace), OUTER, the route to INNER, the reply table
        # and its rule.
        batch.add_veth(
            lb.ovn_host,
            lb.ovn_ns,
            ns_fd,
            mtu=lb.mtu,
            peer_mtu=lb.mtu,
            peer_mac=lb.mac,
            index=o1,
            peer_index=NS_OVN_INDEX,
        )
        batch.add_veth(lb.haproxy_host, lb.haproxy_ns, ns_fd, index=h1, peer_index=NS_HAPROXY_INDEX)
        batch.add_address(h1, lb.haproxy_host, lb.outer, 16, noprefixroute=True)
        batch.replace_route(KernelRoute(f"{lb.inner}/32", None, h1, lb.outer))
        batch.replace_route(KernelRoute(f"{lb.inner}/32", None, h1, lb.outer, lb.table))
        batch.replace_route(KernelRoute("0.0.0.0/0", lb.inner, h1, None, lb.table))
        batch.add_source_rule(lb.outer, lb.table, RULE_PRIORITY)
        batch.send(host)
    finally:
        os.close(ns_fd)
    with ioctl_sock:
        try:
            # Inside, one batch on the namespace's own socket.
            for link, name in ((LO_INDEX, "lo"), (NS_OVN_INDEX, lb.ovn_ns), (NS_HAPROXY_INDEX, lb.haproxy_ns)):
                batch.set_up(link, name)
            batch.add_address(NS_OVN_INDEX, lb.ovn_ns, lb.vip, lb.prefixlen)
            batch.add_address(NS_HAPROXY_INDEX, lb.haproxy_ns, lb.inner, 16)
            batch.replace_route(KernelRoute("0.0.0.0/0", lb.gateway, NS_OVN_INDEX, None))
            for link, name in ((NS_OVN_INDEX, lb.ovn_ns), (NS_HAPROXY_INDEX, lb.haproxy_ns)):
                batch.forward_ipv4(link, name)  # as the agent does: no file under /proc/sys/net
            batch.send(inside)
            if tx_checksum_off:
                _tx_checksum_off(ioctl_sock, lb.ovn_ns)
        finally:
            inside.close()


def _tx_checksum_off(sock: socket.socket, ifname: str) -> None:
    """ethtool -K <ifname> tx off, on a socket of the namespace (the ioctl acts in the socket's namespace)."""
    import fcntl

    value = ethtool._EthtoolValue(ethtool.ETHTOOL_STXCSUM, 0)
    ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(value)) + b"\0" * 16
    fcntl.ioctl(sock.fileno(), ethtool.SIOCETHTOOL, ifreq)


def _write_nat(lb: FloorLb) -> None:
    """The namespace's nat table in one commit (this thread is inside the namespace):
    the agent's own rules, built as the agent builds them."""
    members = tuple(Member(key, address, port, 1, "off", False, mapped) for key, address, port, mapped in lb.members)
    rules = nat_rules(NatPlan(lb.ovn_ns, lb.haproxy_ns, lb.vip, lb.inner, lb.outer, lb.listener_ports, members))
    table = iptc.Table(iptc.Table.NAT, autocommit=False)
    table.refresh()  # the handle is cached process-wide: make it this namespace's
    try:
        for chain in CHAIN_HOOKS:
            table.create_chain(chain)
        for rule in rules:
            table.append_entry(rule.chain, iptables.rule_entry(rule))
        table.commit()
    finally:
        table.close()  # leave no handle (and socket) pinned to this namespace


def add_ovs_ports(vsctl, bridge: str, lbs: list[FloorLb]) -> float:
    """Every OVN-side host end on the integration bridge, in one transaction; the seconds it took.

    No iface-id: the floor's ports must not bind the load balancers' logical
    ports, which the agent binds later in the same run.
    """
    started = time.perf_counter()
    args: list[str] = []
    for lb in lbs:
        args += ["--", "add-port", bridge, lb.ovn_host]
    if args:
        vsctl(*args[1:], timeout=600)
    return time.perf_counter() - started


def delete_netns(name: str) -> None:
    """`ip netns del`: unmount and unlink /run/netns/<name> (the kernel frees it, veths included)."""
    path = f"/run/netns/{name}"
    if _libc.umount2(path.encode(), 2) != 0 and ctypes.get_errno() not in (errno.EINVAL, errno.ENOENT):
        raise OSError(ctypes.get_errno(), f"umount {path}")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def remove_floor(lbs: list[FloorLb], vsctl=None, bridge: str = "br-int") -> list[str]:
    """Delete everything build_floor (and add_ovs_ports) made; problems as text, [] when all went.

    The namespaces go first: each takes its veth pairs with it, host ends
    included, so nothing is deleted link by link. The host's policy rules
    and routes of the reply tables follow (the routes went with the links).
    """
    problems: list[str] = []
    if vsctl is not None:
        args: list[str] = []
        for lb in lbs:
            args += ["--", "--if-exists", "del-port", bridge, lb.ovn_host]
        try:
            if args:
                vsctl(*args[1:], timeout=600)
        except Exception as exc:  # noqa: BLE001 - reported, the rest still goes
            problems.append(f"OVS ports: {exc}")
    for lb in lbs:
        try:
            delete_netns(lb.netns)
        except OSError as exc:
            problems.append(f"namespace {lb.netns}: {exc}")
    names = {n for lb in lbs for n in (lb.ovn_host, lb.haproxy_host)}
    deadline = time.monotonic() + 120
    while names & set(os.listdir("/sys/class/net")) and time.monotonic() < deadline:
        time.sleep(0.1)  # the kernel tears namespaces down asynchronously
    tables = {lb.table for lb in lbs}
    with IPRoute() as host:
        for name in sorted(names & set(os.listdir("/sys/class/net"))):
            try:
                host.link("del", ifname=name)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"link {name}: {exc}")
        for rule in host.get_rules(family=socket.AF_INET):
            priority = rule.get("FRA_PRIORITY")
            table = rule.get("FRA_TABLE") or rule["table"]
            try:
                if priority == RULE_PRIORITY and table in tables:
                    host.rule("del", priority=priority, src=rule.get("FRA_SRC"), src_len=32, table=table)
                elif priority in (SKIP_PRIORITY, SKIP_TARGET):
                    host.rule("del", priority=priority)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"rule at {priority}: {exc}")
    return problems
