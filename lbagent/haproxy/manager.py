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
  the last reload; this module installs a batch and reloads once (a
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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lbagent.support.blocking import BlockingPool
from lbagent.haproxy import templating
from lbagent.haproxy.batching import RELOAD_PACE, ReloadBatcher
from lbagent.haproxy.bulkcheck import BulkChecker
from lbagent.haproxy.counters import HaproxyCounters
from lbagent.haproxy.candidate import StagedChange, current, discard, install_change, roll_back, stage
from lbagent.haproxy.errors import HaproxyCheckError, HaproxyError, HaproxyReloadError
from lbagent.haproxy.live import LiveEditError, LiveServers, ServerEdit, plan_server_edits
from lbagent.haproxy.locks import LockMap
from lbagent.haproxy.files import (
    HaproxyPaths, empty_dir, fsync_dir, install, read_or_none, replace_text, sync_filesystem, write_staged,
)
from lbagent.haproxy.process import HaproxyProcess
from lbagent.haproxy.render import HARD_STOP_AFTER, render_base
from lbagent.haproxy.sockets import parse_show_stat, send_command

log = logging.getLogger(__name__)

# haproxy -c processes at once: each takes a core for tens of milliseconds.
MAX_PARALLEL_CHECKS = 4
PENDING_MARKER = "reload-pending"
READD_PATIENCE = 0.5  # seconds a server added back waits for its draining namesake (then: a reload)
RELOAD_RETRY = 5.0  # seconds between reloads the supervisor retries after a live edit left one due


@dataclass(frozen=True, eq=False)
class PreparedChange:
    """A load balancer's change, staged and checked, not yet live (see `HaproxyManager.prepare`)."""

    staged: StagedChange
    edits: list[ServerEdit] | None  # the running worker takes it as these server edits; None: a reload


class HaproxyManager:
    def __init__(self, binary: str, run_dir: Path, prometheus_listen: str = "", debounce: float = 0.05,
                 max_delay: float | None = None, reload_pace: float = RELOAD_PACE):
        self.paths = HaproxyPaths(Path(run_dir))
        self.process = HaproxyProcess(binary, Path(run_dir))
        self._prometheus_listen = prometheus_listen
        self._batches: ReloadBatcher[StagedChange] = ReloadBatcher(
            self._reload_batch, debounce, max_delay if max_delay is not None else max(1.0, 20 * debounce),
            reload_pace)
        self._marker = self.paths.root / PENDING_MARKER
        self._loop_objects = False
        self._lb_locks = LockMap()
        self._check_slots: asyncio.Semaphore | None = None
        self._bulk_checks: BulkChecker | None = None
        self._process_lock: asyncio.Lock | None = None
        self._counters = HaproxyCounters()
        # Servers removed live that still had connections drain at most as long as an old worker may.
        self._live = LiveServers(self.paths.master_sock, self.process.show_proc, HARD_STOP_AFTER, READD_PATIENCE)
        # A live edit went half-way and its reload failed: the worker differs from the disk.
        self._reload_due = False
        self._reload_retry_at = 0.0
        # Reloads and starts never wait behind candidate checks, nor status behind either.
        self._process_work = BlockingPool("haproxy-process", 1)
        self._lb_work = BlockingPool("haproxy-files", MAX_PARALLEL_CHECKS)
        self._stats_work = BlockingPool("haproxy-stats", 1)

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
        """Write the base file if it changed and adopt the running master, or start one."""
        self._ensure_loop_objects()
        self.paths.check_socket_paths()
        # Changes a previous agent staged but never installed: not live, and no longer wanted.
        await self._process_work.run(empty_dir, self.paths.staging_dir)
        base_changed = await self._process_work.run(self._write_base)
        await self._lb_work.run(templating.preload)
        async with self._process_lock:
            outcome = await self._process_work.run(self._adopt_or_start)
            self._counters.record_start(outcome)
            if outcome != "adopted":
                return
            if base_changed or await self._process_work.run(self._marker.exists):
                # Files the adopted master may not have loaded yet.
                try:
                    await self._process_work.run(self._check_and_reload)
                    self._counters.record_reload()
                except HaproxyError as exc:
                    self._counters.record_failure(exc)
                    if base_changed:
                        raise  # our own base file is refused: nothing will work
                    log.warning("object=haproxy action=reload result=error error=%r", str(exc))

    async def stop(self) -> bool:
        """Stop the master (cleanup and tests only: the agent's own shutdown leaves haproxy serving)."""
        await self.close()
        self._ensure_loop_objects()
        async with self._process_lock:
            return await self._process_work.run(self.process.stop)

    async def close(self) -> None:
        """Stop batching (waiters of an unfinished batch are cancelled); haproxy keeps running."""
        for staged in await self._batches.close():
            await self._lb_work.run(discard, staged)
        await self.tidied()

    async def tidied(self) -> None:
        """Returns once the staging directories of installed changes are gone.
        Their removal is queued on the reload thread by the job that installed
        them: the first turn lets a job still running there finish (and queue
        its removal), the second waits for that removal."""
        for _ in range(2):
            await self._process_work.run(_nothing)

    async def supervise_once(self) -> bool:
        """Start the master again, on the files on disk, if it is gone. True if it had to.
        Also deletes the servers a live edit left in maintenance, once unconnected."""
        self._ensure_loop_objects()
        if self.process.is_running():
            if self._reload_due and asyncio.get_running_loop().time() >= self._reload_retry_at:
                await self._reload_what_is_due()
            elif self._live.draining:
                async with self._process_lock:
                    try:
                        await self._process_work.run(self._live.retry)
                    except (LiveEditError, OSError) as exc:
                        log.debug("object=haproxy action=delete_servers result=error error=%r", str(exc))
            return False
        async with self._process_lock:
            try:
                outcome = await self._process_work.run(self._adopt_or_start)
            except HaproxyError as exc:
                self._counters.last_error = str(exc)
                raise
            if outcome != "adopted":
                self._worker_replaced()
        self._counters.record_start(outcome)
        if outcome != "adopted":
            log.warning("object=haproxy action=restart outcome=%s pid=%s", outcome, self.process.pid)
        return outcome != "adopted"

    async def _reload_what_is_due(self) -> None:
        """The reload a half-applied live edit needs (its own one failed): the files on disk."""
        async with self._process_lock:
            try:
                await self._process_work.run(self._check_and_reload)
            except HaproxyError as exc:
                self._counters.record_failure(exc)
                self._reload_retry_at = asyncio.get_running_loop().time() + RELOAD_RETRY
                log.warning("object=haproxy action=reload result=error error=%r", str(exc))
                return
            self._worker_replaced()
        self._counters.record_reload()

    def _worker_replaced(self) -> None:
        """A new worker runs the files on disk: nothing drains in it, nothing is due."""
        self._live.forget()
        self._reload_due = False

    def _adopt_or_start(self) -> str:
        """'adopted', 'started', or 'started bare' when the files on disk kept haproxy from starting."""
        try:
            outcome = self.process.adopt_or_start()
        except HaproxyReloadError as exc:
            lb_ids = self.paths.lb_ids_on_disk()
            if not lb_ids:
                raise
            # Every file passed its checks, yet together they do not start (a
            # port taken meanwhile, say). Serving nothing until each load
            # balancer's next pass re-applies, and re-checks, its own file beats
            # one file keeping all of them down for good.
            log.error("object=haproxy action=start result=error error=%r removed=%s", str(exc), sorted(lb_ids))
            for lb_id in lb_ids:
                replace_text(self.paths.lb_file(lb_id), None, self.paths.staging_dir)
            self.process.start()
            self._counters.last_error = (f"haproxy did not start on the files on disk ({exc}); started without "
                                f"them, their load balancers re-apply them: {', '.join(sorted(lb_ids))}")
            outcome = "started bare"
        if outcome != "adopted":
            self._clear_marker()  # a new master loaded whatever is on disk
        return outcome

    def remove_files(self) -> list[str]:
        """Remove every file of ours under <run_dir>/haproxy (after stop()); the removed paths."""
        directories = (self.paths.conf_dir, self.paths.staging_dir, self.paths.certs_dir)
        removed = [path for directory in directories for path in empty_dir(directory)]
        for path in (self.paths.base_cfg, self.paths.pidfile, self._marker, self.paths.master_sock,
                     self.paths.stats_sock):
            if path.exists() or path.is_symlink():
                path.unlink()
                removed.append(str(path))
        for directory in (*directories, self.paths.root):
            try:
                directory.rmdir()
            except OSError:
                pass  # gone already, or something not ours is in there: leave it
        return removed

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

    async def submit(self, lb_id: str, text: str | None,
                     files: Mapping[str, bytes] | None = None) -> asyncio.Future | None:
        """`apply` up to the point where the change is checked and queued: None if
        the disk already holds it, else the future of its reload (see `apply`).
        The load balancer's next change waits until this one's reload is over."""
        # The batcher waits for a change being checked: it joins the batch at once.
        with self._batches.checking():
            prepared = await self.prepare(lb_id, text, files)
            return None if prepared is None else self.queue(prepared)

    async def prepare(self, lb_id: str, text: str | None,
                      files: Mapping[str, bytes] | None = None) -> PreparedChange | None:
        """The first half of `submit`: the change staged and accepted by `haproxy -c`
        (HaproxyCheckError if refused), or None if the disk already holds it.
        Nothing live changes until it is `queue`d. A prepared change must be
        queued or dropped: until then (and until its reload is over) the load
        balancer's next change waits."""
        self._ensure_loop_objects()
        files = dict(files or {})
        self.paths.lb_file(lb_id)  # refuses an id that is no file name, before any I/O
        await self._lb_locks.acquire(lb_id)
        try:
            previous_text, previous_files = await self._lb_work.run(current, self.paths, lb_id)
            if (previous_text, previous_files) == (text, files):
                self._lb_locks.release(lb_id)
                return None
            edits = None
            if previous_text is not None and text is not None and previous_files == files:
                edits = plan_server_edits(previous_text, text)
            staged = await self._checked_candidate(lb_id, text, files, previous_text)
        except BaseException:
            self._lb_locks.release(lb_id)
            raise
        return PreparedChange(staged, edits)

    def queue(self, prepared: PreparedChange) -> asyncio.Future:
        """Hand a prepared change on: a server-only change to the running worker,
        any other to the next reload batch. The future resolves as `apply` says."""
        if prepared.edits is not None:
            done = asyncio.ensure_future(self._apply_live(prepared.staged, prepared.edits))
        else:
            done = self._batches.add(prepared.staged)
        done.add_done_callback(lambda _: self._lb_locks.release(prepared.staged.lb_id))
        return done

    async def drop(self, prepared: PreparedChange) -> None:
        """Forget a prepared change that will not be queued; nothing live changed."""
        try:
            await self._lb_work.run(discard, prepared.staged)
        finally:
            self._lb_locks.release(prepared.staged.lb_id)

    async def _checked_candidate(self, lb_id: str, text: str | None, files: dict[str, bytes],
                                 previous_text: str | None) -> StagedChange:
        """The change staged with its files, and accepted by haproxy next to the base file."""
        staged = await self._lb_work.run(stage, self.paths, lb_id, text, files, self._check_base, previous_text)
        if text is None:
            return staged  # a removal needs no check
        try:
            if files:
                async with self._check_slots:
                    await self._lb_work.run(self.process.check, staged.check_paths)
            else:
                await self._bulk_checks.check(staged)
        except BaseException as exc:
            await self._lb_work.run(discard, staged)
            if isinstance(exc, HaproxyCheckError):
                # Name the load balancer, not the temporary files haproxy saw.
                raise HaproxyCheckError(staged.hide_paths(exc.output),
                                        f"configuration of load balancer {lb_id}") from None
            raise
        return staged

    # --- live edits ---------------------------------------------------------------------

    async def _apply_live(self, staged: StagedChange, edits: list[ServerEdit]) -> bool:
        """Install a checked server-only change and edit the running worker to match."""
        try:
            async with self._process_lock:
                outcome = await self._process_work.run(self._install_live, staged, edits)
        except Exception as exc:  # the change is not running: the pass fails and is retried
            self._counters.record_failure(exc)
            log.warning("object=haproxy action=live lb=%s result=error error=%r", staged.lb_id, str(exc))
            raise
        if outcome == "live":
            self._counters.record_live_update()
        else:
            self._counters.record_outcome(outcome)
        log.info("object=haproxy action=%s lb=%s servers=%d", outcome, staged.lb_id, len(edits))
        return True

    def _install_live(self, staged: StagedChange, edits: list[ServerEdit]) -> str:
        """'live', or the outcome of the reload that took over when haproxy refused an edit."""
        self.paths.make_dirs()
        # A worker that may not run what the disk holds (an earlier reload is
        # still due) cannot be edited into what the new file says: reload.
        behind = self._reload_due or self._marker.exists()
        self._marker.touch()  # on disk, maybe not running yet: a restarted agent reloads
        try:
            sync_filesystem(self.paths.staging_dir)
            install_change(staged)
            if behind:
                raise LiveEditError("a reload of the files on disk is still due")
            self._live.apply(edits)
        except Exception as exc:  # a refused edit, the socket, or anything else half-way
            if not staged.text_installed:
                roll_back(staged)
                self._clear_marker()
                raise
            log.warning("object=haproxy action=live lb=%s result=error error=%r", staged.lb_id, str(exc))
            return self._reload_instead(staged, edited=getattr(exc, "edited", True))
        self._clear_marker()
        self._process_work.submit(discard, staged)
        return "live"

    def _reload_instead(self, staged: StagedChange, edited: bool) -> str:
        """The files on disk, all checked, put the worker right. If that reload fails
        too: with the worker untouched the old file goes back; with part of the
        edits in it the new file stays, and the supervisor retries the reload."""
        try:
            outcome = self.process.reload_or_start()
        except BaseException:
            if edited:
                self._reload_due = True  # the marker stays too: a restarted agent reloads
                discard(staged)
            else:
                roll_back(staged)
                self._clear_marker()
            raise
        self._worker_replaced()
        self._clear_marker()
        discard(staged)
        return outcome

    def _check_base(self, crt_base: Path) -> str:
        return render_base(self.paths.run_dir, self._prometheus_listen, crt_base=crt_base)

    def lb_ids_on_disk(self) -> set[str]:
        return self.paths.lb_ids_on_disk()

    # --- reloading batches ----------------------------------------------------------

    async def _reload_batch(self, batch: list[StagedChange]) -> float:
        """Install a batch and reload (the batcher's `commit`); the seconds the reload took."""
        loop = asyncio.get_running_loop()
        try:
            async with self._process_lock:
                started = loop.time()
                outcome = await self._process_work.run(self._install_and_reload, batch)
        except Exception as exc:
            self._counters.record_failure(exc)
            log.warning("object=haproxy action=reload lbs=%d result=error error=%r", len(batch), str(exc))
            raise
        took = loop.time() - started
        self._counters.last_reload_seconds = round(took, 3)
        self._counters.record_outcome(outcome)
        log.info("object=haproxy action=%s lbs=%d seconds=%.2f", outcome, len(batch), took)
        return took

    def _install_and_reload(self, batch: list[StagedChange]) -> str:
        self.paths.make_dirs()
        self._marker.touch()
        try:
            sync_filesystem(self.paths.staging_dir)  # every staged text durable before any rename
            for staged in batch:
                install_change(staged, sync_dir=False)
            fsync_dir(self.paths.conf_dir)
            # No `haproxy -c` of the whole directory first: every candidate was
            # checked with the base, names are unique by construction, and a
            # reload haproxy cannot load is reported (show proc counts it) and
            # put back below. With 1,000 load balancers that check parsed them
            # all once more, 0.3 s on every reload.
            outcome = self.process.reload_or_start()
        except BaseException:
            for staged in batch:
                roll_back(staged)
            self._clear_marker()
            raise
        self._clear_marker()
        self._worker_replaced()
        # The staging directories (with the previous files parked in them) go
        # after the batch's waiters hear of the reload, on this same thread
        # before its next job: removing fifty took 0.1 s in a cold start.
        self._process_work.submit(_discard_all, batch)
        return outcome

    def _check_and_reload(self) -> None:
        self._check_directory()
        self.process.reload()
        self._clear_marker()

    def _check_directory(self) -> None:
        try:
            self.process.check([self.paths.base_cfg, self.paths.conf_dir])
        except HaproxyCheckError as exc:
            raise HaproxyCheckError(exc.output, "configuration directory") from None

    def _clear_marker(self) -> None:
        self._marker.unlink(missing_ok=True)

    def _write_base(self) -> bool:
        """Write haproxy.cfg if its text changed; True if it did."""
        self.paths.make_dirs()
        text = render_base(self.paths.run_dir, self._prometheus_listen)
        if read_or_none(self.paths.base_cfg) == text:
            return False
        staged = write_staged(self.paths.staging_dir, text)
        try:
            self.process.check([staged])
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
        install(staged, self.paths.base_cfg)
        return True

    # --- loop-bound helpers --------------------------------------------------------

    def _ensure_loop_objects(self) -> None:
        # Created on first use, inside the running loop that will use them.
        if not self._loop_objects:
            self._loop_objects = True
            self._check_slots = asyncio.Semaphore(MAX_PARALLEL_CHECKS)
            self._bulk_checks = BulkChecker(lambda paths: self._lb_work.run(self.process.check, paths),
                                            self._check_slots)
            self._process_lock = asyncio.Lock()

    # --- observing -------------------------------------------------------------------

    def status(self) -> dict:
        return self._counters.status(self.process.pid, self._live.draining)

    async def server_states(self) -> dict[tuple[str, str], str]:
        """(backend name, server name) -> haproxy's status word ("UP", "DOWN", "MAINT", "no check", ...)."""
        try:
            text = await self._stats_work.run(send_command, self.paths.stats_sock, "show stat")
        except OSError as exc:
            raise HaproxyError(f"haproxy stats socket unavailable: {exc}") from exc
        return parse_show_stat(text)


def _discard_all(batch: list[StagedChange]) -> None:
    for staged in batch:
        discard(staged)  # the previous files are no longer needed


def _nothing() -> None:
    pass
