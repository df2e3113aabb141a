"""Active health checks of the members of UDP listeners.

UDP is balanced by the kernel inside the load balancer's namespace, so no
haproxy checks those members: this module probes them from that namespace
(sockets opened on a namespace thread stay bound to it), with the listener's
rise/fall/interval/timeout, and tells OvnWorker when a member's health
flips so its next pass gives that member new flows again, or none.

A `udp` check sends `udp_request` and, when `udp_expect` is set, wants it in
the answer; without an expected answer silence counts as alive and an ICMP
port-unreachable as dead. A `tcp` check connects to the member's port.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass

from lbagent.desired.members import Member
from lbagent.desired.model import HealthCheck

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (load balancer, listener, member key)


@dataclass(frozen=True)
class Probe:
    netns: str
    kind: str  # "udp" | "tcp"
    address: str
    port: int
    request: bytes
    expect: bytes
    interval: float
    timeout: float
    rise: int
    fall: int


def _open_socket(kind: str) -> socket.socket:
    # Called on a thread inside the namespace: the socket stays bound to it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


class UdpHealthChecker:
    def __init__(self, namespaces, on_change: Callable[[str], None]):
        self._namespaces = namespaces
        self._on_change = on_change
        self._probes: dict[Key, Probe] = {}
        self._tasks: dict[Key, asyncio.Task] = {}
        self._up: dict[Key, bool] = {}

    def sync(self, lb_id: str, netns: str, listeners: list[tuple[str, HealthCheck, list[Member]]]) -> None:
        """The probes `lb_id` needs now: (listener id, health check, members)."""
        wanted: dict[Key, Probe] = {}
        for listener_id, check, members in listeners:
            for member in members:
                wanted[(lb_id, listener_id, member.key)] = Probe(
                    netns,
                    check.type if check.type in ("udp", "tcp") else "udp",
                    member.address,
                    member.port,
                    check.udp_request.encode(),
                    check.udp_expect.encode(),
                    float(check.interval),
                    float(check.timeout),
                    check.rise,
                    check.fall,
                )
        for key in [k for k in self._probes if k[0] == lb_id and wanted.get(k) != self._probes[k]]:
            self._drop(key)
        for key, probe in wanted.items():
            if key not in self._probes:
                self._probes[key] = probe
                self._up[key] = True  # like haproxy: a new member starts up
                self._tasks[key] = asyncio.create_task(self._run(key, probe), name=f"udp-check-{key}")

    def unhealthy(self, lb_id: str) -> dict[str, set[str]]:
        down: dict[str, set[str]] = {}
        for (lb, listener, member), up in self._up.items():
            if lb == lb_id and not up:
                down.setdefault(listener, set()).add(member)
        return down

    def health(self, lb_id: str) -> dict[str, str]:
        """Member key -> "up"/"down" for the members of this load balancer's UDP listeners."""
        merged: dict[str, str] = {}
        for (lb, _, member), up in self._up.items():
            if lb == lb_id and merged.get(member) != "up":
                merged[member] = "up" if up else "down"
        return merged

    def forget(self, lb_id: str) -> None:
        for key in [k for k in self._probes if k[0] == lb_id]:
            self._drop(key)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for key in list(self._probes):
            self._drop(key)
        await asyncio.gather(*tasks, return_exceptions=True)

    def _drop(self, key: Key) -> None:
        self._probes.pop(key, None)
        self._up.pop(key, None)
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()

    async def _run(self, key: Key, probe: Probe) -> None:
        passed = failed = 0
        while True:
            ok = await self.probe_once(probe)
            passed, failed = (passed + 1, 0) if ok else (0, failed + 1)
            up = self._up.get(key, True)
            if (up and failed >= probe.fall) or (not up and passed >= probe.rise):
                self._up[key] = not up
                log.info("lb=%s listener=%s member=%s object=health action=%s", *key, "up" if not up else "down")
                self._on_change(key[0])
            await asyncio.sleep(probe.interval)  # the check's own period, not a wait for a condition

    async def probe_once(self, probe: Probe) -> bool:
        loop = asyncio.get_running_loop()
        try:
            sock = await self._namespaces.run(probe.netns, _open_socket, probe.kind)
        except Exception as exc:  # the namespace is being rebuilt: no verdict yet counts as a failure
            log.debug("health probe could not open a socket in %s: %s", probe.netns, exc)
            return False
        try:
            async with asyncio.timeout(probe.timeout):
                return await self._exchange(loop, sock, probe)
        except TimeoutError:
            # UDP with nothing expected: silence means nobody refused it.
            return probe.kind == "udp" and not probe.expect
        except OSError:
            return False  # refused (ICMP port unreachable, RST) or unreachable
        finally:
            sock.close()

    @staticmethod
    async def _exchange(loop, sock: socket.socket, probe: Probe) -> bool:
        await loop.sock_connect(sock, (probe.address, probe.port))
        if probe.kind == "tcp":
            return True
        await loop.sock_sendall(sock, probe.request)
        answer = await loop.sock_recv(sock, 4096)
        return not probe.expect or probe.expect in answer
