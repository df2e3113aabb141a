"""The OVN central of a multi-host sandbox: NB and SB databases and ovn-northd in a namespace of their own.

This module owns the central's processes, databases and directories. The
hosts reach its databases over the underlay (`nb_remote`, `sb_remote`), the
test process over unix sockets (`nb_db`, `nbctl`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from devtools.namespaces import NETNS_RUN_DIR, appctl, daemon_dirs, dir_env, start_daemon, stop_daemons
from devtools.procs import run, which
from devtools.sandbox import NB_SCHEMA, SB_SCHEMA, _Daemon, _tail

NB_PORT, SB_PORT, NB_RAFT_PORT = 6641, 6642, 6643


class Central:
    """OVN NB (a one-member RAFT cluster) and SB databases and ovn-northd, in network namespace `netns`.

    The databases listen on the underlay address for the hosts and on unix
    sockets in `<base>/run` for the test process (`nbctl`, `sbctl`, `nb_db`).
    """

    def __init__(self, base: Path, netns: str, ip: str):
        self.base, self.netns, self.ip = base, netns, ip
        self.dirs = daemon_dirs(base)
        self.launcher = (which("nsenter") or "nsenter", f"--net={NETNS_RUN_DIR / netns}", "--")
        run_dir, log_dir = self.dirs["run"], self.dirs["log"]
        self._nb = _Daemon("ovnnb_db", "ovsdb-server", run_dir, log_dir)
        self._sb = _Daemon("ovnsb_db", "ovsdb-server", run_dir, log_dir)
        self._northd = _Daemon("ovn-northd", "ovn-northd", run_dir, log_dir)
        self.daemons = [self._nb, self._sb, self._northd]
        # ovn-northd finds the databases by these socket names in OVN_RUNDIR.
        self.nb_db, self.sb_db = f"unix:{run_dir / 'ovnnb_db.sock'}", f"unix:{run_dir / 'ovnsb_db.sock'}"
        # The databases as the hosts reach them, over the underlay.
        self.nb_remote, self.sb_remote = f"tcp:{ip}:{NB_PORT}", f"tcp:{ip}:{SB_PORT}"

    @property
    def env(self) -> dict[str, str]:
        """For ctl tools and programs of the test process: the databases by their unix sockets."""
        return {**dir_env(self.dirs), "OVN_NB_DB": self.nb_db, "OVN_SB_DB": self.sb_db}

    def nbctl(self, *args: str, timeout: float = 30) -> str:
        return self._ctl("ovn-nbctl", self.nb_db, args, timeout)

    def sbctl(self, *args: str, timeout: float = 30) -> str:
        return self._ctl("ovn-sbctl", self.sb_db, args, timeout)

    def _ctl(self, tool: str, db: str, args: Sequence[str], timeout: float) -> str:
        return run(tool, f"--db={db}", f"--timeout={int(timeout)}", *args, env=self.env, timeout=timeout + 5)

    def appctl(self, daemon: str, *args: str, timeout: float = 30) -> str:
        """`ovs-appctl` against ovnnb_db, ovnsb_db or ovn-northd."""
        return appctl(self.daemons, daemon, self.env, *args, timeout=timeout)

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
