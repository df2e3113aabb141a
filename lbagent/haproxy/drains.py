"""When the servers draining in the running haproxy worker are cut, kept on disk.

A server removed live, or set to weight 0, keeps its established connections
until its group's `drain_timeout` has passed. `DrainBook` remembers those
deadlines (wall-clock seconds, so they mean the same to a restarted agent) and
the worker that holds the servers: an agent restarted meanwhile adopts the
master and still cuts them on time, and a deadline recorded for a worker that
is gone is void, because its servers went with it.

One JSON file, replaced atomically; blocking, like everything on the
haproxy process thread that uses it.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

DRAINS_FILE = "drains.json"


@dataclass
class Drains:
    """The deadlines of one worker: `removed` servers are deleted at theirs, `quiesced` (weight 0) ones stay."""

    worker: int | None = None
    removed: dict[str, float] = field(default_factory=dict)  # "backend/server" -> when its sessions are shut
    quiesced: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.removed or self.quiesced)

    def deadlines(self) -> dict[str, float]:
        return {**self.quiesced, **self.removed}


class DrainBook:
    def __init__(self, path: Path | None):
        self._path = path  # None: nothing is kept (deadlines die with the agent)

    def load(self) -> Drains:
        """What the file holds; empty when there is none or it cannot be read."""
        if self._path is None:
            return Drains()
        try:
            data = json.loads(self._path.read_text())
            return Drains(
                worker=data.get("worker"),
                removed={str(k): float(v) for k, v in data.get("removed", {}).items()},
                quiesced={str(k): float(v) for k, v in data.get("quiesced", {}).items()},
            )
        except FileNotFoundError:
            return Drains()
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            # Losing the deadlines only lets those servers drain until the worker goes.
            log.warning("object=haproxy action=load_drains result=error error=%r", str(exc))
            return Drains()

    def save(self, drains: Drains) -> None:
        if self._path is None:
            return
        if not drains:
            self._path.unlink(missing_ok=True)
            return
        text = json.dumps({"worker": drains.worker, "removed": drains.removed, "quiesced": drains.quiesced})
        temporary = self._path.with_name(self._path.name + ".tmp")
        temporary.write_text(text)
        os.replace(temporary, self._path)
