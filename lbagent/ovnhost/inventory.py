"""The objects on this host that carry the agent's marks, by kind.

Shared vocabulary of the host (which finds them), the supervisor (which knows
which are in use) and garbage collection (which sweeps the difference).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Inventory:
    """Objects with the agent's marks, by kind."""

    netns: frozenset[str] = frozenset()
    links: frozenset[str] = frozenset()
    ovs_ports: frozenset[str] = frozenset()
    haproxy: frozenset[str] = frozenset()
    reply_rules: frozenset[str] = frozenset()  # OUTER addresses with a policy rule

    def minus(self, used: "Inventory") -> set[tuple[str, str]]:
        return {
            (kind, name)
            for kind in ("netns", "links", "ovs_ports", "haproxy", "reply_rules")
            for name in getattr(self, kind) - getattr(used, kind)
        }
