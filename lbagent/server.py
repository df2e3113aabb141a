"""Running the agent in the foreground: `lbagent run`.

Starts the agent and the API listener, then waits for SIGTERM/SIGINT, which
stop the agent (not the data path: namespaces, rules and haproxy keep serving).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import ssl

from aiohttp import web

from lbagent.agent import Agent
from lbagent.api import create_app
from lbagent.config import Config

log = logging.getLogger(__name__)


async def serve(config: Config) -> None:
    agent = Agent(config)
    runner = web.AppRunner(create_app(agent, config.read_token(), config.api.max_body_bytes),
                           access_log=None, handle_signals=False)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.start()
        site = _site(runner, config)
        await site.start()
        if config.api.address.is_unix:
            os.chmod(config.api.address.path, 0o600)
        log.info("action=listening api=%s", config.api.listen)
        await stop.wait()
        log.info("action=stopping reason=signal")
    finally:
        await runner.cleanup()
        await agent.stop()
    log.info("action=stopped data_path=left_serving")


def _site(runner: web.AppRunner, config: Config) -> web.BaseSite:
    address = config.api.address
    if address.is_unix:
        address.path.parent.mkdir(parents=True, exist_ok=True)
        if address.path.exists():
            address.path.unlink()  # a stale socket from an earlier run
        return web.UnixSite(runner, str(address.path))
    context = None
    if config.api.tls_cert_file is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(config.api.tls_cert_file, config.api.tls_key_file)
    return web.TCPSite(runner, address.host, address.port, ssl_context=context)
