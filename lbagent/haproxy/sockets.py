"""Talking to haproxy over its two UNIX sockets, and reading what it answers.

The master CLI (`master.sock`) answers `show proc` and takes `reload`; the
runtime API of the current worker (`stats.sock`) answers `show stat`. Both
are one command per connection here: the command is sent, the write side
shut down, and the answer read to EOF, line by line for the long ones.
Everything is synchronous with a deadline; callers on the event loop use a
worker thread.
"""

from __future__ import annotations

import csv
import re
import socket
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from lbagent.haproxy.errors import HaproxyAnswerError
from lbagent.haproxy.health import from_stat_fields

DEFAULT_TIMEOUT = 5.0
MAX_ANSWER_BYTES = 64 * 1024 * 1024  # show stat of thousands of servers fits easily


def send_command(path: Path, command: str, timeout: float = DEFAULT_TIMEOUT) -> str:
    """haproxy's whole answer to `command`; OSError (refused, reset, timed out) when there is none."""
    return "".join(answer_lines(path, command, timeout))


def answer_lines(path: Path, command: str, timeout: float = DEFAULT_TIMEOUT) -> Iterator[str]:
    """haproxy's answer to `command`, line by line as it arrives: an answer of
    thousands of rows is never held whole. Every read waits only for what is
    left of `timeout` (the caller's time between lines counts too). OSError
    (refused, reset, timed out) when there is none; HaproxyAnswerError past
    MAX_ANSWER_BYTES."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(command.encode("ascii") + b"\n")
        # Without the shutdown haproxy keeps the session open for more commands.
        sock.shutdown(socket.SHUT_WR)
        size = 0
        partial: list[bytes] = []  # the start of a line that has not ended yet
        while True:
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            chunk = sock.recv(65536)
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise HaproxyAnswerError(f"answer to {command!r} larger than {MAX_ANSWER_BYTES} bytes")
            *ended, rest = chunk.split(b"\n")
            if ended:
                ended[0] = b"".join([*partial, ended[0]])
                partial = []
                for line in ended:
                    yield line.decode("utf-8", errors="replace") + "\n"
            if rest:
                partial.append(rest)
        if partial:
            yield b"".join(partial).decode("utf-8", errors="replace")


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


SHOW_SERVER_STATS = "show stat -1 4 -1"  # every proxy (-1), server rows only (4), every server (-1)
# The columns a server's health is read from, in from_stat_fields' order.
HEALTH_COLUMNS = ("status", "lastchg", "check_status", "check_code")


def parse_show_stat(answer: str | Iterable[str], proxy_prefix: str = "") -> dict[tuple[str, str], str]:
    """(proxy name, server name) -> status ("UP", "DOWN", "MAINT", "no check", ...) for every server row
    of the proxies whose names start with `proxy_prefix`, each a `ServerHealth` that carries its
    reason and since when it holds. `answer` is the text, or its lines as they arrive
    (`answer_lines`). Rows of other proxies are not decoded, and no row is kept once read:
    at a thousand load balancers the whole answer is 2.7 MB of text in 12,000 lines."""
    lines = iter(answer.splitlines() if isinstance(answer, str) else answer)
    header = next(lines, "")
    if not header.startswith("# "):
        return {}
    columns = header[2:].rstrip("\r\n").split(",")
    if "pxname" not in columns or "svname" not in columns:
        return {}
    proxy, server = columns.index("pxname"), columns.index("svname")
    health = [columns.index(name) if name in columns else None for name in HEALTH_COLUMNS]
    now = datetime.now(UTC)
    states: dict[tuple[str, str], str] = {}
    for row in csv.reader(line for line in lines if line.startswith(proxy_prefix)):
        if len(row) <= max(proxy, server) or not row[proxy] or row[server] in ("FRONTEND", "BACKEND"):
            continue
        status, lastchg, check_status, check_code = (row[i] if i is not None and i < len(row) else "" for i in health)
        # A backend's name, interned, is one string for all its servers in what is kept.
        key = (sys.intern(row[proxy]), row[server])
        states[key] = from_stat_fields(status, lastchg, check_status, check_code, now)
    return states
