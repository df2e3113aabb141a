"""Allocation of the per-load-balancer address pairs and backend ports.

Every load balancer has two pairs (INNER, OUTER) = (N, N+1): one in
169.254/16, with N stepping by two from 169.254.0.100, and one in the
agent's IPv6 prefix (`[agent] inner_prefix6`), with N stepping by two from
the prefix's third address (the first is the subnet-router anycast address)
up to below its highest 128 (reserved anycast addresses, RFC 2526). A
candidate is skipped when either address is already on the host, is
169.254.169.254, is the /16's broadcast, or belongs to another load
balancer. The search starts after the last allocation and wraps around once:
it always ends, and says plainly when the range is exhausted.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from lbagent.errors import LbAgentError

LINK_LOCAL = ipaddress.IPv4Network("169.254.0.0/16")
FIRST = int(ipaddress.IPv4Address("169.254.0.100"))
LAST = int(LINK_LOCAL.broadcast_address) - 1  # the highest usable OUTER
METADATA = ipaddress.IPv4Address("169.254.169.254")
# RFC 2526 reserves the highest 128 addresses of a prefix for anycast.
_RESERVED_ANYCAST6 = 128
# Every member (a backend, a selected pod) of a load balancer gets a port of
# its own on INNER; lbagent.desired.fields.MAX_BACKENDS_PER_LB says the same.
PORT_MIN, PORT_MAX = 1025, 65535


class ExhaustedError(LbAgentError):
    """No free address pair, port or name is left to allocate."""


@dataclass(frozen=True)
class AddressPair:
    inner: str
    outer: str


@dataclass(frozen=True)
class PairSpace:
    """Where one family's pairs come from: INNER steps by two from `first`,
    OUTER (INNER + 1) is at most `last`; `reserved` addresses are never used."""

    first: int
    last: int
    version: int
    name: str  # for the message when the space is exhausted
    reserved: frozenset[int] = frozenset()

    def text(self, value: int) -> str:
        return str(ipaddress.IPv4Address(value) if self.version == 4 else ipaddress.IPv6Address(value))


def link_local_space() -> PairSpace:
    return PairSpace(FIRST, LAST, 4, "169.254", frozenset({int(METADATA)}))


def inner_prefix6_space(prefix: str) -> PairSpace:
    """The pairs of an IPv6 prefix (lbagent.config checks it leaves room for them)."""
    network = ipaddress.IPv6Network(prefix)
    first = int(network.network_address) + 2
    return PairSpace(first, int(network.broadcast_address) - _RESERVED_ANYCAST6, 6, f"{network}")


class PairAllocator:
    def __init__(self, allocated: dict[str, AddressPair] | None = None, space: PairSpace | None = None):
        self._pairs: dict[str, AddressPair] = dict(allocated or {})
        # Kept as pairs come and go: a refresh of a thousand new load balancers
        # would otherwise gather every address again for each of them.
        self._used = {address for pair in self._pairs.values() for address in (pair.inner, pair.outer)}
        self._space = space or link_local_space()
        self._cursor = self._space.first

    @property
    def pairs(self) -> dict[str, AddressPair]:
        return dict(self._pairs)

    def get(self, key: str) -> AddressPair | None:
        return self._pairs.get(key)

    def allocate(self, key: str, host_addresses: set[str]) -> AddressPair:
        """The pair of `key`, allocating one if it has none yet."""
        existing = self._pairs.get(key)
        if existing is not None:
            return existing
        space = self._space
        slots = (space.last - space.first + 1) // 2
        start = (self._cursor - space.first) // 2
        # Ends at the first free slot: taken addresses are few, even where slots are 2**79.
        for step in range(slots):
            inner = space.first + 2 * ((start + step) % slots)
            if inner in space.reserved or inner + 1 in space.reserved:
                continue
            candidate = AddressPair(space.text(inner), space.text(inner + 1))
            if not any(a in self._used or a in host_addresses for a in (candidate.inner, candidate.outer)):
                self._pairs[key] = candidate
                self._used.update((candidate.inner, candidate.outer))
                self._cursor = inner + 2
                return candidate
        raise ExhaustedError(f"no free {space.name} address pair left for a load balancer")

    def release(self, key: str) -> None:
        pair = self._pairs.pop(key, None)
        if pair is not None:
            self._used.difference_update((pair.inner, pair.outer))


def assign_ports(current: dict[str, int], keys: list[str]) -> dict[str, int]:
    """Ports on INNER for `keys`: kept for keys that had one, lowest free for new ones."""
    capacity = PORT_MAX - PORT_MIN + 1
    if len(keys) > capacity:
        raise ExhaustedError(
            f"{len(keys)} members (backends and selected pods) need a port on INNER each, more than the "
            f"{capacity} of {PORT_MIN}-{PORT_MAX}: remove backends or narrow the pod selectors"
        )
    wanted = set(keys)
    result = {k: p for k, p in current.items() if k in wanted}
    used = set(result.values())
    candidate = PORT_MIN
    for key in keys:
        if key in result:
            continue
        while candidate in used:
            candidate += 1
        if candidate > PORT_MAX:
            raise ExhaustedError("no free port left on INNER for backend " + key)
        result[key] = candidate
        used.add(candidate)
    return result
