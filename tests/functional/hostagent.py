"""An agent on a simulated host of a `MultiHost` sandbox, run and talked to as systemd and the
region controller would: `lbagent run` inside the host's namespaces, HTTP over a unix socket
(the host's loopback is not the test's), the CLI inside the host too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from devtools.multihost import MultiHost, SimHost
from lbagent.cli.client import UnixHTTPConnection

from agentproc import LBAGENT, AgentProcess, _decode, wait_until


class HostAgent(AgentProcess):
    def __init__(self, mh: MultiHost, host: SimHost, lease: float = 1.5, grace: float = 30.0, extra: str = ""):
        self.sim = host
        self.socket = host.base / "agent" / "api.sock"
        ovn = f'[ovn]\nnb = "{mh.central.nb_remote}"\nlease_seconds = {lease}\nrestart_grace = {grace}\n'
        super().__init__(host.base / "agent", host.ovs_db, host.name, extra_config=ovn + extra, env=host.env)
        text = self.config_path.read_text().replace(
            f'listen = "127.0.0.1:{self.port}"', f'listen = "unix:{self.socket}"'
        )
        self.config_path.write_text(text)

    def start(self, timeout: float = 60) -> HostAgent:
        with open(self.log_path, "ab") as log:
            self.proc = self.sim.popen(
                [LBAGENT, "run", "--config", str(self.config_path)], stdout=log, stderr=subprocess.STDOUT
            )
        wait_until(self._healthy, timeout, f"the agent of {self.sim.name} to answer /healthz")
        return self

    def request(self, method, path, body=None, token="default", content_type="application/json", raw=None, timeout=120):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": content_type} if data is not None else {}
        token = self.token if token == "default" else token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn = UnixHTTPConnection(str(self.socket), timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, _decode(response.read())
        finally:
            conn.close()

    def cli(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        argv = [*self.sim.launcher, LBAGENT, *args, "--config", str(self.config_path)]
        return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout, env=self.sim.env)

    def ha(self, lb_id: str) -> dict:
        return self.lb(lb_id).get("ha") or {}

    def destroy(self) -> None:
        """Stop the agent and remove what it made on its host (a crashed host's too)."""
        self.stop()
        if self.sim.ovs_db_running():
            result = self.cli("cleanup", "--yes", check=False, timeout=120)
            if result.returncode != 0:
                print("lbagent cleanup failed:", result.stdout, result.stderr)
        if os.environ.get("LBAGENT_KEEP_AGENT_DIRS") is None:
            shutil.rmtree(self.base, ignore_errors=True)


def agents_on(mh: MultiHost, names: list[str], **kwargs) -> dict[str, HostAgent]:
    return {name: HostAgent(mh, mh.host(name), **kwargs) for name in names}
