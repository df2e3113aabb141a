"""HaproxyManager against the real haproxy binary in a temporary run_dir.

Load balancers bind 127.0.0.1:<free port> instead of an OUTER address, and
their one server is a small asyncio echo server (INNER is 127.0.0.1 too).
Every test stops the haproxy it started, by pid, even when it fails.
"""

import asyncio
import functools
import os
import signal
import socket
import ssl
import stat
import threading
from pathlib import Path

import psutil
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from devtools.topology import self_signed_certificate
from lbagent.haproxy.batching import MAX_RELOAD_PAUSE
from lbagent.haproxy.errors import HaproxyCheckError, HaproxyError, HaproxyReloadError
from lbagent.haproxy.manager import HaproxyManager
from lbagent.haproxy.render import HaproxyConfig
from lbagent.haproxy.sockets import SHOW_SERVER_STATS, parse_show_proc, parse_show_stat, send_command
from tests.unit.samples import (
    HAPROXY,
    WAIT,
    echo_through,
    free_port,
    lb_config,
    lb_text,
    until,
)


@functools.cache
def certificate(common_name: str) -> tuple[str, str]:
    return self_signed_certificate(common_name)


def tls_config(
    lb_id: str,
    port: int,
    backend_port: int,
    names: tuple[str, ...],
    key_of: str | None = None,
    extra_listeners: tuple[dict, ...] = (),
) -> HaproxyConfig:
    """An https listener serving a certificate per name; `key_of` pairs the first with another name's key
    (in its file only: the desired state refuses such a pair, so only haproxy's own check sees it)."""
    certs = [
        {"id": f"c{index}", **dict(zip(("certificate", "private_key"), certificate(name)))}
        for index, name in enumerate(names)
    ]
    listener = {
        "id": "tls",
        "listener_type": "https",
        "listener_port": port,
        "backend_group_id": "g",
        "certificates": certs,
    }
    config = lb_config(lb_id, [listener, *extra_listeners], backend_port)
    if key_of is None:
        return config
    first = min(config.files)
    pem = (certificate(names[0])[0].strip() + "\n" + certificate(key_of)[1].strip() + "\n").encode()
    return HaproxyConfig(config.text, {**config.files, first: pem})


async def served_name(port: int, sni: str | None = None) -> str:
    """The common name of the certificate haproxy presents on 127.0.0.1:port for `sni`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, ssl=context, server_hostname=sni), WAIT
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


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


async def test_the_running_haproxy_holds_no_system_ca_store(manager, echo_port):
    # haproxy 2.6 loads every system CA at each start and reload unless told not to:
    # most of the time of a check or a reload, for a client nothing here uses.
    assert await manager.apply("lb-a", lb_text("lb-a", free_port(), echo_port)) is True
    # With the store loaded this lists "@system-ca - 144 certificate(s)"; with none, nothing.
    assert send_command(manager.paths.stats_sock, "show ssl ca-file").strip() == ""


async def test_a_reload_is_answered_before_its_staging_directories_go(manager, echo_port, monkeypatch):
    """Removing the staged directories waits on the reload thread behind the
    answer: with it held, the change is still reported served, and once let
    go (and waited for with tidied) nothing is left under staging/."""
    from lbagent.haproxy import reloads

    release, removed = threading.Event(), []
    real_discard = reloads.discard

    def held_discard(staged):
        assert release.wait(WAIT)
        removed.append(staged.lb_id)
        real_discard(staged)

    monkeypatch.setattr(reloads, "discard", held_discard)
    port = free_port()
    assert await asyncio.wait_for(manager.apply("lb-a", lb_text("lb-a", port, echo_port)), WAIT) is True
    assert await echo_through(port)
    assert removed == [] and len(list(manager.paths.staging_dir.iterdir())) == 1
    release.set()
    await manager.tidied()
    assert removed == ["lb-a"] and list(manager.paths.staging_dir.iterdir()) == []


async def test_a_prepared_change_is_checked_but_live_only_once_queued(manager, echo_port):
    port = free_port()
    with pytest.raises(HaproxyCheckError, match="unknown keyword 'bogus'"):
        await manager.prepare("lb-a", lb_text("lb-a", port, echo_port) + "    bogus directive\n")
    assert list(manager.paths.staging_dir.iterdir()) == []

    prepared = await asyncio.wait_for(manager.prepare("lb-a", lb_text("lb-a", port, echo_port)), WAIT)
    assert not (manager.paths.conf_dir / "lb-a.cfg").exists() and manager.status()["reloads"] == 0
    later = asyncio.ensure_future(manager.apply("lb-a", lb_text("lb-a", port, echo_port, timeouts={"client_idle": 77})))
    await asyncio.sleep(0.5)  # longer than a check: only the prepared change's lock holds it
    assert not later.done() and manager._lb_locks["lb-a"][1] == 2  # the next change waits for the prepared one
    await manager.drop(prepared)  # its pass failed: nothing of it goes live
    assert await asyncio.wait_for(later, WAIT) is True
    assert manager.status()["reloads"] == 1 and "77s" in (manager.paths.conf_dir / "lb-a.cfg").read_text()
    assert await echo_through(port)

    prepared = await manager.prepare("lb-a", lb_text("lb-a", port, echo_port))
    assert await asyncio.wait_for(manager.queue(prepared), WAIT) is True
    assert manager.status()["reloads"] == 2 and await echo_through(port)
    await manager.tidied()
    assert list(manager.paths.staging_dir.iterdir()) == []


async def test_a_stream_of_changes_is_batched_by_pacing(manager, echo_port):
    manager.reload_pace = 20.0  # each reload would be followed by a long pause while changes keep coming
    changes = []
    for i in range(16):  # a change every 50 ms for 0.8 s, as passes of a large refresh arrive
        changes.append(asyncio.create_task(manager.apply(f"lb-{i}", lb_text(f"lb-{i}", free_port(), echo_port))))
        await asyncio.sleep(0.05)
    assert await asyncio.gather(*changes) == [True] * 16
    # Unpaced, a reload would start whenever the previous one ended (about every 0.1 s).
    assert manager.status()["reloads"] <= 4


async def test_pacing_ends_once_the_burst_is_over(manager, echo_port):
    manager.reload_pace = 1000.0  # paced to the end, the second reload would wait MAX_RELOAD_PAUSE
    loop = asyncio.get_running_loop()
    first = asyncio.create_task(manager.apply("lb-a", lb_text("lb-a", free_port(), echo_port)))
    await until(lambda: manager._work.process_lock.locked(), "the first reload to start")
    second = asyncio.create_task(manager.apply("lb-b", lb_text("lb-b", free_port(), echo_port)))  # a burst
    assert await first
    first_done = loop.time()
    assert await second
    assert loop.time() - first_done < MAX_RELOAD_PAUSE / 2
    assert manager.status()["reloads"] == 2


async def test_one_change_after_another_is_not_paced(manager, echo_port):
    manager.reload_pace = 40.0  # were these paced, each would wait seconds
    port = free_port()
    loop = asyncio.get_running_loop()
    finished = []
    for i in range(3):
        # Each change waits for its reload: haproxy is idle when the next one comes.
        assert await manager.apply("lb-a", lb_text("lb-a", port, echo_port, timeouts={"client_idle": 60 + i}))
        finished.append((loop.time(), manager.status()["last_reload_seconds"]))
    for (done, took), (next_done, _next_took) in zip(finished, finished[1:]):
        assert next_done - done < min(manager.reload_pace * took, MAX_RELOAD_PAUSE), finished
    assert manager.status()["reloads"] == 3


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


# --- certificates and keys -----------------------------------------------------------------


def tree_modes(directory: Path) -> dict[str, int]:
    return {
        p.relative_to(directory).as_posix(): stat.S_IMODE(p.lstat().st_mode) for p in [directory, *directory.rglob("*")]
    }


async def test_files_are_written_private_checked_and_served_by_sni(manager, echo_port):
    port = free_port()
    config = tls_config("lb-a", port, echo_port, ("one.example.com", "two.example.com"))
    assert await manager.apply("lb-a", config.text, config.files) is True
    directory = manager.paths.certs_dir / "lb-a"
    assert tree_modes(directory) == {".": 0o700, "tls": 0o700, "tls/0-c0.pem": 0o600, "tls/1-c1.pem": 0o600}
    assert stat.S_IMODE(manager.paths.certs_dir.stat().st_mode) == 0o700
    assert (directory / "tls" / "1-c1.pem").read_bytes() == config.files["tls/1-c1.pem"]
    assert await served_name(port, "two.example.com") == "two.example.com"
    assert await served_name(port, "one.example.com") == "one.example.com"
    assert await served_name(port) == "one.example.com"  # no SNI: the first certificate
    assert manager.lb_ids_on_disk() == {"lb-a"}

    # Unchanged text and files: nothing happens.
    reloads = manager.status()["reloads"]
    assert await manager.apply("lb-a", config.text, config.files) is False
    assert manager.status()["reloads"] == reloads

    # Same file names, new content: written and reloaded.
    changed = tls_config("lb-a", port, echo_port, ("three.example.com", "two.example.com"))
    assert changed.text == config.text
    assert await manager.apply("lb-a", changed.text, changed.files) is True
    assert await served_name(port) == "three.example.com"
    await manager.tidied()
    assert list(manager.paths.staging_dir.iterdir()) == []


async def assert_previous_files_serve(manager, previous: HaproxyConfig, port: int) -> None:
    """The load balancer's text and files are `previous` again, and haproxy serves its certificate."""
    assert (manager.paths.conf_dir / "lb-a.cfg").read_text() == previous.text
    assert (manager.paths.certs_dir / "lb-a" / "tls" / "0-c0.pem").read_bytes() == previous.files["tls/0-c0.pem"]
    assert list(manager.paths.staging_dir.iterdir()) == []
    assert await served_name(port) == "one.example.com"


async def test_refused_certificate_keeps_the_previous_one_serving(manager, echo_port):
    port = free_port()
    good = tls_config("lb-a", port, echo_port, ("one.example.com",))
    await manager.apply("lb-a", good.text, good.files)
    before = manager.status()["reloads"]
    # Well-formed PEM, but the key belongs to another certificate.
    bad = tls_config("lb-a", port, echo_port, ("new.example.com",), key_of="other.example.com")
    with pytest.raises(HaproxyCheckError) as caught:
        await manager.apply("lb-a", bad.text, bad.files)
    message = str(caught.value)
    assert "lb-a" in message and "<certificates>" in message and "staging" not in message
    assert "PRIVATE KEY" not in message
    key_body = certificate("other.example.com")[1].splitlines()[1]
    assert key_body not in message
    assert manager.status()["reloads"] == before
    await assert_previous_files_serve(manager, good, port)


async def test_failed_reload_puts_the_previous_files_back(manager, echo_port):
    port = free_port()
    good = tls_config("lb-a", port, echo_port, ("one.example.com",))
    await manager.apply("lb-a", good.text, good.files)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = {
            "id": "more",
            "listener_type": "tcp",
            "listener_port": squatter.getsockname()[1],
            "backend_group_id": "g",
        }
        bad = tls_config("lb-a", port, echo_port, ("two.example.com",), extra_listeners=(taken,))
        with pytest.raises(HaproxyReloadError):
            await manager.apply("lb-a", bad.text, bad.files)
    await assert_previous_files_serve(manager, good, port)
    # And the next reload, with the same files, works.
    assert await manager.apply("lb-a", good.text + "# again\n", good.files) is True


async def test_removing_a_load_balancer_removes_its_files(manager, echo_port):
    config = tls_config("lb-a", free_port(), echo_port, ("one.example.com",))
    await manager.apply("lb-a", config.text, config.files)
    # Back to a plain listener: the directory goes with the last certificate.
    plain = lb_text("lb-a", free_port(), echo_port)
    assert await manager.apply("lb-a", plain) is True
    assert not (manager.paths.certs_dir / "lb-a").exists()
    await manager.apply("lb-a", config.text, config.files)
    assert await manager.apply("lb-a", None) is True
    assert not (manager.paths.certs_dir / "lb-a").exists() and manager.lb_ids_on_disk() == set()


async def test_orphaned_files_directory_counts_as_on_disk_and_goes(manager):
    orphan = manager.paths.certs_dir / "lb-gone"
    orphan.mkdir(parents=True)
    (orphan / "x.pem").write_bytes(b"")
    assert manager.lb_ids_on_disk() == {"lb-gone"}
    assert await manager.apply("lb-gone", None) is True
    assert not orphan.exists()


@pytest.mark.parametrize("name", ["../x.pem", "a/../../x", ".hidden", "a/b/c.pem", "", "a b"])
async def test_file_names_that_could_escape_are_refused(manager, name):
    with pytest.raises(HaproxyError):
        await manager.apply("lb-a", "# nothing\n", {name: b"x"})
    assert not (manager.paths.certs_dir / "lb-a").exists()


async def test_remove_files_takes_certificates_and_staging_leftovers(run_dir, echo_port):
    mgr = HaproxyManager(HAPROXY, run_dir)
    await mgr.start()
    config = tls_config("lb-a", free_port(), echo_port, ("one.example.com",))
    await mgr.apply("lb-a", config.text, config.files)
    leftover = mgr.paths.staging_dir / ".change-crashed"
    (leftover / "certs").mkdir(parents=True)
    await mgr.stop()
    removed = mgr.remove_files()
    assert str(mgr.paths.certs_dir / "lb-a") in removed and str(leftover) in removed
    assert not (run_dir / "haproxy").exists()


async def test_start_clears_changes_a_previous_agent_never_installed(manager, run_dir):
    leftover = manager.paths.staging_dir / ".change-crashed"
    leftover.mkdir()
    (leftover / "candidate.cfg").write_text("# never installed\n")
    successor = HaproxyManager(HAPROXY, run_dir)
    await successor.start()
    assert list(manager.paths.staging_dir.iterdir()) == []


# --- hitless reloads ---------------------------------------------------------------------------


def listening_inode(port: int) -> str | None:
    """The inode of the socket listening on 127.0.0.1:port, from /proc/net/tcp."""
    local = f"0100007F:{port:04X}"
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1] == local and fields[3] == "0A":  # 0A: LISTEN
            return fields[9]
    return None


async def test_reloads_refuse_no_connection(manager, echo_port):
    """Connections opened during 10 reloads all succeed: the new worker takes the
    listening socket over from the old one instead of binding a new one."""
    manager.reload_pace = 0  # back-to-back reloads: the more of them, the likelier a gap would show
    port = free_port()
    await manager.apply("lb-a", lb_text("lb-a", port, echo_port))
    socket_before = listening_inode(port)
    assert socket_before is not None
    outcome = {"ok": 0, "failed": []}
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as conn:
                    conn.sendall(b"ping\n")
                    assert conn.recv(16) == b"ping\n"
                outcome["ok"] += 1
            except (OSError, AssertionError) as exc:
                outcome["failed"].append(repr(exc))

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        for i in range(10):
            # Each text differs (a timeout), so each apply is one reload.
            assert (
                await manager.apply("lb-a", lb_text("lb-a", port, echo_port, timeouts={"client_idle": 60 + i})) is True
            )
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, WAIT)
    assert manager.status()["reloads"] == 11
    assert outcome["failed"] == [] and outcome["ok"] > 10, outcome
    assert listening_inode(port) == socket_before


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


async def test_server_states_read_the_server_rows_only(manager, echo_port):
    """haproxy answers SHOW_SERVER_STATS with the server rows alone (a third of
    `show stat` at a thousand load balancers), and they give the same states."""
    await manager.apply("lb-a", lb_text("lb-a", free_port(), echo_port))
    full = send_command(manager.paths.stats_sock, "show stat").splitlines()
    servers = send_command(manager.paths.stats_sock, SHOW_SERVER_STATS).splitlines()
    assert any(",FRONTEND," in line for line in full) and any(",BACKEND," in line for line in full)
    assert not any(",FRONTEND," in line or ",BACKEND," in line for line in servers)
    assert servers[0] == full[0]  # the same header
    assert [line for line in servers[1:] if line] == [
        line for line in full[1:] if line and ",FRONTEND," not in line and ",BACKEND," not in line
    ]
    assert set(await manager.server_states()) == {("be:lb-a:l", "be-1")}


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
    text = (
        "# pxname,svname,qcur,status,weight\n"
        "fe_a_l,FRONTEND,,OPEN,\n"
        "be_a_l,be-1,0,UP,1\n"
        "be_a_l,g.pod-1,0,no check,1\n"
        "be_a_l,BACKEND,0,UP,2\n"
    )
    assert parse_show_stat(text) == {("be_a_l", "be-1"): "UP", ("be_a_l", "g.pod-1"): "no check"}
    assert parse_show_stat("") == {}


def test_parse_show_stat_of_one_load_balancer_reads_its_own_rows_only():
    text = (
        "# pxname,svname,qcur,status,weight\n"
        "be:lb-a:l,be-1,0,UP,1\n"
        "be:lb-ab:l,be-1,0,DOWN,1\n"
        "be:lb-a:m,g.pod-1,0,no check,1\n"
    )
    assert parse_show_stat(text, "be:lb-a:") == {("be:lb-a:l", "be-1"): "UP", ("be:lb-a:m", "g.pod-1"): "no check"}
