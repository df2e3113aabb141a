"""One load balancer's change on its way to haproxy: staged, checked, installed, then kept or put back.

A change is the load balancer's config text and its files (certificates with
their keys). Both are staged in a private directory under `staging/`:

    staging/.change-XXXX/
        haproxy.cfg       the base file, its crt-base pointing at certs/ below
        candidate.cfg     the new text
        certs/<lb id>/    the new files (0700 directories, 0600 files)
        previous/         the files directory that was live (during a batch)

so `haproxy -c` can check the candidate with exactly the files it names
before anything live changes. Installing swaps the files directory and
renames the text into conf.d/; until the batch has reloaded, what was there
before is kept (the text in memory, the directory parked), so a failed batch
can put everything back. Every function here blocks: callers on the event
loop use a worker thread.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lbagent.haproxy.errors import HaproxyError
from lbagent.haproxy.files import (
    HaproxyPaths,
    check_file_name,
    install,
    read_or_none,
    read_tree,
    remove_tree,
    replace_text,
    restore_tree,
    swap_tree,
    write_tree,
)

CHECK_BASE = "haproxy.cfg"
CANDIDATE = "candidate.cfg"
STAGED_FILES = "certs"
PARKED = "previous"


@dataclass
class StagedChange:
    lb_id: str
    target: Path  # conf.d/<lb id>.cfg
    files_dir: Path  # certs/<lb id>
    work: Path  # the private staging directory
    text: str | None  # None: remove the config file
    has_files: bool
    previous_text: str | None  # what the config file held, to put back
    files_swapped: bool = False
    text_installed: bool = False
    had_files: bool = field(default=False, repr=False)

    @property
    def check_paths(self) -> list[Path]:
        """What `haproxy -c` reads for this change: the staged base, then the candidate."""
        return [self.work / CHECK_BASE, self.work / CANDIDATE]

    @property
    def staged_text(self) -> Path:
        return self.work / CANDIDATE

    def hide_paths(self, output: str) -> str:
        """haproxy's words with the staging paths replaced by what they stand for."""
        output = output.replace(str(self.work / STAGED_FILES), "<certificates>")
        return output.replace(str(self.staged_text), f"<candidate for {self.lb_id}>")


def current(paths: HaproxyPaths, lb_id: str) -> tuple[str | None, dict[str, bytes]]:
    """The load balancer's config text (None: no file) and files as they are on disk."""
    return read_or_none(paths.lb_file(lb_id)), read_tree(paths.lb_files_dir(lb_id))


def stage(
    paths: HaproxyPaths,
    lb_id: str,
    text: str | None,
    files: Mapping[str, bytes],
    base_for: Callable[[Path], str],
    previous_text: str | None,
) -> StagedChange:
    """Write the change into a new private staging directory; `base_for(crt_base)` renders the base file."""
    for name in files:
        check_file_name(name)
    if text is None and files:
        raise HaproxyError("files without a configuration that uses them")
    paths.make_dirs()
    work = Path(tempfile.mkdtemp(dir=paths.staging_dir, prefix=".change-"))
    change = StagedChange(
        lb_id, paths.lb_file(lb_id), paths.lb_files_dir(lb_id), work, text, bool(files), previous_text
    )
    try:
        staged_files = work / STAGED_FILES
        staged_files.mkdir(mode=0o700)
        if files:
            write_tree(staged_files / lb_id, files)
        if text is not None:
            # Not fsynced here: the manager syncs the filesystem once for a
            # whole batch before installing it, and the base is never installed.
            _write(work / CHECK_BASE, base_for(staged_files))
            _write(change.staged_text, text)
    except BaseException:
        remove_tree(work)
        raise
    return change


def install_change(change: StagedChange, sync_dir: bool = True) -> None:
    """Make the change live on disk (haproxy reads it at the next reload). Its
    staged text must be durable already (`sync_filesystem`); without
    `sync_dir` the caller fsyncs conf.d once for the batch."""
    staged_files = change.work / STAGED_FILES / change.lb_id if change.has_files else None
    change.had_files = swap_tree(staged_files, change.files_dir, change.work / PARKED)
    change.files_swapped = True
    if change.text is None:
        replace_text(change.target, None, change.work)
    else:
        install(change.staged_text, change.target, sync_dir)
    change.text_installed = True


def roll_back(change: StagedChange) -> None:
    """Put back what was live before `install_change` (whatever part of it ran), then discard."""
    if change.text_installed:
        replace_text(change.target, change.previous_text, change.work)
    if change.files_swapped:
        restore_tree(change.files_dir, change.work / PARKED, change.had_files)
    discard(change)


def discard(change: StagedChange) -> None:
    """Forget the staging directory (and with it a parked previous directory)."""
    remove_tree(change.work)


def _write(path: Path, text: str) -> None:
    """A new file holding `text`, mode 0600 like every file of ours."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
