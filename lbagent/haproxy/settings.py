"""What the agent's configuration tells haproxy beyond its files: the [haproxy] keys the base file carries.

`HaproxySettings` is handed to `HaproxyManager` (built from the TOML file by
`lbagent.config`); its defaults keep haproxy as a bare test harness wants it:
workers as root, no chroot, the default per-listener connection cap.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lbagent.haproxy.capacity import DEFAULT_LISTENER_MAXCONN


@dataclass(frozen=True)
class Privileges:
    """Whom haproxy's workers run as, and where they are jailed; the master stays root.

    The master reads every file (certificates included) and binds every socket
    before it forks, so a worker needs neither root nor anything in its chroot.
    """

    user: str
    group: str
    chroot: Path | None  # an empty directory, root's, 0755; None: no chroot


@dataclass(frozen=True)
class HaproxySettings:
    prometheus_listen: str = ""  # "" is off
    default_listener_maxconn: int = DEFAULT_LISTENER_MAXCONN
    privileges: Privileges | None = None  # None: workers keep the master's root
