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

from lbagent.config import Config
from lbagent.haproxy.manager import HaproxyManager
from lbagent.naming import InterfaceNames, interface_names, names_from_interface, netns_name
from lbagent.ovnhost import links
from lbagent.ovnhost.bridges import ProviderBridges, bridge_name
from lbagent.ovnhost.inventory import owner_value
from lbagent.ovnhost.netns import NamespaceMarks, delete_netns, netns_exists, netns_path
from lbagent.ovnhost.ovs import OvsClient
from lbagent.state import StateFileError, StateStore


async def cleanup_host(config: Config) -> list[str]:
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
        for port, lb_id in (await asyncio.to_thread(ovs.owned_ports)).items():
            names = names_from_interface(port)
            if lb_id and names is not None:
                owned.setdefault(lb_id, names)
            await asyncio.to_thread(ovs.delete_port, port)
            report.append(f"removed OVS port {port}")
    except Exception as exc:  # OVS may be down; the rest can still be cleaned
        report.append(f"warning: OVS ports not cleaned: {exc}")
    finally:
        await asyncio.to_thread(ovs.stop)

    for lb_id, names in sorted(owned.items()):
        report += [f"removed link {n}" for n in await asyncio.to_thread(links.delete_host_links, names)]
        netns = netns_name(lb_id)
        if os.path.exists(netns_path(netns)):
            await asyncio.to_thread(delete_netns, netns)
            report.append(f"removed namespace {netns}")
    for name in sorted(await asyncio.to_thread(links.marked_host_links, owner_value(config.agent.host))):
        if await asyncio.to_thread(links.delete_link, name):
            report.append(f"removed link {name}")
    marks = NamespaceMarks(config.agent.host)
    for netns in sorted(marks.marked()):
        if netns_exists(netns):
            await asyncio.to_thread(delete_netns, netns)
            report.append(f"removed namespace {netns}")
    marks.remove_all()
    outers = {a.outer for a in allocations.values()}
    report += [f"removed policy rule from {o}" for o in await asyncio.to_thread(links.delete_reply_rules, outers)]
    if store.path.exists():
        store.path.unlink()
        report.append(f"removed state file {store.path}")
    return report or ["nothing to clean up"]
