"""HaproxyManager against the real haproxy binary in a temporary run_dir.

Load balancers bind 127.0.0.1:<free port> instead of an OUTER address, and
their one server is a small asyncio echo server (INNER is 127.0.0.1 too).
Every test stops the haproxy it started, by pid, even when it fails.
"""

import asyncio
import os
import shutil
import signal
import socket
import time
from pathlib import Path

import psutil
import pytest

from lbagent.haproxy.errors import HaproxyCheckError, HaproxyError, HaproxyReloadError
from lbagent.haproxy.manager import HaproxyManager
from lbagent.haproxy.render import render_loadbalancer
from lbagent.haproxy.sockets import parse_show_proc, parse_show_stat
from lbagent.members import Member
from lbagent.model import parse_desired_state

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
WAIT = 10.0  # seconds: the bound of every wait below


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def lb_text(lb_id: str, port: int, backend_port: int, health_check: dict | None = None) -> str:
    listener = {"id": "l", "listener_type": "tcp", "listener_port": port, "backend_group_id": "g"}
    if health_check:
        listener["health_check"] = health_check
    state = parse_desired_state({
        "generation": 1,
        "subnets": [{"id": "net-1", "cidr": "198.18.0.0/24", "gateway": "198.18.0.1"}],
        "loadbalancers": [{
            "id": lb_id, "network": {"subnet_id": "net-1", "ip": "198.18.0.12", "mac": "00:22:0a:00:00:12"},
            "listeners": [listener],
            "backend_groups": [{"id": "g", "backends": [{"id": "be-1", "address": "198.18.0.21", "port": 80}]}],
        }],
    })
    members = {"g": [Member("be-1", "198.18.0.21", 80, 1, "off", False, backend_port)]}
    return render_loadbalancer(state.loadbalancers[0], "127.0.0.1", members, inner="127.0.0.1")


async def until(condition, what: str, timeout: float = WAIT):
    """Poll an async or plain condition until it holds; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def echo_through(port: int, payload: bytes = b"ping\n") -> bool:
    """True if a connection to 127.0.0.1:port echoes `payload` back (through haproxy to the echo server)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT)
    except OSError:
        return False
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), WAIT) == payload
    except (OSError, asyncio.IncompleteReadError):
        return False
    finally:
        writer.close()


def haproxy_pids_for(run_dir: Path) -> list[int]:
    """Processes whose command line loads this test's haproxy.cfg (its unique temporary path)."""
    marker = str(run_dir / "haproxy" / "haproxy.cfg")
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in (proc.info["cmdline"] or []):
            pids.append(proc.info["pid"])
    return pids


@pytest.fixture
async def echo_port():
    async def echo(reader, writer):
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


@pytest.fixture
async def run_dir(tmp_path):
    if not Path(HAPROXY).exists():
        pytest.skip("haproxy is not installed (make deps installs it)")
    path = tmp_path / "run"
    yield path
    # Whatever a test left running on its run_dir goes, by pid.
    for pid in haproxy_pids_for(path):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
async def manager(run_dir):
    mgr = HaproxyManager(HAPROXY, run_dir)
    await mgr.start()
    yield mgr
    await mgr.stop()


# --- applying --------------------------------------------------------------------------


async def test_apply_serves_and_the_same_text_again_does_not_reload(manager, echo_port):
    port = free_port()
    text = lb_text("lb-a", port, echo_port)
    assert await manager.apply("lb-a", text) is True
    assert await echo_through(port)
    assert (manager.paths.conf_dir / "lb-a.cfg").read_text() == text
    status = manager.status()
    assert status["running"] and status["reloads"] == 1 and status["last_reload_at"].endswith("+00:00")
    workers = manager.process.show_proc().workers

    assert await manager.apply("lb-a", text) is False
    assert manager.status()["reloads"] == 1
    assert manager.status()["pid"] == status["pid"]
    assert manager.process.show_proc().workers == workers
    assert manager.lb_ids_on_disk() == {"lb-a"}


async def test_concurrent_changes_share_a_few_reloads(manager, echo_port):
    ports = {f"lb-{i}": free_port() for i in range(20)}
    results = await asyncio.gather(*(manager.apply(lb, lb_text(lb, p, echo_port)) for lb, p in ports.items()))
    assert results == [True] * 20
    assert 1 <= manager.status()["reloads"] <= 3
    for port in ports.values():
        assert await echo_through(port)
    assert manager.lb_ids_on_disk() == set(ports)


async def test_refused_config_leaves_the_previous_one_serving(manager, echo_port):
    port = free_port()
    good = lb_text("lb-a", port, echo_port)
    await manager.apply("lb-a", good)
    reloads = manager.status()["reloads"]

    with pytest.raises(HaproxyCheckError, match="unknown keyword 'bogus'") as caught:
        await manager.apply("lb-a", good + "    bogus directive\n")
    assert "lb-a" in str(caught.value) and "staging" not in str(caught.value)

    assert (manager.paths.conf_dir / "lb-a.cfg").read_text() == good
    assert manager.status()["reloads"] == reloads
    assert list(manager.paths.staging_dir.iterdir()) == []
    assert await echo_through(port)


async def test_failed_reload_puts_the_batch_back_and_later_reloads_work(manager, echo_port):
    serving = free_port()
    await manager.apply("lb-a", lb_text("lb-a", serving, echo_port))
    # A listening socket without SO_REUSEPORT: haproxy -c cannot see the
    # conflict, the reload's bind fails, and the master keeps its old workers.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        with pytest.raises(HaproxyReloadError, match="previous workers keep serving"):
            await manager.apply("lb-b", lb_text("lb-b", taken, echo_port))
    assert manager.lb_ids_on_disk() == {"lb-a"}
    assert manager.status()["failed_reloads"] == 1
    assert await echo_through(serving)

    other = free_port()
    assert await manager.apply("lb-c", lb_text("lb-c", other, echo_port)) is True
    assert await echo_through(other) and await echo_through(serving)


async def test_reload_without_master_cli_falls_back_to_a_signal(manager, echo_port):
    manager.paths.master_sock.unlink()
    port = free_port()
    assert await manager.apply("lb-a", lb_text("lb-a", port, echo_port)) is True
    assert manager.status()["reloads"] == 1
    assert await echo_through(port)


async def test_removing_a_load_balancer_stops_its_port(manager, echo_port):
    port = free_port()
    await manager.apply("lb-a", lb_text("lb-a", port, echo_port))
    assert await manager.apply("lb-a", None) is True
    assert manager.lb_ids_on_disk() == set()
    assert not await echo_through(port)
    assert await manager.apply("lb-a", None) is False


async def test_unsafe_lb_id_never_becomes_a_path(manager):
    with pytest.raises(HaproxyError):
        await manager.apply("../escape", "# nothing\n")


# --- the master process ------------------------------------------------------------------


async def test_killed_master_is_restarted_by_supervision(manager, echo_port):
    port = free_port()
    await manager.apply("lb-a", lb_text("lb-a", port, echo_port))
    old_pid = manager.status()["pid"]
    assert await manager.supervise_once() is False

    os.kill(old_pid, signal.SIGKILL)
    await until(lambda: not manager.status()["running"], "the killed master to be gone")
    assert await manager.supervise_once() is True
    status = manager.status()
    assert status["running"] and status["pid"] != old_pid
    assert await echo_through(port)


async def test_a_new_manager_adopts_the_running_master(manager, run_dir, echo_port):
    port = free_port()
    text = lb_text("lb-a", port, echo_port)
    await manager.apply("lb-a", text)
    pid = manager.status()["pid"]

    # As after an agent restart: same run_dir, new manager, haproxy untouched.
    successor = HaproxyManager(HAPROXY, run_dir)
    await successor.start()
    assert successor.status()["pid"] == pid
    assert await successor.apply("lb-a", text) is False
    assert successor.status()["reloads"] == 0
    assert await echo_through(port)


async def test_adoption_reloads_files_that_may_not_be_loaded(manager, run_dir, echo_port):
    # An agent that died between installing a file and reloading left the marker.
    port = free_port()
    (manager.paths.conf_dir / "lb-a.cfg").write_text(lb_text("lb-a", port, echo_port))
    (manager.paths.root / "reload-pending").touch()

    successor = HaproxyManager(HAPROXY, run_dir)
    await successor.start()
    assert successor.status()["reloads"] == 1
    assert not (manager.paths.root / "reload-pending").exists()
    assert await echo_through(port)


async def test_a_changed_base_file_reloads_the_adopted_master(manager, run_dir):
    metrics = free_port()
    successor = HaproxyManager(HAPROXY, run_dir, prometheus_listen=f"127.0.0.1:{metrics}")
    await successor.start()
    assert successor.status()["pid"] == manager.status()["pid"]
    assert successor.status()["reloads"] == 1
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", metrics), WAIT)
    writer.write(b"GET /metrics HTTP/1.0\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), WAIT)
    writer.close()
    assert answer.startswith(b"HTTP/1.1 200") and b"haproxy_process_" in answer


async def test_files_that_keep_haproxy_down_are_dropped(manager, echo_port):
    port = free_port()
    text = lb_text("lb-a", port, echo_port)
    await manager.apply("lb-a", text)
    await manager.stop()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        (manager.paths.conf_dir / "lb-b.cfg").write_text(lb_text("lb-b", squatter.getsockname()[1], echo_port))
        assert await manager.supervise_once() is True
    status = manager.status()
    assert status["running"] and "lb-a, lb-b" in status["last_error"]
    assert manager.lb_ids_on_disk() == set()
    # Each load balancer's next pass puts its file back.
    assert await manager.apply("lb-a", text) is True
    assert await echo_through(port)


async def test_stop_and_remove_files(run_dir):
    mgr = HaproxyManager(HAPROXY, run_dir)
    assert await mgr.stop() is False
    await mgr.start()
    pid = mgr.status()["pid"]
    assert await mgr.stop() is True
    assert not mgr.status()["running"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    removed = mgr.remove_files()
    assert str(run_dir / "haproxy" / "haproxy.cfg") in removed
    assert not (run_dir / "haproxy").exists()


async def test_server_states_report_each_server(manager, echo_port):
    port = free_port()
    await manager.apply("lb-a", lb_text("lb-a", port, echo_port, {"type": "tcp", "interval": 1, "rise": 1}))

    async def up():
        return (await manager.server_states()).get(("be:lb-a:l", "be-1")) == "UP"

    await until(up, "the health check to mark be-1 UP")


async def test_server_states_without_haproxy_raise(run_dir):
    with pytest.raises(HaproxyError):
        await HaproxyManager(HAPROXY, run_dir).server_states()


# --- parsing haproxy's answers ----------------------------------------------------------

SHOW_PROC = """\
#<PID>          <type>          <reloads>       <uptime>        <version>
12885           master          2 [failed: 1]   0d00h00m15s     2.6.12-1+deb12u4
# workers
13273           worker          0               0d00h00m00s     2.6.12-1+deb12u4
# old workers
13001           worker          1               0d00h01m00s     2.6.12-1+deb12u4
# programs

"""


def test_parse_show_proc():
    table = parse_show_proc(SHOW_PROC)
    assert (table.master_pid, table.reloads, table.failed) == (12885, 2, 1)
    assert table.workers == {13273} and table.old_workers == {13001}
    assert parse_show_proc("") is None


def test_parse_show_stat_keeps_server_rows():
    text = ("# pxname,svname,qcur,status,weight\n"
            "fe_a_l,FRONTEND,,OPEN,\n"
            "be_a_l,be-1,0,UP,1\n"
            "be_a_l,g.pod-1,0,no check,1\n"
            "be_a_l,BACKEND,0,UP,2\n")
    assert parse_show_stat(text) == {("be_a_l", "be-1"): "UP", ("be_a_l", "g.pod-1"): "no check"}
    assert parse_show_stat("") == {}
