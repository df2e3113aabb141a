"""`Lifecycle`: the haproxy master started or adopted, supervised, stopped, and its files removed.

- `start` writes the base file if it changed and adopts the running master,
  or starts one. An adopted master reloads once if the base file changed or
  the marker says files on disk may not be loaded yet (see `worker`).
- `supervise_once` starts the master again, on the files on disk, if it is
  gone; while it runs, it retries a reload a half-applied live edit left
  due, or deletes the servers a live edit left draining once unconnected.
- Files on disk that keep haproxy from starting are removed (their load
  balancers re-apply them), so one file cannot keep all of them down.
"""

from __future__ import annotations

import asyncio

from lbagent.haproxy import templating
from lbagent.haproxy.errors import HaproxyError, HaproxyReloadError
from lbagent.haproxy.files import empty_dir, replace_text
from lbagent.haproxy.live import LiveEditError
from lbagent.haproxy.parts import Part, Shared, log
from lbagent.haproxy.reloads import Reloader


class Lifecycle(Part):
    def __init__(self, shared: Shared, reloader: Reloader):
        super().__init__(shared)
        self._reloader = reloader

    async def start(self) -> None:
        """Write the base file if it changed and adopt the running master, or start one."""
        self._paths.check_socket_paths()
        # Changes a previous agent staged but never installed: not live, and no longer wanted.
        await self._work.process_work.run(empty_dir, self._paths.staging_dir)
        base_changed = await self._work.process_work.run(self._reloader.write_base)
        await self._work.lb_work.run(templating.preload)
        async with self._work.process_lock:
            outcome = await self._work.process_work.run(self._adopt_or_start)
            self._counters.record_start(outcome)
            if outcome != "adopted":
                return
            if base_changed or await self._work.process_work.run(self._worker.marked):
                # Files the adopted master may not have loaded yet.
                try:
                    await self._work.process_work.run(self._reloader.check_and_reload)
                    self._counters.record_reload()
                except HaproxyError as exc:
                    self._counters.record_failure(exc)
                    if base_changed:
                        raise  # our own base file is refused: nothing will work
                    log.warning("object=haproxy action=reload result=error error=%r", str(exc))

    async def stop(self) -> bool:
        """Stop the master and its workers; False if none ran."""
        async with self._work.process_lock:
            return await self._work.process_work.run(self._process.stop)

    async def supervise_once(self) -> bool:
        """Start the master again, on the files on disk, if it is gone. True if it had to.
        Also deletes the servers a live edit left in maintenance, once unconnected."""
        if self._process.is_running():
            if self._worker.retry_due(asyncio.get_running_loop().time()):
                await self._reload_what_is_due()
            elif self._worker.live.draining:
                async with self._work.process_lock:
                    try:
                        await self._work.process_work.run(self._worker.live.retry)
                    except (LiveEditError, OSError) as exc:
                        log.debug("object=haproxy action=delete_servers result=error error=%r", str(exc))
            return False
        async with self._work.process_lock:
            try:
                outcome = await self._work.process_work.run(self._adopt_or_start)
            except HaproxyError as exc:
                self._counters.last_error = str(exc)
                raise
            if outcome != "adopted":
                self._worker.replaced()
        self._counters.record_start(outcome)
        if outcome != "adopted":
            log.warning("object=haproxy action=restart outcome=%s pid=%s", outcome, self._process.pid)
        return outcome != "adopted"

    async def _reload_what_is_due(self) -> None:
        """The reload a half-applied live edit needs (its own one failed): the files on disk."""
        async with self._work.process_lock:
            try:
                await self._work.process_work.run(self._reloader.check_and_reload)
            except HaproxyError as exc:
                self._counters.record_failure(exc)
                self._worker.retry_later(asyncio.get_running_loop().time())
                log.warning("object=haproxy action=reload result=error error=%r", str(exc))
                return
            self._worker.replaced()
        self._counters.record_reload()

    def _adopt_or_start(self) -> str:
        """'adopted', 'started', or 'started bare' when the files on disk kept haproxy from starting."""
        try:
            outcome = self._process.adopt_or_start()
        except HaproxyReloadError as exc:
            lb_ids = self._paths.lb_ids_on_disk()
            if not lb_ids:
                raise
            # Every file passed its checks, yet together they do not start (a
            # port taken meanwhile, say). Serving nothing until each load
            # balancer's next pass re-applies, and re-checks, its own file beats
            # one file keeping all of them down for good.
            log.error("object=haproxy action=start result=error error=%r removed=%s", str(exc), sorted(lb_ids))
            for lb_id in lb_ids:
                replace_text(self._paths.lb_file(lb_id), None, self._paths.staging_dir)
            self._process.start()
            self._counters.last_error = (
                f"haproxy did not start on the files on disk ({exc}); started without "
                f"them, their load balancers re-apply them: {', '.join(sorted(lb_ids))}"
            )
            outcome = "started bare"
        if outcome != "adopted":
            self._worker.clear_marker()  # a new master loaded whatever is on disk
        return outcome

    def remove_files(self) -> list[str]:
        """Remove every file of ours under <run_dir>/haproxy (after stop()); the removed paths."""
        directories = (self._paths.conf_dir, self._paths.staging_dir, self._paths.certs_dir)
        removed = [path for directory in directories for path in empty_dir(directory)]
        for path in (
            self._paths.base_cfg,
            self._paths.joined_cfg,
            self._paths.pidfile,
            self._worker.marker,
            self._worker.drains_file,
            self._paths.master_sock,
            self._paths.stats_sock,
        ):
            if path.exists() or path.is_symlink():
                path.unlink()
                removed.append(str(path))
        for directory in (*directories, self._paths.chroot_dir, self._paths.root):
            try:
                directory.rmdir()
            except OSError:
                pass  # gone already, or something not ours is in there: leave it
        return removed
