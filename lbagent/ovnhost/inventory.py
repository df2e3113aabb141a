"""The objects on this host that carry the agent's marks, by kind, and the
marks themselves.

OVSDB rows carry the owner key; the host ends of the veths carry the same
value as their `ifalias` (kept by the kernel); namespaces are marked by a file
per namespace (see `netns.NamespaceMarks` for why).

Shared vocabulary of the host (which finds them), the supervisor (which knows
which are in use) and garbage collection (which sweeps the difference).
"""

from __future__ import annotations

from dataclasses import dataclass

# external_ids keys of the OVSDB rows the agent makes: load balancer ports
# (Interface rows) and provider bridges. Here, not in ovs.py, because
# provider_ovs.py, which ovs.py builds on, needs them too.
OWNER_KEY = "lbagent-owner"  # value: "lbagent/<host>", so two agents never claim each other's rows
LB_KEY = "lbagent-lb"


def owner_value(host: str) -> str:
    """The agent's mark: the owner key's value on OVSDB rows, and the
    `ifalias` of the host ends of the veths it makes."""
    return f"lbagent/{host}"


def owner_host(owner: str) -> str:
    """The host an `owner_value` names."""
    return owner.removeprefix("lbagent/")


@dataclass(frozen=True)
class Inventory:
    """Objects with the agent's marks, by kind."""

    netns: frozenset[str] = frozenset()
    links: frozenset[str] = frozenset()
    ovs_ports: frozenset[str] = frozenset()
    haproxy: frozenset[str] = frozenset()
    reply_rules: frozenset[str] = frozenset()  # OUTER addresses with a policy rule

    def minus(self, used: Inventory) -> set[tuple[str, str]]:
        return {
            (kind, name)
            for kind in ("netns", "links", "ovs_ports", "haproxy", "reply_rules")
            for name in getattr(self, kind) - getattr(used, kind)
        }
