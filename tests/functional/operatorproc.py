"""Agents configured the way an operator would (unix socket, TLS, JSON logs,
haproxy's exporter) or started the way systemd would, for the operator tests.

`ConfiguredAgent` is an `AgentProcess` whose configuration file is edited
before start, that talks to the agent through `lbagent.cli.client` (so unix
sockets and TLS work, exactly as the CLI reaches it), and that can be started
with any command line. The `configured_agent` fixture removes every agent it
started, pass or fail, like `agent_factory`.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess

from prometheus_client.parser import text_string_to_metric_families

from lbagent.cli.client import connection
from lbagent.config import load_config

from agentproc import LBAGENT, AgentProcess, _decode, wait_until


class ConfiguredAgent(AgentProcess):
    def __init__(self, *args, listen: str | None = None, settings: dict[str, list[str]] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        text = self.config_path.read_text()
        if listen is not None:
            text = re.sub(r'(?m)^listen = ".*"$', f'listen = "{listen}"', text)
        for section, lines in (settings or {}).items():
            header = f"[{section}]\n"
            addition = "".join(line + "\n" for line in lines)
            text = text.replace(header, header + addition) if header in text else text + header + addition
        self.config_path.write_text(text)
        self.config = load_config(self.config_path)

    def start(self, timeout: float = 30, argv: list[str] | None = None, env: dict | None = None) -> ConfiguredAgent:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv or [LBAGENT, "run", "--config", str(self.config_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env or self.env,
            )
        wait_until(self._healthy, timeout, "the agent's /healthz")
        return self

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
        """As AgentProcess.request, over whatever the configuration listens on."""
        conn = connection(self.config, timeout)
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = {"Content-Type": content_type} if data is not None else {}
        token = self.token if token == "default" else token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, _decode(response.read())
        except http.client.HTTPException as exc:
            raise ConnectionError(f"{method} {path}: {exc!r}") from exc
        finally:
            conn.close()

    def metrics(self) -> dict[tuple[str, tuple], float]:
        code, text = self.request("GET", "/metrics")
        assert code == 200, text
        return samples(text)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value, through the Prometheus text parser."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


VIP, MAC = "198.18.0.12", "00:22:0a:00:00:12"
BACKENDS = {"be-a": "198.18.0.21", "be-b": "198.18.0.22"}


def served_state(generation: int, lb_id: str | None) -> dict:
    """Desired state with the served_vpc load balancer (tcp/80 over both backends), or none."""
    from lbstate import backend, desired, loadbalancer, tcp_listener

    if lb_id is None:
        return desired(generation)
    members = [backend(name, address) for name, address in BACKENDS.items()]
    return desired(generation, loadbalancer(lb_id, VIP, MAC, [tcp_listener("lsn-80", 80)], {"bg-1": members}))


def wait_ready(agent: AgentProcess, lb_id: str, timeout: float = 30) -> dict:
    """Until the load balancer is ready and ovn-controller has installed its port."""
    return wait_until(
        lambda: (lb := agent.lb(lb_id))["ovn_installed"] and lb["state"] == "ready" and lb,
        timeout,
        f"{lb_id} ready with ovn-installed",
    )
