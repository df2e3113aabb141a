"""`lbagent status`: fetch the status document and render it for a person.

When the agent is down the document is rebuilt from the state directory and
the host (which namespaces exist), and says so.
"""

from __future__ import annotations

import click

from lbagent.client import AgentUnreachable, get_json
from lbagent.config import Config
from lbagent.naming import netns_name
from lbagent.ovnhost.netns import netns_exists
from lbagent.state import StateFileError, StateStore

STATE_COLORS = {"ready": "green", "error": "red", "pending": "yellow", "deleting": "yellow"}


def collect_status(config: Config) -> tuple[dict, str]:
    try:
        code, document = get_json(config, "/v1/status")
        if code == 200:
            return document, "agent"
        raise click.ClickException(f"agent answered {code}: {document.get('message', document)}")
    except AgentUnreachable as exc:
        return offline_status(config, str(exc)), "state directory (the agent is not running)"


def offline_status(config: Config, why: str) -> dict:
    store = StateStore(config.agent.state_dir)
    try:
        persisted = store.load()
    except StateFileError as exc:
        return {"agent": {"host": config.agent.host, "running": False, "error": str(exc)}, "loadbalancers": []}
    lbs = []
    for lb in (persisted.desired or {}).get("loadbalancers", []):
        allocation = persisted.allocations.get(lb.get("id"))
        ports = allocation.ports if allocation else {}
        lbs.append({
            "id": lb.get("id"),
            "state": "unknown",
            "netns": netns_name(lb.get("id", "")),
            "netns_present": netns_exists(netns_name(lb.get("id", ""))),
            "vip": lb.get("network", {}).get("ip"),
            "inner": allocation.inner if allocation else None,
            "outer": allocation.outer if allocation else None,
            "listeners": [{"id": ls.get("id"), "listener_type": ls.get("listener_type"),
                           "listener_port": ls.get("listener_port"), "state": "unknown"}
                          for ls in lb.get("listeners", [])],
            "backends": [{"id": b.get("id"), "address": b.get("address"), "port": b.get("port"),
                          "mapped_port": ports.get(b.get("id")), "health": "unknown"}
                         for g in lb.get("backend_groups", []) for b in g.get("backends", [])],
            "last_error": None,
        })
    generation = (persisted.desired or {}).get("generation")
    return {"agent": {"host": config.agent.host, "running": False, "generation": generation, "reason": why},
            "loadbalancers": lbs}


def render_status(document: dict, source: str, color: bool = False, detail: bool = False) -> str:
    agent = document.get("agent", {})
    lines = [f"source: {source}",
             f"host: {agent.get('host')}  generation: {agent.get('generation')}  synced: {agent.get('synced', '-')}"]
    haproxy = agent.get("haproxy")
    if haproxy:
        lines.append(f"haproxy: pid {haproxy.get('pid')} running={haproxy.get('running')} "
                     f"reloads={haproxy.get('reloads')}")
    lbs = document.get("loadbalancers", [])
    if not lbs:
        lines.append("no load balancers")
        return "\n".join(lines)
    rows = [("ID", "STATE", "VIP", "INNER/OUTER", "LISTENERS", "BACKENDS", "LAST ERROR")]
    for lb in lbs:
        listeners = ",".join(f"{ls['listener_type']}/{ls['listener_port']}" for ls in lb.get("listeners", []))
        backends = ",".join(f"{b['address']}:{b['port']}→{b.get('mapped_port')}({b.get('health', '?')})"
                            for b in lb.get("backends", []))
        rows.append((lb["id"], lb["state"], lb.get("vip") or "-", f"{lb.get('inner')}/{lb.get('outer')}",
                     listeners or "-", backends or "-", lb.get("last_error") or "-"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]) - 1)]
    for index, row in enumerate(rows):
        cells = [str(cell).ljust(width) for cell, width in zip(row, widths)]
        state = cells[1]
        if color and index > 0:
            cells[1] = click.style(state, fg=STATE_COLORS.get(row[1].strip(), None))
        lines.append("  ".join(cells + [str(row[-1])]).rstrip())
    if detail:
        for lb in lbs:
            lines.append("")
            lines.append(f"{lb['id']}: netns {lb.get('netns')} ovs_port {lb.get('ovs_port')} "
                         f"ovn_installed={lb.get('ovn_installed')} retries={lb.get('retries')}")
            for b in lb.get("backends", []):
                lines.append(f"  backend {b['id']} {b['address']}:{b['port']} mapped {b.get('mapped_port')} "
                             f"health {b.get('health')}")
    return "\n".join(lines)
