"""The status document of one load balancer (api.md "Status"), built from what
the supervisor knows and what the last pass observed. Never includes secrets:
certificates and keys are not part of it.
"""

from __future__ import annotations

from lbagent.haproxy.render import server_name

HEALTH_WORDS = (("UP", "up"), ("DOWN", "down"), ("NOLB", "draining"), ("MAINT", "maint"), ("no check", "unchecked"))


def health_by_loadbalancer(server_states: dict[tuple[str, str], str]) -> dict[str, dict[str, str]]:
    """Load balancer id -> server name -> health word, in one pass over haproxy's
    servers (a backend serving two listeners is up if any of its checks says
    so). Backends are named "be:<lb>:<listener>[:<rule>]"."""
    health: dict[str, dict[str, str]] = {}
    for (backend, server), raw in server_states.items():
        kind, _, rest = backend.partition(":")
        lb_id = rest.partition(":")[0]
        if kind != "be" or not lb_id:
            continue
        merged = health.setdefault(lb_id, {})
        if merged.get(server) != "up":
            merged[server] = next((w for key, w in HEALTH_WORDS if raw.startswith(key)), "unknown")
    return health


def _rule_status(rule) -> dict:
    redirect = rule.redirect.model_dump(mode="json") if rule.redirect is not None else None
    return {"id": rule.id, "domain": rule.domain, "path": rule.path, "backend_group_id": rule.backend_group_id,
            "redirect": redirect}


def loadbalancer_status(task, lb, allocation, names, netns: str, observation, health: dict[str, str],
                        members: dict) -> dict:
    listeners = []
    backends = []
    if lb is not None:
        for listener in lb.listeners:
            state = task.state if listener.enabled and lb.enabled else "disabled"
            listeners.append({"id": listener.id, "listener_type": listener.listener_type,
                              "listener_port": listener.listener_port, "state": state,
                              "backend_group_id": listener.backend_group_id,
                              "rules": [_rule_status(rule) for rule in listener.rules]})
        seen = set()
        for group_id, group in members.items():
            for member in group:
                if member.key in seen:
                    continue
                seen.add(member.key)
                backends.append({"id": member.key, "group": group_id, "address": member.address,
                                 "port": member.port, "weight": member.weight, "mapped_port": member.mapped_port,
                                 "health": health.get(server_name(member.key), "unknown")})
    return {
        "id": task.lb_id,
        "state": task.state,
        "status": lb.status if lb is not None else None,
        "generation": task.generation,
        "netns": netns,
        "vip": lb.network.ip if lb is not None else None,
        "inner": allocation.inner if allocation else None,
        "outer": allocation.outer if allocation else None,
        "interfaces": {"ovn": [names.ovn_ns, names.ovn_host], "haproxy": [names.haproxy_ns, names.haproxy_host]}
        if names else None,
        "ovs_port": observation.ovs_port if observation else None,
        "ovn_installed": observation.ovn_installed if observation else False,
        "listeners": listeners,
        "backends": backends,
        "last_error": task.last_error,
        "retries": task.retries,
        "passes": task.passes,
        "last_reconciled_at": task.last_reconciled_at,
    }
