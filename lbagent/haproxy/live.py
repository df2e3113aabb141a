"""Server changes the running haproxy takes without a reload.

A reload makes a new worker parse every load balancer's file: half a second
with a thousand of them, for a change as small as one backend replaced. When
the change from one file to the next is confined to `server` lines of
backends that exist in both, `plan_server_edits` says which commands of the
CLI make the running worker match the new file, and `apply_edits`
sends them:

- an added server is created (haproxy creates it in maintenance), enabled,
  and its health checks enabled when its line has `check`;
- a removed server goes into maintenance, so it takes no new connection, and
  is deleted; haproxy refuses to delete one that still has connections, which
  then drains (`LiveServers.retry` deletes it once idle) for its group's drain
  timeout, after which its sessions are shut and it goes; a reload drops it too;
- a server whose line differs only in its weight gets the new weight; one set
  to weight 0 keeps its sessions for the drain timeout, then they are shut.

A backend's drain timeout is a comment of its section (`DRAIN_COMMENT`, absent
at the default), so the file on disk says it to whichever agent edits the worker;
the deadlines themselves are kept by `drains.DrainBook`.

`LiveServers` sends the commands through the master CLI to the current
worker by pid: right after a reload the stats socket could still reach the
old worker, where an edit would be lost.

Anything else is left to a reload: other lines changed, a server line changed
otherwise, a backend with a balance algorithm haproxy cannot add servers to
(`source`), servers with a persistence cookie (haproxy refuses `cookie` on
servers it adds at run time) or with TLS to the backend. The file on disk is always the new one, so a
later reload or restart loads the same servers.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lbagent.haproxy.drains import DrainBook
from lbagent.haproxy.errors import HaproxyError
from lbagent.haproxy.sockets import ProcTable, send_command

log = logging.getLogger(__name__)

# Balance algorithms whose backends accept servers added at run time (haproxy 2.6).
DYNAMIC_BALANCE = frozenset({"roundrobin", "leastconn", "first", "random"})
STILL_CONNECTED = "still has connections"
# Server keywords that keep a change to a reload: haproxy refuses `cookie` on
# servers it adds at run time, and whether `ssl` implies TLS health checks is
# settled at configuration parsing; a reload keeps both exactly as written.
_UNSAFE_LIVE = frozenset({"cookie", "ssl"})
# "# drain-timeout <seconds>" in a backend section: haproxy ignores it, live edits read it.
DRAIN_COMMENT = "# drain-timeout "


@dataclass(frozen=True)
class ServerEdit:
    backend: str
    server: str
    line: str | None  # the new `server` line (its words after the name); None: remove the server
    weight_only: bool = False
    drain_timeout: float | None = None  # seconds its sessions may stay once removed or at weight 0; None: the default

    @property
    def quiesces(self) -> bool:
        """A weight edit to 0: the server stays but takes no new connection."""
        return self.weight_only and self.line is not None and _weight(self.line) == "0"

    @property
    def target(self) -> str:
        return f"{self.backend}/{self.server}"


@dataclass
class _Section:
    header: str
    lines: list[str]
    servers: dict[str, str]  # server name -> the words after it
    drain_timeout: float | None = None


def _sections(text: str) -> list[_Section]:
    sections: list[_Section] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(DRAIN_COMMENT) and sections:
            sections[-1].drain_timeout = float(line.removeprefix(DRAIN_COMMENT))
            continue
        if not line or line.startswith("#"):
            continue
        if raw[:1].strip():  # a section starts at column 0
            sections.append(_Section(line, [], {}))
        elif not sections:
            return []  # not one of our files: nothing to compare
        elif line.startswith("server "):
            _, name, rest = (line.split(None, 2) + [""])[:3]
            sections[-1].servers[name] = rest
        else:
            sections[-1].lines.append(line)
    return sections


def _weight(words: str) -> str | None:
    match = re.search(r"(?:^| )weight (\d+)(?: |$)", words)
    return match.group(1) if match else None


def _without_weight(words: str) -> str:
    return re.sub(r"(?:^| )weight \d+(?= |$)", "", words)


def plan_server_edits(old_text: str, new_text: str) -> list[ServerEdit] | None:
    """The edits that turn `old_text`'s servers into `new_text`'s, or None when
    the change needs a reload (see the module docstring). [] when equal."""
    old, new = _sections(old_text), _sections(new_text)
    if not old or [(s.header, s.lines) for s in old] != [(s.header, s.lines) for s in new]:
        return None
    edits: list[ServerEdit] = []
    for before, after in zip(old, new):
        if before.servers == after.servers:
            continue
        drain = after.drain_timeout
        kind, _, backend = before.header.partition(" ")
        balance = next((line.split()[1] for line in before.lines if line.startswith("balance ")), "roundrobin")
        if kind != "backend" or balance not in DYNAMIC_BALANCE:
            return None
        for name, words in after.servers.items():
            if _UNSAFE_LIVE & set(words.split()):
                return None
            previous = before.servers.get(name)
            if previous is None:
                edits.append(ServerEdit(backend, name, words, drain_timeout=drain))
            elif previous != words:
                if _without_weight(previous) != _without_weight(words) or _weight(words) is None:
                    return None
                edits.append(ServerEdit(backend, name, words, weight_only=True, drain_timeout=drain))
        gone = [name for name in before.servers if name not in after.servers]
        edits += [ServerEdit(backend, name, None, drain_timeout=drain) for name in gone]
    return edits


class LiveEditError(HaproxyError):
    """haproxy refused a command of a live edit: the running worker needs a reload.
    `edited`: whether commands before the refused one changed the worker."""

    def __init__(self, message: str, edited: bool = False):
        super().__init__(message)
        self.edited = edited


def apply_edits(edits: list[ServerEdit], send: Callable[[str], str]) -> set[str]:
    """Send the edits' commands through `send` (one CLI command, its answer).
    Additions and weights first, removals last, so a backend never runs short
    meanwhile. Returns the targets ("backend/server") that are in maintenance
    but could not be deleted yet; LiveEditError on any other refusal."""
    lingering: set[str] = set()
    for edit in sorted(edits, key=lambda e: e.line is None):
        if edit.line is None:
            _expect(send(f"set server {edit.target} state maint"), "", edit)
            if not delete(edit.target, send):
                lingering.add(edit.target)
        elif edit.weight_only:
            _expect(send(f"set weight {edit.target} {_weight(edit.line)}"), "", edit)
        else:
            _expect(send(f"add server {edit.target} {edit.line}"), "New server registered.", edit)
            _expect(send(f"enable server {edit.target}"), "", edit)
            if "check" in edit.line.split():
                _expect(send(f"enable health {edit.target}"), "", edit)
    return lingering


class LiveServers:
    """Edits of the current haproxy worker, and the servers still draining in it.
    Blocking (sockets, the drain book): called on the manager's process thread, under its lock."""

    def __init__(
        self,
        master_sock: Path,
        show_proc: Callable[[], ProcTable | None],
        drain_limit: float,
        readd_patience: float = 0.5,
        clock: Callable[[], float] = time.time,
        book: DrainBook | None = None,
        transport: Callable[[Path, str], str] = send_command,
    ):
        self._master_sock = master_sock
        self._transport = transport  # one command to the master CLI, its answer
        self._show_proc = show_proc
        self._drain_limit = drain_limit  # seconds a removed server keeps its sessions when its file says nothing
        self._readd_patience = readd_patience
        self._clock = clock  # wall clock: deadlines outlive the agent
        self._book = book or DrainBook(None)
        self._drains = self._book.load()
        self._draining = self._drains.removed  # "backend/server" -> when its sessions are shut
        self._quiesced = self._drains.quiesced  # the same for servers at weight 0, which stay

    @property
    def draining(self) -> int:
        return len(self._draining) + len(self._quiesced)

    def deadlines(self) -> dict[str, float]:
        """ "backend/server" -> when the sessions of each server draining are shut (wall-clock seconds)."""
        return self._drains.deadlines()

    def apply(self, edits: list[ServerEdit]) -> None:
        """Send the edits to the current worker; LiveEditError if it refuses one."""
        send = self._sender()
        self._clear_the_way(edits, send)
        sent = 0

        def counted(command: str) -> str:
            nonlocal sent
            sent += 1
            return send(command)

        try:
            lingering = apply_edits(edits, counted)
        except (LiveEditError, OSError) as exc:
            # The command that failed changed nothing; those before it did.
            raise LiveEditError(str(exc), edited=sent > 1) from exc
        self._start_drains(edits, lingering)
        self._retry(send)  # a drain timeout of 0 shuts at once
        self._book.save(self._drains)

    def retry(self) -> None:
        """Delete the draining servers that are idle, shut those past their deadline."""
        if self.draining:
            self._retry(self._sender())
            self._book.save(self._drains)

    def forget(self) -> None:
        """A new worker (reload, restart) never had the draining servers."""
        self._draining.clear()
        self._quiesced.clear()
        self._book.save(self._drains)

    def _start_drains(self, edits: list[ServerEdit], lingering: set[str]) -> None:
        now = self._clock()
        for edit in edits:
            limit = self._drain_limit if edit.drain_timeout is None else edit.drain_timeout
            # A server at weight 0 that is then removed keeps the deadline it had.
            started = self._quiesced.pop(edit.target, now + limit)
            if edit.target in lingering:
                self._draining[edit.target] = started
            elif edit.quiesces:
                self._quiesced[edit.target] = started

    def _sender(self) -> Callable[[str], str]:
        table = self._show_proc()
        if table is None or len(table.workers) != 1:
            raise LiveEditError("no single current haproxy worker to edit")
        worker = next(iter(table.workers))
        if self._drains.worker != worker:
            # Deadlines recorded for another worker: its servers went with it.
            self._draining.clear()
            self._quiesced.clear()
            self._drains.worker = worker
        prefix = f"@!{worker} "
        return lambda command: self._transport(self._master_sock, prefix + command)

    def _retry(self, send: Callable[[str], str]) -> None:
        now = self._clock()
        for target, shut_at in sorted(self._quiesced.items()):
            if now >= shut_at:
                send(f"shutdown sessions server {target}")
                del self._quiesced[target]
        for target, shut_at in sorted(self._draining.items()):
            if now >= shut_at:
                send(f"shutdown sessions server {target}")
            try:
                gone = delete(target, send)
            except LiveEditError as exc:
                gone = "No such server" in str(exc)  # dropped meanwhile: nothing left to delete
                if not gone:
                    log.warning("object=haproxy action=delete_server server=%s result=error error=%r", target, str(exc))
            if gone:
                del self._draining[target]

    def _clear_the_way(self, edits: list[ServerEdit], send: Callable[[str], str]) -> None:
        """Delete what can be of the draining servers; one about to be added again
        gets `readd_patience` for its last connections (short requests end in
        milliseconds) before haproxy is asked, and refuses, to add it twice."""
        adding = {edit.target for edit in edits if edit.line is not None and not edit.weight_only}
        # A weight above 0 again ends the drain of a server that stayed.
        for edit in edits:
            if edit.weight_only and not edit.quiesces:
                self._quiesced.pop(edit.target, None)
        deadline = self._clock() + self._readd_patience
        self._retry(send)
        while adding & self._draining.keys() and self._clock() < deadline:
            time.sleep(0.02)
            self._retry(send)


def delete(target: str, send: Callable[[str], str]) -> bool:
    """Delete a server in maintenance; False while it still has connections."""
    answer = send(f"del server {target}").strip()
    if answer == "Server deleted.":
        return True
    if STILL_CONNECTED in answer:
        return False
    raise LiveEditError(f"del server {target}: {answer}")


def _expect(answer: str, wanted: str, edit: ServerEdit) -> None:
    if answer.strip() != wanted:
        raise LiveEditError(f"{edit.target}: haproxy answered {answer.strip()!r}")
