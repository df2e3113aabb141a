"""`lbagent status`: fetch the status document and render it for a person.

When the agent is down the document is rebuilt from the state directory and
the host (which namespaces exist), and says so. `lbagent status ID` adds the
packet counters of the load balancer's NAT rules, read from its namespace by
the CLI itself (`lbagent.cli.natcounters`), whether the agent runs or not.
"""

from __future__ import annotations

from collections import Counter
from urllib.parse import quote

import click

from lbagent.cli.client import AgentUnreachable, get_json
from lbagent.cli.natcounters import read_counters
from lbagent.config import Config
from lbagent.naming import netns_name
from lbagent.ovnhost.netns import netns_exists
from lbagent.state import StateFileError, StateStore, ipv6_addresses

STATE_COLORS = {
    "ready": "green",
    "up": "green",
    "error": "red",
    "down": "red",
    "pending": "yellow",
    "deleting": "yellow",
    "draining": "yellow",
    "unknown": "yellow",
}
OFFLINE = "state directory (the agent is not running)"


def collect_status(config: Config, lb_id: str | None = None) -> tuple[dict, str]:
    """(status document, where it came from); with lb_id, only that load balancer, NAT counters included."""
    try:
        if lb_id is None:
            return _answer(get_json(config, "/v1/status")), "agent"
        document, source = _from_agent_one(config, lb_id), "agent"
    except AgentUnreachable as exc:
        document, source = offline_status(config, str(exc)), OFFLINE
        if lb_id is None:
            return document, source
        document["loadbalancers"] = [lb for lb in document["loadbalancers"] if lb["id"] == lb_id]
    if not document["loadbalancers"]:
        raise click.ClickException(f"no load balancer {lb_id!r} on this host")
    for lb in document["loadbalancers"]:
        _add_counters(lb)
    return document, source


def _answer(reply: tuple[int, dict]) -> dict:
    code, document = reply
    if code != 200:
        raise click.ClickException(f"agent answered {code}: {document.get('message', document)}")
    return document


def _from_agent_one(config: Config, lb_id: str) -> dict:
    code, found = get_json(config, f"/v1/loadbalancers/{quote(lb_id, safe='')}")
    if code == 404:
        raise click.ClickException(f"no load balancer {lb_id!r} on this host")
    status = _answer(get_json(config, "/v1/status"))
    return {**status, "loadbalancers": [_answer((code, found))]}


def _add_counters(lb: dict) -> None:
    netns = lb.get("netns") or netns_name(lb["id"])
    lb["nat_rules"], lb["nat_rules_error"] = [], None
    if not netns_exists(netns):
        lb["nat_rules_error"] = f"namespace {netns} does not exist"
        return
    try:
        lb["nat_rules"] = [rule.to_json() for rule in read_counters(netns)]
    except RuntimeError as exc:
        lb["nat_rules_error"] = str(exc)


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
        lbs.append(
            {
                "id": lb.get("id"),
                "state": "unknown",
                "netns": netns_name(lb.get("id", "")),
                "netns_present": netns_exists(netns_name(lb.get("id", ""))),
                "vip": lb.get("network", {}).get("ip"),
                "inner": allocation.inner if allocation else None,
                "outer": allocation.outer if allocation else None,
                **ipv6_addresses(lb.get("network", {}).get("ip6"), allocation),
                "listeners": [
                    {
                        "id": ls.get("id"),
                        "listener_type": ls.get("listener_type"),
                        "listener_port": ls.get("listener_port"),
                        "state": "unknown",
                    }
                    for ls in lb.get("listeners", [])
                ],
                "backends": [
                    {
                        "id": b.get("id"),
                        "address": b.get("address"),
                        "port": b.get("port"),
                        "mapped_port": ports.get(b.get("id")),
                        "health": "unknown",
                    }
                    for g in lb.get("backend_groups", [])
                    for b in g.get("backends", [])
                ],
                "last_error": None,
            }
        )
    generation = (persisted.desired or {}).get("generation")
    return {
        "agent": {"host": config.agent.host, "running": False, "generation": generation, "reason": why},
        "loadbalancers": lbs,
    }


# --- rendering ---------------------------------------------------------------------


def table(rows: list[tuple], color: bool = False, colored: tuple[int, ...] = (), indent: str = "") -> list[str]:
    """Aligned columns; the header is rows[0]; `colored` columns are coloured by their word."""
    cells = [[str("-" if cell is None or cell == "" else cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = []
    for index, row in enumerate(cells):
        out = []
        for column, (cell, width) in enumerate(zip(row, widths)):
            padded = cell.ljust(width) if column < len(row) - 1 else cell
            if color and index > 0 and column in colored:
                padded = click.style(padded, fg=STATE_COLORS.get(cell))
            out.append(padded)
        lines.append((indent + "  ".join(out)).rstrip())
    return lines


def _header(document: dict, source: str) -> list[str]:
    agent = document.get("agent", {})
    lines = [
        f"source: {source}",
        f"host: {agent.get('host')}  generation: {agent.get('generation')}  synced: {agent.get('synced', '-')}",
    ]
    if agent.get("running") is False:
        lines.append(f"agent: not running ({agent.get('reason') or agent.get('error')})")
    haproxy = agent.get("haproxy")
    if haproxy:
        lines.append(
            f"haproxy: pid {haproxy.get('pid')} running={haproxy.get('running')} "
            f"reloads={haproxy.get('reloads')} failed_reloads={haproxy.get('failed_reloads', 0)} "
            f"live_updates={haproxy.get('live_updates', 0)}"
        )
    return lines


def _siblings(document: dict) -> list[str]:
    """One line each for subnets, provider networks, pods and the work queue; the errors under them."""
    lines = []
    for section, label, name in (("subnets", "subnets", "id"), ("provider_networks", "provider networks", "name")):
        items = document.get(section) or []
        if items:
            states = Counter(item.get("state") for item in items)
            lines.append(f"{label}: " + ", ".join(f"{n} {state}" for state, n in sorted(states.items())))
            lines += [f"  {item[name]}: {item['error']}" for item in items if item.get("error")]
    pods = document.get("pods")
    if pods and pods.get("count"):
        lines.append(f"pods: {pods['count']} ({pods.get('ready', '-')} ready)")
    queues = document.get("agent", {}).get("queues") or {}
    if queues:
        lines.append(
            "queue (waiting/delayed/running/retrying): "
            + "  ".join(
                f"{kind} {q['depth']}/{q['delayed']}/{q['processing']}/{q['retrying']}" for kind, q in queues.items()
            )
        )
    return lines


def render_status(document: dict, source: str, color: bool = False, detail: bool = False) -> str:
    lines = _header(document, source) + _siblings(document)
    lbs = document.get("loadbalancers", [])
    if not lbs:
        lines.append("no load balancers")
        return "\n".join(lines)
    rows = [("ID", "STATE", "ROLE", "VIP", "INNER/OUTER", "LISTENERS", "BACKENDS", "REASON")]
    for lb in lbs:
        listeners = ",".join(f"{ls['listener_type']}/{ls['listener_port']}" for ls in lb.get("listeners", []))
        backends = ",".join(
            f"{b['address']}:{b['port']}→{b.get('mapped_port')}({_health_summary(b)})" for b in lb.get("backends", [])
        )
        rows.append(
            (
                lb["id"],
                lb["state"],
                (lb.get("ha") or {}).get("role", "-"),  # "-": served by this host alone
                " ".join(filter(None, (lb.get("vip"), lb.get("vip6")))),
                f"{lb.get('inner')}/{lb.get('outer')}",
                listeners,
                backends,
                lb.get("reason") or lb.get("last_error"),  # what keeps it from ready, if anything
            )
        )
    lines += table(rows, color, colored=(1,))
    if detail:
        for lb in lbs:
            lines += [""] + render_detail(lb, color)
    return "\n".join(lines)


def _health_summary(backend: dict) -> str:
    """'up', 'down: connect_refused', '... backup': the health, why, and whether it only stands in."""
    reason = backend.get("health_reason")
    text = str(backend.get("health", "?"))
    if reason and reason != "ok":
        text += f": {reason}"
    return text + (" backup" if backend.get("backup") else "")


def _draining_lines(draining: list[dict]) -> list[str]:
    """Servers removed or at weight 0 whose sessions the drain timeout shuts, with the seconds left."""
    if not draining:
        return []
    rows = [("SERVER", "SECONDS LEFT")] + [(d["id"], d["remaining"]) for d in draining]
    return ["  draining (established connections kept until the drain timeout):"] + table(rows, indent="    ")


def render_detail(lb: dict, color: bool = False) -> list[str]:
    present = lb.get("netns_present")
    lines = [
        f"{lb['id']}: state {lb['state']} generation {lb.get('generation')} retries {lb.get('retries', '-')} "
        f"last pass {lb.get('last_reconciled_at') or '-'}",
        f"  netns {lb.get('netns')}{'' if present is None else (' (present)' if present else ' (absent)')}"
        f"  ovs_port {lb.get('ovs_port') or '-'}  ovn_installed={lb.get('ovn_installed', '-')}",
    ]
    if lb.get("vip6"):
        lines.append(f"  ipv6: vip {lb['vip6']}  inner/outer {lb.get('inner6')}/{lb.get('outer6')}")
    if lb.get("ha"):
        ha = lb["ha"]
        lines.append(
            f"  ha: {ha.get('role')} term {ha.get('term')} active host {ha.get('active_host') or '-'}"
            f" since {ha.get('since')} last failover {ha.get('last_failover_s') or '-'} s"
        )
    if lb.get("reason") and lb.get("reason") != lb.get("last_error"):
        lines.append(f"  reason: {lb['reason']}")
    if lb.get("last_error"):
        lines.append(f"  last error: {lb['last_error']}")
    lines.append("  listeners:")
    lines += table(
        [("ID", "TYPE", "PORT", "STATE")]
        + [(ls["id"], ls["listener_type"], ls["listener_port"], ls["state"]) for ls in lb.get("listeners", [])],
        color,
        colored=(3,),
        indent="    ",
    )
    rules = [
        (
            ls["id"],
            r["id"],
            r.get("domain") or "*",
            r.get("path") or "/",
            r.get("backend_group_id") or f"redirect {(r.get('redirect') or {}).get('code', '')}".strip(),
        )
        for ls in lb.get("listeners", [])
        for r in ls.get("rules", [])
    ]
    if rules:
        lines.append("  rules (the most specific match wins):")
        lines += table([("LISTENER", "RULE", "DOMAIN", "PATH", "TO")] + rules, indent="    ")
    lines.append("  backends:")
    lines += table(
        [("ID", "ADDRESS", "MAPPED PORT", "WEIGHT", "HEALTH", "REASON", "SINCE", "BACKUP")]
        + [
            (
                b["id"],
                f"{b['address']}:{b['port']}",
                b.get("mapped_port"),
                b.get("weight"),
                b.get("health"),
                b.get("health_reason") or "-",
                b.get("health_since") or "-",
                "yes" if b.get("backup") else "no",
            )
            for b in lb.get("backends", [])
        ],
        color,
        colored=(4,),
        indent="    ",
    )
    lines += _draining_lines(lb.get("draining", []))
    lines.append(f"  NAT rules in {lb.get('netns')} (packets, bytes since the rule was added):")
    if lb.get("nat_rules_error"):
        lines.append(f"    unavailable: {lb['nat_rules_error']}")
    else:
        lines += table(
            [("CHAIN", "PACKETS", "BYTES", "TARGET", "TO", "RULE")]
            + [(r["chain"], r["packets"], r["bytes"], r["target"], r["to"], r["tag"]) for r in lb.get("nat_rules", [])],
            indent="    ",
        )
    return lines
