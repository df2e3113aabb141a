"""A small synchronous client of the agent's own API, for the CLI (and tests).

It reaches the agent the way the configuration says it listens: a unix
socket, plain TCP, or TLS trusting the certificate named in the configuration.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl

from lbagent.config import Config
from lbagent.errors import LbAgentError


class AgentUnreachable(LbAgentError):
    """The agent's API did not answer (not running, or listening elsewhere)."""


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def connection(config: Config, timeout: float) -> http.client.HTTPConnection:
    address = config.api.address
    if address.host is None:  # unix:/PATH: exactly one of path and host is set
        return UnixHTTPConnection(str(address.path), timeout)
    if config.api.tls_cert_file is not None:
        # Our own agent on this host: its certificate is the one in our config.
        context = ssl.create_default_context(cafile=str(config.api.tls_cert_file))
        context.check_hostname = False
        return http.client.HTTPSConnection(address.host, address.port, timeout=timeout, context=context)
    return http.client.HTTPConnection(address.host, address.port, timeout=timeout)


def request(config: Config, method: str, path: str, body: object = None, timeout: float = 10.0) -> tuple[int, object]:
    """(status, decoded JSON or text) of one request with the configured token."""
    conn = connection(config, timeout)
    headers = {"Accept": "application/json"}
    token = config.read_token()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    try:
        conn.request(method, path, body=data, headers=headers)
        response = conn.getresponse()
        raw = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise AgentUnreachable(f"agent API at {config.api.listen} not reachable: {exc}") from exc
    finally:
        conn.close()
    try:
        return response.status, json.loads(raw or b"{}")
    except ValueError:
        return response.status, raw.decode(errors="replace")


def get_json(config: Config, path: str, timeout: float = 10.0) -> tuple[int, dict]:
    code, answer = request(config, "GET", path, timeout=timeout)
    return code, answer if isinstance(answer, dict) else {"message": answer}
