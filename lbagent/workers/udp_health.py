"""Active health checks of the members of UDP listeners.

UDP is balanced by the kernel inside the load balancer's namespace, so no
haproxy checks those members: this module probes them from that namespace
(sockets opened on a namespace thread stay bound to it), with the listener's
rise/fall/interval/timeout, and tells OvnWorker when a member's health
flips so its next pass gives that member new flows again, or none.

A `udp` check sends `udp_request` and, when `udp_expect` is set, wants it in
the answer; without an expected answer silence counts as alive and an ICMP
port-unreachable as dead. A `tcp` check connects to the member's port. Both
probe the group's `health_check_port` instead where it has one.

Each probe ends in a reason, as haproxy's checks do: `ok`, `connect_refused`
(a reset, an ICMP port-unreachable), `timeout` (nothing in time, or nothing
reachable) or `bad_response` (an answer without `udp_expect`); the status
document shows the last one and when the member last turned up or down.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from lbagent.desired.fields import family_of
from lbagent.desired.memberoptions import probed_port
from lbagent.desired.members import Member
from lbagent.desired.model import HealthCheck
from lbagent.haproxy.health import ServerHealth

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (load balancer, listener, member key)
OK = "ok"


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


def _open_socket(kind: str, address: str) -> socket.socket:
    # Called on a thread inside the namespace: the socket stays bound to it.
    family = socket.AF_INET6 if family_of(address) == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


class UdpHealthChecker:
    def __init__(
        self,
        namespaces,
        on_change: Callable[[str], None],
        carries_traffic: Callable[[str], bool] = lambda lb_id: True,
    ):
        self._namespaces = namespaces
        self._on_change = on_change
        # Whether a load balancer's own port carries traffic: until it does (a
        # new one, a standby's port bound elsewhere) no probe can leave its
        # namespace, and a failed one says nothing of the member.
        self._carries_traffic = carries_traffic
        self._probes: dict[Key, Probe] = {}
        # lb id -> its keys: a pass asks for its own members' health, which a
        # walk of every load balancer's would make grow with the host.
        self._keys: dict[str, set[Key]] = {}
        self._tasks: dict[Key, asyncio.Task] = {}
        self._up: dict[Key, bool] = {}
        self._reason: dict[Key, str] = {}  # the last probe's
        self._since: dict[Key, datetime] = {}  # the last turn up or down, or the first probe

    def sync(self, lb_id: str, netns: str, listeners: list[tuple[str, HealthCheck, list[Member]]]) -> None:
        """The probes `lb_id` needs now: (listener id, health check, members)."""
        wanted: dict[Key, Probe] = {}
        for listener_id, check, members in listeners:
            for member in members:
                wanted[(lb_id, listener_id, member.key)] = Probe(
                    netns,
                    check.type if check.type in ("udp", "tcp") else "udp",
                    member.address,
                    probed_port(member),
                    check.udp_request.encode(),
                    check.udp_expect.encode(),
                    float(check.interval),
                    float(check.timeout),
                    check.rise,
                    check.fall,
                )
        for key in [k for k in self._keys.get(lb_id, ()) if wanted.get(k) != self._probes[k]]:
            self._drop(key)
        for key, probe in wanted.items():
            if key not in self._probes:
                self._probes[key] = probe
                self._keys.setdefault(lb_id, set()).add(key)
                self._up[key] = True  # like haproxy: a new member starts up
                self._since[key] = datetime.now(UTC)
                self._tasks[key] = asyncio.create_task(self._run(key, probe), name=f"udp-check-{key}")

    def unhealthy(self, lb_id: str) -> dict[str, set[str]]:
        down: dict[str, set[str]] = {}
        for key in self._keys.get(lb_id, ()):
            if not self._up[key]:
                down.setdefault(key[1], set()).add(key[2])
        return down

    def health(self, lb_id: str) -> dict[str, ServerHealth]:
        """Member key -> "up"/"down" for the members of this load balancer's UDP listeners
        (up if any listener's check says so), with the reason of its last probe."""
        merged: dict[str, ServerHealth] = {}
        for key in sorted(self._keys.get(lb_id, ())):
            member, up = key[2], self._up[key]
            if merged.get(member) != "up":
                merged[member] = ServerHealth("up" if up else "down", self._reason.get(key), self._since.get(key))
        return merged

    def forget(self, lb_id: str) -> None:
        for key in list(self._keys.get(lb_id, ())):
            self._drop(key)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for key in list(self._probes):
            self._drop(key)
        await asyncio.gather(*tasks, return_exceptions=True)

    def _drop(self, key: Key) -> None:
        self._probes.pop(key, None)
        keys = self._keys.get(key[0])
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._keys[key[0]]
        self._up.pop(key, None)
        self._reason.pop(key, None)
        self._since.pop(key, None)
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()

    async def _run(self, key: Key, probe: Probe) -> None:
        passed = failed = 0
        while True:
            carried = self._carries(key[0])
            reason = await self.check_once(probe)
            if key not in self._probes:
                return  # dropped while probing
            if carried and self._carries(key[0]):
                self._reason[key] = reason
                passed, failed = (passed + 1, 0) if reason == OK else (0, failed + 1)
                self._count(key, probe, passed, failed)
            else:
                # Sent or answered while nothing could pass the load balancer's
                # port: a failure says nothing of the member, and neither does a
                # silence that a check without `udp_expect` takes for an answer.
                passed = failed = 0
            await asyncio.sleep(probe.interval)  # the check's own period, not a wait for a condition

    def _carries(self, lb_id: str) -> bool:
        try:
            return self._carries_traffic(lb_id)
        except Exception:  # a defect there must not end this member's checks: judged as before
            log.warning("lb=%s action=carries_traffic result=error", lb_id, exc_info=True)
            return True

    def _count(self, key: Key, probe: Probe, passed: int, failed: int) -> None:
        """The member turns after `fall` failures in a row, or back after `rise` passes."""
        up = self._up.get(key, True)
        if (up and failed >= probe.fall) or (not up and passed >= probe.rise):
            self._up[key] = not up
            self._since[key] = datetime.now(UTC)
            log.info("lb=%s listener=%s member=%s object=health action=%s", *key, "up" if not up else "down")
            self._on_change(key[0])

    async def probe_once(self, probe: Probe) -> bool:
        return await self.check_once(probe) == OK

    async def check_once(self, probe: Probe) -> str:
        """One probe: "ok", or why it failed."""
        loop = asyncio.get_running_loop()
        try:
            sock = await self._namespaces.run(probe.netns, _open_socket, probe.kind, probe.address)
        except Exception as exc:  # the namespace is being rebuilt: no verdict yet counts as a failure
            log.debug("health probe could not open a socket in %s: %s", probe.netns, exc)
            return "timeout"
        try:
            async with asyncio.timeout(probe.timeout):
                return await self._exchange(loop, sock, probe)
        except TimeoutError:
            # UDP with nothing expected: silence means nobody refused it.
            return OK if probe.kind == "udp" and not probe.expect else "timeout"
        except ConnectionRefusedError:
            return "connect_refused"  # an ICMP port unreachable, or a reset
        except OSError:
            return "timeout"  # unreachable: nothing could answer
        finally:
            sock.close()

    @staticmethod
    async def _exchange(loop, sock: socket.socket, probe: Probe) -> str:
        await loop.sock_connect(sock, (probe.address, probe.port))
        if probe.kind == "tcp":
            return OK
        await loop.sock_sendall(sock, probe.request)
        answer = await loop.sock_recv(sock, 4096)
        return OK if not probe.expect or probe.expect in answer else "bad_response"
