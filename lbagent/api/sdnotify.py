"""systemd's service notification protocol (sd_notify(3)) and the agent's use of it.

`Notifier` sends "KEY=VALUE" lines as one datagram to $NOTIFY_SOCKET (a path,
or an abstract name written with a leading '@'). It never blocks and never
raises: without systemd, or when the socket is gone, a notification is simply
not sent. `SystemdLink` tells systemd the agent's lifecycle: READY=1 once the
agent is ready (a complete desired state known and its first pass finished),
WATCHDOG=1 at half of $WATCHDOG_USEC for as long as the event loop runs, and
STOPPING=1 on shutdown; STATUS= lines say what it waits for meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, MutableMapping

log = logging.getLogger(__name__)

READY_POLL_INTERVAL = 0.2  # seconds between two looks at the agent's readiness
NOTIFY_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def socket_address(value: str) -> str:
    """$NOTIFY_SOCKET as an AF_UNIX address: '@name' is the abstract name '\\0name'."""
    return "\0" + value[1:] if value.startswith("@") else value


def watchdog_interval(environ: MutableMapping[str, str], pid: int | None = None) -> float | None:
    """Seconds between two WATCHDOG=1 pings (half the timeout), or None when the watchdog is off or not ours."""
    try:
        usec = int(environ.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner and owner != str(os.getpid() if pid is None else pid):
        return None
    return usec / 2 / 1_000_000


class Notifier:
    def __init__(self, notify_socket: str | None, watchdog: float | None):
        self.notify_socket = notify_socket or None
        self.watchdog = watchdog

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] | None = None, unset: bool = True) -> Notifier:
        """Read the variables systemd sets; with unset, remove them so that children
        (haproxy) do not talk to systemd in the agent's name."""
        environ = os.environ if environ is None else environ
        notifier = cls(environ.get("NOTIFY_SOCKET"), watchdog_interval(environ))
        if unset:
            for name in NOTIFY_VARIABLES:
                environ.pop(name, None)
        return notifier

    def notify(self, *lines: str) -> bool:
        """Send the lines as one message; True if it was sent."""
        if self.notify_socket is None:
            return False
        message = "\n".join(lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)  # called on the event loop: drop rather than wait
                sock.sendto(message, socket_address(self.notify_socket))
        except OSError as exc:
            log.warning("object=systemd action=notify result=error error=%r", str(exc))
            return False
        return True


class SystemdLink:
    """The agent's lifecycle as systemd sees it (Type=notify with a watchdog)."""

    def __init__(self, notifier: Notifier, not_ready_reason: Callable[[], str | None]):
        self._notifier = notifier
        self._not_ready_reason = not_ready_reason
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        if self._notifier.notify_socket is None:
            return
        if self._notifier.watchdog is not None:
            self._tasks.append(asyncio.create_task(self._watchdog(self._notifier.watchdog), name="systemd-watchdog"))
        self._tasks.append(asyncio.create_task(self._announce_ready(), name="systemd-ready"))

    async def _watchdog(self, interval: float) -> None:
        # Runs on the event loop itself: a loop that stops turning stops the pings.
        while True:
            self._notifier.notify("WATCHDOG=1")
            await asyncio.sleep(interval)

    async def _announce_ready(self) -> None:
        said = None
        while (reason := self._not_ready_reason()) is not None:
            if reason != said:
                self._notifier.notify(f"STATUS=waiting: {reason}")
                said = reason
            await asyncio.sleep(READY_POLL_INTERVAL)
        self._notifier.notify("READY=1", "STATUS=ready: first pass over the desired state finished")
        log.info("object=systemd action=ready")

    async def stop(self) -> None:
        self._notifier.notify("STOPPING=1", "STATUS=stopping; the data path keeps serving")
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
