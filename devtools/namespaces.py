"""The namespaces, mounts and processes of simulated machines, and the ledger of what was made.

This module owns the mechanics `devtools.simhost` and `devtools.central`
share: network namespaces made only under a name nobody holds and removed
with every device in them, mounts, finding the processes that live in a set
of namespaces, daemons started with --detach inside namespaces, and the
`Ledger` in which `devtools.multihost` writes everything down before it is
made, so that a later stop (also from another process) removes exactly that.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from devtools.procs import TOOL_PATH, CommandError, clean_env, pid_alive, run, stop_pid, wait_for
from devtools.sandbox import _Daemon, _tail

NETNS_RUN_DIR = Path("/run/netns")


class MultiHostError(RuntimeError):
    """A multi-host sandbox cannot be started or stopped as asked."""


# --------------------------------------------------------------------------
# what was made


@dataclass
class Ledger:
    """Everything a multi-host sandbox made, in `path`, saved before each thing is made."""

    path: Path | None
    prefix: str = ""
    hosts: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)  # in the machine's /run/netns
    mounts: list[str] = field(default_factory=list)  # mount points, in the order they were mounted
    processes: list[dict[str, Any]] = field(default_factory=list)  # {"host", "pid", "expect"}
    vpcs: list[str] = field(default_factory=list)  # state files of Vpc objects

    def add(self, kind: str, item: Any) -> None:
        entries = getattr(self, kind)
        if item not in entries:
            entries.append(item)
            self.save()

    def discard(self, kind: str, item: Any) -> None:
        entries = getattr(self, kind)
        if item in entries:
            entries.remove(item)
            self.save()

    def save(self) -> None:
        if self.path is None:
            return
        record = {k: v for k, v in asdict(self).items() if k != "path"}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(self.path)

    @classmethod
    def load(cls, path: Path) -> Ledger:
        return cls(path, **json.loads(path.read_text()))


# --------------------------------------------------------------------------
# namespaces and processes


def netns_exists(name: str) -> bool:
    return (NETNS_RUN_DIR / name).exists()


def add_netns(name: str, ledger: Ledger) -> None:
    """Create a network namespace of ours (refusing one that exists: it would be someone else's)."""
    if netns_exists(name):
        raise MultiHostError(f"network namespace {name} exists already: is a sandbox with this prefix running?")
    ledger.add("namespaces", name)
    run("ip", "netns", "add", name)
    run("ip", "-n", name, "link", "set", "lo", "up")


def del_netns(name: str, ledger: Ledger) -> None:
    """Delete one of our network namespaces (the ledger says which) with every device in it."""
    if name not in ledger.namespaces:
        return
    if netns_exists(name):
        # Devices go first, one by one: the userspace datapath's taps outlive
        # their ovs-vswitchd, and are not left to the namespace's teardown.
        links = json.loads(run("ip", "-n", name, "-j", "link", "show") or "[]")
        for link in links:
            if link["ifname"] != "lo":
                run("ip", "-n", name, "link", "del", link["ifname"], check=False)
        run("ip", "netns", "del", name)
    ledger.discard("namespaces", name)


def ns_ids(*paths: str | os.PathLike) -> set[tuple[int, int]]:
    """Identities (device, inode) of the namespaces behind these namespace files."""
    ids = set()
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:  # gone, or a process of another user namespace
            continue
        ids.add((st.st_dev, st.st_ino))
    return ids


def pids_in(namespaces: set[tuple[int, int]]) -> list[int]:
    """Processes whose mount or network namespace is one of `namespaces`."""
    found: list[int] = []
    if not namespaces:
        return found
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for kind in ("mnt", "net"):
            if ns_ids(entry / "ns" / kind) & namespaces:
                found.append(int(entry.name))
                break
    return found


def kill_now(pids: Iterable[int], what: str) -> None:
    """SIGKILL, as a machine that loses power; wait until they are gone."""
    pids = [pid for pid in pids if pid_alive(pid)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    wait_for(lambda: not any(pid_alive(pid) for pid in pids), 10, f"{what} to die")


def start_daemon(daemon: _Daemon, launcher: Sequence[str], env: dict[str, str], *args: str) -> None:
    """Start a daemon with --detach inside the namespaces `launcher` enters; return once it is ready."""
    argv = [*launcher, *daemon.argv(*args)]
    errfile = daemon.logdir / f"{daemon.name}.stderr"
    with open(errfile, "w") as err:
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, timeout=60)
    if proc.returncode != 0:
        raise CommandError(argv, proc.returncode, "", errfile.read_text() + _tail(daemon.logfile))


def appctl(daemons: Iterable[_Daemon], name: str, env: dict[str, str], *args: str, timeout: float = 30) -> str:
    """`ovs-appctl` against the daemon called `name`, by its control socket."""
    target = next(d for d in daemons if d.name == name)
    return run("ovs-appctl", "-t", str(target.ctl), *args, env=env, timeout=timeout)


def stop_daemons(daemons: Iterable[_Daemon], errors: list[str]) -> None:
    for daemon in daemons:
        pid = daemon.pid()
        try:
            if pid is not None:
                stop_pid(pid, expect=str(daemon.pidfile), what=daemon.name)
            daemon.pidfile.unlink(missing_ok=True)
        except Exception as exc:  # noqa: BLE001 - keep stopping the rest
            errors.append(f"{daemon.name}: {exc}")


def daemon_dirs(base: Path) -> dict[str, Path]:
    return {k: base / k for k in ("run", "db", "log", "etc")}


def dir_env(dirs: dict[str, Path]) -> dict[str, str]:
    """OVS_* and OVN_* directories: every daemon, ctl tool and agent of one machine uses these."""
    env = {**clean_env(), "PATH": TOOL_PATH}
    for project in ("OVS", "OVN"):
        for kind, var in (("run", "RUNDIR"), ("db", "DBDIR"), ("log", "LOGDIR"), ("etc", "SYSCONFDIR")):
            env[f"{project}_{var}"] = str(dirs[kind])
    return env


def is_mount_point(path: Path) -> bool:
    """Whether something is mounted on `path` (os.path.ismount misses a bind mount within one filesystem)."""
    # Field 5 of mountinfo, with space, tab, newline and backslash octal-escaped.
    escaped = str(path).translate({ord(c): f"\\{ord(c):03o}" for c in " \t\n\\"})
    with open("/proc/self/mountinfo") as mountinfo:
        return any(line.split()[4] == escaped for line in mountinfo)


def unmount(path: Path, ledger: Ledger, errors: list[str]) -> None:
    """Unmount one of our mounts (the ledger says which)."""
    if str(path) not in ledger.mounts:
        return
    while is_mount_point(path):
        try:
            run("umount", path)
        except CommandError as exc:
            errors.append(str(exc))
            return
    ledger.discard("mounts", str(path))
