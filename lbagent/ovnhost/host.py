"""`OvnHost`: everything one load balancer needs on this host, converged in one pass.

It owns the namespace `lb-<id>`, both veth pairs, addresses and routes, the
integration-bridge port bound by `iface-id`, and the NAT rules. It knows
nothing of haproxy or of the desired-state model: the supervisor hands it a
`HostSpec` and gets back what it observed.

What it makes carries this agent's mark (`inventory.owner_value` of its
host), and `inventory` lists only marked objects: the OVS port's owner key,
the host ends' ifalias (`links`), a mark file per namespace
(`netns.NamespaceMarks`). An `lb-` namespace or a veth named like ours that
someone else made is never garbage to this agent.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from contextlib import closing, nullcontext
from dataclasses import dataclass, replace

from lbagent.errors import LbAgentError
from lbagent.naming import NETNS_PREFIX, InterfaceNames, iface_id, names_from_interface, netns_name
from lbagent.ovnhost import iptables, links, snapshot
from lbagent.ovnhost.bridgeports import BridgePorts
from lbagent.ovnhost.errors import AlreadyExists, NamespaceError, NetlinkError
from lbagent.ovnhost.inventory import LB_KEY, Inventory, owner_host
from lbagent.ovnhost.iplib import Netlink
from lbagent.ovnhost.links import LinkSpec
from lbagent.ovnhost.nat import NatRule
from lbagent.ovnhost.netns import NamespaceExecutor, NamespaceMarks, list_netns, netns_exists, netns_path
from lbagent.ovnhost.ovs import OvsClient
from lbagent.ovnhost.rtnl_socket import open_socket
from lbagent.support.blocking import BlockingPool
from lbagent.support.coalesce import Coalescer
from lbagent.support.waits import InFlight

log = logging.getLogger(__name__)

NETDEV = "netdev"
LINKS_FREED_WITHIN = 5.0  # seconds the kernel gets to free a deleted namespace's links
LINKS_FREED_POLL = 0.05
MAX_RULE_REMOVALS = 1000  # reply rules removed after one read of the host's rules
MAX_SNAPSHOTS = 64  # resync looks in one namespace-thread job (a few ms each)
SNAPSHOT_GATHER = 0.1  # seconds a resync's look waits for others to share its job


@dataclass(frozen=True, slots=True)
class HostSpec:
    lb_id: str
    netns: str
    links: LinkSpec
    nat: tuple[NatRule, ...]

    def look(self) -> HostLook:
        """What a look at this load balancer's data path (`OvnHost.snapshot`) needs of this spec."""
        return HostLook(self.lb_id, self.netns, self.links, iptables.wanted_nat(self.nat))


@dataclass(frozen=True, slots=True)
class HostLook:
    """A `HostSpec` as a resync's look needs it: kept between passes, for as
    many load balancers as the host has, so it holds a digest of the NAT
    rules rather than the rules."""

    lb_id: str
    netns: str
    links: LinkSpec
    nat: iptables.WantedNat


@dataclass(frozen=True, slots=True)
class HostObservation:
    ovs_port: str
    ovn_installed: bool


class OvnHost:
    def __init__(self, ovs: OvsClient, namespaces: NamespaceExecutor, iptc: NamespaceExecutor):
        self._ovs = ovs
        self._namespaces = namespaces
        self._iptc = iptc
        # One thread: the IDL connection serialises transactions anyway, and
        # OVSDB work must not queue behind other kinds of blocking work.
        self.ovsdb = BlockingPool("ovsdb", 1)
        self._building = InFlight()  # passes about to add their port: new ports wait a little for theirs
        self._ports = BridgePorts(ovs, self.ovsdb, self._building)
        # Each removal reads every reply rule of the host: removals that arrive
        # together share one read (2,500 of them one by one took minutes).
        self._rule_removals = Coalescer(
            "reply-rule-removals", self._delete_rules, self._delete_rule, NetlinkError, MAX_RULE_REMOVALS
        )
        self._nat_states: dict[str, str] = {}  # lb id -> what its last pass left in its nat table
        self._reattach: set[str] = set()  # lb ids whose OVN-side veth is newer than their OVS port
        self._ports_seen: dict[str, tuple[int, bytes]] = {}  # OVS port -> (OVSDB change count, its last look)
        self._snapshots = Coalescer(
            "snapshots", self._take_snapshots, self._take_snapshot, NamespaceError, MAX_SNAPSHOTS, gather=_gather_looks
        )
        self._host_fd = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        # The owner the OVS client writes on its rows marks the links too; an
        # OVS stand-in without one (kernel-only tests) marks nothing.
        self.mark: str = getattr(ovs, "owner", "")
        self.netns_marks = NamespaceMarks(owner_host(self.mark) if self.mark else "")

    async def host_addresses(self) -> set[str]:
        return await self._namespaces.run(None, _read_host_addresses)

    async def bridge_is_netdev(self) -> bool:
        return await self.ovsdb.run(self._ovs.datapath_type) == NETDEV

    async def converge(self, spec: HostSpec) -> HostObservation:
        spec = replace(spec, links=replace(spec.links, mark=self.mark))
        # Off the loop: a look at the file system gives up the interpreter lock,
        # and while namespaces were being built the loop waited to get it back
        # (a tenth of its busy time in a cold start of 1,000).
        fresh, marked_now = await asyncio.to_thread(self._claim_namespace, spec.netns)
        if marked_now and not fresh:
            log.info("action=adopt object=netns lb=%s netns=%s", spec.lb_id, spec.netns)
        if fresh:
            # New veths (the old ones went with their namespace): the port must
            # be added anew, even if this pass fails before it gets that far.
            self._reattach.add(spec.lb_id)
        # Only a pass that is about to add its port is worth a new port's wait.
        with self._building.entered() if spec.lb_id in self._reattach else nullcontext():
            await self._converge_links_and_nat(spec, fresh)
        port = spec.links.names.ovn_host
        wanted_ids = {"iface-id": iface_id(spec.lb_id), LB_KEY: spec.lb_id}
        # A re-created veth has a new ifindex; the userspace datapath keeps its
        # socket on the old one until the port itself is re-added.
        observed = await self._ports.converge(port, wanted_ids, reattach=spec.lb_id in self._reattach)
        self._reattach.discard(spec.lb_id)
        return HostObservation(port, bool(observed and observed.ovn_installed))

    async def snapshot(self, look: HostLook, also: Callable[[], bytes]) -> bytes | None:
        """Everything `converge` would look at, as it is now, in one short value
        (see `snapshot`): the namespace and its mark, its links, addresses,
        routes and NAT tables, the host ends and the reply path, the OVS port.
        `also()` is read on the same thread and goes in too (the caller's own
        files). None if the look failed: the caller's whole pass finds out why.
        The looks of resyncs that come within `SNAPSHOT_GATHER` of each other
        share one job on a namespace thread: a hand-off to a thread and back
        cost as much as a third of a look."""
        return await self._snapshots.submit((look, also))

    async def _take_snapshots(self, looks: list[tuple[HostLook, Callable[[], bytes]]]) -> list[bytes | None]:
        return await self._namespaces.run(None, self._look_at_all, looks)

    def _look_at_all(self, looks: list[tuple[HostLook, Callable[[], bytes]]]) -> list[bytes | None]:
        """The looks of one job, their host parts asked over one socket."""
        try:
            host_socket = open_socket(strict=True)
        except NetlinkError as exc:  # no look without it: their whole passes find out why
            log.debug("action=snapshot result=error error=%r", str(exc))
            return [None] * len(looks)
        with closing(host_socket):
            return [self._snapshot_or_none(look, also, host_socket) for look, also in looks]

    async def _take_snapshot(self, look: tuple[HostLook, Callable[[], bytes]]) -> bytes | None:
        return (await self._take_snapshots([look]))[0]

    def _snapshot_or_none(self, look: HostLook, also: Callable[[], bytes], host_socket: socket.socket) -> bytes | None:
        try:
            return self._snapshot(look, also, host_socket)
        except (LbAgentError, OSError) as exc:
            log.debug("lb=%s action=snapshot result=error error=%r", look.lb_id, str(exc))
        except Exception as exc:  # a look's own defect: its whole pass runs, the others' looks stand
            log.warning("lb=%s action=snapshot result=error error=%r", look.lb_id, repr(exc), exc_info=True)
        return None

    def _snapshot(self, look: HostLook, also: Callable[[], bytes], host_socket: socket.socket) -> bytes:
        if self.netns_marks.dir and not self.netns_marks.is_marked(look.netns):
            return b"not marked"
        # No look for the namespace itself: entering one that is gone, or a stale
        # file where it was, fails (NamespaceError), and so does this look.
        return snapshot.digest(
            (
                self._namespaces.call(look.netns, snapshot.inside_namespace, look.links, look.nat),
                snapshot.on_host(look.links, host_socket),
                self._port_seen(look.links.names.ovn_host),
                also(),
            )
        )

    def _port_seen(self, port: str) -> bytes:
        """The OVS port as a snapshot keeps it. Looked up again only when the
        local copy of OVSDB has changed since the last look: a lookup takes
        the IDL's lock and builds Python objects of its rows, and a converged
        host's OVSDB hardly changes."""
        count = self._ovs.change_count()  # before the lookup: a change meanwhile makes the next look look again
        last = self._ports_seen.get(port)
        if last is not None and last[0] == count:
            return last[1]
        state = self._ovs.observe_port(port)
        seen = repr((state.on_bridge, sorted(state.external_ids.items()), state.ofport) if state else None).encode()
        self._ports_seen[port] = (count, seen)
        return seen

    def _claim_namespace(self, netns: str) -> tuple[bool, bool]:
        """(whether the namespace is still to be made, whether it was unmarked).
        Marked before it is made: a namespace of ours is never unmarked. Known
        and unmarked (made by an agent without marks): adopted."""
        fresh = not netns_exists(netns)
        return fresh, self.netns_marks.mark(netns)

    async def _converge_links_and_nat(self, spec: HostSpec, fresh: bool) -> None:
        """`fresh`: the namespace does not exist yet."""
        built = await self._make_namespace(spec) if fresh else None
        # The NAT rules need only the namespace (they name links, not indexes):
        # they go in on the iptables thread while the links are finished (a
        # resync's check of the table shares the namespace threads with them).
        created, nat = await asyncio.gather(
            self._finish_links(spec, built), self._converge_nat(spec), return_exceptions=True
        )
        if isinstance(created, BaseException):
            raise created
        if isinstance(nat, BaseException):
            raise nat
        if spec.links.names.ovn_ns in created:
            self._reattach.add(spec.lb_id)

    async def _make_namespace(self, spec: HostSpec) -> set[str] | None:
        """Make the namespace and, on the same thread, its veths, addresses and
        routes in batches (nothing to read in a namespace just made). Returns
        the namespace ends made; None if the build stopped part-way."""
        log.info("action=create object=netns lb=%s netns=%s", spec.lb_id, spec.netns)
        try:
            return await self._namespaces.create(spec.netns, links.build_namespace, spec.links, self._host_fd)
        except NetlinkError as exc:
            log.info("action=build object=links lb=%s result=partial error=%r", spec.lb_id, str(exc))
            return None

    async def _finish_links(self, spec: HostSpec, built: set[str] | None) -> set[str]:
        """The host side of a namespace `_make_namespace` built, in one batch; or,
        for any other namespace or a build that stopped part-way, the
        step-by-step converge, which finds what is there and finishes it."""
        if built is not None:
            try:
                await self._namespaces.run(None, links.build_host, spec.links)
                return built
            except NetlinkError as exc:
                log.info("action=build object=links lb=%s result=partial error=%r", spec.lb_id, str(exc))
        return await self._converge_links(spec)

    async def _converge_nat(self, spec: HostSpec) -> None:
        _, self._nat_states[spec.lb_id] = await iptables.converge_nat(
            self._namespaces, self._iptc, spec.netns, list(spec.nat), self._nat_states.get(spec.lb_id)
        )

    async def _converge_links(self, spec: HostSpec) -> set[str]:
        try:
            created = await self._namespaces.run(spec.netns, links.converge_namespace, spec.links, self._host_fd)
        except AlreadyExists:
            # A host end left over from an earlier life of this namespace
            # blocks the new pair: remove it and build the pair again.
            await self._namespaces.run(None, links.delete_host_links, spec.links.names)
            created = await self._namespaces.run(spec.netns, links.converge_namespace, spec.links, self._host_fd)
        await self._namespaces.run(None, links.converge_host, spec.links)
        return created

    async def read_allocation(self, lb_id: str) -> tuple[str, str, str, dict[str, int], tuple[str, str] | None] | None:
        """What an existing namespace says about its allocation: (tag, inner,
        outer, ports, the IPv6 pair if it serves IPv6). Used when the state file
        is lost, so an adopted load balancer keeps its addresses and backend ports."""
        netns = netns_name(lb_id)
        if not netns_exists(netns):
            return None
        inside = await self._namespaces.run(netns, links.read_namespace_links)
        haproxy_ns = next((n for n in inside if n.startswith("h") and n.endswith("0")), None)
        if haproxy_ns is None or not inside[haproxy_ns]:
            return None
        names = names_from_interface(haproxy_ns)
        if names is None:  # not one of ours (read_namespace_links lists only ours)
            return None
        outer = await self._namespaces.run(None, _read_address, names.haproxy_host)
        if not outer:
            return None
        ports = await self._iptc.run(netns, iptables.observed_backend_ports)
        inner6 = await self._namespaces.run(netns, links.ipv6_address, haproxy_ns)
        outer6 = await self._namespaces.run(None, links.ipv6_address, names.haproxy_host) if inner6 else ""
        return names.tag, inside[haproxy_ns], outer, ports, (inner6, outer6) if inner6 and outer6 else None

    async def inventory(self) -> Inventory:
        """Everything on this host that carries our marks."""
        marked = await self._namespaces.run(None, links.marked_host_links, self.mark)
        rules = await self._namespaces.run(None, links.reply_rule_sources)
        ports = await self.ovsdb.run(self._ovs.owned_ports)
        return Inventory(
            frozenset(await self._namespaces.run(None, self._marked_netns)),
            frozenset(marked),
            frozenset(ports),
            reply_rules=frozenset(rules),
        )

    def _marked_netns(self) -> set[str]:
        """Our namespaces: those that exist and carry our mark. A mark without
        its namespace goes (one being made now is marked again by its pass)."""
        existing = set(list_netns(NETNS_PREFIX))
        marks = self.netns_marks.marked()
        for stale in marks - existing:
            self.netns_marks.unmark(stale)
        return marks & existing

    async def delete_orphan(self, kind: str, name: str) -> None:
        if kind == "netns":
            await self._namespaces.delete(name)
            self.netns_marks.unmark(name)
        elif kind == "links":
            await self._namespaces.run(None, links.delete_link, name)
        elif kind == "ovs_ports":
            await self._ports.delete(name)
        elif kind == "reply_rules":
            await self._rule_removals.submit(name)
        else:
            raise ValueError(f"unknown kind of object {kind!r}")

    async def remove(
        self, lb_id: str, netns: str, names: InterfaceNames, outer: str, outer6: str | None = None
    ) -> None:
        """Remove everything converge() made; safe on partial or absent state.
        `outer6`: the IPv6 OUTER whose reply rule goes too, if it may have one.
        (Each counted write logs its own line; the namespace is not counted.)"""
        self._nat_states.pop(lb_id, None)
        self._reattach.discard(lb_id)
        self._ports_seen.pop(names.ovn_host, None)
        for source in (outer, outer6) if outer6 else (outer,):
            await self._rule_removals.submit(source)
        await self._ports.delete(names.ovn_host)
        if os.path.exists(netns_path(netns)):  # mounted or a stale file: both go
            # Its veth pairs, host ends included, go with it: the kernel frees
            # a namespace's links together, and one link alone costs it far
            # more (2,500 of them took minutes, one after another).
            await self._namespaces.delete(netns)
            log.info("action=delete object=netns lb=%s netns=%s", lb_id, netns)
            await self._wait_host_ends_freed(names)
        else:
            await self._namespaces.run(None, links.delete_host_links, names)
        self.netns_marks.unmark(netns)

    async def _wait_host_ends_freed(self, names: InterfaceNames) -> None:
        """The kernel frees a deleted namespace's links in the background: wait
        for its host ends (a pass that builds the load balancer again wants
        their names), and delete those it has not freed in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINKS_FREED_WITHIN
        # Off the loop: while namespaces are being freed a look in sysfs waits
        # behind the kernel's own work (380 ms seen with a thousand going).
        while await asyncio.to_thread(_any_link_exists, names.host_ends):
            if loop.time() >= deadline:
                await self._namespaces.run(None, links.delete_host_links, names)
                return
            await asyncio.sleep(LINKS_FREED_POLL)

    async def _delete_rules(self, outers: list[str]) -> list[bool]:
        deleted = set(await self._namespaces.run(None, links.delete_reply_rules, set(outers)))
        return [outer in deleted for outer in outers]

    async def _delete_rule(self, outer: str) -> bool:
        return (await self._delete_rules([outer]))[0]


async def _gather_looks(looks: list) -> None:
    await asyncio.sleep(SNAPSHOT_GATHER)


def _any_link_exists(names: tuple[str, ...]) -> bool:
    return any(map(links.link_exists, names))


def _read_address(name: str) -> str:
    with Netlink.open() as nl:
        link = nl.link(name)
        addresses = sorted(a.address for a in nl.addresses(link.index)) if link else []
    return addresses[0] if addresses else ""


def _read_host_addresses() -> set[str]:
    with Netlink.open() as nl:
        return nl.all_addresses()
