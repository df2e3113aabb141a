"""`WorkerState`: how far the running haproxy worker may be from the files on disk.

- A marker file says "on disk but maybe not loaded yet": an agent restarted
  between installing and reloading reloads once when it adopts the master.
- `reload_due`: a live edit went half-way and its reload failed, so the
  worker differs from the disk; the manager's supervision retries that reload every
  `RELOAD_RETRY` seconds.
- `live`: the current worker's servers as live edits left them, with those
  still draining and until when (kept in `drains_file` across restarts).

Whoever replaces the worker (a reload, a start) calls `replaced`: the new
worker runs the files on disk, so nothing drains in it and nothing is due.
"""

from __future__ import annotations

from lbagent.desired.fields import DEFAULT_DRAIN_TIMEOUT
from lbagent.haproxy.drains import DRAINS_FILE, DrainBook
from lbagent.haproxy.files import HaproxyPaths
from lbagent.haproxy.live import LiveServers
from lbagent.haproxy.process import HaproxyProcess

PENDING_MARKER = "reload-pending"
READD_PATIENCE = 0.5  # seconds a server added back waits for its draining namesake (then: a reload)
RELOAD_RETRY = 5.0  # seconds between reloads supervision retries after a live edit left one due


class WorkerState:
    def __init__(self, paths: HaproxyPaths, process: HaproxyProcess):
        self.marker = paths.root / PENDING_MARKER
        # Servers removed live that still have connections drain for their group's drain timeout.
        self.drains_file = paths.root / DRAINS_FILE
        book = DrainBook(self.drains_file)
        self.live = LiveServers(paths.master_sock, process.show_proc, DEFAULT_DRAIN_TIMEOUT, READD_PATIENCE, book=book)
        # A live edit went half-way and its reload failed: the worker differs from the disk.
        self.reload_due = False
        self._reload_retry_at = 0.0

    def mark(self) -> None:
        """On disk, maybe not running yet: a restarted agent reloads."""
        self.marker.touch()

    def marked(self) -> bool:
        return self.marker.exists()

    def clear_marker(self) -> None:
        self.marker.unlink(missing_ok=True)

    def behind(self) -> bool:
        """The worker may not run what the disk holds (an earlier reload is still due)."""
        return self.reload_due or self.marked()

    def retry_due(self, now: float) -> bool:
        """A reload is due and its retry time (loop time) has come."""
        return self.reload_due and now >= self._reload_retry_at

    def retry_later(self, now: float) -> None:
        self._reload_retry_at = now + RELOAD_RETRY

    def replaced(self) -> None:
        """A new worker runs the files on disk: nothing drains in it, nothing is due."""
        self.live.forget()
        self.reload_due = False
