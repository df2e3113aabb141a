"""The listeners: a unix socket mode 0600 before anyone can connect, stale sockets
replaced, a live one never stolen; malformed requests logged as one line."""

import asyncio
import logging
import os
import re
import socket
import stat

import pytest
from aiohttp import web

from lbagent.api.app import create_app
from lbagent.api.server import app_runner, bind_unix_socket
from lbagent.errors import ConfigError
from tests.unit.fakes import FakeAgent
from tests.unit.samples import TOKEN


def test_bound_with_mode_0600_before_listening(tmp_path):
    path = tmp_path / "sub" / "api.sock"
    old_umask = os.umask(0)  # the mode must not depend on the umask
    try:
        sock = bind_unix_socket(path)
    finally:
        os.umask(old_umask)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(str(path))  # not listening yet: nobody is served before the mode is set
    finally:
        sock.close()


def test_a_stale_socket_is_replaced_and_a_live_one_refused(tmp_path):
    path = tmp_path / "api.sock"
    stale = bind_unix_socket(path)
    stale.close()  # bound but closed: what a killed agent leaves behind
    replacement = bind_unix_socket(path)
    replacement.listen()
    try:
        with pytest.raises(ConfigError, match="already listening"):
            bind_unix_socket(path)
        assert path.is_socket()
    finally:
        replacement.close()


@pytest.fixture
async def served_port():
    runner = app_runner(create_app(FakeAgent(), TOKEN, max_body_bytes=64 * 1024, reporter=FakeAgent()))
    await runner.setup()
    site = web.SockSite(runner, socket.create_server(("127.0.0.1", 0)))
    await site.start()
    yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await runner.cleanup()


async def send(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)  # a malformed request closes the connection
    finally:
        writer.close()


BEARER = b"Authorization: Bearer " + TOKEN.encode()


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /v1/st\x01atus HTTP/1.1\r\n" + BEARER + b"\r\n\r\n",  # a bad request line
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + BEARER + b"\r\nBad Header: \x01\r\n\r\n",
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + BEARER + b"\x7f\r\n\r\n",  # the token's own line
        b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + BEARER + b"x" * 9000 + b"\r\n\r\n",  # too long
    ],
)
async def test_a_malformed_request_is_one_warning_line_without_its_text(served_port, caplog, request_bytes):
    caplog.set_level(logging.DEBUG)
    answer = await send(served_port, request_bytes)
    assert answer.startswith(b"HTTP/1.0 400 ")
    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "lbagent.api"))]
    assert [(r.levelno, r.exc_info, r.exc_text) for r in records] == [(logging.WARNING, None, None)]
    assert re.fullmatch(
        r"action=api result=malformed_request remote=127\.0\.0\.1 status=400 error=\w+", records[0].getMessage()
    )
    assert TOKEN not in caplog.text


async def test_a_bad_method_on_a_fresh_connection_is_one_debug_line(served_port, caplog):
    caplog.set_level(logging.DEBUG)
    await send(served_port, b"\x16\x03\x01" + BEARER + b"\r\n\r\n")  # a TLS hello, or anything but HTTP
    records = [r for r in caplog.records if r.name.startswith(("aiohttp", "lbagent.api"))]
    assert [(r.levelno, r.exc_info) for r in records] == [(logging.DEBUG, None)]
    assert TOKEN not in caplog.text
