"""The on-disk layout under `<run_dir>/haproxy/` and how files there are replaced.

    haproxy.cfg        global + defaults (rendered from base.cfg.j2)
    conf.d/<lbid>.cfg  one load balancer each; haproxy loads the directory
    staging/           candidates being checked; same filesystem as conf.d so
                       that moving one into place is an atomic rename
    master.sock        master CLI (reload, show proc), mode 600
    stats.sock         runtime API of the current worker (show stat), mode 600
    haproxy.pid        the master's pid

Only this module knows the layout; everything else asks a `HaproxyPaths`.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lbagent.haproxy.errors import HaproxyError

_LB_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
LB_SUFFIX = ".cfg"
# haproxy binds a UNIX socket as "<path>.<pid>.tmp" first and sun_path holds
# 107 characters: longer paths fail at start with a cryptic message.
MAX_SOCKET_PATH = 95


@dataclass(frozen=True)
class HaproxyPaths:
    run_dir: Path

    def __post_init__(self) -> None:
        # The master daemonizes into "/": a relative path would mean another file there.
        object.__setattr__(self, "run_dir", Path(self.run_dir).absolute())

    @property
    def root(self) -> Path:
        return Path(self.run_dir) / "haproxy"

    @property
    def base_cfg(self) -> Path:
        return self.root / "haproxy.cfg"

    @property
    def conf_dir(self) -> Path:
        return self.root / "conf.d"

    @property
    def staging_dir(self) -> Path:
        return self.root / "staging"

    @property
    def master_sock(self) -> Path:
        return self.root / "master.sock"

    @property
    def stats_sock(self) -> Path:
        return self.root / "stats.sock"

    @property
    def pidfile(self) -> Path:
        return self.root / "haproxy.pid"

    def lb_file(self, lb_id: str) -> Path:
        # The id becomes a file name: refuse anything that could leave conf.d.
        if not _LB_ID_RE.fullmatch(lb_id):
            raise HaproxyError(f"not a load balancer id usable as a file name: {lb_id!r}")
        return self.conf_dir / f"{lb_id}{LB_SUFFIX}"

    def check_socket_paths(self) -> None:
        for path in (self.master_sock, self.stats_sock):
            if len(str(path)) > MAX_SOCKET_PATH:
                raise HaproxyError(f"run_dir too long: {path} exceeds {MAX_SOCKET_PATH} characters (UNIX socket limit)")

    def make_dirs(self) -> None:
        for directory in (self.root, self.conf_dir, self.staging_dir):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def lb_ids_on_disk(self) -> set[str]:
        try:
            names = os.listdir(self.conf_dir)
        except FileNotFoundError:
            return set()
        return {
            name[: -len(LB_SUFFIX)]
            for name in names
            if name.endswith(LB_SUFFIX) and _LB_ID_RE.fullmatch(name[: -len(LB_SUFFIX)])
        }


def read_or_none(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def write_staged(directory: Path, text: str) -> Path:
    """A new fsynced file in `directory` holding `text`, ready to be renamed into place."""
    fd, name = tempfile.mkstemp(dir=directory, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        os.unlink(name)
        raise
    return Path(name)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install(staged: Path, target: Path) -> None:
    """Atomically replace `target` by the already-fsynced `staged` file."""
    os.replace(staged, target)
    fsync_dir(target.parent)


def replace_text(path: Path, text: str | None, staging_dir: Path) -> None:
    """Make `path` hold `text` (None: not exist), atomically; a reader sees old or new, never half."""
    if text is None:
        try:
            path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(path.parent)
        return
    install(write_staged(staging_dir, text), path)
