"""Run the agent the way systemd does (`lbagent run --config FILE`) for a test,
and talk to it the way the region controller does (HTTP + bearer token)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

LBAGENT = str(Path(sys.executable).with_name("lbagent"))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class AgentProcess:
    def __init__(
        self,
        base: Path,
        ovs_db: str,
        host: str,
        resync_interval: float = 30.0,
        extra_config: str = "",
        resync_rate: float | None = None,
        env: dict | None = None,
        size_neighbour_tables: bool = False,
    ):
        self.base = base
        self.host = host
        self.env = env
        base.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(16)
        (base / "token").write_text(self.token + "\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.state_dir = base / "state"
        self.run_dir = base / "run"
        self.config_path = base / "lbagent.toml"
        rate = f"resync_rate = {resync_rate}\n" if resync_rate is not None else ""
        self.config_path.write_text(
            f'[agent]\nhost = "{host}"\nstate_dir = "{self.state_dir}"\nrun_dir = "{self.run_dir}"\n'
            f"resync_interval = {resync_interval}\n{rate}"
            # The tables are the machine's: only a test that restores them lets an agent raise them.
            f"size_neighbour_tables = {str(size_neighbour_tables).lower()}\n"
            f'[api]\nlisten = "127.0.0.1:{self.port}"\ntoken_file = "{base / "token"}"\n'
            f'[ovs]\ndb = "{ovs_db}"\n{extra_config}'
        )
        self.log_path = base / "agent.log"
        self.proc: subprocess.Popen | None = None
        # What `destroy` gives `lbagent cleanup`: after thousands of load balancers
        # ovs-vswitchd takes minutes to settle, and cleanup waits for it.
        self.cleanup_timeout = 120.0

    def start(self, timeout: float = 30) -> AgentProcess:
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [LBAGENT, "run", "--config", str(self.config_path)], stdout=log, stderr=subprocess.STDOUT, env=self.env
        )
        log.close()
        wait_until(self._healthy, timeout, "the agent's /healthz")
        return self

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"agent exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return self.request("GET", "/healthz")[0] == 200
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def request(
        self,
        method: str,
        path: str,
        body=None,
        token: str | None = "default",
        content_type: str = "application/json",
        raw: bytes | None = None,
        timeout: float = 120,
    ):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": content_type} if data is not None else {}
        token = self.token if token == "default" else token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, _decode(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _decode(exc.read())

    def refresh(self, state: dict, wait: float | None = 60):
        path = "/v1/refresh" + (f"?wait={wait}" if wait is not None else "")
        return self.request("POST", path, state)

    def status(self) -> dict:
        code, body = self.request("GET", "/v1/status")
        assert code == 200, body
        return body

    def resync_checks(self) -> dict[str, float]:
        """lbagent_resync_checks_total by result ("unchanged", "changed"), from /metrics."""
        code, text = self.request("GET", "/metrics")
        assert code == 200, text
        found = {"unchanged": 0.0, "changed": 0.0}
        for line in text.splitlines():
            if line.startswith("lbagent_resync_checks_total{"):
                labels, _, value = line.rpartition(" ")
                found[labels.split('result="', 1)[1].split('"', 1)[0]] = float(value)
        return found

    def lb(self, lb_id: str) -> dict:
        code, body = self.request("GET", f"/v1/loadbalancers/{lb_id}")
        assert code == 200, body
        return body

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [LBAGENT, *args, "--config", str(self.config_path)],
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            env=self.env,
        )

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout)

    def destroy(self) -> None:
        """Stop the agent and remove everything it created (haproxy included)."""
        self.stop()
        result = subprocess.run(
            [LBAGENT, "cleanup", "--yes", "--config", str(self.config_path)],
            capture_output=True,
            text=True,
            timeout=self.cleanup_timeout,
            env=self.env,
        )
        if result.returncode != 0:
            print("lbagent cleanup failed:", result.stdout, result.stderr, file=sys.stderr)
        if os.environ.get("LBAGENT_KEEP_AGENT_DIRS") is None:
            shutil.rmtree(self.base, ignore_errors=True)


def _decode(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")
