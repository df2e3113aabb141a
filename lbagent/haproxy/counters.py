"""`HaproxyCounters`: what haproxy did, for the status document and the metrics.

Reloads that succeeded or failed, masters started, changes applied live with
no reload, when the last reload was and how long it took, and the last error
(cleared by the next successful reload). The parts of the manager record
here; `status` adds what only the running process knows.
"""

from __future__ import annotations

from datetime import UTC, datetime


class HaproxyCounters:
    def __init__(self) -> None:
        self.reloads = 0
        self.failed_reloads = 0
        self.starts = 0
        self.live_updates = 0
        self.last_reload_at: str | None = None
        self.last_reload_seconds: float | None = None
        self.last_error: str | None = None

    def record_reload(self) -> None:
        self.reloads += 1
        self.last_reload_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.last_error = None

    def record_start(self, outcome: str) -> None:
        if outcome != "adopted":
            self.starts += 1

    def record_outcome(self, outcome: str) -> None:
        """Count what `reload_or_start` did: a reload, or a start."""
        if outcome == "reloaded":
            self.record_reload()
        else:
            self.record_start(outcome)

    def record_failure(self, exc: BaseException) -> None:
        self.failed_reloads += 1
        self.last_error = str(exc)

    def record_live_update(self) -> None:
        self.live_updates += 1

    def status(self, pid: int | None, servers_draining: int) -> dict:
        """The status document: these counters, the master's pid and the servers draining in its worker."""
        return {
            "pid": pid,
            "running": pid is not None,
            "last_reload_at": self.last_reload_at,
            "last_reload_seconds": self.last_reload_seconds,
            "reloads": self.reloads,
            "failed_reloads": self.failed_reloads,
            "starts": self.starts,
            "live_updates": self.live_updates,
            "servers_draining": servers_draining,
            "last_error": self.last_error,
        }
