"""`read_small`: a small file of /proc or /sys, read in one system call.

open() in text mode costs about 57 µs on the development VM where os.open and
os.read take 10: the agent reads such files for every load balancer on every
resync (a namespace's iptables table names) and for every veth at each
garbage collection (its ifalias).
"""

from __future__ import annotations

import os

SMALL_FILE_SIZE = 4096  # a page: what the kernel hands out of such a file in one read


def read_small(path: str, size: int = SMALL_FILE_SIZE) -> str:
    """The file's text (its first `size` bytes); OSError as os.open and os.read raise it."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, size).decode(errors="replace")
    finally:
        os.close(fd)
