"""What the high-availability benchmark watches while it breaks things: the client's connections
(bench/ha_probe.py inside the client's namespace) and, every sample interval, the SB binding of
the load balancer's port with both agents' roles and terms."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import bench.common  # noqa: F401 - puts tests/functional (hostagent) on sys.path
from bench.ha_report import Attempt, Sample, parse_attempt
from devtools.multihost import MultiHost, SimHost
from devtools.topology import VpcHost
from tests.functional.hostagent import HostAgent

PROBE = Path(__file__).resolve().parent / "ha_probe.py"


class Probe:
    """The client making a new connection to the VIP every `interval`; its attempts, as they end."""

    def __init__(self, host: SimHost, client: VpcHost, vip: str, port: int = 80, interval: float = 0.02):
        self.host, self.client, self.vip, self.port, self.interval = host, client, vip, port, interval
        self._attempts: list[Attempt] = []
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> Probe:
        argv = ["ip", "netns", "exec", self.client.netns, sys.executable, str(PROBE)]
        self._proc = self.host.popen(
            [*argv, self.vip, str(self.port), f"{self.interval:g}"], stdout=subprocess.PIPE, text=True
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            attempt = parse_attempt(line)
            if attempt is not None:
                with self._lock:
                    self._attempts.append(attempt)

    def attempts(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts)

    def answering(self, since: float) -> bool:
        """Whether a connection started after `since` was answered."""
        return any(a.outcome == "ok" and a.start >= since for a in self.attempts())

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)


class Sampler:
    """Every `interval`, on a thread: the chassis SB binds `lsp` to and each agent's (role, term)."""

    def __init__(self, mh: MultiHost, lsp: str, lb_id: str, agents: dict[str, HostAgent], interval: float = 0.05):
        self.mh, self.lsp, self.lb_id, self.agents, self.interval = mh, lsp, lb_id, agents, interval
        self.samples: list[Sample] = []
        self.durations: list[float] = []  # how long each sample took
        self._chassis_names: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            began = time.monotonic()
            self.samples.append(
                Sample(began, self._chassis(), {name: self._role(a) for name, a in self.agents.items()})
            )
            self.durations.append(time.monotonic() - began)
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _chassis(self) -> str | None:
        try:
            found = self.mh.central.sbctl(
                "--bare", "--columns=chassis", "find", "Port_Binding", f"logical_port={self.lsp}", timeout=5
            )
        except Exception:  # noqa: BLE001 - a failed look is an unknown moment, not the end of the run
            return None
        uuid = found.strip()
        if not uuid:
            return None
        if uuid not in self._chassis_names:
            self._chassis_names[uuid] = self.mh.central.sbctl(
                "--bare", "--columns=name", "list", "Chassis", uuid
            ).strip()
        return self._chassis_names[uuid] or None

    def _role(self, agent: HostAgent) -> tuple[str | None, int | None]:
        try:
            code, body = agent.request("GET", f"/v1/loadbalancers/{self.lb_id}", timeout=1)
        except OSError:
            return ("down", None)
        if code != 200 or not isinstance(body, dict):
            return (None, None)
        ha = body.get("ha") or {}
        return (ha.get("role"), ha.get("term"))

    def since(self, moment: float) -> list[Sample]:
        return [s for s in list(self.samples) if s.at >= moment]
