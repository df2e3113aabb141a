"""haproxy's workers as an unprivileged user in an empty chroot, with a real haproxy: the master
stays root and keeps loading certificates, reloading and answering its CLI."""

import asyncio
import os
import pwd
import socket
import ssl
from pathlib import Path

import pytest

from lbagent.desired.members import Member
from lbagent.haproxy.manager import HaproxyManager
from lbagent.haproxy.render import render_base, render_config
from lbagent.haproxy.settings import Privileges
from tests.unit.samples import HAPROXY, WAIT, certificate, echo_through, free_port, lb_config, only_loadbalancer

USER = "lbagent-haproxy"  # made by `make deps`


def account() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("dropping privileges needs root")
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        pytest.fail(f"user {USER} does not exist (make deps creates it)")


def ids(pid: int) -> tuple[int, int]:
    """(real uid, real gid) of a process, from /proc/<pid>/status."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])


def tls_listener(listener_id: str, port: int) -> dict:
    return {
        "id": listener_id,
        "listener_type": "https",
        "listener_port": port,
        "backend_group_id": "g",
        "certificates": [{"id": "c0", **certificate("one.example.com")}],
    }


def served_over_tls(port: int) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as raw:
        with context.wrap_socket(raw, server_hostname="one.example.com") as tls:
            return tls.version() is not None


def test_base_file_names_the_account_and_the_jail():
    text = render_base("/run/lbagent", privileges=Privileges("u", "g", Path("/run/lbagent/haproxy/chroot")))
    global_section = text.split("\ndefaults\n")[0]
    assert "    user u\n    group g\n" in global_section
    assert "    chroot /run/lbagent/haproxy/chroot\n" in global_section
    unprivileged = render_base("/run/lbagent").split("\ndefaults\n")[0]
    assert "    user " not in unprivileged and "    chroot " not in unprivileged


@pytest.fixture
async def jailed(run_dir):
    user = account()
    jail = run_dir / "haproxy" / "chroot"
    mgr = HaproxyManager(HAPROXY, run_dir, user=user.pw_name, group=USER, chroot=jail)
    await mgr.start()
    yield mgr, user
    await mgr.stop()


def workers(manager) -> frozenset[int]:
    table = manager.process.show_proc()
    assert table is not None and table.workers
    return table.workers


async def test_workers_run_as_the_user_in_the_jail_and_reloads_keep_them_there(jailed, echo_port):
    manager, user = jailed
    jail = manager.paths.chroot_dir
    status = jail.stat()
    assert (status.st_uid, status.st_mode & 0o7777) == (0, 0o755) and not any(jail.iterdir())

    tls_port, tcp_port = free_port(), free_port()
    assert await manager.apply("lb-a", *_config([tls_listener("tls", tls_port)], echo_port))
    assert served_over_tls(tls_port)  # the master read the key as root, before the workers dropped root
    first = workers(manager)
    for pid in first:
        assert ids(pid) == (user.pw_uid, user.pw_gid)
        assert os.readlink(f"/proc/{pid}/root") == str(jail)
    assert ids(manager.status()["pid"]) == (0, 0)

    tcp = {"id": "plain", "listener_type": "tcp", "listener_port": tcp_port, "backend_group_id": "g"}
    assert await manager.apply("lb-a", *_config([tls_listener("tls", tls_port), tcp], echo_port))
    second = workers(manager)
    assert second and not second & first
    for pid in second:
        assert ids(pid) == (user.pw_uid, user.pw_gid)
        assert os.readlink(f"/proc/{pid}/root") == str(jail)
    assert served_over_tls(tls_port)
    assert await echo_through(tcp_port)


def _config(listeners, echo_port):
    config = lb_config("lb-a", listeners, echo_port)
    return config.text, config.files


async def test_remove_files_takes_the_jail_too(jailed):
    manager, _ = jailed
    assert manager.paths.chroot_dir.is_dir()
    await manager.stop()
    manager.remove_files()
    assert not manager.paths.root.exists()


def one_server(key: str, mapped_port: int, port: int) -> str:
    """lb-a's file: one tcp listener on `port` whose group has the one member `key` on 127.0.0.1:mapped_port."""
    listener = {"id": "plain", "listener_type": "tcp", "listener_port": port, "backend_group_id": "g"}
    lb = only_loadbalancer(
        "lb-a", [listener], [{"id": "g", "backends": [{"id": key, "address": "198.18.0.21", "port": 80}]}]
    )
    members = {"g": [Member(key, "198.18.0.21", 80, 1, "off", False, mapped_port)]}
    return render_config(lb, "127.0.0.1", members, inner="127.0.0.1").text


async def test_the_master_cli_still_edits_the_jailed_worker(jailed, echo_port):
    manager, _ = jailed
    port = free_port()
    assert await manager.apply("lb-a", one_server("a", echo_port, port))
    reloads = manager.status()["reloads"]

    async def echo(reader, writer):
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    other = await asyncio.start_server(echo, "127.0.0.1", 0)
    try:
        # The member is replaced: a live edit through the master CLI, no reload.
        assert await manager.apply("lb-a", one_server("b", other.sockets[0].getsockname()[1], port))
        status = manager.status()
        assert (status["reloads"], status["live_updates"]) == (reloads, 1)
        assert await echo_through(port)
    finally:
        other.close()
        await other.wait_closed()
