"""The process and command helpers every part of `devtools` (and the tests) share.

Running a command with a bounded time and a readable error (`run`,
`CommandError`), bounded waits on a real condition (`wait_for`), finding the
OVS/OVN tools (`which`, `required_tools`, `skip_reason`), the host's link
names, and stopping a process only by the pid we were given, after checking
it is still the process we started (`stop_pid`).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class CommandError(RuntimeError):
    """A subprocess failed; the message carries its command line and stderr."""

    def __init__(self, argv: list[str], returncode: int, stdout: str, stderr: str):
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        # Inline scripts (python -c ...) would drown the message: abbreviate them.
        shown = " ".join(a if len(a) <= 120 and "\n" not in a else "<script>" for a in argv)
        super().__init__(f"{shown} exited {returncode}: {stderr.strip() or stdout.strip()}")

    @property
    def summary(self) -> str:
        """The command and the last line it printed (for warnings; a traceback's last line)."""
        lines = (self.stderr.strip() or self.stdout.strip()).splitlines() or [""]
        return f"{os.path.basename(self.argv[0])} {' '.join(self.argv[1:2])} exited {self.returncode}: {lines[-1]}"


class WaitAborted(RuntimeError):
    """Raised by a `wait_for` predicate when waiting longer is pointless (the process died)."""


# The daemons and ethtool live in sbin directories, which a non-login root
# shell (or CI) may not have on its PATH.
TOOL_PATH = os.pathsep.join([os.environ.get("PATH", "/usr/bin:/bin"), "/usr/local/sbin", "/usr/sbin", "/sbin"])


def which(tool: str) -> str | None:
    """Where `tool` is, searching PATH and the sbin directories."""
    return shutil.which(tool, path=TOOL_PATH)


def required_tools() -> list[str]:
    """The executables the sandbox and topology need (for skip checks)."""
    return [
        "ovsdb-tool",
        "ovsdb-server",
        "ovs-vswitchd",
        "ovs-vsctl",
        "ovs-appctl",
        "ovn-northd",
        "ovn-controller",
        "ovn-nbctl",
        "ovn-sbctl",
        "ip",
        "ethtool",
        "curl",
        # the multi-host sandbox's namespaces
        "nsenter",
        "unshare",
    ]


class MissingTools(RuntimeError):
    """Root runs the functional tests, but a tool they need is missing: a failure, never a skip."""


def skip_reason(euid: int, missing: list[str]) -> str | None:
    """Why the functional tests are skipped (None: they run). Without root they
    cannot run at all and are skipped; as root a missing tool means the set-up
    is broken (`make deps` installs them all), and a skip would hide it."""
    if euid != 0:
        return "functional tests need root (network namespaces, OVS, iptables)"
    if missing:
        raise MissingTools(
            f"functional tests need {', '.join(missing)}, missing although running as root (run `make deps`)"
        )
    return None


def run(*argv: str | os.PathLike, env: dict[str, str] | None = None, timeout: float = 30, check: bool = True) -> str:
    """Run a command, return its stdout; raise CommandError (with stderr) on failure."""
    args = [os.fspath(a) for a in argv]
    args[0] = which(args[0]) or args[0]
    if env is None:  # the command may look up more tools (ip netns exec ethtool ...)
        env = {**os.environ, "PATH": TOOL_PATH}
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise CommandError(args, -1, "", f"timed out after {timeout}s") from exc
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, proc.stdout, proc.stderr)
    return proc.stdout


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.1) -> T:
    """Poll `predicate` until it returns something truthy; return that.

    Exceptions from the predicate count as "not yet" (the thing may not exist
    yet); the last one is quoted in the TimeoutError so failures explain
    themselves. WaitAborted propagates at once.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
        except WaitAborted:
            raise
        except Exception as exc:  # noqa: BLE001 - reported below
            last_error, result = exc, None
        if result:
            return result
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error})" if last_error else ""
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)


def link_names(*launcher: str) -> set[str]:
    """Names of the links in the host network namespace, or where `launcher` (a command prefix) runs `ip`."""
    return {link["ifname"] for link in json.loads(run(*launcher, "ip", "-j", "link", "show") or "[]")}


def _proc_state(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def pid_alive(pid: int) -> bool:
    """True if `pid` runs; a zombie (our init may not reap) counts as gone."""
    state = _proc_state(pid)
    return state is not None and state not in ("Z", "X")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return ""


KILLED_EXIT_WAIT = 60.0  # seconds a SIGKILLed process may take to be gone


def stop_pid(pid: int, *, expect: str, timeout: float = 10, what: str = "") -> bool:
    """Terminate `pid` if it is still the process we started; return whether one was stopped.

    `expect` must occur in the process's command line (a pidfile path, a
    config path, a marker): a pid recorded long ago may have been reused by
    an unrelated process, which we must never signal. SIGTERM first, SIGKILL
    when it does not exit within `timeout`. A killed process may still take
    long to go: ovs-vswitchd closing thousands of tap devices, each under the
    kernel's one rtnl lock, took more than 5 s after 2,500 load balancers.
    """
    what = what or f"pid {pid}"
    if not pid_alive(pid) or expect not in _cmdline(pid):
        return False
    for sig, grace in ((signal.SIGTERM, timeout), (signal.SIGKILL, KILLED_EXIT_WAIT)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        try:
            wait_for(lambda: not pid_alive(pid), grace, f"{what} to exit after {sig.name}")
            return True
        except TimeoutError:
            if sig is signal.SIGKILL:
                raise
    return True


def end_process(proc: subprocess.Popen, timeout: float = 10) -> None:
    """Terminate a child we started, SIGKILL if it does not exit within `timeout`, and reap it."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


def clean_env() -> dict[str, str]:
    """The caller's environment without OVS_*/OVN_* settings that could point at another OVS."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("OVS_", "OVN_"))}
