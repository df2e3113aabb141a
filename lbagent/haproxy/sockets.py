"""Talking to haproxy over its two UNIX sockets, and reading what it answers.

The master CLI (`master.sock`) answers `show proc` and takes `reload`; the
runtime API of the current worker (`stats.sock`) answers `show stat`. Both
are one command per connection here: the command is sent, the write side
shut down, and the answer read to EOF. Everything is synchronous with a
deadline; callers on the event loop use a worker thread.
"""

from __future__ import annotations

import csv
import io
import re
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from lbagent.haproxy.errors import HaproxyAnswerError
from lbagent.haproxy.health import from_stat_row

DEFAULT_TIMEOUT = 5.0
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # show stat of thousands of servers fits easily


def send_command(path: Path, command: str, timeout: float = DEFAULT_TIMEOUT) -> str:
    """haproxy's whole answer to `command`; OSError (refused, reset, timed out) when there is none."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(command.encode("ascii") + b"\n")
        # Without the shutdown haproxy keeps the session open for more commands.
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        size = 0
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = sock.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise HaproxyAnswerError(f"answer to {command!r} larger than {MAX_ANSWER_BYTES} bytes")
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class ProcTable:
    """The master CLI's `show proc`: the master and its current and old workers."""

    master_pid: int
    reloads: int  # reloads attempted since the master started
    failed: int  # failed reloads since the last successful one
    workers: frozenset[int]  # current workers (running the newest configuration)
    old_workers: frozenset[int]  # finishing their connections after a reload


# "12885           master          2 [failed: 0]   0d00h00m15s     2.6.12-1+deb12u4"
_MASTER_RE = re.compile(r"^(\d+)\s+master\s+(\d+)\s+\[failed:\s*(\d+)\]", re.MULTILINE)
_PROC_RE = re.compile(r"^(\d+)\s+worker\b")


def parse_show_proc(text: str) -> ProcTable | None:
    """None when `text` is not a show proc answer (empty while the master re-executes, say)."""
    master = _MASTER_RE.search(text)
    if master is None:
        return None
    workers: dict[str, set[int]] = {"workers": set(), "old workers": set()}
    section = None
    for line in text.splitlines():
        if line.startswith("#"):
            section = line.lstrip("#").strip()
            continue
        match = _PROC_RE.match(line)
        if match and section in workers:
            workers[section].add(int(match.group(1)))
    return ProcTable(
        master_pid=int(master.group(1)),
        reloads=int(master.group(2)),
        failed=int(master.group(3)),
        workers=frozenset(workers["workers"]),
        old_workers=frozenset(workers["old workers"]),
    )


def parse_show_stat(text: str, proxy_prefix: str = "") -> dict[tuple[str, str], str]:
    """(proxy name, server name) -> status ("UP", "DOWN", "MAINT", "no check", ...) for every server row
    of the proxies whose names start with `proxy_prefix`, each a `ServerHealth` that carries its
    reason and since when it holds. Rows of other proxies are not decoded: at a thousand load
    balancers the whole answer takes a third of a second."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        return {}
    wanted = [line for line in lines[1:] if line.startswith(proxy_prefix)] if proxy_prefix else lines[1:]
    rows = csv.DictReader(io.StringIO("\n".join([lines[0][2:], *wanted])))
    now = datetime.now(UTC)
    return {
        (row["pxname"], row["svname"]): from_stat_row(row, now)
        for row in rows
        if row.get("svname") not in (None, "FRONTEND", "BACKEND") and row.get("pxname")
    }
