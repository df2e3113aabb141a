"""Names of everything the agent creates for a load balancer.

Interface names are limited to 15 characters and load balancer ids are up to
64, so names come from a hash of the id, never a prefix of it: two ids that
share a prefix still get distinct names. A salt lets the supervisor step
around the (rare) hash collision; the chosen salt is persisted with the other
allocations so names stay stable across restarts.

A name says what an object is for, never whose it is: anyone may make an
`lb-x` namespace or a veth named like these. Ownership is proved by marks
(`ovnhost.inventory`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

NETNS_PREFIX = "lb-"
IFACE_ID_PREFIX = "iface/lb/"
HASH_CHARS = 8
# o<hash>0 / h<hash>0 live in the namespace, o<hash>1 / h<hash>1 on the host.
INTERFACE_RE = re.compile(rf"^[oh][0-9a-f]{{{HASH_CHARS}}}[01]$")


@dataclass(frozen=True, slots=True)
class InterfaceNames:
    ovn_ns: str  # namespace end of the OVN-side veth; carries the VIP and MAC
    ovn_host: str  # host end, attached to the integration bridge
    haproxy_ns: str  # namespace end of the haproxy-side veth; carries INNER
    haproxy_host: str  # host end; carries OUTER, haproxy binds there

    @property
    def host_ends(self) -> tuple[str, str]:
        return self.ovn_host, self.haproxy_host

    @property
    def tag(self) -> str:
        return self.ovn_ns[1 : 1 + HASH_CHARS]


def interface_names(lb_id: str, salt: int = 0) -> InterfaceNames:
    material = lb_id if salt == 0 else f"{lb_id}#{salt}"
    return names_for_tag(hashlib.sha256(material.encode()).hexdigest()[:HASH_CHARS])


def names_for_tag(tag: str) -> InterfaceNames:
    return InterfaceNames(f"o{tag}0", f"o{tag}1", f"h{tag}0", f"h{tag}1")


def names_from_interface(name: str) -> InterfaceNames | None:
    """All four names of the pair set `name` (one of ours) belongs to."""
    return names_for_tag(name[1:-1]) if INTERFACE_RE.match(name) else None


def netns_name(lb_id: str) -> str:
    return NETNS_PREFIX + lb_id


def lb_id_from_netns(name: str) -> str | None:
    return name[len(NETNS_PREFIX) :] if name.startswith(NETNS_PREFIX) else None


def iface_id(lb_id: str) -> str:
    return IFACE_ID_PREFIX + lb_id
