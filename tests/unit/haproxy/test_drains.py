"""A backend group's drain_timeout: a server removed live, or set to weight 0, keeps its
sessions until then, then they are shut; the deadlines survive a restart of the agent
(lbagent.haproxy.drains) and status shows them.

The rules run over a fake master CLI; one test runs the real haproxy with a held connection.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from lbagent.api.status import health_by_loadbalancer, loadbalancer_status
from lbagent.desired.members import Member
from lbagent.haproxy.drains import DrainBook
from lbagent.haproxy.health import ServerHealth, drain_remaining, with_drain_deadlines
from lbagent.haproxy.live import LiveServers, plan_server_edits
from lbagent.haproxy.render import render_config
from lbagent.haproxy.sockets import ProcTable
from tests.unit.samples import WAIT, free_port, only_loadbalancer, until

STILL = "Server still has connections attached to it, cannot remove it."


def lb_text(weights: dict[str, int], drain_timeout: int | None = None, port: int = 9000, mapped: int = 9100) -> str:
    group: dict = {"id": "g", "backends": [{"id": k, "address": "198.18.0.21", "port": 80} for k in weights]}
    if drain_timeout is not None:
        group["drain_timeout"] = drain_timeout
    listener = {"id": "l", "listener_type": "tcp", "listener_port": port, "backend_group_id": "g", "scheduler": "wrr"}
    lb = only_loadbalancer("lb-1", [listener], [group])
    # Each member keeps its port on INNER whatever else is in the group ("a" at `mapped`, "b" after it).
    members = {
        "g": [Member(k, "198.18.0.21", 80, w, "off", False, mapped + ord(k) - ord("a")) for k, w in weights.items()]
    }
    return render_config(lb, "127.0.0.1", members, inner="127.0.0.1").text


class FakeWorker:
    """The master CLI of one worker whose servers keep their connections until shut."""

    def __init__(self, pid: int = 7):
        self.pid = pid
        self.sent: list[str] = []
        self.connected: set[str] = set()

    def table(self) -> ProcTable:
        return ProcTable(1, 0, 0, frozenset({self.pid}), frozenset())

    def send(self, _socket: Path, addressed: str) -> str:
        to, _, command = addressed.partition(" ")
        assert to == f"@!{self.pid}"
        self.sent.append(command)
        verb, _, target = command.rpartition(" ")
        if verb == "shutdown sessions server":
            self.connected.discard(target)
        if verb == "del server":
            return STILL if target in self.connected else "Server deleted."
        if verb == "add server be:lb-1:l":
            return "New server registered."
        return ""


def live_servers(worker: FakeWorker, clock: list[float], book: Path | None = None) -> LiveServers:
    return LiveServers(
        Path("/nonexistent"), worker.table, 300, clock=lambda: clock[0], book=DrainBook(book), transport=worker.send
    )


def shut(worker: FakeWorker) -> list[str]:
    return [c for c in worker.sent if c.startswith("shutdown sessions")]


def test_a_groups_drain_timeout_is_written_for_live_edits_and_left_out_at_the_default():
    assert "# drain-timeout 30" in lb_text({"a": 1}, drain_timeout=30)
    assert "drain-timeout" not in lb_text({"a": 1}) and "drain-timeout" not in lb_text({"a": 1}, drain_timeout=300)
    edits = plan_server_edits(lb_text({"a": 1, "b": 1}, 30), lb_text({"b": 0}, 30))
    assert edits is not None and {(e.server, e.drain_timeout, e.quiesces) for e in edits} == {
        ("a", 30.0, False),
        ("b", 30.0, True),
    }
    assert {e.drain_timeout for e in plan_server_edits(lb_text({"a": 1}), lb_text({}))} == {None}


def test_a_removed_server_keeps_its_sessions_until_the_drain_timeout_then_goes():
    worker, clock = FakeWorker(), [1000.0]
    worker.connected.add("be:lb-1:l/a")
    live = live_servers(worker, clock)
    live.apply(plan_server_edits(lb_text({"a": 1}, 30), lb_text({}, 30)))
    assert live.deadlines() == {"be:lb-1:l/a": 1030.0} and shut(worker) == []
    clock[0] = 1029.9
    live.retry()
    assert live.draining == 1 and shut(worker) == []
    clock[0] = 1030.0
    live.retry()
    assert live.draining == 0 and shut(worker) == ["shutdown sessions server be:lb-1:l/a"]


def test_a_drain_timeout_of_0_shuts_at_once():
    worker, clock = FakeWorker(), [1000.0]
    worker.connected.add("be:lb-1:l/a")
    live = live_servers(worker, clock)
    live.apply(plan_server_edits(lb_text({"a": 1}, 0), lb_text({}, 0)))
    assert live.draining == 0 and shut(worker) == ["shutdown sessions server be:lb-1:l/a"]


def test_a_server_at_weight_0_is_shut_at_its_deadline_but_stays_and_weight_back_ends_the_drain():
    worker, clock = FakeWorker(), [1000.0]
    live = live_servers(worker, clock)
    live.apply(plan_server_edits(lb_text({"a": 1}, 10), lb_text({"a": 0}, 10)))
    assert live.deadlines() == {"be:lb-1:l/a": 1010.0}
    clock[0] = 1010.0
    live.retry()
    assert shut(worker) == ["shutdown sessions server be:lb-1:l/a"] and live.draining == 0
    assert not [c for c in worker.sent if c.startswith("del server")]

    live.apply(plan_server_edits(lb_text({"a": 1}, 10), lb_text({"a": 0}, 10)))
    live.apply(plan_server_edits(lb_text({"a": 0}, 10), lb_text({"a": 1}, 10)))
    assert live.draining == 0


def test_a_server_removed_after_weight_0_keeps_the_deadline_it_had():
    worker, clock = FakeWorker(), [1000.0]
    worker.connected.add("be:lb-1:l/a")
    live = live_servers(worker, clock)
    live.apply(plan_server_edits(lb_text({"a": 1}, 10), lb_text({"a": 0}, 10)))
    clock[0] = 1005.0
    live.apply(plan_server_edits(lb_text({"a": 0}, 10), lb_text({}, 10)))
    assert live.deadlines() == {"be:lb-1:l/a": 1010.0}


def test_deadlines_survive_a_restart_of_the_agent_but_not_a_new_worker(tmp_path):
    book, clock = tmp_path / "drains.json", [1000.0]
    worker = FakeWorker(pid=7)
    worker.connected.add("be:lb-1:l/a")
    live_servers(worker, clock, book).apply(plan_server_edits(lb_text({"a": 1}, 60), lb_text({}, 60)))

    restarted = live_servers(worker, clock, book)  # the same worker, adopted
    assert restarted.deadlines() == {"be:lb-1:l/a": 1060.0}
    clock[0] = 1060.0
    restarted.retry()
    assert shut(worker) == ["shutdown sessions server be:lb-1:l/a"] and not book.exists()

    live_servers(worker, clock, book).apply(plan_server_edits(lb_text({"b": 1}, 60), lb_text({}, 60)))
    worker.connected.add("be:lb-1:l/b")
    replaced = FakeWorker(pid=8)
    after = live_servers(replaced, clock, book)
    after.retry()
    assert after.draining == 0 and shut(replaced) == []


def test_a_drain_book_that_cannot_be_read_is_empty(tmp_path):
    (tmp_path / "drains.json").write_text("{not json")
    assert not DrainBook(tmp_path / "drains.json").load()


def test_status_lists_the_servers_draining_with_the_seconds_left():
    soon = datetime.now(UTC) + timedelta(seconds=41.5)
    states = with_drain_deadlines(
        {("be:lb-1:l", "a"): ServerHealth("MAINT", "disabled"), ("be:lb-1:l", "b"): ServerHealth("UP", "ok")},
        {"be:lb-1:l/a": soon.timestamp(), "be:lb-1:l/gone": soon.timestamp()},
    )
    assert drain_remaining(states[("be:lb-1:l", "a")], datetime.now(UTC)) == 42
    assert drain_remaining(states[("be:lb-1:l", "b")], datetime.now(UTC)) is None

    class Task:
        lb_id, state, reason, generation, last_error, retries, passes, last_reconciled_at = ("lb-1", "ready") + (
            None,
        ) * 6

    health = health_by_loadbalancer(states)["lb-1"]
    document = loadbalancer_status(Task(), None, None, None, "lb-x", None, health, {})
    assert document["draining"] == [{"id": "a", "remaining": 42}]


# --- the real haproxy -----------------------------------------------------------------------


@pytest.fixture
async def holding_server():
    """A backend that answers "A" and holds every connection open; its port."""
    held: list[asyncio.StreamWriter] = []

    async def serve(reader, writer):
        held.append(writer)
        writer.write(b"A")
        await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    for writer in held:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_a_connection_through_haproxy_outlives_its_servers_removal_until_the_drain_timeout(
    manager, holding_server
):
    port = free_port()
    await manager.apply("lb-1", lb_text({"a": 1}, drain_timeout=2, port=port, mapped=holding_server))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(1), WAIT) == b"A"
    removed_at = asyncio.get_running_loop().time()
    await manager.apply("lb-1", lb_text({}, drain_timeout=2, port=port))
    assert manager.status()["servers_draining"] == 1
    remaining = [drain_remaining(s, datetime.now(UTC)) for s in (await manager.server_states()).values()]
    assert remaining in ([2], [1])
    closed = asyncio.ensure_future(reader.read(1))

    async def cut() -> bool:
        await manager.supervise_once()
        return closed.done()

    await until(cut, "the drained connection cut")
    assert closed.result() == b""
    assert asyncio.get_running_loop().time() - removed_at >= 1.9  # not before its deadline
    await until(lambda: manager.status()["servers_draining"] == 0, "the drained server deleted")
    writer.close()
