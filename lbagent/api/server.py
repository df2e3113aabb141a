"""Running the agent in the foreground: `lbagent run`.

Starts the agent and the API listener, tells systemd about its lifecycle
(`lbagent.api.sdnotify`), then waits for SIGTERM/SIGINT, which stop the agent
(not the data path: namespaces, rules and haproxy keep serving).

A unix-socket listener is bound, made mode 0600 and only then listened on,
so there is no moment at which anyone else could connect. A TCP listener
speaks TLS when the configuration names a certificate and key.

aiohttp logs a request it cannot parse (a bad request line or header) as an
error with a traceback and the offending text, which may hold a bearer token;
here it is one warning line that names the kind of error and nothing the
client sent. Bodies are never decompressed (the API refuses encoded ones), so
none can expand past the body limit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from lbagent.agent import Agent
from lbagent.api.app import create_app
from lbagent.api.sdnotify import Notifier, SystemdLink
from lbagent.config import Config
from lbagent.errors import ConfigError

log = logging.getLogger(__name__)

SOCKET_MODE = 0o600


async def serve(config: Config) -> None:
    notifier = Notifier.from_environment()
    agent = Agent(config)
    systemd = SystemdLink(notifier, agent.startup_reason)  # READY=1 once started: /readyz says more
    # api.md: a unix socket relies on its file mode instead of a token.
    token = None if config.api.address.is_unix else config.read_token()
    runner = app_runner(create_app(agent, token, config.api.max_body_bytes))
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        # Watchdog pings start now: connecting to OVSDB and adopting haproxy may take a while.
        systemd.start()
        await agent.start()
        site = await asyncio.to_thread(_site, runner, config)
        await site.start()
        log.info("action=listening api=%s tls=%s", config.api.listen, config.api.tls_cert_file is not None)
        await stop.wait()
        log.info("action=stopping reason=signal")
    finally:
        await systemd.stop()
        await runner.cleanup()
        await agent.stop()
    log.info("action=stopped data_path=left_serving")


class RequestErrorLog(logging.LoggerAdapter):
    """aiohttp's server logger, with a malformed request written as one line
    without its traceback or text."""

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        if isinstance(exc_info, HttpProcessingError):
            _log_malformed(logging.WARNING, exc_info, args)
        else:
            self.logger.exception(msg, *args, exc_info=exc_info, **kwargs)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        # aiohttp logs a bad method on a fresh connection (TLS or another protocol on the port) at debug.
        error = kwargs.get("exc_info")
        if isinstance(error, HttpProcessingError):
            _log_malformed(logging.DEBUG, error, args)
        else:
            self.logger.debug(msg, *args, **kwargs)


def _log_malformed(level: int, error: HttpProcessingError, args: tuple[object, ...]) -> None:
    remote = args[0] if args else None  # aiohttp passes the peer's address
    log.log(
        level,
        "action=api result=malformed_request remote=%s status=%s error=%s",
        remote,
        error.code,
        type(error).__name__,
    )


def runner_options() -> dict[str, Any]:
    """How the API application is served: no access log, no signal handlers of
    its own (serve() has them), bodies left as they came, malformed requests
    logged quietly."""
    return {
        "access_log": None,
        "handle_signals": False,
        "auto_decompress": False,
        "logger": RequestErrorLog(logging.getLogger("aiohttp.server"), {}),
    }


def app_runner(app: web.Application) -> web.AppRunner:
    return web.AppRunner(app, **runner_options())


def _site(runner: web.AppRunner, config: Config) -> web.BaseSite:
    """The listener of the configuration (blocking: files, sockets, certificates)."""
    address = config.api.address
    if address.path is not None:  # unix:/PATH
        return web.SockSite(runner, bind_unix_socket(address.path))
    context = None
    if config.api.tls_cert_file is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(config.api.tls_cert_file, config.api.tls_key_file)
    return web.TCPSite(runner, address.host, address.port, ssl_context=context)


def bind_unix_socket(path: Path) -> socket.socket:
    """A unix stream socket bound at `path` with mode 0600, not yet listening."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.is_socket():
        if _answers(path):
            raise ConfigError(f"api.listen unix:{path}: another process is already listening there")
        path.unlink()  # a stale socket from an earlier run
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        # Before listen(): until then a connect is refused, so the mode is in
        # place before anyone can be served.
        os.chmod(path, SOCKET_MODE)
    except OSError:
        sock.close()
        raise
    return sock


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True
