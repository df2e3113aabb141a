"""`TrafficProbes`: which load balancers' OVN ports are known to carry traffic.

A load balancer becomes `ready` only once its gateway answered an ARP request
sent from its namespace through OVN (`lbagent.ovnhost.arpprobe`); until then it
is `pending`, `waiting for traffic`, and is probed again every `retry`
seconds. A confirmed one is probed again every `recheck()` seconds (the resync
interval), and loses its confirmation after `strikes` failed probes in a row,
one `retry` apart: a single lost frame on a busy host does not take a VIP out
of service, a port that stopped forwarding does within seconds of being
noticed.

This module keeps the schedule and the verdicts; the readiness watch says which
load balancers wait and which serve, and `probe` does the exchange.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from lbagent.errors import LbAgentError
from lbagent.ovnhost import arpprobe
from lbagent.ovnhost.netns import NamespaceExecutor

log = logging.getLogger("lbagent.workers.ovn_worker")  # its lines are the worker's

RETRY_SECONDS = 1.0
PROBE_TIMEOUT = 1.0  # OVN answers a gateway's ARP in the local pipeline: milliseconds when it forwards
STRIKES = 3
# One tick's probes (4 ticks a second): thousands of ports installed at once are
# probed within seconds, without a burst of thousands of frames into OVS.
PROBES_AT_ONCE = 128


@dataclass(frozen=True)
class ProbeTarget:
    """Where one load balancer's probe goes from: its namespace, OVN-side interface, MAC and
    address; and to: its subnet's gateway."""

    netns: str
    ifname: str
    mac: str
    ip: str
    gateway: str


Probe = Callable[[ProbeTarget], Awaitable[bool]]


class TrafficProbes:
    def __init__(
        self,
        probe: Probe,
        recheck: Callable[[], float],
        retry: float = RETRY_SECONDS,
        strikes: int = STRIKES,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._probe = probe
        self._recheck = recheck
        self._retry = retry
        self._strikes = strikes
        self._clock = clock
        self._confirmed: set[str] = set()
        self._due: dict[str, float] = {}  # lb id -> when it is probed next
        self._failures: dict[str, int] = {}  # confirmed lb id -> failed probes in a row

    def confirmed(self, lb_id: str) -> bool:
        return lb_id in self._confirmed

    def forget(self, lb_id: str) -> None:
        """It is gone, or its port lost ovn-installed: confirmed again only by a new answer."""
        self._confirmed.discard(lb_id)
        self._due.pop(lb_id, None)
        self._failures.pop(lb_id, None)

    def due(self, lb_ids: Iterable[str]) -> list[str]:
        """Those of `lb_ids` whose probe is due now, at most PROBES_AT_ONCE, the longest due first."""
        now = self._clock()
        found = sorted((self._due.get(lb_id, 0.0), lb_id) for lb_id in lb_ids if self._due.get(lb_id, 0.0) <= now)
        return [lb_id for _, lb_id in found[:PROBES_AT_ONCE]]

    def confirmed_ids(self) -> set[str]:
        return set(self._confirmed)

    async def probe(self, targets: dict[str, ProbeTarget]) -> tuple[set[str], set[str]]:
        """Probe these load balancers at once; (those newly confirmed, those that lost it)."""
        ids = list(targets)
        results = await asyncio.gather(*(self._probe(targets[lb_id]) for lb_id in ids), return_exceptions=True)
        now, gained, lost = self._clock(), set(), set()
        for lb_id, result in zip(ids, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, LbAgentError | OSError):
                raise result
            answered = result is True
            if answered:
                self._failures.pop(lb_id, None)
                self._due[lb_id] = now + self._recheck()
                if lb_id not in self._confirmed:
                    self._confirmed.add(lb_id)
                    gained.add(lb_id)
                continue
            self._due[lb_id] = now + self._retry
            if lb_id in self._confirmed:
                failures = self._failures[lb_id] = self._failures.get(lb_id, 0) + 1
                if failures >= self._strikes:
                    self.forget(lb_id)
                    self._due[lb_id] = now + self._retry
                    lost.add(lb_id)
            if isinstance(result, BaseException):
                log.debug("lb=%s action=probe_traffic result=error error=%r", lb_id, str(result))
        return gained, lost


async def arp_probe(namespaces: NamespaceExecutor, target: ProbeTarget, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether `target`'s gateway answers an ARP request from its namespace within `timeout`."""
    sock = await namespaces.run(target.netns, arpprobe.open_socket, target.ifname)
    return await arpprobe.exchange(sock, target.mac, target.ip, target.gateway, timeout)
