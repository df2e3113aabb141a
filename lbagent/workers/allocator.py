"""Allocation of the per-load-balancer 169.254 address pairs and backend ports.

Pairs are (INNER, OUTER) = (169.254.x.y, 169.254.x.y+1) with x.y stepping by
two from 0.100. A candidate is skipped when either address is already on the
host, is 169.254.169.254, is the /16's broadcast, or belongs to another load
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
# Every member (a backend, a selected pod) of a load balancer gets a port of
# its own on INNER; lbagent.desired.fields.MAX_BACKENDS_PER_LB says the same.
PORT_MIN, PORT_MAX = 1025, 65535


class ExhaustedError(LbAgentError):
    """No free address pair, port or name is left to allocate."""


@dataclass(frozen=True)
class AddressPair:
    inner: str
    outer: str


class PairAllocator:
    def __init__(self, allocated: dict[str, AddressPair] | None = None):
        self._pairs: dict[str, AddressPair] = dict(allocated or {})
        self._cursor = FIRST

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
        taken = set(host_addresses)
        for pair in self._pairs.values():
            taken.update((pair.inner, pair.outer))
        slots = (LAST - FIRST + 1) // 2
        start = (self._cursor - FIRST) // 2
        for step in range(slots):
            inner = FIRST + 2 * ((start + step) % slots)
            candidate = AddressPair(str(ipaddress.IPv4Address(inner)), str(ipaddress.IPv4Address(inner + 1)))
            if _usable(candidate, taken):
                self._pairs[key] = candidate
                self._cursor = inner + 2
                return candidate
        raise ExhaustedError("no free 169.254 address pair left for a load balancer")

    def release(self, key: str) -> None:
        self._pairs.pop(key, None)


def _usable(pair: AddressPair, taken: set[str]) -> bool:
    for address in (pair.inner, pair.outer):
        if address in taken or ipaddress.IPv4Address(address) == METADATA:
            return False
    return True


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
