"""sd_notify: datagrams to $NOTIFY_SOCKET (paths and abstract names), the watchdog
interval, and the READY / WATCHDOG / STOPPING lifecycle of SystemdLink."""

import asyncio
import os
import secrets
import socket

import pytest

from lbagent.api import sdnotify
from lbagent.api.sdnotify import Notifier, SystemdLink, watchdog_interval


@pytest.fixture(params=["path", "abstract"])
def listener(request, tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        name = str(tmp_path / "notify.sock")
        sock.bind(name)
    else:
        name = "@lbagent-test-" + secrets.token_hex(6)
        sock.bind("\0" + name[1:])
    sock.settimeout(5)
    yield name, sock
    sock.close()


def test_notify_sends_one_datagram(listener):
    name, sock = listener
    assert Notifier(name, None).notify("READY=1", "STATUS=ready")
    assert sock.recv(4096) == b"READY=1\nSTATUS=ready"


def test_without_systemd_nothing_is_sent_and_nothing_raises(tmp_path):
    assert not Notifier(None, None).notify("READY=1")
    assert not Notifier(str(tmp_path / "gone.sock"), None).notify("READY=1")


def test_environment_is_read_and_unset_for_children():
    environ = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid()), "PATH": "/"}
    notifier = Notifier.from_environment(environ)
    assert notifier.notify_socket == "/run/x" and notifier.watchdog == 1.5
    assert environ == {"PATH": "/"}


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "nonsense"}, None),
        ({"WATCHDOG_USEC": "1000000"}, 0.5),
        ({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
    ],
)
def test_watchdog_interval(environ, expected):
    assert watchdog_interval(environ) == expected


async def test_lifecycle_ready_only_after_the_agent_is(listener, monkeypatch):
    name, sock = listener
    sock.setblocking(False)
    monkeypatch.setattr(sdnotify, "READY_POLL_INTERVAL", 0.01)
    reason = ["no complete desired state yet"]
    link = SystemdLink(Notifier(name, 0.01), lambda: reason[0])
    loop = asyncio.get_running_loop()
    link.start()

    async def receive_until(wanted: bytes) -> list[bytes]:
        seen = []
        while not any(wanted in message for message in seen):
            seen.append(await asyncio.wait_for(loop.sock_recv(sock, 4096), 5))
        return seen

    before = await receive_until(b"WATCHDOG=1")
    before += await receive_until(b"WATCHDOG=1")  # the loop runs and pings repeatedly...
    assert b"STATUS=waiting: no complete desired state yet" in before
    assert not any(b"READY=1" in m for m in before)  # ...but the agent is not ready
    reason[0] = None
    after = await receive_until(b"READY=1")
    assert any(m.startswith(b"READY=1\nSTATUS=ready") for m in after)
    await link.stop()
    assert (await receive_until(b"STOPPING=1"))[-1].startswith(b"STOPPING=1")
