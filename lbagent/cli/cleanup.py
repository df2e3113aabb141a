"""`lbagent cleanup`: remove everything this agent created on this host, and only that.

What is ours is what our state file allocated and what carries our marks: OVS
interfaces whose owner key names this agent's host, and the namespaces and
links derived from those load balancers' ids; then host links whose ifalias
is this agent's mark and namespaces with this agent's mark file (orphans of
load balancers the state file no longer records). Other agents' and foreign
objects are never touched, even if their names look alike.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import TypeVar

from lbagent.config import Config
from lbagent.haproxy.manager import HaproxyManager
from lbagent.naming import InterfaceNames, interface_names, names_from_interface, netns_name
from lbagent.ovnhost import links
from lbagent.ovnhost.bridges import ProviderBridges, bridge_name
from lbagent.ovnhost.inventory import owner_value
from lbagent.ovnhost.netns import NamespaceMarks, delete_netns, netns_path
from lbagent.ovnhost.ovs import OvsClient
from lbagent.state import StateFileError, StateStore

# Namespaces are deleted a few at a time: each is an unmount and an unlink,
# and the kernel frees the network namespace behind it on its own.
CLEANUP_THREADS = 8
PORTS_PER_TRANSACTION = 500
LINKS_GONE_WITHIN = 60.0  # seconds the kernel gets to free the links of deleted namespaces
T = TypeVar("T")
Progress = Callable[[str], None]


def _quiet(line: str) -> None:
    del line


async def cleanup_host(config: Config, progress: Progress = _quiet) -> list[str]:
    """Remove what is ours; `progress` gets a line now and then (the CLI shows
    it on a terminal: thousands of namespaces take a while)."""
    report: list[str] = []
    haproxy = HaproxyManager(config.haproxy.binary, config.agent.run_dir)
    if await haproxy.stop():
        report.append("stopped haproxy")
    report += [f"removed haproxy file {f}" for f in await asyncio.to_thread(haproxy.remove_files)]

    store = StateStore(config.agent.state_dir)
    try:
        allocations = store.load().allocations
    except StateFileError as exc:
        report.append(f"warning: state file unreadable ({exc}); cleaning by OVS marks only")
        allocations = {}
    owned: dict[str, InterfaceNames] = {lb_id: interface_names(lb_id, a.salt) for lb_id, a in allocations.items()}

    ovs = OvsClient(config.ovs.db, config.ovs.integration_bridge, config.agent.host)
    try:
        await asyncio.to_thread(ovs.start)
        bridges = ProviderBridges(ovs)
        for network in await asyncio.to_thread(bridges.owned_networks):
            await asyncio.to_thread(bridges.remove, network)
            report.append(f"removed provider bridge {bridge_name(network)} (its interface got its addresses back)")
        ports = await asyncio.to_thread(ovs.owned_ports)
        for port, lb_id in ports.items():
            names = names_from_interface(port)
            if lb_id and names is not None:
                owned.setdefault(lb_id, names)
        report += await _delete_ports(ovs, sorted(ports), progress)
    except Exception as exc:  # OVS may be down; the rest can still be cleaned
        report.append(f"warning: OVS ports not cleaned: {exc}")
    finally:
        await asyncio.to_thread(ovs.stop)

    report += await _in_threads(_remove_load_balancer, sorted(owned.items()), progress, "load balancers")
    # The kernel frees deleted namespaces, their links with them, in batches
    # of its own; one link deleted alone costs it far more.
    await asyncio.to_thread(
        links.wait_gone, {n for names in owned.values() for n in names.host_ends}, LINKS_GONE_WITHIN
    )
    for name in sorted(await asyncio.to_thread(links.marked_host_links, owner_value(config.agent.host))):
        if await asyncio.to_thread(links.delete_link, name):
            report.append(f"removed link {name}")
    marks = NamespaceMarks(config.agent.host)
    report += await _in_threads(_remove_namespace, sorted(marks.marked()), progress, "orphan namespaces")
    marks.remove_all()
    outers = {a.outer for a in allocations.values()} | {a.outer6 for a in allocations.values() if a.outer6}
    report += [f"removed policy rule from {o}" for o in await asyncio.to_thread(links.delete_reply_rules, outers)]
    if store.path.exists():
        store.path.unlink()
        report.append(f"removed state file {store.path}")
    return report or ["nothing to clean up"]


async def _delete_ports(ovs: OvsClient, ports: list[str], progress: Progress = _quiet) -> list[str]:
    """In transactions of many ports: each one is a reconfiguration of the whole bridge."""
    report = []
    for start in range(0, len(ports), PORTS_PER_TRANSACTION):
        chunk = ports[start : start + PORTS_PER_TRANSACTION]
        present = await asyncio.to_thread(ovs.delete_ports, chunk)
        report += [f"removed OVS port {port}" for port, there in zip(chunk, present) if there]
        progress(f"OVS ports: {start + len(chunk)}/{len(ports)}")
    return report


async def _in_threads(
    remove: Callable[[T], list[str]], items: list[T], progress: Progress = _quiet, what: str = "items"
) -> list[str]:
    """`remove` of every item, a few at a time on threads; their reports in the items' order."""
    slots = asyncio.Semaphore(CLEANUP_THREADS)
    done = 0

    async def one(item: T) -> list[str]:
        nonlocal done
        async with slots:
            lines = await asyncio.to_thread(remove, item)
        done += 1
        progress(f"{what}: {done}/{len(items)}")
        return lines

    return [line for lines in await asyncio.gather(*map(one, items)) for line in lines]


def _remove_load_balancer(owned: tuple[str, InterfaceNames]) -> list[str]:
    """Its namespace, which takes both veth pairs with it; its host ends
    themselves only when there is no namespace."""
    lb_id, names = owned
    removed = _remove_namespace(netns_name(lb_id))
    return removed or [f"removed link {n}" for n in links.delete_host_links(names)]


def _remove_namespace(netns: str) -> list[str]:
    if not os.path.exists(netns_path(netns)):  # mounted or a stale file: both go
        return []
    delete_netns(netns)
    return [f"removed namespace {netns}"]
