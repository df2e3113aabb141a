"""One simulated OVN host, and the OVN central that all of them share, each in namespaces of its own.

This module owns the processes of a `SimHost` (its ovsdb-server, ovs-vswitchd,
ovn-controller and whatever is started through `SimHost.popen`), its network
namespace, its persistent mount namespace with a private /run/netns, and the
devices inside them; and the processes of the `Central` (NB and SB
ovsdb-servers, ovn-northd) in the central's network namespace. How hosts
and central are put together (names, addresses, the underlay) is
`devtools.multihost`'s; what they make is written to its `Ledger` before it is
made, so that a later `stop()`, also from another process, undoes it.

Every process of a host runs through the host's `launcher`
(`nsenter --mount=<mount file> --net=/run/netns/<netns> --`). nsenter execs
the command, so a pid we get back is the process itself, and opens both
namespace files before entering either, so the host namespace's file (in the
machine's /run/netns) is found although the host's own /run/netns hides it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from devtools.procs import (
    TOOL_PATH,
    CommandError,
    clean_env,
    pid_alive,
    run,
    stop_pid,
    wait_for,
    which,
)
from devtools.sandbox import INTEGRATION_BRIDGE, NB_SCHEMA, OVS_SCHEMA, SB_SCHEMA, _Daemon, _tail

UPLINK = "ul0"  # the host's (and the central's) end of its veth into the underlay
PHYS_BRIDGE = "br-phy"  # the OVS bridge whose own device carries a host's underlay address
NB_PORT, SB_PORT, NB_RAFT_PORT = 6641, 6642, 6643
# Geneve adds 58 bytes to every frame of a VPC port (MTU 1500): the underlay carries them whole.
UNDERLAY_MTU = 9000
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
        # Devices go first: a userspace datapath's taps survive their
        # vswitchd, and a device the kernel moved out of a dying namespace
        # would land in the machine's.
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


def stop_daemons(daemons: Iterable[_Daemon], errors: list[str]) -> None:
    for daemon in daemons:
        pid = daemon.pid()
        try:
            if pid is not None:
                stop_pid(pid, expect=str(daemon.pidfile), what=daemon.name)
            daemon.pidfile.unlink(missing_ok=True)
        except Exception as exc:  # noqa: BLE001 - keep stopping the rest
            errors.append(f"{daemon.name}: {exc}")


def _dirs(base: Path) -> dict[str, Path]:
    return {k: base / k for k in ("run", "db", "log", "etc")}


def _dir_env(dirs: dict[str, Path]) -> dict[str, str]:
    """OVS_* and OVN_* directories: every daemon, ctl tool and agent of one machine uses these."""
    env = {**clean_env(), "PATH": TOOL_PATH}
    for project in ("OVS", "OVN"):
        for kind, var in (("run", "RUNDIR"), ("db", "DBDIR"), ("log", "LOGDIR"), ("etc", "SYSCONFDIR")):
            env[f"{project}_{var}"] = str(dirs[kind])
    return env


# --------------------------------------------------------------------------
# the central


class Central:
    """OVN NB (a one-member RAFT cluster) and SB databases and ovn-northd, in network namespace `netns`.

    The databases listen on the underlay address for the hosts and on unix
    sockets in `<base>/run` for the test process (`nbctl`, `sbctl`, `nb_db`).
    """

    def __init__(self, base: Path, netns: str, ip: str):
        self.base, self.netns, self.ip = base, netns, ip
        self.dirs = _dirs(base)
        self.launcher = (which("nsenter") or "nsenter", f"--net={NETNS_RUN_DIR / netns}", "--")
        run_dir, log_dir = self.dirs["run"], self.dirs["log"]
        self._nb = _Daemon("ovnnb_db", "ovsdb-server", run_dir, log_dir)
        self._sb = _Daemon("ovnsb_db", "ovsdb-server", run_dir, log_dir)
        self._northd = _Daemon("ovn-northd", "ovn-northd", run_dir, log_dir)
        self.daemons = [self._nb, self._sb, self._northd]

    # ovn-northd finds the databases by these socket names in OVN_RUNDIR.
    @property
    def nb_db(self) -> str:
        return f"unix:{self.dirs['run'] / 'ovnnb_db.sock'}"

    @property
    def sb_db(self) -> str:
        return f"unix:{self.dirs['run'] / 'ovnsb_db.sock'}"

    @property
    def nb_remote(self) -> str:
        """The NB database as the hosts reach it, over the underlay."""
        return f"tcp:{self.ip}:{NB_PORT}"

    @property
    def sb_remote(self) -> str:
        return f"tcp:{self.ip}:{SB_PORT}"

    @property
    def env(self) -> dict[str, str]:
        """For ctl tools and programs of the test process: the databases by their unix sockets."""
        return {**_dir_env(self.dirs), "OVN_NB_DB": self.nb_db, "OVN_SB_DB": self.sb_db}

    def nbctl(self, *args: str, timeout: float = 30) -> str:
        return self._ctl("ovn-nbctl", self.nb_db, args, timeout)

    def sbctl(self, *args: str, timeout: float = 30) -> str:
        return self._ctl("ovn-sbctl", self.sb_db, args, timeout)

    def _ctl(self, tool: str, db: str, args: Sequence[str], timeout: float) -> str:
        return run(tool, f"--db={db}", f"--timeout={int(timeout)}", *args, env=self.env, timeout=timeout + 5)

    def nb_db_running(self) -> bool:
        return self._nb.running()

    def sb_db_running(self) -> bool:
        return self._sb.running()

    def port_binding_chassis(self, lsp: str) -> str | None:
        """Name of the chassis the SB Port_Binding of `lsp` is bound to (None: unbound or no binding)."""
        uuid = self.sbctl("--bare", "--columns=chassis", "find", "Port_Binding", f"logical_port={lsp}").strip()
        if not uuid:
            return None
        return self.sbctl("--bare", "--columns=name", "list", "Chassis", uuid).strip() or None

    def chassis_names(self) -> set[str]:
        return set(self.sbctl("--bare", "--columns=name", "list", "Chassis").split())

    def start(self) -> None:
        """Databases and northd; the namespace with the underlay address must exist."""
        for d in self.dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        nb_file, sb_file = self.dirs["db"] / "ovnnb_db.db", self.dirs["db"] / "ovnsb_db.db"
        for path in (nb_file, sb_file):
            path.unlink(missing_ok=True)
        # Clustered like a production NB: the agents' compare-and-swap
        # transactions must meet RAFT's semantics (leader-only, ordered).
        run("ovsdb-tool", "create-cluster", nb_file, NB_SCHEMA, f"tcp:{self.ip}:{NB_RAFT_PORT}", env=self.env)
        run("ovsdb-tool", "create", sb_file, SB_SCHEMA, env=self.env)
        for daemon, db_file, sock, port in (
            (self._nb, nb_file, self.nb_db, NB_PORT),
            (self._sb, sb_file, self.sb_db, SB_PORT),
        ):
            start_daemon(
                daemon, self.launcher, self.env, str(db_file), f"--remote=p{sock}", f"--remote=ptcp:{port}:{self.ip}"
            )
        self.nbctl("--no-wait", "init")
        self.sbctl("init")
        start_daemon(self._northd, self.launcher, self.env, f"--ovnnb-db={self.nb_db}", f"--ovnsb-db={self.sb_db}")

    def stop(self, errors: list[str]) -> None:
        stop_daemons(reversed(self.daemons), errors)

    def logs(self, lines: int = 20) -> str:
        return "".join(_tail(d.logfile, lines) for d in self.daemons)


# --------------------------------------------------------------------------
# a host


@dataclass(frozen=True)
class HostPlan:
    """Where one host's things are and what they are called (`devtools.multihost` makes these)."""

    name: str
    base: Path  # its directory
    netns: str  # its network namespace, in the machine's /run/netns
    mount_file: Path  # its persistent mount namespace
    chassis: str
    underlay_ip: str
    underlay_prefixlen: int
    underlay_netns: str
    underlay_peer: str  # the underlay end of its veth, in underlay_netns


class SimHost:
    """An OVN hypervisor: its own OVS + ovn-controller, network namespace and private /run/netns.

    Layout under `base`: `run`, `db`, `log`, `etc` (OVS_* and OVN_* point
    there), and `netns`, bound on /run/netns inside the host's mount
    namespace; what is made there is visible from outside only as an empty file.
    """

    def __init__(self, plan: HostPlan, central: Central, ledger: Ledger):
        self.plan, self.central, self._ledger = plan, central, ledger
        self.name, self.base, self.netns, self.chassis = plan.name, plan.base, plan.netns, plan.chassis
        self.underlay_ip = plan.underlay_ip
        self.dirs = _dirs(plan.base)
        self.netns_dir = plan.base / "netns"
        run_dir, log_dir = self.dirs["run"], self.dirs["log"]
        self._ovsdb = _Daemon("ovsdb-server", "ovsdb-server", run_dir, log_dir)
        self._vswitchd = _Daemon("ovs-vswitchd", "ovs-vswitchd", run_dir, log_dir)
        self._controller = _Daemon("ovn-controller", "ovn-controller", run_dir, log_dir, own_unixctl=False)
        self.daemons = [self._ovsdb, self._vswitchd, self._controller]
        self._procs: dict[int, subprocess.Popen] = {}

    # -- addresses and environment -------------------------------------------

    @property
    def launcher(self) -> tuple[str, ...]:
        """Command prefix that runs a command inside the host (its network and mount namespaces)."""
        nsenter = which("nsenter") or "nsenter"
        return (nsenter, f"--mount={self.plan.mount_file}", f"--net={NETNS_RUN_DIR / self.netns}", "--")

    @property
    def ovs_db(self) -> str:
        return f"unix:{self.dirs['run'] / 'db.sock'}"

    @property
    def env(self) -> dict[str, str]:
        """For the host's processes (an agent): its directories, and NB/SB as it reaches them."""
        return {**_dir_env(self.dirs), "OVN_NB_DB": self.central.nb_remote, "OVN_SB_DB": self.central.sb_remote}

    def vsctl(self, *args: str, timeout: float = 30) -> str:
        return run(
            "ovs-vsctl", f"--db={self.ovs_db}", f"--timeout={int(timeout)}", *args, env=self.env, timeout=timeout + 5
        )

    def appctl(self, daemon: str, *args: str, timeout: float = 30) -> str:
        """`ovs-appctl` against one of the host's daemons (ovsdb-server, ovs-vswitchd, ovn-controller)."""
        target = next(d for d in self.daemons if d.name == daemon)
        return run("ovs-appctl", "-t", str(target.ctl), *args, env=self.env, timeout=timeout)

    def ovs_db_running(self) -> bool:
        return self._ovsdb.running()

    # -- running things on it ------------------------------------------------

    def run(self, *argv: str, timeout: float = 30, check: bool = True, env: dict[str, str] | None = None) -> str:
        """Run a command inside the host's network and mount namespaces; return its stdout."""
        return run(*self.launcher, *argv, timeout=timeout, check=check, env=env or self.env)

    def in_netns(self, ns: str, *argv: str, timeout: float = 30, check: bool = True) -> str:
        """Run a command in namespace `ns` of the host's private /run/netns."""
        return self.run("ip", "netns", "exec", ns, *argv, timeout=timeout, check=check)

    def netns_list(self) -> list[str]:
        """The names in the host's private /run/netns."""
        return sorted(p.name for p in self.netns_dir.iterdir()) if self.netns_dir.is_dir() else []

    def popen(
        self,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        stdout: int | IO[Any] | None = subprocess.DEVNULL,
        stderr: int | IO[Any] | None = subprocess.DEVNULL,
        **kwargs: Any,
    ) -> subprocess.Popen:
        """Start a long-running process (an agent) inside the host; `stop()` and `crash()` end it.

        Before it is signalled, a process is recognised by its last argument,
        which survives wrappers that exec their command (`ip netns exec`).
        """
        argv = [which(argv[0]) or argv[0], *argv[1:]]
        # Its own session: a Ctrl-C meant for the test runner must not reach it.
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(
            [*self.launcher, *argv],
            env=env or self.env,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            **kwargs,
        )
        self._procs[proc.pid] = proc
        self._ledger.add("processes", {"host": self.name, "pid": proc.pid, "expect": argv[-1]})
        return proc

    # -- lifecycle -----------------------------------------------------------

    def make_namespaces(self) -> None:
        """The network namespace, and a mount namespace whose /run/netns is the host's own."""
        for d in [*self.dirs.values(), self.netns_dir]:
            d.mkdir(parents=True, exist_ok=True)
        add_netns(self.netns, self._ledger)
        mount_file = self.plan.mount_file
        mount_file.touch()
        self._ledger.add("mounts", str(mount_file))
        # The new mount namespace starts as a private copy of ours: it would
        # keep every namespace mounted under /run/netns alive (other tests')
        # until it goes, so those come off first. sysfs is mounted again from
        # inside the network namespace, to show its devices (as `ip netns exec` does).
        script = (
            "while mountpoint -q /run/netns; do umount -l /run/netns; done;"
            ' mkdir -p /run/netns && mount --bind "$1" /run/netns && umount -l /sys && mount -t sysfs sysfs /sys'
        )
        run(
            "unshare",
            f"--mount={mount_file}",
            "--propagation",
            "private",
            "--",
            "nsenter",
            f"--net={NETNS_RUN_DIR / self.netns}",
            "--",
            "sh",
            "-c",
            script,
            "sh",
            self.netns_dir,
        )

    def start_daemons(self) -> None:
        """ovsdb-server, ovs-vswitchd with br-phy carrying the underlay address, ovn-controller."""
        db = self.dirs["db"] / "conf.db"
        db.unlink(missing_ok=True)
        run("ovsdb-tool", "create", db, OVS_SCHEMA, env=self.env)
        start_daemon(self._ovsdb, self.launcher, self.env, str(db), f"--remote=punix:{self.dirs['run'] / 'db.sock'}")
        self.vsctl(
            "--no-wait",
            "init",
            "--",
            "set",
            "Open_vSwitch",
            ".",
            f"external_ids:system-id={self.chassis}",
            f"external_ids:hostname={self.chassis}",
            f"external_ids:ovn-remote={self.central.sb_remote}",
            "external_ids:ovn-encap-type=geneve",
            f"external_ids:ovn-encap-ip={self.underlay_ip}",
            f"external_ids:ovn-bridge={INTEGRATION_BRIDGE}",
            "external_ids:ovn-bridge-datapath-type=netdev",
            # Two cores for the whole machine: one thread of each kind per host.
            "other_config:n-handler-threads=1",
            "other_config:n-revalidator-threads=1",
        )
        start_daemon(self._vswitchd, self.launcher, self.env, self.ovs_db)
        self.vsctl(
            "--may-exist",
            "add-br",
            PHYS_BRIDGE,
            "--",
            "set",
            "Bridge",
            PHYS_BRIDGE,
            "datapath_type=netdev",
            "--",
            "--may-exist",
            "add-port",
            PHYS_BRIDGE,
            UPLINK,
        )
        self._configure_underlay_address()
        start_daemon(self._controller, self.launcher, self.env, self.ovs_db)

    def _configure_underlay_address(self) -> None:
        # Userspace tunnelling routes the encapsulated frames by the routes
        # of the bridge device holding the encap address.
        self.run("ip", "addr", "replace", f"{self.underlay_ip}/{self.plan.underlay_prefixlen}", "dev", PHYS_BRIDGE)
        self.run("ip", "link", "set", PHYS_BRIDGE, "up")

    def wait_ready(self, timeout: float) -> None:
        """br-int built for the userspace datapath; the chassis and its Geneve encap in SB."""
        wait_for(
            lambda: self.vsctl("--if-exists", "get", "Bridge", INTEGRATION_BRIDGE, "datapath_type").strip() == "netdev",
            timeout,
            f"ovn-controller of {self.name} to create {INTEGRATION_BRIDGE} (see {self._controller.logfile})",
        )
        wait_for(
            lambda: (
                self.underlay_ip
                in self.central.sbctl("--bare", "--columns=ip", "find", "Encap", f"chassis_name={self.chassis}")
            ),
            timeout,
            f"chassis {self.chassis} with its Geneve encap in the southbound database",
        )

    def stop(self, errors: list[str]) -> None:
        """Everything of the host: its processes, private namespaces, devices, namespace, mount."""
        self._stop_tracked(errors)
        stop_daemons(reversed(self.daemons), errors)
        self._stop_leftovers(errors)
        if self._owns_mount():
            for ns in self.netns_list():
                try:
                    self.run("ip", "netns", "del", ns)
                except CommandError as exc:
                    errors.append(f"{self.name}: netns {ns}: {exc}")
        try:
            del_netns(self.netns, self._ledger)
        except CommandError as exc:
            errors.append(f"{self.name}: {exc}")
        unmount(self.plan.mount_file, self._ledger, errors)

    def _stop_tracked(self, errors: list[str]) -> None:
        for entry in [p for p in self._ledger.processes if p["host"] == self.name]:
            try:
                stop_pid(entry["pid"], expect=entry["expect"], what=f"process {entry['pid']} on {self.name}")
            except TimeoutError as exc:
                errors.append(str(exc))
                continue
            self._reap(entry["pid"])
            self._ledger.discard("processes", entry)

    def _reap(self, pid: int) -> None:
        proc = self._procs.pop(pid, None)
        if proc is not None:
            proc.wait(timeout=5)

    def _owns_mount(self) -> bool:
        return str(self.plan.mount_file) in self._ledger.mounts and is_mount_point(self.plan.mount_file)

    def _namespace_ids(self) -> set[tuple[int, int]]:
        """The host's mount and network namespaces and those in its private /run/netns."""
        ids = ns_ids(self.plan.mount_file) if self._owns_mount() else set()
        if self.netns in self._ledger.namespaces:
            ids |= ns_ids(NETNS_RUN_DIR / self.netns)
        private = [f"/run/netns/{ns}" for ns in self.netns_list()]
        if private and self._owns_mount():
            out = self.run("stat", "-L", "--format=%d %i", *private, check=False)
            ids |= {(int(dev), int(ino)) for dev, ino in (line.split() for line in out.splitlines())}
        return ids

    def _stop_leftovers(self, errors: list[str]) -> None:
        # Whatever still runs in the host's namespaces was started by us or by
        # something we started there (an agent's haproxy, a server).
        for pid in pids_in(self._namespace_ids()):
            try:
                stop_pid(pid, expect="", what=f"process {pid} left on {self.name}")
            except TimeoutError as exc:
                errors.append(str(exc))

    def crash(self) -> None:
        """SIGKILL every process of the host but its ovsdb-server (its database survives, as on a disk)."""
        keep = self._ovsdb.pid()
        victims = set(pids_in(self._namespace_ids())) | set(self._procs)
        victims |= {pid for pid in (self._vswitchd.pid(), self._controller.pid()) if pid is not None}
        kill_now(victims - {keep}, f"the processes of {self.name}")
        for pid in list(self._procs):
            self._reap(pid)
        for entry in [p for p in self._ledger.processes if p["host"] == self.name]:
            self._ledger.discard("processes", entry)

    def revive(self, timeout: float = 30) -> None:
        """ovs-vswitchd and ovn-controller again, on the same databases; wait until the chassis is back."""
        for daemon in (self._vswitchd, self._controller):
            daemon.pidfile.unlink(missing_ok=True)
        start_daemon(self._vswitchd, self.launcher, self.env, self.ovs_db)
        self._configure_underlay_address()
        start_daemon(self._controller, self.launcher, self.env, self.ovs_db)
        self.wait_ready(timeout)
        wait_for(
            lambda: self.appctl("ovn-controller", "connection-status").strip() == "connected",
            timeout,
            f"ovn-controller of {self.name} to connect to the southbound database",
        )

    # -- faults ----------------------------------------------------------------

    def cut_underlay(self) -> None:
        """Take the host off the underlay (its link to the central and to every other host)."""
        self._underlay_link("down")

    def heal_underlay(self) -> None:
        self._underlay_link("up")

    def _underlay_link(self, state: str) -> None:
        run("ip", "-n", self.plan.underlay_netns, "link", "set", self.plan.underlay_peer, state)

    def port_binding_chassis(self, lsp: str) -> str | None:
        """Name of the chassis SB binds logical port `lsp` to (any host's; None: unbound)."""
        return self.central.port_binding_chassis(lsp)

    def logs(self, lines: int = 20) -> str:
        return "".join(_tail(d.logfile, lines) for d in self.daemons)


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
