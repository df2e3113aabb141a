"""`LiveApplier`: a checked server-only change installed and made live with no reload.

A change confined to server lines of existing backends (a backend added,
removed or reweighted) skips the reload batch: its file is installed and the
running worker is edited through the master CLI (`live`). If haproxy refuses
an edit, a reload of the files on disk follows at once; if that reload fails
too, what is left depends on whether the worker was touched (see
`_reload_instead`).
"""

from __future__ import annotations

from lbagent.haproxy.candidate import StagedChange, discard, install_change, roll_back
from lbagent.haproxy.files import sync_filesystem
from lbagent.haproxy.live import LiveEditError, ServerEdit
from lbagent.haproxy.parts import Part, log


class LiveApplier(Part):
    async def apply(self, staged: StagedChange, edits: list[ServerEdit]) -> bool:
        """Install a checked server-only change and edit the running worker to match."""
        try:
            async with self._work.process_lock:
                outcome = await self._work.process_work.run(self._install_live, staged, edits)
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
        self._paths.make_dirs()
        # A worker that may not run what the disk holds (an earlier reload is
        # still due) cannot be edited into what the new file says: reload.
        behind = self._worker.behind()
        self._worker.mark()  # on disk, maybe not running yet: a restarted agent reloads
        try:
            sync_filesystem(self._paths.staging_dir)
            install_change(staged)
            if behind:
                raise LiveEditError("a reload of the files on disk is still due")
            self._worker.live.apply(edits)
        except Exception as exc:  # a refused edit, the socket, or anything else half-way
            if not staged.text_installed:
                roll_back(staged)
                self._worker.clear_marker()
                raise
            log.warning("object=haproxy action=live lb=%s result=error error=%r", staged.lb_id, str(exc))
            return self._reload_instead(staged, edited=getattr(exc, "edited", True))
        self._worker.clear_marker()
        self._work.process_work.submit(discard, staged)
        return "live"

    def _reload_instead(self, staged: StagedChange, edited: bool) -> str:
        """The files on disk, all checked, put the worker right. If that reload fails
        too: with the worker untouched the old file goes back; with part of the
        edits in it the new file stays, and supervision retries the reload."""
        try:
            outcome = self._process.reload_or_start()
        except BaseException:
            if edited:
                self._worker.reload_due = True  # the marker stays too: a restarted agent reloads
                discard(staged)
            else:
                roll_back(staged)
                self._worker.clear_marker()
            raise
        self._worker.replaced()
        self._worker.clear_marker()
        discard(staged)
        return outcome
