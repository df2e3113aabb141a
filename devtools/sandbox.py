"""A private OVS + OVN for functional tests and the demo.

This module owns the daemons of one sandbox (an ovsdb-server for
Open_vSwitch, ovs-vswitchd with the userspace datapath, the OVN NB and SB
ovsdb-servers, ovn-northd and ovn-controller), their run/db/log directories
under one base directory, and the host-wide devices the userspace datapath
leaves behind (`ovs-netdev` and one tap per internal interface, e.g.
`br-int`). It never touches a system OVS: every daemon and every ctl command
gets explicit sockets in our directories and an environment scrubbed of
OVS_*/OVN_* variables, and daemons are stopped only through the pidfiles we
gave them.

The daemons are started directly (not with ovs-ctl/ovn-ctl) because ovs-ctl
wants to load the kernel module and write a system-id into /etc, and
ovn-ctl's defaults point at system paths; started by hand each daemon gets
exactly our pidfile, log file and unixctl socket, without a monitor process.

The process and command helpers it uses live in `devtools.procs`; the
commonest are re-exported here, where the tests and the benchmark import them.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.procs import (
    TOOL_PATH,
    CommandError,
    MissingTools,
    T,
    WaitAborted,
    clean_env,
    link_names,
    pid_alive,
    required_tools,
    run,
    skip_reason,
    stop_pid,
    wait_for,
    which,
)

__all__ = [
    "MissingTools",
    "skip_reason",
    "CommandError",
    "OvnSandbox",
    "SandboxBusy",
    "WaitAborted",
    "link_names",
    "pid_alive",
    "required_tools",
    "run",
    "stop_pid",
    "wait_for",
    "which",
]


OVS_SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
NB_SCHEMA = Path("/usr/share/ovn/ovn-nb.ovsschema")
SB_SCHEMA = Path("/usr/share/ovn/ovn-sb.ovsschema")

# One lock for the whole machine: two userspace ovs-vswitchd collide on the
# `ovs-netdev` device, so at most one sandbox (tests or demo) may run.
HOST_LOCK = Path("/run/lock/lbagent-ovs-sandbox.lock")
NETDEV_DEVICE = "ovs-netdev"
BUSY_MESSAGE = "another OVS sandbox (demo or tests) is running; run `make demo-down` first"

INTEGRATION_BRIDGE = "br-int"


class SandboxBusy(RuntimeError):
    """Another userspace-datapath OVS sandbox is running on this machine."""


# --------------------------------------------------------------------------
# shared helpers


# --------------------------------------------------------------------------
# the sandbox


@dataclass(frozen=True)
class _Daemon:
    """One daemon of the sandbox: where its pidfile, log and control socket live."""

    name: str  # pidfile/log/ctl stem, unique in the sandbox
    binary: str
    rundir: Path
    logdir: Path
    # ovn-controller has no --unixctl option; it names its socket
    # <OVN_RUNDIR>/ovn-controller.<pid>.ctl by itself.
    own_unixctl: bool = True

    @property
    def pidfile(self) -> Path:
        return self.rundir / f"{self.name}.pid"

    @property
    def ctl(self) -> Path:
        if self.own_unixctl:
            return self.rundir / f"{self.name}.ctl"
        return self.rundir / f"{self.name}.{self.pid()}.ctl"

    @property
    def logfile(self) -> Path:
        return self.logdir / f"{self.name}.log"

    def argv(self, *args: str) -> list[str]:
        # No --monitor: the pidfile then names the daemon itself, so stopping
        # it by pid stops exactly what we started.
        argv = [
            which(self.binary) or self.binary,
            *args,
            "--detach",
            "--no-chdir",
            f"--pidfile={self.pidfile}",
            f"--log-file={self.logfile}",
        ]
        return argv + [f"--unixctl={self.ctl}"] if self.own_unixctl else argv

    def pid(self) -> int | None:
        try:
            return int(self.pidfile.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and pid_alive(pid)


class OvnSandbox:
    """A private OVS (userspace datapath) and OVN under `base_dir`.

    Layout: `<base>/ovs/{run,db,log,etc}`, `<base>/ovn/{run,db,log,etc}` and
    `<base>/sandbox.json` (what `stop()` needs to undo, so that a different
    process, e.g. `demo down`, can stop a sandbox started elsewhere).
    """

    def __init__(self, base_dir: Path | str):
        self.base_dir = Path(base_dir).absolute()
        self.ovs_dirs = {k: self.base_dir / "ovs" / k for k in ("run", "db", "log", "etc")}
        self.ovn_dirs = {k: self.base_dir / "ovn" / k for k in ("run", "db", "log", "etc")}
        self.state_file = self.base_dir / "sandbox.json"
        self._lock_fd: int | None = None
        ovs_run, ovs_log = self.ovs_dirs["run"], self.ovs_dirs["log"]
        ovn_run, ovn_log = self.ovn_dirs["run"], self.ovn_dirs["log"]
        self._ovsdb = _Daemon("ovsdb-server", "ovsdb-server", ovs_run, ovs_log)
        self._vswitchd = _Daemon("ovs-vswitchd", "ovs-vswitchd", ovs_run, ovs_log)
        self._nb = _Daemon("ovnnb_db", "ovsdb-server", ovn_run, ovn_log)
        self._sb = _Daemon("ovnsb_db", "ovsdb-server", ovn_run, ovn_log)
        self._northd = _Daemon("ovn-northd", "ovn-northd", ovn_run, ovn_log)
        self._controller = _Daemon("ovn-controller", "ovn-controller", ovn_run, ovn_log, own_unixctl=False)

    # -- addresses and environment -------------------------------------------

    @property
    def ovs_sock(self) -> Path:
        return self.ovs_dirs["run"] / "db.sock"

    @property
    def nb_sock(self) -> Path:
        return self.ovn_dirs["run"] / "ovnnb_db.sock"

    @property
    def sb_sock(self) -> Path:
        return self.ovn_dirs["run"] / "ovnsb_db.sock"

    @property
    def ovs_db(self) -> str:
        return f"unix:{self.ovs_sock}"

    @property
    def nb_db(self) -> str:
        return f"unix:{self.nb_sock}"

    @property
    def sb_db(self) -> str:
        return f"unix:{self.sb_sock}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for anything that talks to this sandbox (daemons, ctl tools, the agent)."""
        env = clean_env()
        env.update(
            {
                "PATH": TOOL_PATH,
                "OVS_RUNDIR": str(self.ovs_dirs["run"]),
                "OVS_DBDIR": str(self.ovs_dirs["db"]),
                "OVS_LOGDIR": str(self.ovs_dirs["log"]),
                "OVS_SYSCONFDIR": str(self.ovs_dirs["etc"]),
                "OVN_RUNDIR": str(self.ovn_dirs["run"]),
                "OVN_DBDIR": str(self.ovn_dirs["db"]),
                "OVN_LOGDIR": str(self.ovn_dirs["log"]),
                "OVN_SYSCONFDIR": str(self.ovn_dirs["etc"]),
                "OVN_NB_DB": self.nb_db,
                "OVN_SB_DB": self.sb_db,
            }
        )
        return env

    @property
    def daemons(self) -> list[_Daemon]:
        """In start order."""
        return [self._ovsdb, self._vswitchd, self._nb, self._sb, self._northd, self._controller]

    # -- ctl helpers ---------------------------------------------------------

    def vsctl(self, *args: str, timeout: float = 30) -> str:
        return run(
            "ovs-vsctl", f"--db={self.ovs_db}", f"--timeout={int(timeout)}", *args, env=self.env, timeout=timeout + 5
        )

    def nbctl(self, *args: str, timeout: float = 30) -> str:
        return run(
            "ovn-nbctl", f"--db={self.nb_db}", f"--timeout={int(timeout)}", *args, env=self.env, timeout=timeout + 5
        )

    def sbctl(self, *args: str, timeout: float = 30) -> str:
        return run(
            "ovn-sbctl", f"--db={self.sb_db}", f"--timeout={int(timeout)}", *args, env=self.env, timeout=timeout + 5
        )

    def appctl(self, daemon: str, *args: str, timeout: float = 30) -> str:
        """`ovs-appctl` against one of our daemons, by its control socket."""
        target = next(d for d in self.daemons if d.name == daemon)
        return run("ovs-appctl", "-t", str(target.ctl), *args, env=self.env, timeout=timeout)

    @staticmethod
    def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
        return wait_for(predicate, timeout, what, interval)

    def running(self) -> bool:
        """True while any of our daemons runs."""
        return any(d.running() for d in self.daemons)

    def ovs_db_running(self) -> bool:
        return self._ovsdb.running()

    def nb_db_running(self) -> bool:
        return self._nb.running()

    # -- lifecycle -----------------------------------------------------------

    def __enter__(self) -> OvnSandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 60) -> None:
        """Start every daemon and wait until ovn-controller has built br-int.

        On any failure everything started so far is stopped again before the
        error propagates.
        """
        self._claim_host()
        try:
            for d in [*self.ovs_dirs.values(), *self.ovn_dirs.values()]:
                d.mkdir(parents=True, exist_ok=True)
            self._start_ovs()
            self._start_ovn()
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _claim_host(self) -> None:
        """Refuse when another sandbox runs: its lock is held or its `ovs-netdev` exists.

        The flock covers the window while we start (and a test session's whole
        life); the `ovs-netdev` device covers a sandbox started by a process
        that has exited since (the demo).
        """
        HOST_LOCK.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        # Several developers' test runs on one machine may queue for the
        # sandbox instead of failing: LBAGENT_SANDBOX_WAIT=<seconds>.
        deadline = time.monotonic() + float(os.environ.get("LBAGENT_SANDBOX_WAIT", "0"))
        while True:
            busy = self._try_claim(fd)
            if busy is None:
                break
            if time.monotonic() >= deadline:
                os.close(fd)
                raise SandboxBusy(f"{BUSY_MESSAGE} ({busy})")
            time.sleep(1)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{self.base_dir}\n".encode(), 0)
        self._lock_fd = fd

    @staticmethod
    def _try_claim(fd: int) -> str | None:
        """None once we hold the lock and no other sandbox's devices exist; else why not."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return f"lock {HOST_LOCK} is held"
        if NETDEV_DEVICE in link_names():
            owner = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            fcntl.flock(fd, fcntl.LOCK_UN)
            hint = f"; last started from {owner}" if owner else ""
            return f"device {NETDEV_DEVICE} exists{hint}"
        return None

    def _release_host(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def _start_daemon(self, daemon: _Daemon, *args: str) -> None:
        # --detach returns once the daemon is ready (socket open, config read).
        # Its early stderr goes to a file, not a pipe a detached child could hold open.
        errfile = daemon.logdir / f"{daemon.name}.stderr"
        with open(errfile, "w") as err:
            proc = subprocess.run(
                daemon.argv(*args), env=self.env, stdin=subprocess.DEVNULL, stdout=err, stderr=err, timeout=60
            )
        if proc.returncode != 0:
            raise CommandError(daemon.argv(*args), proc.returncode, "", errfile.read_text() + _tail(daemon.logfile))

    def _create_db(self, path: Path, schema: Path) -> Path:
        # Always fresh: a chassis left in an old southbound database with the
        # same encap (geneve, 127.0.0.1) keeps the new one from registering.
        path.unlink(missing_ok=True)
        run("ovsdb-tool", "create", path, schema, env=self.env)
        return path

    def _start_ovs(self) -> None:
        db = self._create_db(self.ovs_dirs["db"] / "conf.db", OVS_SCHEMA)
        self._start_daemon(self._ovsdb, str(db), f"--remote=punix:{self.ovs_sock}")
        system_id = f"lbagent-sbx-{uuid.uuid4().hex[:12]}"
        self.vsctl(
            "--no-wait",
            "init",
            "--",
            "set",
            "Open_vSwitch",
            ".",
            f"external_ids:system-id={system_id}",
            f"external_ids:hostname={system_id}",
            f"external_ids:ovn-remote={self.sb_db}",
            "external_ids:ovn-encap-type=geneve",
            "external_ids:ovn-encap-ip=127.0.0.1",
            f"external_ids:ovn-bridge={INTEGRATION_BRIDGE}",
            "external_ids:ovn-bridge-datapath-type=netdev",
        )
        # Record before starting ovs-vswitchd: from its first moment on, it may
        # create host-wide devices that stop() has to remove.
        self._save_state(
            system_id=system_id,
            preexisting_links=sorted(link_names()),
            created_links=[NETDEV_DEVICE, INTEGRATION_BRIDGE],
        )
        self._start_daemon(self._vswitchd, self.ovs_db)

    def _start_ovn(self) -> None:
        nb = self._create_db(self.ovn_dirs["db"] / "ovnnb_db.db", NB_SCHEMA)
        sb = self._create_db(self.ovn_dirs["db"] / "ovnsb_db.db", SB_SCHEMA)
        self._start_daemon(self._nb, str(nb), f"--remote=punix:{self.nb_sock}")
        self._start_daemon(self._sb, str(sb), f"--remote=punix:{self.sb_sock}")
        self.nbctl("--no-wait", "init")
        self.sbctl("init")
        self._start_daemon(self._northd, f"--ovnnb-db={self.nb_db}", f"--ovnsb-db={self.sb_db}")
        self._start_daemon(self._controller, self.ovs_db)

    def _wait_ready(self, timeout: float) -> None:
        system_id = self._load_state()["system_id"]
        wait_for(
            lambda: self._bridge_datapath_type() == "netdev",
            timeout,
            f"ovn-controller to create {INTEGRATION_BRIDGE} with datapath_type=netdev (see {self._controller.logfile})",
        )
        wait_for(
            lambda: system_id in self.sbctl("--bare", "--columns=name", "list", "Chassis"),
            timeout,
            f"chassis {system_id} in the southbound database",
        )
        # A full round trip NB -> northd -> SB -> ovn-controller.
        self.nbctl("--wait=hv", "sync", timeout=timeout)

    def _bridge_datapath_type(self) -> str:
        out = self.vsctl("--if-exists", "get", "Bridge", INTEGRATION_BRIDGE, "datapath_type")
        return out.strip().strip('"')

    def stop(self) -> None:
        """Stop our daemons (by pidfile) and delete the devices ovs-vswitchd left.

        Idempotent and safe after a partial start or from another process.
        Raises after doing everything it can if some daemon would not stop.
        """
        state = self._load_state()
        created = set(state.get("created_links", []))
        if self._ovsdb.running():
            # Taps exist for every internal interface (bridges included),
            # not only the ones we made ourselves (the agent may add bridges).
            created |= self._internal_interfaces()
        errors: list[str] = []
        for daemon in reversed(self.daemons):
            try:
                self._stop_daemon(daemon)
            except Exception as exc:  # noqa: BLE001 - keep stopping the rest
                errors.append(f"{daemon.name}: {exc}")
        if not self._vswitchd.running():
            self._delete_links(created - set(state.get("preexisting_links", [])))
        self._release_host()
        if errors:
            raise RuntimeError("sandbox stop incomplete: " + "; ".join(errors))

    def restart(self, name: str, crash: bool = False) -> int:
        """Stop one daemon (SIGKILL with `crash`) and start it again on the same
        databases, as a fault test needs; returns the new pid."""
        daemons = {
            "ovsdb-server": (self._ovsdb, (str(self.ovs_dirs["db"] / "conf.db"), f"--remote=punix:{self.ovs_sock}")),
            "ovs-vswitchd": (self._vswitchd, (self.ovs_db,)),
            "ovn-controller": (self._controller, (self.ovs_db,)),
        }
        daemon, args = daemons[name]
        pid = daemon.pid()
        if crash and pid is not None and pid_alive(pid):
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not pid_alive(pid), 10, f"{name} to die")
        self._stop_daemon(daemon)
        self._start_daemon(daemon, *args)
        return daemon.pid()

    def _internal_interfaces(self) -> set[str]:
        try:
            out = self.vsctl("--bare", "--columns=name", "find", "Interface", "type=internal", timeout=5)
        except CommandError:
            return set()
        return set(out.split())

    def _stop_daemon(self, daemon: _Daemon) -> None:
        pid = daemon.pid()
        if pid is not None:
            stop_pid(pid, expect=str(daemon.pidfile), what=daemon.name)
        daemon.pidfile.unlink(missing_ok=True)

    def _delete_links(self, names: Iterable[str]) -> None:
        existing = link_names()
        for name in sorted(set(names) & existing):
            run("ip", "link", "del", name, check=False)
        if NETDEV_DEVICE in set(names):
            self._save_state(created_links=[])

    # -- persisted state -----------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        try:
            return json.loads(self.state_file.read_text())
        except FileNotFoundError:
            return {}

    def _save_state(self, **changes: Any) -> None:
        state = {**self._load_state(), **changes}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)

    def logs(self, lines: int = 20) -> str:
        """Tails of every daemon log, for failure messages."""
        return "".join(_tail(d.logfile, lines) for d in self.daemons)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return ""
    return f"\n--- {path} (last {len(text)} lines) ---\n" + "\n".join(text) + "\n"
