"""`HaproxyManager`: the agent's asyncio face of haproxy.

It owns the files under `<run_dir>/haproxy/` and turns per-load-balancer
changes into as few reloads as possible:

- `apply(lb_id, text, files)` does nothing (and does not reload) when the
  load balancer's file already holds `text` and its directory exactly `files`
  (certificates and keys, see `candidate`). Otherwise it checks the candidate
  with its files alone with the base file, so a bad load balancer is refused
  before it can disturb the others, and queues it for the next reload.
  `prepare` and `queue` are its two halves, for a caller with other work to
  finish before the change may go live (`drop` forgets a prepared change);
  from `prepare` until the change's reload is over, or it is dropped, the
  load balancer's next change waits.
- Checked changes are queued for the reload batcher (`batching`), which
  hands them back as one batch once the burst settles, paced by the cost of
  the last reload; `reloads` installs a batch and reloads once (a
  configuration haproxy cannot load shows as a failed reload). On failure
  the batch's files are put back as they were, so the running configuration
  and the disk agree again and one bad batch cannot block later reloads.
- A change confined to server lines of existing backends (a backend added,
  removed or reweighted) skips the batch: its file is installed and the
  running worker is edited through the master CLI (`live`), with no reload;
  if haproxy refuses an edit, a reload of the files on disk follows at once.
- A marker file says "on disk but maybe not loaded yet": an agent restarted
  between installing and reloading reloads once when it adopts the master.

Blocking work (files, subprocesses, sockets) runs in worker threads, in
separate pools for reloads, per-load-balancer checks and the stats socket.

`HaproxyManager` is the facade over the parts that do this, each in its own
module: `changes` (prepare, queue, drop), `locks` (one change at a time per
load balancer), `reloads` (install and reload), `liveapply` (live server
edits), `worker` (what the running worker may lack of the disk, the marker
among it), `lifecycle` (start, adopt, supervise, stop), `counters` (status)
and `work` (the thread pools and the process lock).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

from lbagent.haproxy.accesslog import AccessLogReader, log_address
from lbagent.haproxy.batching import RELOAD_PACE, ReloadBatcher
from lbagent.haproxy.candidate import StagedChange, discard
from lbagent.haproxy.capacity import DEFAULT_LISTENER_MAXCONN
from lbagent.haproxy.changes import Changes, PreparedChange
from lbagent.haproxy.errors import HaproxyError
from lbagent.haproxy.files import HaproxyPaths, disk_stamp
from lbagent.haproxy.health import SteadySince, with_drain_deadlines
from lbagent.haproxy.lifecycle import Lifecycle
from lbagent.haproxy.liveapply import LiveApplier
from lbagent.haproxy.locks import LockMap
from lbagent.haproxy.parts import Shared
from lbagent.haproxy.process import HaproxyProcess
from lbagent.haproxy.reloads import Reloader
from lbagent.haproxy.settings import HaproxySettings, Privileges
from lbagent.haproxy.sockets import SHOW_SERVER_STATS, answer_lines, parse_show_stat

__all__ = ["HaproxyManager", "PreparedChange"]


class HaproxyManager:
    def __init__(
        self,
        binary: str,
        run_dir: Path,
        prometheus_listen: str = "",
        debounce: float = 0.05,
        max_delay: float | None = None,
        reload_pace: float = RELOAD_PACE,
        *,
        default_listener_maxconn: int = DEFAULT_LISTENER_MAXCONN,
        user: str = "",
        group: str = "",
        chroot: Path | None = None,
    ):
        """`user` and `group` (both or neither) run haproxy's workers, jailed in `chroot` (an empty
        directory the manager creates); the defaults keep them root and unjailed."""
        self.paths = HaproxyPaths(Path(run_dir))
        self.process = HaproxyProcess(binary, Path(run_dir))
        shared = Shared(self.paths, self.process)
        self._work, self._worker, self._counters = shared.work, shared.worker, shared.counters
        self._lb_locks = LockMap()
        privileges = Privileges(user, group, chroot) if user or chroot is not None else None
        settings = HaproxySettings(prometheus_listen, default_listener_maxconn, privileges)
        self._reloader = Reloader(shared, settings)
        self._batches: ReloadBatcher[StagedChange] = ReloadBatcher(
            self._reloader.reload_batch,
            debounce,
            max_delay if max_delay is not None else max(1.0, 20 * debounce),
            reload_pace,
        )
        self._changes = Changes(shared, self._lb_locks, self._batches, LiveApplier(shared), self._reloader.check_base)
        self._lifecycle = Lifecycle(shared, self._reloader)
        self.access_log = AccessLogReader(log_address(self.paths))
        self._since = SteadySince()  # on the stats thread only

    def expect_changes_while(self, coming: Callable[[], bool]) -> None:
        """`coming()`: whether changes are on their way (see `ReloadBatcher`)."""
        self._batches.coming = coming

    @property
    def reload_pace(self) -> float:
        """How many times its own duration a reload inside a burst is followed by a pause."""
        return self._batches.reload_pace

    @reload_pace.setter
    def reload_pace(self, value: float) -> None:
        self._batches.reload_pace = value

    # --- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        """Read access lines, write the base file if it changed and adopt the running master, or start one."""
        await self.access_log.start()
        await self._lifecycle.start()

    async def stop(self) -> bool:
        """Stop the master (cleanup and tests only: the agent's own shutdown leaves haproxy serving)."""
        await self.close()
        return await self._lifecycle.stop()

    async def close(self) -> None:
        """Stop batching (waiters of an unfinished batch are cancelled); haproxy keeps running."""
        for staged in await self._batches.close():
            await self._work.lb_work.run(discard, staged)
        await self.tidied()
        self.access_log.close()

    async def tidied(self) -> None:
        """Returns once the staging directories of installed changes are gone (see `HaproxyWork.tidied`)."""
        await self._work.tidied()

    async def supervise_once(self) -> bool:
        """Start the master again, on the files on disk, if it is gone. True if it had to.
        Also deletes the servers a live edit left in maintenance, once unconnected."""
        return await self._lifecycle.supervise_once()

    def remove_files(self) -> list[str]:
        """Remove every file of ours under <run_dir>/haproxy (after stop()); the removed paths."""
        return self._lifecycle.remove_files()

    # --- applying ------------------------------------------------------------------

    async def apply(self, lb_id: str, text: str | None, files: Mapping[str, bytes] | None = None) -> bool:
        """Make conf.d/<lb_id>.cfg hold `text` (None: no file), certs/<lb_id>/ hold
        exactly `files` (relative path -> content; None or empty: no directory),
        and haproxy run them.

        False, with no reload, if the disk already holds them. True once a
        reload that includes them has succeeded. HaproxyCheckError if haproxy
        refuses the candidate (the previous text and files stay and keep
        serving); HaproxyError if the batch's reload failed (the previous ones
        are back).
        """
        reloaded = await self.submit(lb_id, text, files)
        return False if reloaded is None else await reloaded

    async def submit(
        self, lb_id: str, text: str | None, files: Mapping[str, bytes] | None = None
    ) -> asyncio.Future | None:
        """`apply` up to the point where the change is checked and queued: None if
        the disk already holds it, else the future of its reload (see `apply`).
        The load balancer's next change waits until this one's reload is over."""
        return await self._changes.submit(lb_id, text, files)

    async def prepare(
        self, lb_id: str, text: str | None, files: Mapping[str, bytes] | None = None
    ) -> PreparedChange | None:
        """The first half of `submit`: the change staged and accepted by `haproxy -c`
        (HaproxyCheckError if refused), or None if the disk already holds it.
        Nothing live changes until it is `queue`d. A prepared change must be
        queued or dropped: until then (and until its reload is over) the load
        balancer's next change waits."""
        return await self._changes.prepare(lb_id, text, files)

    def queue(self, prepared: PreparedChange) -> asyncio.Future:
        """Hand a prepared change on: a server-only change to the running worker,
        any other to the next reload batch. The future resolves as `apply` says."""
        return self._changes.queue(prepared)

    async def drop(self, prepared: PreparedChange) -> None:
        """Forget a prepared change that will not be queued; nothing live changed."""
        await self._changes.drop(prepared)

    def disk_stamp(self, lb_id: str) -> bytes:
        """`files.disk_stamp` of the load balancer (blocking: a few stat calls)."""
        return disk_stamp(self.paths, lb_id)

    def lb_ids_on_disk(self) -> set[str]:
        return self.paths.lb_ids_on_disk()

    # --- observing -------------------------------------------------------------------

    def status(self) -> dict:
        return self._counters.status(self.process.pid, self._worker.live.draining)

    async def server_states(self, backend_prefix: str = "") -> dict[tuple[str, str], str]:
        """(backend name, server name) -> haproxy's status word ("UP", "DOWN", "MAINT", "no check", ...),
        of the backends whose names start with `backend_prefix`. Read and decoded on the stats
        thread: the event loop must not stand still while thousands of rows are parsed."""
        try:
            states = await self._work.stats_work.run(
                _read_server_states, self.paths.stats_sock, backend_prefix, self._since
            )
        except OSError as exc:
            raise HaproxyError(f"haproxy stats socket unavailable: {exc}") from exc
        return with_drain_deadlines(states, self._worker.live.deadlines())


def _read_server_states(stats_sock: Path, backend_prefix: str, since: SteadySince) -> dict[tuple[str, str], str]:
    states = parse_show_stat(answer_lines(stats_sock, SHOW_SERVER_STATS), backend_prefix)
    return since.steady(states, complete=not backend_prefix)
