"""`Reloader`: files installed, then one reload that loads them.

- `reload_batch(batch)` is the reload batcher's `commit`: it installs a
  batch of checked changes and reloads once (a configuration haproxy cannot
  load shows as a failed reload). On failure the batch's files are put back
  as they were, so the running configuration and the disk agree again and
  one bad batch cannot block later reloads.
- `check_and_reload()` reloads the files on disk, checked as a whole: what
  an adopted master may not have loaded yet, or a reload a live edit left
  due. Blocking: callers run it on the process thread, under the process
  lock.
- `write_base()` writes haproxy.cfg, sized (`capacity`) from the load
  balancer files; the process calls it each time it joins them, before haproxy
  loads them, so a reload that adds or removes frontends carries a base file
  to match. `check_base(crt_base)` is the base file a candidate is checked with.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from lbagent.haproxy.accesslog import wants_access_log
from lbagent.haproxy.candidate import StagedChange, discard, install_change, roll_back
from lbagent.haproxy.capacity import demand, inherited_fd_limit, size
from lbagent.haproxy.errors import HaproxyCheckError
from lbagent.haproxy.files import (
    fsync_dir,
    install,
    make_jail,
    read_lb_files,
    read_or_none,
    sync_filesystem,
    write_staged,
)
from lbagent.haproxy.parts import Part, Shared, log
from lbagent.haproxy.render import render_base
from lbagent.haproxy.settings import HaproxySettings


class Reloader(Part):
    def __init__(self, shared: Shared, settings: HaproxySettings):
        super().__init__(shared)
        self._settings = settings
        self._process.before_load = self.write_base

    async def reload_batch(self, batch: list[StagedChange]) -> float:
        """Install a batch and reload (the batcher's `commit`); the seconds the reload took."""
        loop = asyncio.get_running_loop()
        try:
            async with self._work.process_lock:
                started = loop.time()
                outcome = await self._work.process_work.run(self._install_and_reload, batch)
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
        self._paths.make_dirs()
        self._worker.mark()
        try:
            sync_filesystem(self._paths.staging_dir)  # every staged text durable before any rename
            for staged in batch:
                install_change(staged, sync_dir=False)
            fsync_dir(self._paths.conf_dir)
            # No `haproxy -c` of the whole directory first: every candidate was
            # checked with the base, names are unique by construction, and a
            # reload haproxy cannot load is reported (show proc counts it) and
            # put back below. With 1,000 load balancers that check parsed them
            # all once more, 0.3 s on every reload.
            outcome = self._process.reload_or_start()
        except BaseException:
            for staged in batch:
                roll_back(staged)
            self._worker.clear_marker()
            raise
        self._worker.clear_marker()
        self._worker.replaced()
        # The staging directories (with the previous files parked in them) go
        # after the batch's waiters hear of the reload, on this same thread
        # before its next job: removing fifty took 0.1 s in a cold start.
        self._work.process_work.submit(_discard_all, batch)
        return outcome

    def check_and_reload(self) -> None:
        self._check_directory()
        self._process.reload()
        self._worker.clear_marker()

    def _check_directory(self) -> None:
        try:
            self._process.check([self._paths.base_cfg, self._paths.conf_dir])
        except HaproxyCheckError as exc:
            raise HaproxyCheckError(exc.output, "configuration directory") from None

    def write_base(self, joined: str | None = None) -> bool:
        """Write haproxy.cfg, sized for `joined` (default: the load balancer files on disk), if its
        text changed; True if it did."""
        self._paths.make_dirs()
        privileges = self._settings.privileges
        if privileges is not None and privileges.chroot is not None:
            make_jail(privileges.chroot)
        files_text = read_lb_files(self._paths) if joined is None else joined
        wants = demand(files_text)
        capacity = size(wants, self._settings.default_listener_maxconn, inherited_fd_limit(self._process.pid))
        text = render_base(
            self._paths.run_dir,
            self._settings.prometheus_listen,
            listener_maxconn=self._settings.default_listener_maxconn,
            capacity=capacity,
            privileges=privileges,
            access_log=wants_access_log(files_text),
        )
        if read_or_none(self._paths.base_cfg) == text:
            return False
        if capacity.capped:
            log.warning(
                "object=haproxy action=size frontends=%d checked_servers=%d maxconn=%d result=capped reason=%r",
                len(wants.frontend_limits),
                wants.checked_servers,
                capacity.maxconn,
                "the listeners' caps together exceed what the descriptor limit allows",
            )
        staged = write_staged(self._paths.staging_dir, text)
        try:
            self._process.check([staged])
        except BaseException:
            staged.unlink(missing_ok=True)
            raise
        install(staged, self._paths.base_cfg)
        return True

    def check_base(self, crt_base: Path) -> str:
        return render_base(
            self._paths.run_dir,
            self._settings.prometheus_listen,
            crt_base=crt_base,
            listener_maxconn=self._settings.default_listener_maxconn,
            privileges=self._settings.privileges,
        )


def _discard_all(batch: list[StagedChange]) -> None:
    for staged in batch:
        discard(staged)  # the previous files are no longer needed
