"""`TrafficProbes`: which load balancers' OVN ports are known to carry traffic.

A load balancer becomes `ready` only once its gateway answered an ARP request
sent from its namespace through OVN (`lbagent.ovnhost.arpprobe`); until then it
is `pending`, `waiting for traffic`, and is probed again every `retry`
seconds. A confirmed one is probed again every `recheck()` seconds (the resync
interval), and loses its confirmation after `strikes` failed probes in a row,
one `retry` apart: a single lost frame on a busy host does not take a VIP out
of service, a port that stopped forwarding does within seconds of being
noticed.

This module keeps the schedule (a heap: a tick looks only at what is due) and
the verdicts; the readiness watch says which load balancers wait, and `probe`
does the exchange. A load balancer forgotten while its probe was under way
(removed, its port no longer installed) takes no verdict from that probe.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lbagent.ovnhost import arpprobe
from lbagent.ovnhost.netns import NamespaceExecutor
from lbagent.support.blocking import BlockingPool

log = logging.getLogger("lbagent.workers.ovn_worker")  # its lines are the worker's

RETRY_SECONDS = 1.0
STRIKES = 3
PROBE_TIMEOUT = 1.0  # OVN answers a gateway's ARP in the local pipeline: milliseconds when it forwards
# Opening the socket waits for a namespace thread, which passes share: a probe
# that cannot even start within this is a failed probe, not a stalled watch.
PROBE_DEADLINE = PROBE_TIMEOUT + 2.0
# One tick's probes (4 ticks a second): thousands of ports installed at once are
# probed within seconds, without a burst of thousands of frames into OVS.
PROBES_AT_ONCE = 128
# Threads that close probe sockets: each close waits for the kernel (see arp_probe), not for a core.
PROBE_CLOSERS = 16


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
        self._heap: list[tuple[float, str]] = []  # (when, lb id); stale where _due says otherwise
        self._failures: dict[str, int] = {}  # confirmed lb id -> failed probes in a row
        self._epochs: dict[str, int] = {}  # lb id -> times forgotten: a probe's verdict needs the same

    def confirmed(self, lb_id: str) -> bool:
        return lb_id in self._confirmed

    def want(self, lb_id: str) -> None:
        """It waits for traffic: probed at once unless a probe is already scheduled."""
        if lb_id not in self._due:
            self._schedule(lb_id, self._clock())

    def forget(self, lb_id: str) -> None:
        """It is gone, disabled, or its port is not installed or not bound here: confirmed again
        only by a new answer, and nothing is probed until it is wanted again."""
        self._confirmed.discard(lb_id)
        self._due.pop(lb_id, None)
        self._failures.pop(lb_id, None)
        self._epochs[lb_id] = self._epochs.get(lb_id, 0) + 1

    def _schedule(self, lb_id: str, at: float) -> None:
        self._due[lb_id] = at
        heapq.heappush(self._heap, (at, lb_id))

    def due(self) -> list[str]:
        """The load balancers whose probe is due now, at most PROBES_AT_ONCE, the longest due first."""
        now, found = self._clock(), list[str]()
        while self._heap and self._heap[0][0] <= now and len(found) < PROBES_AT_ONCE:
            at, lb_id = heapq.heappop(self._heap)
            if self._due.get(lb_id) == at:
                del self._due[lb_id]
                found.append(lb_id)
        return found

    async def probe(self, targets: dict[str, ProbeTarget]) -> tuple[set[str], set[str]]:
        """Probe these load balancers at once; (those newly confirmed, those that lost it)."""
        epochs = {lb_id: self._epochs.get(lb_id, 0) for lb_id in targets}
        results = await asyncio.gather(*(self._bounded(target) for target in targets.values()))
        now, gained, lost = self._clock(), set(), set()
        for lb_id, answered in zip(targets, results, strict=True):
            if self._epochs.get(lb_id, 0) != epochs[lb_id]:
                continue  # forgotten meanwhile: this verdict is about a port that is no more
            if answered:
                self._failures.pop(lb_id, None)
                self._schedule(lb_id, now + self._recheck())
                if lb_id not in self._confirmed:
                    self._confirmed.add(lb_id)
                    gained.add(lb_id)
                continue
            self._schedule(lb_id, now + self._retry)
            if lb_id in self._confirmed:
                self._failures[lb_id] = self._failures.get(lb_id, 0) + 1
                if self._failures[lb_id] >= self._strikes:
                    self._confirmed.discard(lb_id)
                    del self._failures[lb_id]
                    lost.add(lb_id)
        return gained, lost

    async def _bounded(self, target: ProbeTarget) -> bool:
        """The probe's answer; False when it failed in any way or took past PROBE_DEADLINE."""
        try:
            async with asyncio.timeout(PROBE_DEADLINE):
                return await self._probe(target)
        except Exception as exc:  # one probe's failure is that load balancer's silence, never the watch's
            log.log(
                logging.DEBUG if isinstance(exc, arpprobe.ProbeError | TimeoutError) else logging.WARNING,
                "netns=%s action=probe_traffic result=error error=%r",
                target.netns,
                str(exc) or type(exc).__name__,
            )
            return False


async def arp_probe(
    namespaces: NamespaceExecutor, closer: BlockingPool, target: ProbeTarget, timeout: float = PROBE_TIMEOUT
) -> bool:
    """Whether `target`'s gateway answers an ARP request from its namespace within `timeout`.

    The socket is closed on `closer`'s threads, never on the event loop: closing
    a packet socket waits for an RCU grace period (synchronize_net), which took
    400 ms and more while a thousand load balancers were being built, and the
    probes of one tick held the loop for seconds."""
    frame = arpprobe.request(target.mac, target.ip, target.gateway)
    sock = await namespaces.run(target.netns, arpprobe.open_socket, target.ifname)
    try:
        return await arpprobe.exchange(sock, frame, target.ip, target.gateway, timeout)
    finally:
        closer.submit(sock.close)
