"""One simulated OVN host: its own OVS and ovn-controller, network namespace and private /run/netns.

This module owns the processes of a `SimHost` (its ovsdb-server,
ovs-vswitchd, ovn-controller and whatever is started through
`SimHost.popen`), its network namespace, its persistent mount namespace with
a private /run/netns, and the devices inside them. How the hosts and the
central are put together (names, addresses, the underlay) is
`devtools.multihost`'s; what a host makes is written to that sandbox's
`Ledger` before it is made, so that a later `stop()`, also from another
process, undoes it.

Every process of a host runs through the host's `launcher`
(`nsenter --mount=<mount file> --net=/run/netns/<netns> --`). nsenter execs
the command, so a pid we get back is the process itself, and opens both
namespace files before entering either, so the host namespace's file (in the
machine's /run/netns) is found although the host's own /run/netns hides it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from devtools.central import Central
from devtools.namespaces import (
    NETNS_RUN_DIR,
    Ledger,
    add_netns,
    appctl,
    daemon_dirs,
    del_netns,
    dir_env,
    is_mount_point,
    kill_now,
    ns_ids,
    pids_in,
    start_daemon,
    stop_daemons,
    unmount,
)
from devtools.procs import CommandError, run, stop_pid, wait_for, which
from devtools.sandbox import INTEGRATION_BRIDGE, OVS_SCHEMA, _Daemon, _tail

UPLINK = "ul0"  # the host's (and the central's) end of its veth into the underlay
PHYS_BRIDGE = "br-phy"  # the OVS bridge whose own device carries a host's underlay address
# Geneve adds 58 bytes to every frame of a VPC port (MTU 1500): the underlay carries them whole.
UNDERLAY_MTU = 9000


class MultiHostError(RuntimeError):
    """A multi-host sandbox cannot be started or stopped as asked."""


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
        self.dirs = daemon_dirs(plan.base)
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
        return {**dir_env(self.dirs), "OVN_NB_DB": self.central.nb_remote, "OVN_SB_DB": self.central.sb_remote}

    def vsctl(self, *args: str, timeout: float = 30) -> str:
        """`ovs-vsctl` on the host's database, waiting for ovs-vswitchd only while that runs (not when crashed)."""
        no_wait = () if self._vswitchd.running() else ("--no-wait",)
        return run(
            "ovs-vsctl",
            f"--db={self.ovs_db}",
            f"--timeout={int(timeout)}",
            *no_wait,
            *args,
            env=self.env,
            timeout=timeout + 5,
        )

    def appctl(self, daemon: str, *args: str, timeout: float = 30) -> str:
        """`ovs-appctl` against one of the host's daemons (ovsdb-server, ovs-vswitchd, ovn-controller)."""
        return appctl(self.daemons, daemon, self.env, *args, timeout=timeout)

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
        launcher = self.launcher
        if (cwd := kwargs.pop("cwd", None)) is not None:
            # Entering a mount namespace moves to its root: nsenter changes directory afterwards.
            launcher = (*launcher[:-1], f"--wd={cwd}", "--")
        proc = subprocess.Popen(
            [*launcher, *argv],
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
        chassis = {
            "system-id": self.chassis,
            "hostname": self.chassis,
            "ovn-remote": self.central.sb_remote,
            "ovn-encap-type": "geneve",
            "ovn-encap-ip": self.underlay_ip,
            "ovn-bridge": INTEGRATION_BRIDGE,
            "ovn-bridge-datapath-type": "netdev",
        }
        # Two cores for the whole machine: one thread of each kind per host.
        threads = {"n-handler-threads": 1, "n-revalidator-threads": 1}
        settings = [f"external_ids:{k}={v}" for k, v in chassis.items()]
        settings += [f"other_config:{k}={v}" for k, v in threads.items()]
        self.vsctl("--no-wait", "init", "--", "set", "Open_vSwitch", ".", *settings)
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
