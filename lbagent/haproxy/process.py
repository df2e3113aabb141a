"""The one haproxy master of this host: start, adopt, reload, stop, check.

The master runs daemonized in its own session so that it outlives the agent:
stopping or restarting the agent leaves the data path serving, and the next
agent adopts the master named by the pidfile. Reloads go through the master
CLI and are confirmed by a new worker showing up in `show proc`.

Everything here blocks (subprocesses, sockets, polling with deadlines); the
async manager calls it from worker threads. Mutating operations hold one
lock, so a reload never races a start or a stop.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from lbagent.haproxy.errors import HaproxyCheckError, HaproxyError, HaproxyReloadError, trim_output
from lbagent.haproxy.files import HaproxyPaths, join_lb_files
from lbagent.haproxy.sockets import ProcTable, parse_show_proc, send_command

log = logging.getLogger(__name__)

CHECK_TIMEOUT = 60.0  # haproxy -c of a few thousand proxies stays well below this
START_TIMEOUT = 60.0
RELOAD_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
POLL_INTERVAL = 0.02


def _start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot), from one read of
    /proc/<pid>/stat; None if it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # After the command name (in parentheses, and free to hold anything): the
    # state, then 18 fields more to the start time.
    fields = stat[stat.rfind(b")") + 2 :].split()
    if len(fields) < 20 or fields[0] == b"Z":
        return None
    return int(fields[19])


def _wait_until(condition, timeout: float):
    """condition()'s first truthy value within `timeout` seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_INTERVAL)


class HaproxyProcess:
    def __init__(self, binary: str, run_dir: Path):
        self.binary = binary
        self.paths = HaproxyPaths(Path(run_dir))
        self._pid: int | None = None
        self._known: tuple[int, int] | None = None  # (pid, start time) of the process last found ours
        self._lock = threading.RLock()
        # Called with the joined load balancer files each time they are joined,
        # before haproxy loads them (the base file is sized from them).
        self.before_load: Callable[[str], object] = lambda joined: None

    # --- observing ---------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The master's pid while it runs."""
        pid = self._pid
        return pid if pid is not None and self._is_ours(pid) else None

    def is_running(self) -> bool:
        return self.pid is not None

    def _is_ours(self, pid: int) -> bool:
        """A live (not zombie) haproxy loading our haproxy.cfg: a recycled pid is someone else.

        The readiness watch asks four times a second, on the event loop: once a
        pid is known ours, one read of its stat file (alive, not a zombie, the
        same start time, so the same process) answers without its command line."""
        started = _start_time(pid)
        if started is None:
            return False
        if self._known == (pid, started):
            return True
        try:
            cmdline = psutil.Process(pid).cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False
        ours = bool(cmdline) and "haproxy" in os.path.basename(cmdline[0]) and str(self.paths.base_cfg) in cmdline
        if ours:
            self._known = (pid, started)
        return ours

    def _pid_from_file(self) -> int | None:
        try:
            pid = int(self.paths.pidfile.read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None
        return pid if self._is_ours(pid) else None

    def show_proc(self, timeout: float = 2.0) -> ProcTable | None:
        """The master's process table, or None when its CLI does not answer."""
        try:
            return parse_show_proc(send_command(self.paths.master_sock, "show proc", timeout))
        except OSError:
            return None

    # --- starting ------------------------------------------------------------

    def adopt_or_start(self) -> str:
        """'adopted' a master already serving our files, or 'started' a new one."""
        with self._lock:
            if self.is_running():
                return "adopted"
            pid = self._pid_from_file()
            if pid is not None:
                self._pid = pid
                log.info("object=haproxy action=adopt pid=%d", pid)
                return "adopted"
            self.start()
            return "started"

    def start(self) -> int:
        """Start a master on the files on disk and wait for its first worker."""
        with self._lock:
            command = [
                self._resolved_binary(),
                "-W",
                "-D",
                "-S",
                f"{self.paths.master_sock},mode,600",
                "-p",
                str(self.paths.pidfile),
                "-f",
                str(self.paths.base_cfg),
                "-f",
                str(self.paths.joined_cfg),
            ]
            self.before_load(join_lb_files(self.paths))
            # A file, not a pipe: the daemon keeps the launcher's stdio for a
            # while, and reading a pipe to EOF would wait for it.
            with tempfile.TemporaryFile() as output:
                try:
                    result = subprocess.run(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=output,
                        stderr=output,
                        timeout=START_TIMEOUT,
                        start_new_session=True,
                        check=False,
                    )
                except subprocess.TimeoutExpired:
                    raise HaproxyReloadError(f"haproxy did not daemonize within {START_TIMEOUT:.0f}s") from None
                output.seek(0)
                said = output.read().decode("utf-8", errors="replace")
            if result.returncode != 0:
                raise HaproxyReloadError(f"haproxy did not start (exit {result.returncode}): {trim_output(said)}")
            pid = _wait_until(self._pid_from_file, START_TIMEOUT)
            if pid is None:
                raise HaproxyReloadError(f"haproxy started but {self.paths.pidfile} names no live master")
            self._pid = pid
            if not _wait_until(lambda: (t := self.show_proc()) is not None and t.workers, START_TIMEOUT):
                raise HaproxyReloadError(f"haproxy master {pid} started no worker within {START_TIMEOUT:.0f}s")
            log.info("object=haproxy action=start pid=%d", pid)
            return pid

    def _resolved_binary(self) -> str:
        # An absolute path in the master's command line: that is what adoption
        # and `ps` show, whatever PATH the next agent runs with.
        found = shutil.which(self.binary)
        if found is None:
            raise HaproxyError(f"haproxy binary not found: {self.binary!r}")
        return os.path.abspath(found)

    # --- reloading -------------------------------------------------------------

    def reload_or_start(self) -> str:
        """'reloaded' the running master onto the files on disk, or 'started' one if none runs."""
        with self._lock:
            if self.is_running():
                self.reload()
                return "reloaded"
            return self.adopt_or_start()

    def reload(self, timeout: float = RELOAD_TIMEOUT) -> None:
        """Hitless reload; returns once a worker running the new files serves.

        The master re-executes itself: its CLI goes away for a moment, then
        `show proc` counts one more reload and lists a new current worker. If
        the new files cannot be loaded (a bind that fails, say) the master
        counts a failed reload and the old workers keep serving.
        """
        with self._lock:
            pid = self.pid
            if pid is None:
                raise HaproxyReloadError("haproxy master is not running")
            self.before_load(join_lb_files(self.paths))
            before = self.show_proc()
            if before is not None and self._ask_master_to_reload():
                outcome = _wait_until(lambda: self._reload_outcome(before), timeout)
            else:
                # No usable master CLI: the signal does the same, and a new
                # child process is the only sign of success we can see.
                workers = self._worker_pids(pid)
                os.kill(pid, signal.SIGUSR2)
                outcome = _wait_until(lambda: "ok" if self._worker_pids(pid) - workers else None, timeout)
            if outcome is None:
                raise HaproxyReloadError(f"no new haproxy worker within {timeout:.0f}s of the reload")
            if outcome != "ok":
                raise HaproxyReloadError(outcome)
            log.debug("object=haproxy action=reload pid=%d", pid)

    def _ask_master_to_reload(self) -> bool:
        try:
            send_command(self.paths.master_sock, "reload")
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            pass  # the master re-executes while we read: the usual answer
        except OSError:
            return False
        return True

    def _reload_outcome(self, before: ProcTable) -> str | None:
        """'ok', a failure message, or None while the reload is still under way."""
        table = self.show_proc()
        if table is None or table.reloads <= before.reloads:
            return None
        if table.workers - before.workers:
            return "ok"
        if table.failed > 0:
            return (
                f"haproxy could not load the new configuration (a bind conflict?); its previous "
                f"workers keep serving ({table.failed} failed reload(s) in a row)"
            )
        return None

    def _worker_pids(self, master_pid: int) -> set[int]:
        try:
            return {child.pid for child in psutil.Process(master_pid).children()}
        except psutil.NoSuchProcess:
            return set()

    # --- stopping -----------------------------------------------------------------

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Stop our master and its workers: SIGTERM, then SIGKILL after `timeout`. False if none ran."""
        with self._lock:
            pid = self.pid or self._pid_from_file()
            self._pid = None
            if pid is None:
                return False
            try:
                master = psutil.Process(pid)
                procs = [master, *master.children()]
                master.terminate()
            except psutil.NoSuchProcess:
                return True
            if _wait_until(lambda: not any(_alive(p) for p in procs), timeout) is None:
                for proc in procs:
                    if _alive(proc):
                        proc.kill()
                _wait_until(lambda: not any(_alive(p) for p in procs), timeout)
            log.info("object=haproxy action=stop pid=%d", pid)
            return True

    # --- checking --------------------------------------------------------------------

    def check(self, paths: list[Path]) -> None:
        """`haproxy -c` of these files/directories in order; HaproxyCheckError with haproxy's words if invalid."""
        command = [self._resolved_binary(), "-c"]
        for path in paths:
            command += ["-f", str(path)]
        try:
            result = subprocess.run(
                command, stdin=subprocess.DEVNULL, capture_output=True, timeout=CHECK_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            raise HaproxyCheckError(f"haproxy -c took longer than {CHECK_TIMEOUT:.0f}s") from None
        if result.returncode != 0:
            said = (result.stderr + result.stdout).decode("utf-8", errors="replace")
            raise HaproxyCheckError(said)


def _alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an orphan's zombie lingers until init reaps it)."""
    try:
        # is_running() also compares the creation time: a recycled pid is not ours.
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
