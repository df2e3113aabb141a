"""Connection caps: each listener's own `maxconn`, the process's sized from their sum, and a real
haproxy that keeps one listener's held connections from taking another's slots."""

import asyncio
import contextlib

import pytest

from lbagent.haproxy.capacity import (
    ADMIN_CONNECTIONS,
    FD_HEADROOM,
    Capacity,
    Demand,
    demand,
    inherited_fd_limit,
    size,
)
from lbagent.haproxy.manager import HaproxyManager
from lbagent.haproxy.render import render_base, render_config
from lbagent.haproxy.sockets import send_command
from tests.unit.samples import (
    HAPROXY,
    WAIT,
    echo_through,
    free_port,
    lb_config,
    lb_text,
    only_loadbalancer,
    sample_members,
)


def tcp(listener_id, port, connection_limit=0):
    return {
        "id": listener_id,
        "listener_type": "tcp",
        "listener_port": port,
        "backend_group_id": "bg-web",
        "connection_limit": connection_limit,
    }


GROUPS = [{"id": "bg-web", "backends": [{"id": "be-1", "address": "198.18.0.21", "port": 80}]}]


def rendered(limits):
    lb = only_loadbalancer("lb-c", [tcp(f"l{i}", 8000 + i, limit) for i, limit in enumerate(limits)], GROUPS)
    return render_config(lb, "169.254.0.101", sample_members(lb), inner="169.254.0.100").text


def test_a_listener_with_a_connection_limit_caps_its_own_frontend():
    text = rendered([7, 0])
    first, second = text.split("\nfrontend ")[1:]
    assert "    maxconn 7\n" in first
    assert "maxconn" not in second  # the base file's default applies
    assert demand(text) == Demand([7, None], checked_servers=0)


def test_the_base_file_caps_every_listener_by_default_and_sizes_the_process():
    text = render_base("/run/lbagent", listener_maxconn=250, capacity=Capacity(maxconn=600, ulimit_n=2300))
    global_section, defaults = text.split("\ndefaults\n")
    assert "    maxconn 600\n" in global_section and "    ulimit-n 2300\n" in global_section
    assert "    maxconn 250\n" in defaults


def test_frontend_limits_ignore_backend_lines():
    text = "frontend a\n    maxconn 5\nbackend b\n    maxconn 9\nfrontend c\n    mode tcp\n"
    assert demand(text).frontend_limits == [5, None]


def test_servers_with_a_health_check_are_counted():
    checked = {"type": "tcp", "interval": 60}
    lb = only_loadbalancer(
        "lb-c",
        [tcp("l0", 8000) | {"health_check": checked}, tcp("l1", 8001) | {"backend_group_id": "bg-plain"}],
        [
            {"id": "bg-web", "backends": [{"id": f"be-{i}", "address": "198.18.0.21", "port": 80 + i} for i in (1, 2)]},
            {"id": "bg-plain", "backends": [{"id": "be-3", "address": "198.18.0.22", "port": 80}]},
        ],
    )
    text = render_config(lb, "169.254.0.101", sample_members(lb), inner="169.254.0.100").text
    # bg-web's two backends and the pod sample_members adds; bg-plain's listener has no check.
    assert demand(text) == Demand([None, None], checked_servers=3)


def test_the_process_takes_the_sum_of_the_listeners_and_two_descriptors_each():
    capacity = size(Demand([7, None, None], checked_servers=40), listener_default=100, fd_limit=1_000_000)
    assert capacity.maxconn == 7 + 2 * 100 + ADMIN_CONNECTIONS
    assert capacity.ulimit_n == 2 * capacity.maxconn + 3 + 40 + FD_HEADROOM
    assert not capacity.capped


def test_the_process_never_asks_for_more_descriptors_than_it_may_have():
    capacity = size(Demand([None] * 100, checked_servers=3_000), listener_default=10_000, fd_limit=20_000)
    assert capacity.capped and capacity.ulimit_n <= 20_000
    assert capacity.maxconn == (20_000 - 100 - 3_000 - FD_HEADROOM) // 2


# --- a real haproxy ------------------------------------------------------------------------


def show_info(manager) -> dict[str, str]:
    text = send_command(manager.paths.stats_sock, "show info")
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


@pytest.fixture
async def small_manager(run_dir):
    mgr = HaproxyManager(HAPROXY, run_dir, default_listener_maxconn=3)
    await mgr.start()
    yield mgr
    await mgr.stop()


async def test_the_process_is_resized_by_the_reload_that_adds_a_listener(small_manager, echo_port):
    ports = [free_port(), free_port()]
    one = lb_config(
        "lb-a", [{"id": "l0", "listener_type": "tcp", "listener_port": ports[0], "backend_group_id": "g"}], echo_port
    )
    assert await small_manager.apply("lb-a", one.text)
    assert show_info(small_manager)["Maxconn"] == str(3 + ADMIN_CONNECTIONS)
    limits = show_info(small_manager)["Maxsock"]

    listeners = [
        {"id": f"l{i}", "listener_type": "tcp", "listener_port": port, "backend_group_id": "g"}
        for i, port in enumerate(ports)
    ]
    two = lb_config("lb-a", listeners, echo_port)
    assert await small_manager.apply("lb-a", two.text)
    assert show_info(small_manager)["Maxconn"] == str(2 * 3 + ADMIN_CONNECTIONS)
    assert int(show_info(small_manager)["Maxsock"]) > int(limits)

    # Converged: nothing written, not even the base file.
    base = small_manager.paths.base_cfg.stat()
    assert await small_manager.apply("lb-a", two.text) is False
    assert small_manager.paths.base_cfg.stat().st_mtime_ns == base.st_mtime_ns


async def answered(port: int, payload: bytes = b"ping\n") -> bool:
    """True if a new connection to 127.0.0.1:port is served (echoed) within a second."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT)
    except OSError:
        return False
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), 1.0) == payload
    except (OSError, asyncio.IncompleteReadError, TimeoutError):
        return False
    finally:
        writer.close()


async def test_connections_held_on_one_listener_leave_the_others_served(small_manager, echo_port):
    port_a, port_b = free_port(), free_port()
    for lb_id, port in (("lb-a", port_a), ("lb-b", port_b)):
        listener = {"id": "l", "listener_type": "tcp", "listener_port": port, "backend_group_id": "g"}
        assert await small_manager.apply(lb_id, lb_config(lb_id, [listener], echo_port).text)

    async with contextlib.AsyncExitStack() as held:
        for _ in range(3):  # every slot of lb-a: served, then held idle
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port_a), WAIT)
            held.callback(writer.close)
            writer.write(b"hold\n")
            assert await asyncio.wait_for(reader.readexactly(5), WAIT) == b"hold\n"
        assert not await answered(port_a)
        assert await echo_through(port_b)
    assert await echo_through(port_a)  # the slots come back once the clients let go


def test_a_running_master_with_a_lower_limit_sizes_the_process():
    # An adopted master keeps the limit of the agent that started it.
    import resource
    import subprocess
    import sys

    ours = inherited_fd_limit()
    lower = min(ours, 4096) - 1

    def lower_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (lower, lower))

    master = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, preexec_fn=lower_limit
    )
    try:
        assert inherited_fd_limit(master.pid) == lower
    finally:
        master.communicate(timeout=10)
    assert inherited_fd_limit(master.pid) == ours  # gone: the next master inherits ours


async def test_a_reload_with_a_thousand_checked_servers_fits_the_descriptor_limit(run_dir, echo_port, monkeypatch):
    # haproxy keeps a socket for every checked server: sized without them, a capped
    # process asked for fewer descriptors than it needs and refused to load the file.
    monkeypatch.setattr("lbagent.haproxy.reloads.inherited_fd_limit", lambda pid=None: 3_000)
    port = free_port()
    one_server = lb_text("lb-a", port, echo_port, health_check={"type": "tcp", "interval": 60})
    server_line = next(line for line in one_server.splitlines() if line.startswith("    server "))
    many = "\n".join(server_line.replace("be-1 ", f"be-{i} ", 1) for i in range(1_200))
    manager = HaproxyManager(HAPROXY, run_dir)
    await manager.start()
    try:
        assert await manager.apply("lb-a", one_server.replace(server_line, many))
        info = show_info(manager)
        assert int(info["Maxsock"]) <= int(info["Ulimit-n"]) <= 3_000
        assert await echo_through(port)
    finally:
        await manager.stop()
