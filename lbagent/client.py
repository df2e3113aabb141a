"""A small synchronous client of the agent's own API, for the CLI."""

from __future__ import annotations

import http.client
import json
import socket
import ssl

from lbagent.config import Config


class AgentUnreachable(Exception):
    pass


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


def _connection(config: Config, timeout: float) -> http.client.HTTPConnection:
    address = config.api.address
    if address.is_unix:
        return _UnixConnection(str(address.path), timeout)
    if config.api.tls_cert_file is not None:
        # Our own agent on this host: its certificate is the one in our config.
        context = ssl.create_default_context(cafile=str(config.api.tls_cert_file))
        context.check_hostname = False
        return http.client.HTTPSConnection(address.host, address.port, timeout=timeout, context=context)
    return http.client.HTTPConnection(address.host, address.port, timeout=timeout)


def get_json(config: Config, path: str, timeout: float = 10.0) -> tuple[int, dict]:
    conn = _connection(config, timeout)
    headers = {"Accept": "application/json"}
    token = config.read_token()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        conn.request("GET", path, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    except (OSError, http.client.HTTPException) as exc:
        raise AgentUnreachable(f"agent API at {config.api.listen} not reachable: {exc}") from exc
    finally:
        conn.close()
