"""Access logs (lbagent.haproxy.accesslog): haproxy's lines read from the agent's socket, turned
into records of the agent's log with the load balancer and listener ids, capped per listener;
and the real haproxy writing one line per request (http) and per connection (tcp)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from lbagent.haproxy.accesslog import AccessLogReader, RateCap, log_address, log_format, parse_line, wants_access_log
from lbagent.haproxy.files import HaproxyPaths
from lbagent.haproxy.render import render_base
from lbagent.logs import message_fields
from tests.unit.samples import WAIT, free_port, lb_config, until

HTTP_LINE = (
    'lbagent-access fe=fe:lb-1:web client=198.18.0.9:40000 method=GET path="/a?b=1" status=200 request_ms=0 '
    "queue_ms=0 connect_ms=1 response_ms=2 total_ms=3 backend=be:lb-1:web server=be-1 bytes=120 rate=2"
)


def test_a_line_becomes_a_record_with_its_ids_and_known_fields_only():
    line = parse_line(HTTP_LINE + " lb=forged")
    assert (line.lb_id, line.listener_id, line.rate) == ("lb-1", "web", 2)
    fields = message_fields(line.message(dropped=0))
    assert fields["lb"] == "lb-1" and fields["listener"] == "web" and fields["object"] == "access"
    assert (fields["path"], fields["status"], fields["server"]) == ("/a?b=1", "200", "be-1")
    assert "rate" not in fields and "fe" not in fields


def test_a_path_that_looks_like_fields_stays_the_path():
    line = parse_line(HTTP_LINE.replace('path="/a?b=1"', 'path="/x lb=evil listener=x"'))
    fields = message_fields(line.message(dropped=0))
    assert (fields["lb"], fields["listener"], fields["path"]) == ("lb-1", "web", "/x lb=evil listener=x")


@pytest.mark.parametrize(
    "text",
    ["haproxy started", "lbagent-access fe=fe:lb-1 rate=1", "lbagent-access fe=fe:lb-1:web rate=x", ""],
)
def test_anything_else_on_the_socket_is_ignored(text):
    assert parse_line(text) is None


def test_lines_beyond_a_listeners_rate_are_dropped_and_counted_in_the_next():
    now = [0.0]
    cap = RateCap(clock=lambda: now[0])
    assert [cap.admit("lb-1/web", 2) for _ in range(4)] == [0, 0, None, None]
    assert cap.admit("lb-1/other", 2) == 0  # each listener has its own
    now[0] = 0.5  # one more line's worth
    assert cap.admit("lb-1/web", 2) == 2
    assert cap.admit("lb-1/web", 2) is None


def test_the_reader_writes_admitted_lines_to_the_agents_log(caplog, tmp_path):
    reader = AccessLogReader(("127.0.0.1", 0), cap=RateCap(clock=lambda: 0.0))
    with caplog.at_level(logging.INFO, logger="lbagent.access"):
        for _ in range(3):
            reader.received(HTTP_LINE.encode())
    assert len(caplog.records) == 2 and all("lb=lb-1 listener=web" in r.getMessage() for r in caplog.records)


def test_the_log_format_names_every_field_the_reader_reads():
    assert log_format("http", 7).endswith(" rate=7") and "method=%HM" in log_format("http", 7)
    assert "bytes_in=%U" in log_format("tcp", 7) and "method" not in log_format("tcp", 7)


def test_the_base_file_names_the_socket_only_while_a_frontend_logs():
    logging_lb = lb_config(
        "lb-1",
        [{"id": "l", "listener_type": "tcp", "listener_port": 80, "backend_group_id": "g", "access_log": True}],
        1025,
    )
    quiet_lb = lb_config(
        "lb-1", [{"id": "l", "listener_type": "tcp", "listener_port": 80, "backend_group_id": "g"}], 1025
    )
    assert wants_access_log(logging_lb.text) and not wants_access_log(quiet_lb.text)
    address, port = log_address(HaproxyPaths(Path("/run/lbagent")))
    assert f"    log {address}:{port} format raw local0 info info\n" in render_base(
        Path("/run/lbagent"), access_log=True
    )
    assert address.startswith("127.") and log_address(HaproxyPaths(Path("/run/other")))[0] != address


# --- the real haproxy -----------------------------------------------------------------------


@pytest.fixture
async def http_backend():
    async def answer(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


async def exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT)
    writer.write(request)
    answer = await asyncio.wait_for(reader.read(), WAIT)
    writer.close()
    return answer


def access_records(caplog) -> list[dict[str, str]]:
    return [message_fields(r.getMessage()) for r in caplog.records if r.name == "lbagent.access"]


async def test_haproxy_logs_each_request_and_each_tcp_connection_with_its_ids(manager, http_backend, caplog):
    web, raw, quiet = free_port(), free_port(), free_port()
    listeners = [
        {"id": "web", "listener_type": "http", "listener_port": web, "backend_group_id": "g", "access_log": True},
        {"id": "raw", "listener_type": "tcp", "listener_port": raw, "backend_group_id": "g", "access_log": True},
        {"id": "quiet", "listener_type": "http", "listener_port": quiet, "backend_group_id": "g"},
    ]
    config = lb_config("lb-1", listeners, http_backend)
    caplog.set_level(logging.INFO, logger="lbagent.access")
    await manager.apply("lb-1", config.text, config.files)

    assert (await exchange(quiet, b"GET /q HTTP/1.0\r\n\r\n")).endswith(b"ok")
    assert (await exchange(web, b"GET /hello?x=1 HTTP/1.0\r\nHost: a\r\n\r\n")).endswith(b"ok")
    await until(lambda: access_records(caplog), "the request's access line")
    assert (await exchange(raw, b"GET /raw HTTP/1.0\r\n\r\n")).endswith(b"ok")
    await until(lambda: len(access_records(caplog)) == 2, "the tcp connection's access line")

    request, connection = access_records(caplog)
    assert (request["lb"], request["listener"], request["method"], request["path"], request["status"]) == (
        "lb-1",
        "web",
        "GET",
        "/hello",
        "200",
    )
    assert request["backend"] == "be:lb-1:web" and request["server"] == "be-1"
    assert (connection["lb"], connection["listener"], connection["server"]) == ("lb-1", "raw", "be-1")
    assert int(connection["bytes_in"]) == len(b"GET /raw HTTP/1.0\r\n\r\n") and int(connection["bytes_out"]) > 0
