"""Network namespaces and the threads that work inside them.

setns() changes the namespace of the calling thread only, so namespace-bound
work runs on threads owned by a `NamespaceExecutor`: a call enters the target
namespace, runs, and always returns to the host namespace before the thread
takes the next job. A thread that cannot get back is never reused: the
process aborts rather than act on the wrong namespace (systemd restarts it
and the agent adopts what exists).

Which `lb-` namespaces are this agent's is proved by a mark, not by the name:
an empty file `/run/lbagent-netns/<host>/<namespace>` (`NamespaceMarks`),
written before the namespace is made. Why a file and there:
- it survives agent restarts and goes with a reboot, like the namespaces
  (/run is a tmpfs), and the agent's own run directory may be another path;
- one `listdir` reads the marks of thousands of namespaces, where a mark
  inside each namespace (its loopback's ifalias) would cost two setns() and a
  netlink request per namespace on every garbage-collection pass;
- not in /run/netns itself: `ip netns list` and `ip -all netns exec` take
  every entry there for a namespace;
- a directory per host, so two agents on one machine never claim each
  other's namespaces.
A mark left without its namespace (a create that failed) is dropped when the
inventory finds it; a load balancer still known re-marks its namespace on its
next pass, so a namespace made by an agent before marks existed is adopted
as soon as the state file's record of its load balancer converges it.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
from collections.abc import Callable
from typing import TypeVar

from pyroute2 import netns as pyroute_netns

from lbagent.ovnhost.errors import NamespaceError
from lbagent.support.blocking import BlockingPool

log = logging.getLogger(__name__)

NETNS_DIR = "/run/netns"
MARK_ROOT = "/run/lbagent-netns"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def netns_path(name: str) -> str:
    return os.path.join(NETNS_DIR, name)


def netns_exists(name: str) -> bool:
    # A bind-mounted nsfs file, not just a leftover empty file from an
    # interrupted create.
    return os.path.ismount(netns_path(name))


def list_netns(prefix: str = "") -> list[str]:
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix))


class NamespaceMarks:
    """The files that mark the namespaces one agent (its host) made."""

    def __init__(self, host: str, root: str = MARK_ROOT):
        self.dir = os.path.join(root, host) if host else ""  # no host: marks nothing, finds nothing

    def _path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def is_marked(self, name: str) -> bool:
        return bool(self.dir) and os.path.exists(self._path(name))

    def mark(self, name: str) -> bool:
        """Mark `name` as ours; True if the mark was missing (one stat otherwise)."""
        if not self.dir or self.is_marked(name):
            return False
        os.makedirs(self.dir, exist_ok=True)
        with open(self._path(name), "a"):
            pass
        return True

    def unmark(self, name: str) -> None:
        if self.dir:
            try:
                os.unlink(self._path(name))
            except FileNotFoundError:
                pass

    def marked(self) -> set[str]:
        if not self.dir:
            return set()
        try:
            return set(os.listdir(self.dir))
        except FileNotFoundError:
            return set()

    def remove_all(self) -> None:
        for name in self.marked():
            self.unmark(name)
        try:
            os.rmdir(self.dir)
        except OSError:  # absent, or someone else's file in it
            pass


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise NamespaceError(f"setns into {what}: {os.strerror(code)}")


class NamespaceExecutor:
    """A fixed set of threads that run callables inside named namespaces."""

    def __init__(self, name: str, workers: int = 1):
        # Opened on the constructing thread, which is in the host namespace.
        self._host_fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self._pool = BlockingPool(name, workers)

    async def run(self, netns: str | None, fn: Callable[..., T], *args) -> T:
        return await self._pool.run(self.call, netns, fn, *args)

    def call(self, netns: str | None, fn: Callable[..., T], *args) -> T:
        """Run fn inside netns (None: the host namespace) on the current thread."""
        if netns is None:
            return fn(*args)
        try:
            fd = os.open(netns_path(netns), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NamespaceError(f"namespace {netns} does not exist") from None
        try:
            _setns(fd, netns)
        finally:
            os.close(fd)
        try:
            return fn(*args)
        finally:
            self._return_home()

    def _return_home(self) -> None:
        try:
            _setns(self._host_fd, "the host namespace")
        except NamespaceError:
            log.critical("a namespace thread could not return to the host namespace; aborting")
            os.abort()

    async def create(self, name: str, inside: Callable[..., T] | None = None, *args) -> T | None:
        """Make the namespace; `inside(*args)`, if given, runs in it on the
        same thread before the thread goes home (no second setns)."""
        return await self._pool.run(self._create, name, inside, args)

    def _create(self, name: str, inside: Callable[..., T] | None, args: tuple) -> T | None:
        if os.path.exists(netns_path(name)) and not netns_exists(name):
            os.unlink(netns_path(name))  # stale file from an interrupted create
        if _libc.unshare(CLONE_NEWNET) != 0:
            raise NamespaceError(f"create namespace {name}: {os.strerror(ctypes.get_errno())}")
        try:
            try:
                # /proc/self would name the main thread's namespace; this thread's is new.
                pyroute_netns.attach(name, "thread-self")
            except OSError as exc:
                raise NamespaceError(f"create namespace {name}: {exc}") from exc
            return inside(*args) if inside is not None else None
        finally:
            self._return_home()

    async def delete(self, name: str) -> None:
        await self._pool.run(delete_netns, name)

    def shutdown(self) -> None:
        self._pool.shutdown()
        os.close(self._host_fd)


def delete_netns(name: str) -> None:
    path = netns_path(name)
    if _libc.umount2(path.encode(), 2) != 0:  # MNT_DETACH
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):
            raise NamespaceError(f"delete namespace {name}: {os.strerror(code)}")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def write_sysctl(path: str, value: str, read_first: bool = True) -> bool:
    """Set a sysctl in the calling thread's namespace; True if it changed (or,
    without `read_first`, was written)."""
    full = os.path.join("/proc/sys", path)
    if read_first:
        with open(full) as f:
            if f.read().strip() == value:
                return False
    with open(full, "w") as f:
        f.write(value)
    return True
