"""haproxy as the agent runs it by default: the master root, its workers the
`lbagent-haproxy` user jailed in an empty directory, serving https from a VPC
client through OVN before and after a reload."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import psutil

from devtools.topology import self_signed_certificate

from agentproc import wait_until
from helpers import MAC, VIP, wait_bound
from lbstate import backend, desired, loadbalancer, tcp_listener

USER = "lbagent-haproxy"  # the default [haproxy] user, made by `make deps`


def ids(pid: int) -> tuple[int, int]:
    """(real uid, real gid) of a process, from /proc/<pid>/status."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0])


def https_lb(lb_id: str, *extra_listeners: dict) -> dict:
    cert, key = self_signed_certificate("www.example.com")
    listener = {
        "id": "tls",
        "listener_type": "https",
        "listener_port": 443,
        "backend_group_id": "bg-1",
        "certificates": [{"id": "www", "certificate": cert, "private_key": key}],
    }
    return loadbalancer(lb_id, VIP, MAC, [listener, *extra_listeners], {"bg-1": [backend("be-a", "198.18.0.21")]})


def workers(master_pid: int) -> set[int]:
    return {child.pid for child in psutil.Process(master_pid).children()}


def assert_jailed(pids: set[int], account: pwd.struct_passwd, jail: Path) -> None:
    assert pids
    for pid in pids:
        assert ids(pid) == (account.pw_uid, account.pw_gid), pid
        assert os.readlink(f"/proc/{pid}/root") == str(jail), pid


def test_workers_drop_to_the_user_in_a_chroot_across_reloads(agent_factory, vpc, prefix):
    account = pwd.getpwnam(USER)
    vpc.add_host("a", "198.18.0.21", http_text="backend-a")
    client = vpc.add_host("client", "198.18.0.31")
    lb_id = f"{prefix}-tls"
    vpc.add_lb_port(lb_id, MAC, VIP)
    agent = agent_factory()
    jail = agent.run_dir / "haproxy" / "chroot"

    code, body = agent.refresh(desired(1, https_lb(lb_id)))
    assert code == 200, body
    wait_bound(agent, lb_id)
    https = f"https://{VIP}:443/"
    assert client.run("curl", "-sSk", "--noproxy", "*", "--max-time", "5", https).strip() == "backend-a"

    haproxy = agent.status()["agent"]["haproxy"]
    master = haproxy["pid"]
    assert ids(master) == (0, 0)  # it reads the keys and re-executes on every reload
    status = jail.stat()
    assert (status.st_uid, status.st_mode & 0o7777) == (0, 0o755) and not any(jail.iterdir())
    first = workers(master)
    assert_jailed(first, account, jail)

    # A new listener needs a reload: the new worker is jailed too, and both listeners serve.
    code, body = agent.refresh(desired(2, https_lb(lb_id, tcp_listener("raw", 8080))))
    assert code == 200, body
    wait_until(lambda: agent.status()["agent"]["haproxy"]["reloads"] > haproxy["reloads"], 30, "a reload")
    assert agent.status()["agent"]["haproxy"]["pid"] == master
    current = wait_until(lambda: workers(master) - first, 30, "a new worker")
    assert_jailed(current, account, jail)
    assert client.run("curl", "-sSk", "--noproxy", "*", "--max-time", "5", https).strip() == "backend-a"
    assert client.curl(f"http://{VIP}:8080/").strip() == "backend-a"
