"""Servers added to the running haproxy keep their traffic options: a backup
added live stays out of the rotation while a primary is up, its checks go to
its health check port, and status reads why a check failed."""

from __future__ import annotations

import asyncio

from lbagent.desired.memberoptions import GroupMember, TrafficOptions
from lbagent.desired.members import Member
from lbagent.haproxy.health import reason_of
from lbagent.haproxy.render import render_config
from lbagent.haproxy.sockets import parse_show_stat, send_command
from tests.unit.haproxy.test_live import who_answers
from tests.unit.samples import WAIT, free_port, only_loadbalancer, until

BACKEND = "be:lb-1:l"
CHECK = {"type": "tcp", "interval": 1, "timeout": 1, "rise": 1, "fall": 1}


def text(port: int, members: list[Member]) -> str:
    listener = {
        "id": "l",
        "listener_type": "tcp",
        "listener_port": port,
        "backend_group_id": "g",
        "health_check": CHECK,
    }
    backends = [{"id": m.key, "address": "198.18.0.21", "port": 80} for m in members]
    lb = only_loadbalancer("lb-1", [listener], [{"id": "g", "backends": backends}])
    return render_config(lb, "127.0.0.1", {"g": members}, inner="127.0.0.1").text


def member(key: str, port: int, **options) -> GroupMember:
    return GroupMember(key, "127.0.0.1", port, 1, "off", False, port, options=TrafficOptions(**options))


def stat_column(manager, server: str, column: str) -> str:
    lines = send_command(manager.paths.stats_sock, "show stat").splitlines()
    header = lines[0].removeprefix("# ").split(",")
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        if row.get("pxname") == BACKEND and row.get("svname") == server:
            return row[column]
    raise AssertionError(f"no server {server} in {BACKEND}")


def states(manager):
    return parse_show_stat(send_command(manager.paths.stats_sock, "show stat"))


async def answering(name: str) -> asyncio.Server:
    async def answer(reader, writer):
        writer.write(name.encode())
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", 0)


async def test_a_backup_added_live_waits_and_is_checked_on_its_check_port(manager):
    servers = [await answering(name) for name in "AB"]
    a, b = (server.sockets[0].getsockname()[1] for server in servers)
    try:
        port, dead = free_port(), free_port()
        await manager.apply("lb-1", text(port, [member("a", a)]))
        await manager.apply(
            "lb-1",
            text(
                port,
                [member("a", a), member("b", b, backup=True), member("c", b, check_port=dead, mapped_check_port=dead)],
            ),
        )
        assert manager.status()["live_updates"] == 1
        await until(
            lambda: states(manager)[(BACKEND, "c")] == "DOWN", "c's check on its check port to fail", timeout=WAIT
        )
        assert reason_of(states(manager)[(BACKEND, "c")]) == "connect_refused"  # though c's own port serves
        await until(lambda: states(manager)[(BACKEND, "b")] == "UP", "the backup's check to pass", timeout=WAIT)
        assert (stat_column(manager, "b", "bck"), stat_column(manager, "a", "bck")) == ("1", "0")
        assert {await who_answers(port) for _ in range(6)} == {"A"}  # the backup waits while a is up
    finally:
        for server in servers:
            server.close()
            await server.wait_closed()
