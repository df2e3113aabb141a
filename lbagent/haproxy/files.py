"""The on-disk layout under `<run_dir>/haproxy/` and how files there are replaced.

    haproxy.cfg        global + defaults (rendered from base.cfg.j2)
    conf.d/<lbid>.cfg  one load balancer each: what the agent stages, checks
                       and installs
    loadbalancers.cfg  conf.d/ joined into one file, written before haproxy
                       starts or reloads: what the master loads. The master
                       re-executes itself on every reload with the list of its
                       files in one environment variable (HAPROXY_CFGFILES),
                       which the kernel caps at 128 KiB; a directory of one
                       file per load balancer passed that near 2,000 of them
                       and every reload failed. Two files never do.
    certs/<lbid>/      that load balancer's own files (certificates with their
                       keys), directories 0700, files 0600; haproxy finds them
                       through `crt-base certs/`, so a file refers to them by
                       paths relative to certs/
    staging/           candidates being checked; same filesystem as conf.d and
                       certs/ so that moving one into place is an atomic rename
    chroot/            the workers' root when [haproxy] chroot is left at its
                       default: empty, root's, 0755
    master.sock        master CLI (reload, show proc), mode 600
    stats.sock         runtime API of the current worker (show stat), mode 600
    haproxy.pid        the master's pid

Only this module knows the layout; everything else asks a `HaproxyPaths`.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from lbagent.haproxy.errors import HaproxyError

_LB_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# One component of a load balancer file's relative path: no '/', no leading
# dot (so never '.', '..' or a hidden file), a length any filesystem takes.
_FILE_PART_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}")
MAX_FILE_DEPTH = 2
LB_SUFFIX = ".cfg"
# haproxy binds a UNIX socket as "<path>.<pid>.tmp" first and sun_path holds
# 107 characters: longer paths fail at start with a cryptic message.
MAX_SOCKET_PATH = 95

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class HaproxyPaths:
    run_dir: Path

    def __post_init__(self) -> None:
        # The master daemonizes into "/": a relative path would mean another file there.
        object.__setattr__(self, "run_dir", Path(self.run_dir).absolute())

    # Worked out once: a resync's look stamps every load balancer's files, and
    # building these paths anew each time was a tenth of the look.
    @functools.cached_property
    def root(self) -> Path:
        return Path(self.run_dir) / "haproxy"

    @property
    def base_cfg(self) -> Path:
        return self.root / "haproxy.cfg"

    @functools.cached_property
    def conf_dir(self) -> Path:
        return self.root / "conf.d"

    @property
    def joined_cfg(self) -> Path:
        return self.root / "loadbalancers.cfg"

    @functools.cached_property
    def certs_dir(self) -> Path:
        return self.root / "certs"

    @property
    def staging_dir(self) -> Path:
        return self.root / "staging"

    @property
    def chroot_dir(self) -> Path:
        return self.root / "chroot"

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

    def lb_files_dir(self, lb_id: str) -> Path:
        self.lb_file(lb_id)  # the same check of the id
        return self.certs_dir / lb_id

    def check_socket_paths(self) -> None:
        for path in (self.master_sock, self.stats_sock):
            if len(str(path)) > MAX_SOCKET_PATH:
                raise HaproxyError(f"run_dir too long: {path} exceeds {MAX_SOCKET_PATH} characters (UNIX socket limit)")

    def make_dirs(self) -> None:
        for directory in (self.root, self.conf_dir, self.certs_dir, self.staging_dir):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)

    def lb_ids_on_disk(self) -> set[str]:
        """Load balancers with a config file or a files directory here."""
        configs = {name[: -len(LB_SUFFIX)] for name in _listdir(self.conf_dir) if name.endswith(LB_SUFFIX)}
        with_files = {name for name in _listdir(self.certs_dir) if (self.certs_dir / name).is_dir()}
        return {lb_id for lb_id in configs | with_files if _LB_ID_RE.fullmatch(lb_id)}


def _listdir(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


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


def read_lb_files(paths: HaproxyPaths) -> str:
    """conf.d/*.cfg joined, in haproxy's own order for a directory (by name)."""
    names = sorted(name for name in _listdir(paths.conf_dir) if name.endswith(LB_SUFFIX))
    parts = []
    for name in names:
        try:
            parts.append((paths.conf_dir / name).read_text(encoding="utf-8"))
        except FileNotFoundError:  # removed since the listing: it is not wanted
            continue
    return "\n".join(parts)


def join_lb_files(paths: HaproxyPaths) -> str:
    """Write loadbalancers.cfg anew from conf.d/*.cfg, atomically and durably; its text."""
    joined = read_lb_files(paths)
    install(write_staged(paths.staging_dir, joined), paths.joined_cfg)
    return joined


def make_jail(directory: Path) -> None:
    """`directory` exists as a chroot for haproxy's workers: root's and 0755 (nothing in it is needed)."""
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    status = directory.stat()
    if (status.st_uid, status.st_gid) != (0, 0):
        os.chown(directory, 0, 0)
    if status.st_mode & 0o7777 != 0o755:
        directory.chmod(0o755)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install(staged: Path, target: Path, sync_dir: bool = True) -> None:
    """Atomically replace `target` by the already-durable `staged` file (without
    `sync_dir`, the caller fsyncs the directory once for many renames)."""
    os.replace(staged, target)
    if sync_dir:
        fsync_dir(target.parent)


def sync_filesystem(path: Path) -> None:
    """Flush every written file of the filesystem holding `path` (syncfs): one
    call makes a whole batch of staged files durable before they are renamed."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


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


# --- a load balancer's files: a directory replaced as a whole ------------------------


def check_file_name(name: str) -> None:
    """Refuse a relative file path that could leave its directory or hide in it."""
    parts = name.split("/")
    if len(parts) > MAX_FILE_DEPTH or not all(_FILE_PART_RE.fullmatch(part) for part in parts):
        raise HaproxyError(f"not a file name usable under a load balancer's directory: {name!r}")


def read_tree(directory: Path) -> dict[str, bytes]:
    """Relative path -> content of every regular file below `directory` ({} if it does not exist)."""
    found: dict[str, bytes] = {}
    if not directory.is_dir():
        return found
    for path in sorted(directory.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            continue
        # Anything but a regular file (a symlink, say) is not ours: reading it
        # as empty makes the tree differ, so the next apply replaces it.
        regular = path.is_file() and not path.is_symlink()
        found[path.relative_to(directory).as_posix()] = path.read_bytes() if regular else b""
    return found


def disk_stamp(paths: HaproxyPaths, lb_id: str) -> bytes:
    """What changes whenever the load balancer's configuration or files on disk
    do, without reading them: inode, type, size and times of each (a file is
    replaced by a rename, which makes a new inode). A resync compares it with
    what it was when a pass last found the disk as wanted."""
    stamps = [_stat_of(paths.lb_file(lb_id))]
    for root, directories, names in os.walk(paths.lb_files_dir(lb_id)):
        directories.sort()
        stamps += [f"{root}/{name}:{_stat_of(Path(root, name))}" for name in sorted(names + directories)]
    return "\n".join(stamps).encode()


def _stat_of(path: Path) -> str:
    """The file itself and, for a symlink (which a pass reads through), what it points to."""
    try:
        own = os.lstat(path)
    except FileNotFoundError:
        return "absent"
    if not stat.S_ISLNK(own.st_mode):
        return _stamp(own)
    try:
        return f"{_stamp(own)} -> {_stamp(os.stat(path))}"
    except FileNotFoundError:
        return f"{_stamp(own)} -> absent"


def _stamp(seen: os.stat_result) -> str:
    return f"{seen.st_ino} {seen.st_mode} {seen.st_size} {seen.st_mtime_ns} {seen.st_ctime_ns}"


def write_tree(directory: Path, files: Mapping[str, bytes]) -> None:
    """Create `directory` (0700) holding `files` (0600 each, fsynced); it must not exist yet."""
    for name in files:
        check_file_name(name)
    directory.mkdir(mode=0o700)
    directories = {directory}
    for name, content in sorted(files.items()):
        path = directory / name
        if path.parent not in directories:
            path.parent.mkdir(mode=0o700)
            directories.add(path.parent)
        # Created 0600 from the start: a key is never readable by others, not even for a moment.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
    for written in directories:
        fsync_dir(written)


def swap_tree(new: Path | None, live: Path, park: Path) -> bool:
    """Make `live` be the directory `new` (None: no directory), by renames on one filesystem.

    The directory that was live is moved to `park` (which must not exist);
    True if there was one. `restore_tree` undoes it.
    """
    had = live.is_dir()
    if had:
        os.replace(live, park)
    if new is not None:
        os.replace(new, live)
    fsync_dir(live.parent)
    return had


def restore_tree(live: Path, park: Path, had: bool) -> None:
    """Undo `swap_tree`: `live` becomes what was parked (or nothing)."""
    if live.is_dir():
        shutil.rmtree(live)
    if had:
        os.replace(park, live)
    fsync_dir(live.parent)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def empty_dir(directory: Path) -> list[str]:
    """Remove everything in `directory` (files, links, whole subdirectories); the removed paths."""
    removed: list[str] = []
    if not directory.is_dir():
        return removed
    for entry in sorted(directory.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            remove_tree(entry)
        else:
            entry.unlink(missing_ok=True)
        removed.append(str(entry))
    return removed
