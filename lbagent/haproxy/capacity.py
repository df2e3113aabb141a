"""How many connections haproxy takes: per frontend, and for the whole process.

Every frontend of a listener has its own `maxconn`: the listener's
`connection_limit`, else the configured default (the base file's `defaults`
section), so a listener whose clients hold their connections open fills its
own slots and no other listener's. The process's `maxconn` is the sum over all
frontends with room for the admin ones (stats socket, Prometheus), and its
`ulimit-n` two descriptors per connection (client and server side), one per
listening socket, one per server with a health check (haproxy reserves one
socket for each: past about a thousand checked servers a limit without them
made every reload fail, which `haproxy -c` does not see) and room for the CLI. The load balancer files
joined into one are the only place where every frontend is seen together, so
the sum is read from them each time they are joined, before haproxy loads them.

haproxy cannot raise its descriptor limit above the hard limit it inherits
(without CAP_SYS_RESOURCE), so the process's figures are capped by that limit;
past it, listeners still have their own caps but may together ask for more
than the process has.
"""

from __future__ import annotations

import re
import resource
from dataclasses import dataclass

import psutil

# A listener without connection_limit takes at most this many connections at once.
DEFAULT_LISTENER_MAXCONN = 10_000
# The Prometheus frontend's own cap, and the connections the process keeps for
# it and for the stats socket (haproxy's default of 10 per socket) beyond the listeners.
PROMETHEUS_MAXCONN = 50
ADMIN_CONNECTIONS = 100
# Descriptors beyond two per connection, one per listener and one per checked
# server: the master's socket pair, the stats socket, files opened at start.
FD_HEADROOM = 1_000

# Section starts, maxconn lines and server lines with a check: all `demand` needs to
# look at (a regex skips the other lines in C, a few milliseconds for thousands of
# load balancers). A check's options follow the server's address (templates/macros.j2).
_SECTION_MAXCONN_OR_CHECK = re.compile(
    r"^(?:(frontend|backend|listen|defaults|global)\b|    maxconn ([0-9]+)$|    server [^\n]* (check)\b)",
    re.MULTILINE,
)


@dataclass(frozen=True)
class Capacity:
    """The global section's `maxconn` and `ulimit-n`; `capped` when the sum did not fit the descriptor limit."""

    maxconn: int
    ulimit_n: int
    capped: bool = False


@dataclass(frozen=True)
class Demand:
    """What rendered configuration asks of the process: each frontend's own `maxconn` (None
    where it has none) and how many servers are health-checked."""

    frontend_limits: list[int | None]
    checked_servers: int = 0


def demand(text: str) -> Demand:
    """The frontends' limits and the checked servers in rendered configuration text."""
    limits: list[int | None] = []
    checked = 0
    in_frontend = False
    for match in _SECTION_MAXCONN_OR_CHECK.finditer(text):
        section, maxconn, check = match.groups()
        if section is not None:
            in_frontend = section == "frontend"
            if in_frontend:
                limits.append(None)
        elif check is not None:
            checked += 1
        elif in_frontend:
            limits[-1] = int(maxconn)
    return Demand(limits, checked)


def size(wants: Demand, listener_default: int, fd_limit: int) -> Capacity:
    """The process's figures for what `wants` asks (a frontend's None limit: `listener_default`)."""
    limits = wants.frontend_limits
    wanted = sum(listener_default if limit is None else limit for limit in limits) + ADMIN_CONNECTIONS
    reserved = len(limits) + wants.checked_servers + FD_HEADROOM
    fitting = max((fd_limit - reserved) // 2, ADMIN_CONNECTIONS)
    maxconn = min(wanted, fitting)
    return Capacity(maxconn=maxconn, ulimit_n=min(2 * maxconn + reserved, fd_limit), capped=wanted > fitting)


def inherited_fd_limit(master_pid: int | None = None) -> int:
    """The hard descriptor limit haproxy may raise its own to: the one it inherits
    from this process, or a running master's if that is lower. A master adopted
    from an agent started with a lower limit keeps it, and haproxy fails a
    reload it cannot raise its limit for (`strict-limits`)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY:
        with open("/proc/sys/fs/nr_open", encoding="ascii") as f:
            hard = int(f.read())
    if master_pid is not None:
        try:
            master_hard = psutil.Process(master_pid).rlimit(psutil.RLIMIT_NOFILE)[1]
        except psutil.Error:  # gone meanwhile: the next master inherits ours
            return hard
        if master_hard != resource.RLIM_INFINITY:
            hard = min(hard, master_hard)
    return hard
