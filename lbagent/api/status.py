"""The status documents of api.md ("Status"): the agent's, and each load balancer's.

Built from what the agent reports through `StatusSource` (what the supervisor
knows and what the last pass observed, haproxy's server states, OVS's
installed ports), so the HTTP layer never reaches into the supervisor.
Never includes secrets: certificates and keys are not part of it.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from lbagent import __version__
from lbagent.desired.memberoptions import options_of
from lbagent.haproxy.health import ServerHealth, drain_remaining, reason_of, since_of
from lbagent.haproxy.render import server_name
from lbagent.metrics import write_counts
from lbagent.state import ipv6_addresses
from lbagent.support.turns import in_turns

if TYPE_CHECKING:  # the agent builds the views; only their shape is needed here
    from lbagent.agent import LoadBalancerView

log = logging.getLogger(__name__)

HEALTH_WORDS = (
    ("UP", "up"),
    ("DOWN", "down"),
    ("NOLB", "draining"),
    ("DRAIN", "draining"),
    ("MAINT", "maint"),
    ("no check", "unchecked"),
)


def health_by_loadbalancer(server_states: dict[tuple[str, str], str]) -> dict[str, dict[str, str]]:
    """Load balancer id -> server name -> health word (with haproxy's reason and
    since when), in one pass over haproxy's servers (a backend serving two
    listeners is up if any of its checks says so). Backends are named
    "be:<lb>:<listener>[:<rule>]"."""
    health: dict[str, dict[str, str]] = {}
    for (backend, server), raw in server_states.items():
        kind, _, rest = backend.partition(":")
        lb_id = rest.partition(":")[0]
        if kind != "be" or not lb_id:
            continue
        merged = health.setdefault(lb_id, {})
        if merged.get(server) != "up":
            word = next((w for key, w in HEALTH_WORDS if raw.startswith(key)), "unknown")
            merged[server] = ServerHealth(word, reason_of(raw), *_moments(raw))
    return health


def _moments(raw: str) -> tuple[datetime | None, datetime | None]:
    """(since when, until when it drains) of haproxy's state of a server."""
    return (raw.since, raw.drain_until) if isinstance(raw, ServerHealth) else (None, None)


def _member_health(member, health: dict[str, str]) -> dict:
    """The per-member health fields of the status document."""
    word = health.get(server_name(member.key), "unknown")
    return {
        "backup": options_of(member).backup,
        "health": str(word),
        "health_reason": reason_of(word),
        "health_since": since_of(word),
    }


def _draining(health: dict[str, str]) -> list[dict]:
    """The servers still draining (removed, or at weight 0) and the seconds until their sessions are shut."""
    now = datetime.now(UTC)
    found = []
    for server, word in sorted(health.items()):
        remaining = drain_remaining(word, now)
        if remaining is not None:
            found.append({"id": server, "remaining": remaining})
    return found


def _rule_status(rule) -> dict:
    redirect = rule.redirect.model_dump(mode="json") if rule.redirect is not None else None
    return {
        "id": rule.id,
        "domain": rule.domain,
        "path": rule.path,
        "backend_group_id": rule.backend_group_id,
        "redirect": redirect,
    }


def loadbalancer_status(
    task, lb, allocation, names, netns: str, observation, health: dict[str, str], members: dict
) -> dict:
    listeners = []
    backends = []
    if lb is not None:
        for listener in lb.listeners:
            state = task.state if listener.enabled and lb.enabled else "disabled"
            listeners.append(
                {
                    "id": listener.id,
                    "listener_type": listener.listener_type,
                    "listener_port": listener.listener_port,
                    "state": state,
                    "backend_group_id": listener.backend_group_id,
                    "rules": [_rule_status(rule) for rule in listener.rules],
                }
            )
        seen = set()
        for group_id, group in members.items():
            for member in group:
                if member.key in seen:
                    continue
                seen.add(member.key)
                backends.append(
                    {
                        "id": member.key,
                        "group": group_id,
                        "address": member.address,
                        "port": member.port,
                        "weight": member.weight,
                        "mapped_port": member.mapped_port,
                        **_member_health(member, health),
                    }
                )
    return {
        "id": task.lb_id,
        "state": task.state,
        "reason": task.reason,  # why it is not ready (None when it is)
        "status": lb.status if lb is not None else None,
        "generation": task.generation,
        "netns": netns,
        "vip": lb.network.ip if lb is not None else None,
        "inner": allocation.inner if allocation else None,
        "outer": allocation.outer if allocation else None,
        **ipv6_addresses(lb.network.ip6 if lb is not None else None, allocation),
        "interfaces": {"ovn": [names.ovn_ns, names.ovn_host], "haproxy": [names.haproxy_ns, names.haproxy_host]}
        if names
        else None,
        "ovs_port": observation.ovs_port if observation else None,
        "ovn_installed": observation.ovn_installed if observation else False,
        "listeners": listeners,
        "backends": backends,
        "draining": _draining(health),
        "last_error": task.last_error,
        "certificate_warnings": lb.certificate_warnings(datetime.now(UTC)) if lb is not None else [],
        "retries": task.retries,
        "passes": task.passes,
        "last_reconciled_at": task.last_reconciled_at,
    }


class StatusSource(Protocol):
    """What the agent offers for status: facts it keeps, never its supervisor's dicts."""

    host_name: str
    started_at: str
    state_error: str | None
    gc_stats: dict[str, int]

    @property
    def generation(self) -> int | None: ...
    def synced(self) -> bool: ...
    def not_ready_reason(self) -> str | None: ...
    def haproxy_status(self) -> dict: ...
    def resync_interval(self) -> float: ...
    def queue_stats(self) -> dict: ...
    def neighbour_status(self) -> dict: ...
    def ha_status(self) -> dict | None: ...
    def subnet_status(self) -> list: ...
    def provider_network_status(self) -> list: ...
    def pod_status(self) -> dict: ...
    def loadbalancer_ids(self) -> list[str]: ...
    def loadbalancer_view(self, lb_id: str) -> LoadBalancerView | None: ...
    def loadbalancer_tasks(self) -> list: ...
    async def server_states(self, backend_prefix: str = "") -> dict[tuple[str, str], str]: ...
    async def installed_ports(self) -> set[str]: ...


class StatusReporter:
    """Assembles GET /v1/status, GET /v1/loadbalancers/{id} and the per-load-balancer results of ?wait."""

    def __init__(self, source: StatusSource):
        self._source = source

    async def status(self) -> dict:
        source = self._source
        health = await self._server_health()
        installed = await self._installed_ports()
        # A thousand documents are a quarter of a second of work: in slices.
        lbs = [
            self._document(view, health, installed)
            async for view in in_turns(map(source.loadbalancer_view, source.loadbalancer_ids()))
            if view is not None
        ]
        return {
            "agent": {
                "version": __version__,
                "host": source.host_name,
                "synced": source.synced(),
                "generation": source.generation,
                "started_at": source.started_at,
                "ready": source.not_ready_reason() is None,
                "state_error": source.state_error,
                "haproxy": source.haproxy_status(),
                "writes": write_counts(),
                "gc": dict(source.gc_stats),
                "resync_interval": round(source.resync_interval(), 1),
                "queues": source.queue_stats(),
                "neighbour_tables": source.neighbour_status(),
                "ha": source.ha_status(),
            },
            "loadbalancers": lbs,
            "subnets": source.subnet_status(),
            "provider_networks": source.provider_network_status(),
            "pods": source.pod_status(),
        }

    async def loadbalancer_status(self, lb_id: str) -> dict | None:
        view = self._source.loadbalancer_view(lb_id)
        if view is None:
            return None
        # Only its own backends ("be:<lb>:..."; an id has no colon) are decoded.
        health = await self._server_health(f"be:{lb_id}:")
        return self._document(view, health, await self._installed_ports())

    def results(self, generation: int) -> dict:
        return {
            "generation": generation,
            "loadbalancers": [
                {
                    "id": t.lb_id,
                    "state": t.state,
                    "reason": t.reason,
                    "generation": t.generation,
                    "last_error": t.last_error,
                }
                for t in sorted(self._source.loadbalancer_tasks(), key=lambda t: t.lb_id)
            ],
        }

    async def _server_health(self, backend_prefix: str = "") -> dict[str, dict[str, str]]:
        try:
            states = await self._source.server_states(backend_prefix)
            # Thousands of servers: sorted out on a thread, not on the event loop.
            return await asyncio.to_thread(health_by_loadbalancer, states)
        except Exception as exc:  # health is best effort; the data path is what matters
            log.debug("object=haproxy action=stats result=error error=%r", str(exc))
            return {}

    async def _installed_ports(self) -> set[str] | None:
        try:
            return await self._source.installed_ports()
        except Exception as exc:  # OVSDB may be reconnecting; say "unknown", not "no"
            log.debug("object=ovs action=observe result=error error=%r", str(exc))
            return None

    @staticmethod
    def _document(view: LoadBalancerView, health: dict, installed: set[str] | None) -> dict:
        member_health = {**health.get(view.task.lb_id, {}), **view.udp_health}
        document = loadbalancer_status(
            view.task, view.lb, view.allocation, view.names, view.netns, view.observation, member_health, view.members
        )
        if installed is not None and view.names is not None:
            document["ovn_installed"] = view.names.ovn_host in installed
        document["ha"] = view.ha
        return document
