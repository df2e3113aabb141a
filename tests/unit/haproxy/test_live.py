"""Server-only changes go to the running haproxy without a reload (lbagent.haproxy.live
and HaproxyManager's live path), and everything else still reloads.

The planner is tested on texts; the manager against the real haproxy binary, with
small servers that answer with their own name, so a test sees which one served.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lbagent.desired.members import Member
from lbagent.haproxy.live import LiveEditError, ServerEdit, apply_edits, plan_server_edits
from lbagent.haproxy.render import render_config
from lbagent.haproxy.sockets import parse_show_stat, send_command
from tests.unit.samples import WAIT, free_port, only_loadbalancer, until

BACKEND = "be:lb-1:l"


def text(
    servers: list[tuple[str, int, int]],
    scheduler: str = "wrr",
    lb_id: str = "lb-1",
    port: int = 9000,
    sticky: bool = False,
    **listener,
) -> str:
    """lb-1's file: one tcp (or, sticky, http) listener whose group has `servers` as (key, port, weight)."""
    kind = "http" if sticky else "tcp"
    listener = {
        "id": "l",
        "listener_type": kind,
        "listener_port": port,
        "backend_group_id": "g",
        "scheduler": scheduler,
        **listener,
    }
    if sticky:
        listener["sticky_session"] = {"type": "insert", "cookie": "SRV"}
    backends = [{"id": key, "address": "198.18.0.21", "port": 80, "weight": weight} for key, _, weight in servers]
    lb = only_loadbalancer(lb_id, [listener], [{"id": "g", "backends": backends}])
    members = {"g": [Member(key, "198.18.0.21", 80, weight, "off", False, mapped) for key, mapped, weight in servers]}
    return render_config(lb, "127.0.0.1", members, inner="127.0.0.1").text


# --- planning ------------------------------------------------------------------------------


def test_a_replaced_server_is_one_addition_and_one_removal():
    edits = plan_server_edits(text([("a", 1025, 1), ("b", 1026, 1)]), text([("a", 1025, 1), ("c", 1027, 1)]))
    assert edits == [ServerEdit(BACKEND, "c", "127.0.0.1:1027 weight 1"), ServerEdit(BACKEND, "b", None)]


def test_a_weight_alone_is_a_weight_edit_and_the_same_text_no_edit():
    assert plan_server_edits(text([("a", 1025, 1)]), text([("a", 1025, 3)])) == [
        ServerEdit(BACKEND, "a", "127.0.0.1:1025 weight 3", weight_only=True)
    ]
    assert plan_server_edits(text([("a", 1025, 1)]), text([("a", 1025, 1)])) == []


@pytest.mark.parametrize(
    "old, new",
    [
        # a listener setting: not a server line
        (text([("a", 1025, 1)]), text([("a", 1025, 1)], timeouts={"client_idle": 5})),
        # the same server at another port
        (text([("a", 1025, 1)]), text([("a", 1026, 1)])),
        # balance source: haproxy adds no server at run time there
        (text([("a", 1025, 1)], scheduler="sch"), text([("a", 1025, 1), ("b", 1026, 1)], scheduler="sch")),
        # persistence cookies: refused on servers added at run time
        (text([("a", 1025, 1)], sticky=True), text([("a", 1025, 1), ("b", 1026, 1)], sticky=True)),
        # TLS to the backends (an http listener's group with ssl members)
        (
            text([("a", 1025, 1)], sticky=False).replace("weight 1", "weight 1 ssl verify none"),
            text([("a", 1025, 1), ("b", 1026, 1)]).replace("weight 1", "weight 1 ssl verify none"),
        ),
        # another listener port: the frontend changes
        (text([("a", 1025, 1)]), text([("a", 1025, 1), ("b", 1026, 1)], port=9001)),
        # no sections at all on one side
        ("# lbagent load balancer lb-1\n", text([("a", 1025, 1)])),
    ],
)
def test_anything_beyond_server_lines_needs_a_reload(old, new):
    assert plan_server_edits(old, new) is None


def test_edits_send_additions_first_and_report_servers_still_connected():
    sent = []
    answers = {
        "add server": "New server registered.\n",
        "del server be/gone": "Server deleted.\n",
        "del server be/busy": "Server still has connections attached to it, cannot remove it.\n",
    }

    def send(command):
        sent.append(command)
        return next((a for prefix, a in answers.items() if command.startswith(prefix)), "\n")

    lingering = apply_edits(
        [
            ServerEdit("be", "gone", None),
            ServerEdit("be", "busy", None),
            ServerEdit("be", "new", "127.0.0.1:1 weight 1 check inter 2s rise 2 fall 3"),
            ServerEdit("be", "w", "127.0.0.1:2 weight 7", weight_only=True),
        ],
        send,
    )
    assert lingering == {"be/busy"}
    assert sent == [
        "add server be/new 127.0.0.1:1 weight 1 check inter 2s rise 2 fall 3",
        "enable server be/new",
        "enable health be/new",
        "set weight be/w 7",
        "set server be/gone state maint",
        "del server be/gone",
        "set server be/busy state maint",
        "del server be/busy",
    ]


def test_a_refused_command_is_an_error():
    with pytest.raises(LiveEditError, match="Already exists"):
        apply_edits([ServerEdit("be", "a", "127.0.0.1:1 weight 1")], lambda command: "Already exists.\n")


# --- the manager against haproxy -------------------------------------------------------------


@pytest.fixture
async def named_servers():
    """Two servers on 127.0.0.1 that answer every connection with their own name; they
    record open connections so a test can hold one."""
    servers, held = {}, []

    def serve(name):
        async def answer(reader, writer):
            held.append(writer)
            try:
                writer.write(name.encode())
                await writer.drain()
                await reader.read()  # open until the other side closes
            except OSError:
                pass
            finally:
                writer.close()

        return answer

    for name in ("A", "B"):
        server = await asyncio.start_server(serve(name), "127.0.0.1", 0)
        servers[name] = (server, server.sockets[0].getsockname()[1])
    yield {name: port for name, (_, port) in servers.items()}
    for writer in held:
        writer.close()
    for server, _ in servers.values():
        server.close()
        await server.wait_closed()


async def who_answers(port: int) -> str:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT)
    try:
        return (await asyncio.wait_for(reader.read(1), WAIT)).decode()
    finally:
        writer.close()


def servers_of(manager) -> dict[str, str]:
    states = parse_show_stat(send_command(manager.paths.stats_sock, "show stat"))
    return {server: state for (backend, server), state in states.items() if backend == BACKEND}


def weight_of(manager, server: str) -> int:
    """The running weight (srv_uweight) of one of lb-1's servers, from `show servers state`."""
    for line in send_command(manager.paths.stats_sock, f"show servers state {BACKEND}").splitlines():
        words = line.split()
        if len(words) > 7 and words[1] == BACKEND and words[3] == server:
            return int(words[7])
    raise AssertionError(f"no server {server} in {BACKEND}")


async def test_a_replaced_backend_goes_live_with_no_reload(manager, named_servers):
    port = free_port()
    await manager.apply("lb-1", text([("a", named_servers["A"], 1)], port=port))
    assert await who_answers(port) == "A"
    reloads = manager.status()["reloads"]

    assert await manager.apply("lb-1", text([("b", named_servers["B"], 1)], port=port)) is True
    assert await who_answers(port) == "B"
    status = manager.status()
    assert (status["reloads"], status["live_updates"], status["servers_draining"]) == (reloads, 1, 0)
    assert set(servers_of(manager)) == {"b"}
    assert f"server b 127.0.0.1:{named_servers['B']} " in manager.paths.lb_file("lb-1").read_text()

    # A weight, live too; and what a reload loads from disk is the same.
    assert await manager.apply("lb-1", text([("b", named_servers["B"], 5)], port=port)) is True
    assert manager.status()["live_updates"] == 2
    assert weight_of(manager, "b") == 5
    await manager.apply("lb-1", text([("b", named_servers["B"], 5)], port=port, timeouts={"client_idle": 7}))
    assert manager.status()["reloads"] == reloads + 1
    assert set(servers_of(manager)) == {"b"} and weight_of(manager, "b") == 5 and await who_answers(port) == "B"


async def test_a_server_still_connected_drains_then_goes(manager, named_servers):
    port = free_port()
    await manager.apply("lb-1", text([("a", named_servers["A"], 1)], port=port))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(1), WAIT) == b"A"  # held open through haproxy

    await manager.apply("lb-1", text([("b", named_servers["B"], 1)], port=port))
    assert manager.status()["servers_draining"] == 1
    assert servers_of(manager) == {"a": "MAINT", "b": "no check"}
    assert {await who_answers(port) for _ in range(4)} == {"B"}  # nothing new goes to a
    assert await manager.supervise_once() is False and manager.status()["servers_draining"] == 1

    writer.close()

    async def deleted():
        await manager.supervise_once()
        return manager.status()["servers_draining"] == 0

    await until(deleted, "the drained server deleted")
    assert set(servers_of(manager)) == {"b"}


async def test_a_refused_edit_falls_back_to_a_reload(manager, named_servers):
    port = free_port()
    await manager.apply("lb-1", text([("a", named_servers["A"], 1)], port=port))
    held = await asyncio.open_connection("127.0.0.1", port)
    await manager.apply("lb-1", text([("b", named_servers["B"], 1)], port=port))  # a drains, held
    reloads = manager.status()["reloads"]

    # a comes back while haproxy still has it in maintenance: "add server" is refused.
    await manager.apply("lb-1", text([("a", named_servers["A"], 1), ("b", named_servers["B"], 1)], port=port))
    status = manager.status()
    assert (status["reloads"], status["servers_draining"]) == (reloads + 1, 0)
    assert set(servers_of(manager)) == {"a", "b"}
    assert {await who_answers(port) for _ in range(6)} == {"A", "B"}
    held[1].close()


async def test_a_sticky_backend_reloads(manager, named_servers):
    port = free_port()
    await manager.apply("lb-1", text([("a", named_servers["A"], 1)], port=port, sticky=True))
    reloads = manager.status()["reloads"]
    await manager.apply(
        "lb-1", text([("a", named_servers["A"], 1), ("b", named_servers["B"], 1)], port=port, sticky=True)
    )
    assert (manager.status()["reloads"], manager.status()["live_updates"]) == (reloads + 1, 0)


def refusing(manager, monkeypatch, refuse: str):
    """Make the running worker refuse commands starting with `refuse` (the others reach it)."""
    sender = manager._worker.live._sender

    def patched():
        send = sender()
        return lambda command: "Refused for the test.\n" if command.startswith(refuse) else send(command)

    monkeypatch.setattr(manager._worker.live, "_sender", patched)


def failing_reloads(manager, monkeypatch):
    from lbagent.haproxy.errors import HaproxyReloadError

    def reload_fails():
        raise HaproxyReloadError("refused for the test")

    monkeypatch.setattr(manager.process, "reload_or_start", reload_fails)


async def test_a_refused_edit_whose_reload_fails_too_puts_the_old_file_back(manager, named_servers, monkeypatch):
    from lbagent.haproxy.errors import HaproxyReloadError

    port = free_port()
    old = text([("a", named_servers["A"], 1)], port=port)
    await manager.apply("lb-1", old)
    refusing(manager, monkeypatch, "add server")  # the first command: the worker is untouched
    failing_reloads(manager, monkeypatch)
    with pytest.raises(HaproxyReloadError):
        await manager.apply("lb-1", text([("a", named_servers["A"], 1), ("b", named_servers["B"], 1)], port=port))
    status = manager.status()
    assert (status["failed_reloads"], status["live_updates"]) == (1, 0)
    assert status["last_error"] == "refused for the test"
    assert manager.paths.lb_file("lb-1").read_text() == old
    assert not (manager.paths.root / "reload-pending").exists()
    assert set(servers_of(manager)) == {"a"} and await who_answers(port) == "A"


async def test_a_half_applied_edit_keeps_the_new_file_and_the_supervisor_reloads_it(
    manager, named_servers, monkeypatch
):
    from lbagent.haproxy.errors import HaproxyReloadError

    port = free_port()
    await manager.apply("lb-1", text([("a", named_servers["A"], 1)], port=port))
    reloads = manager.status()["reloads"]
    refusing(manager, monkeypatch, "enable server")  # after "add server" went through
    failing_reloads(manager, monkeypatch)
    new = text([("b", named_servers["B"], 1)], port=port)
    with pytest.raises(HaproxyReloadError):
        await manager.apply("lb-1", new)
    # The worker holds b (in maintenance) and a: neither the old file nor the new one.
    assert servers_of(manager) == {"a": "no check", "b": "MAINT"}
    assert manager.paths.lb_file("lb-1").read_text() == new
    assert (manager.paths.root / "reload-pending").exists()
    monkeypatch.undo()
    assert await manager.supervise_once() is False
    assert set(servers_of(manager)) == {"b"} and await who_answers(port) == "B"
    assert manager.status()["reloads"] == reloads + 1
    assert not (manager.paths.root / "reload-pending").exists()


async def test_a_worker_behind_the_disk_is_reloaded_not_edited(manager, named_servers):
    port = free_port()
    await manager.apply("lb-1", text([("a", named_servers["A"], 1)], port=port))
    reloads = manager.status()["reloads"]
    (manager.paths.root / "reload-pending").touch()  # as an adoption whose reload failed leaves it
    await manager.apply("lb-1", text([("b", named_servers["B"], 1)], port=port))
    status = manager.status()
    assert (status["reloads"], status["live_updates"]) == (reloads + 1, 0)
    assert set(servers_of(manager)) == {"b"}
    assert not (manager.paths.root / "reload-pending").exists()


async def test_a_server_added_live_has_its_health_checked(manager, named_servers):
    port = free_port()
    check = {"type": "tcp", "interval": 1, "timeout": 1, "rise": 1, "fall": 1}
    await manager.apply("lb-1", text([("a", named_servers["A"], 1)], port=port, health_check=check))
    dead = free_port()  # nothing listens there: its check must fail
    await manager.apply(
        "lb-1",
        text(
            [("a", named_servers["A"], 1), ("b", named_servers["B"], 1), ("c", dead, 1)], port=port, health_check=check
        ),
    )
    assert manager.status()["live_updates"] == 1
    await until(
        lambda: servers_of(manager) == {"a": "UP", "b": "UP", "c": "DOWN"}, "checks of the added servers", timeout=WAIT
    )


def test_a_server_draining_past_its_limit_has_its_sessions_shut():
    from lbagent.haproxy.live import LiveServers
    from lbagent.haproxy.sockets import ProcTable

    clock, sent = [0.0], []
    answers = iter(["Server still has connections attached to it, cannot remove it.", "Server deleted."])

    def send(command):
        sent.append(command)
        return next(answers) if command.startswith("del server") else ""

    live = LiveServers(
        Path("/nonexistent"),
        lambda: ProcTable(1, 0, 0, frozenset({7}), frozenset()),
        drain_limit=60,
        clock=lambda: clock[0],
    )
    live._draining["be/old"] = 60.0
    live._retry(send)
    assert live.draining == 1 and sent == ["del server be/old"]
    clock[0] = 61.0
    live._retry(send)
    assert live.draining == 0
    assert sent[1:] == ["shutdown sessions server be/old", "del server be/old"]
