"""The unit's ExecStart line, run as systemd would run it (Type=notify, watchdog):
READY=1 only after the first complete pass, WATCHDOG=1 pings, STOPPING=1 on SIGTERM."""

from __future__ import annotations

import os
import shlex
import socket
import time
from pathlib import Path

import pytest

from agentproc import LBAGENT

UNIT = Path(__file__).parents[2] / "systemd" / "lbagent.service"
WATCHDOG_USEC = 1_000_000  # pings every 0.5 s
DEADLINE = 30.0


def exec_start(config_path: Path) -> list[str]:
    """ExecStart= as written, with only the binary and the config path replaced."""
    line = next(line for line in UNIT.read_text().splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(line.removeprefix("ExecStart="))
    assert argv[0] == "/usr/local/bin/lbagent" and "/etc/lbagent/lbagent.toml" in argv, argv
    return [
        LBAGENT if word == argv[0] else str(config_path) if word == "/etc/lbagent/lbagent.toml" else word
        for word in argv
    ]


class NotifySocket:
    """The datagram socket systemd would own; remembers every message received."""

    def __init__(self, path: Path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[str] = []

    def wait_for(self, line: str, timeout: float = DEADLINE) -> list[str]:
        """Messages received until one holding `line`, inclusive."""
        start, deadline = len(self.messages), time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {line} within {timeout}s; got {self.messages[start:]}")
            self.sock.settimeout(remaining)
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
            if line in self.messages[-1].splitlines():
                return self.messages[start:]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path):
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def test_exec_start_speaks_sd_notify(configured_agent, notify_socket):
    agent = configured_agent()
    env = {**agent.env, "NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    agent.start(argv=exec_start(agent.config_path), env=env)

    # The loop runs and pings; without a desired state the agent is not ready, and says why.
    early = notify_socket.wait_for("WATCHDOG=1")
    early += notify_socket.wait_for("WATCHDOG=1")
    assert not any("READY=1" in m.splitlines() for m in early), early
    assert agent.request("GET", "/readyz")[0] == 503
    assert any(m.startswith("STATUS=waiting: no complete desired state") for m in early), early

    # An empty desired state is complete: its first pass finishes at once.
    assert agent.refresh({"generation": 1})[0] == 200
    notify_socket.wait_for("READY=1")
    assert agent.request("GET", "/readyz")[0] == 200
    notify_socket.wait_for("WATCHDOG=1")

    # haproxy, a child of the agent, was not handed the notification socket.
    pid = agent.status()["agent"]["haproxy"]["pid"]
    assert pid and b"NOTIFY_SOCKET=" not in Path(f"/proc/{pid}/environ").read_bytes()

    assert agent.stop() == 0
    assert any(m.startswith("STOPPING=1") for m in notify_socket.wait_for("STOPPING=1"))
    assert os.path.exists(f"/proc/{pid}")  # KillMode=process: haproxy outlives the agent
