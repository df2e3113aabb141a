"""`Changes`: a load balancer's change prepared (staged and checked), then queued or dropped.

- `prepare(lb_id, text, files)` returns None when the load balancer's file
  already holds `text` and its directory exactly `files` (certificates and
  keys, see `candidate`). Otherwise it checks the candidate with its files
  alone with the base file, so a bad load balancer is refused before it can
  disturb the others.
- `queue` hands a prepared change on: a server-only change to the running
  worker (`liveapply`), any other to the next reload batch (`batching`,
  committed by `reloads`). `drop` forgets a prepared change instead.
- From `prepare` until the change's reload is over, or it is dropped, the
  load balancer's next change waits (`locks`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from lbagent.haproxy.batching import ReloadBatcher
from lbagent.haproxy.bulkcheck import BulkChecker
from lbagent.haproxy.candidate import StagedChange, current, discard, stage
from lbagent.haproxy.errors import HaproxyCheckError
from lbagent.haproxy.live import ServerEdit, plan_server_edits
from lbagent.haproxy.liveapply import LiveApplier
from lbagent.haproxy.locks import LockMap
from lbagent.haproxy.parts import Part, Shared


@dataclass(frozen=True, eq=False)
class PreparedChange:
    """A load balancer's change, staged and checked, not yet live (see `HaproxyManager.prepare`)."""

    staged: StagedChange
    edits: list[ServerEdit] | None  # the running worker takes it as these server edits; None: a reload


class Changes(Part):
    def __init__(
        self,
        shared: Shared,
        locks: LockMap,
        batches: ReloadBatcher[StagedChange],
        live: LiveApplier,
        check_base: Callable[[Path], str],
    ):
        super().__init__(shared)
        self._locks = locks
        self._batches = batches
        self._live = live
        self._check_base = check_base  # the base file a candidate is checked with, for its crt-base
        self._bulk_checks: BulkChecker | None = None

    async def submit(
        self, lb_id: str, text: str | None, files: Mapping[str, bytes] | None = None
    ) -> asyncio.Future | None:
        """`prepare`, then `queue`, as one check in flight for the batcher (see `HaproxyManager.submit`)."""
        # The batcher waits for a change being checked: it joins the batch at once.
        with self._batches.checking():
            prepared = await self.prepare(lb_id, text, files)
            return None if prepared is None else self.queue(prepared)

    async def prepare(
        self, lb_id: str, text: str | None, files: Mapping[str, bytes] | None = None
    ) -> PreparedChange | None:
        """The change staged and checked, holding its load balancer's lock (see `HaproxyManager.prepare`)."""
        files = dict(files or {})
        self._paths.lb_file(lb_id)  # refuses an id that is no file name, before any I/O
        await self._locks.acquire(lb_id)
        try:
            previous_text, previous_files = await self._work.lb_work.run(current, self._paths, lb_id)
            if (previous_text, previous_files) == (text, files):
                self._locks.release(lb_id)
                return None
            edits = None
            if previous_text is not None and text is not None and previous_files == files:
                edits = plan_server_edits(previous_text, text)
            staged = await self._checked_candidate(lb_id, text, files, previous_text)
        except BaseException:
            self._locks.release(lb_id)
            raise
        return PreparedChange(staged, edits)

    def queue(self, prepared: PreparedChange) -> asyncio.Future:
        """To the running worker or the next reload batch (see `HaproxyManager.queue`)."""
        done: asyncio.Future
        if prepared.edits is not None:
            done = asyncio.ensure_future(self._live.apply(prepared.staged, prepared.edits))
        else:
            done = self._batches.add(prepared.staged)
        done.add_done_callback(lambda _: self._locks.release(prepared.staged.lb_id))
        return done

    async def drop(self, prepared: PreparedChange) -> None:
        """The staged files go and the load balancer's lock is released (see `HaproxyManager.drop`)."""
        try:
            await self._work.lb_work.run(discard, prepared.staged)
        finally:
            self._locks.release(prepared.staged.lb_id)

    async def _checked_candidate(
        self, lb_id: str, text: str | None, files: dict[str, bytes], previous_text: str | None
    ) -> StagedChange:
        """The change staged with its files, and accepted by haproxy next to the base file."""
        staged = await self._work.lb_work.run(stage, self._paths, lb_id, text, files, self._check_base, previous_text)
        if text is None:
            return staged  # a removal needs no check
        try:
            if files:
                async with self._work.check_slots:
                    await self._work.lb_work.run(self._process.check, staged.check_paths)
            else:
                await self._bulk_checker().check(staged)
        except BaseException as exc:
            await self._work.lb_work.run(discard, staged)
            if isinstance(exc, HaproxyCheckError):
                # Name the load balancer, not the temporary files haproxy saw.
                raise HaproxyCheckError(
                    staged.hide_paths(exc.output), f"configuration of load balancer {lb_id}"
                ) from None
            raise
        return staged

    def _bulk_checker(self) -> BulkChecker:
        """Made on first use; it shares `check_slots` with the checks of candidates with files."""
        if self._bulk_checks is None:
            self._bulk_checks = BulkChecker(
                lambda paths: self._work.lb_work.run(self._process.check, paths), self._work.check_slots
            )
        return self._bulk_checks
