"""The agent's persisted state: the last accepted desired state and every allocation.

Written atomically (temporary file, fsync, rename, fsync of the directory) so
a crash leaves either the old or the new file, never a torn one. The temporary
file gets a fresh unpredictable name (mkstemp: created exclusively, 0600), so
nothing planted in the directory beforehand is followed or kept. A file that
does not parse, or is not ours, raises `StateFileError`; the agent reports it
and starts from what it finds on the host instead of crashing.

Also owns the rule for the directories the agent keeps to itself (the state
and run directories): `private_dir` makes them, or tightens them to 0700.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from lbagent.errors import LbAgentError
from lbagent.metrics import STATE_WRITES

log = logging.getLogger(__name__)

FORMAT = "lbagent-state"
VERSION = 1
PRIVATE_DIR_MODE = 0o700


class StateFileError(LbAgentError):
    """The state file does not parse, is not ours, or cannot be written."""


@dataclass(frozen=True, slots=True)
class Allocation:
    # Frozen: allocations are replaced, never changed in place, which the
    # worker's memo and the kept `json_text` rely on.
    inner: str
    outer: str
    salt: int = 0
    ports: dict[str, int] = field(default_factory=dict)
    # The IPv6 pair (from [agent] inner_prefix6); None in files written before
    # there was one, until the next allocation gives it.
    inner6: str | None = None
    outer6: str | None = None
    # `to_json()` encoded, once per allocation (the state file and the worker's fingerprints use it).
    json_text: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "json_text", json.dumps(self.to_json(), separators=(",", ":")))

    def to_json(self) -> dict:
        data = {"inner": self.inner, "outer": self.outer, "salt": self.salt, "ports": dict(self.ports)}
        if self.inner6 is not None:
            data.update(inner6=self.inner6, outer6=self.outer6)
        return data

    @classmethod
    def from_json(cls, data: dict) -> Allocation:
        ports = data.get("ports", {})
        if not isinstance(ports, dict) or not all(isinstance(p, int) for p in ports.values()):
            raise StateFileError("allocation ports must map keys to integers")
        inner6, outer6 = data.get("inner6"), data.get("outer6")
        if (inner6 is None) != (outer6 is None) or not all(_ipv6_or_none(a) for a in (inner6, outer6)):
            raise StateFileError("an allocation's inner6 and outer6 must be two IPv6 addresses or both absent")
        return cls(str(data["inner"]), str(data["outer"]), int(data.get("salt", 0)), dict(ports), inner6, outer6)


def _ipv6_or_none(value: object) -> bool:
    if value is None:
        return True
    try:
        ipaddress.IPv6Address(value if isinstance(value, str) else "")
    except ValueError:
        return False
    return True


@dataclass
class PersistedState:
    desired: dict | None = None  # the raw body of the last accepted refresh
    allocations: dict[str, Allocation] = field(default_factory=dict)
    # The JSON text of the body, which stands for `desired` when given: saved as
    # it came rather than encoded again (600 kB for a thousand load balancers),
    # and all the agent keeps of the body once it is accepted (decoded, the
    # same body is 3 MB of dicts, lists and strings).
    desired_text: str | None = field(default=None, compare=False, repr=False)


def desired_json(desired: dict | None) -> str:
    """The JSON text the state file keeps for a body that came without one (not UTF-8, say)."""
    return json.dumps(desired, separators=(",", ":"))


def private_dir(path: Path) -> None:
    """Make `path` a directory only its owner may enter, tightening one that
    exists with a looser mode (and saying so: someone else made it, or changed it)."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & ~PRIVATE_DIR_MODE:
        os.chmod(path, PRIVATE_DIR_MODE)
        log.warning("action=tighten_dir path=%s mode=%o new_mode=%o", path, mode, PRIVATE_DIR_MODE)


class StateStore:
    def __init__(self, state_dir: Path):
        self.path = Path(state_dir) / "state.json"

    def prepare(self) -> None:
        """Make the state directory private, and drop what is at the temporary
        name earlier versions used (a symlink is removed, not followed)."""
        private_dir(self.path.parent)
        try:
            os.unlink(self.path.with_name(f".{self.path.name}.tmp"))
        except FileNotFoundError:
            pass

    def load(self) -> PersistedState:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return PersistedState()
        try:
            data = json.loads(raw)
            if not isinstance(data, dict) or data.get("format") != FORMAT:
                raise StateFileError(f"{self.path} is not an lbagent state file")
            if data.get("version") != VERSION:
                raise StateFileError(f"{self.path} has unsupported version {data.get('version')!r}")
            allocations = {str(k): Allocation.from_json(v) for k, v in data.get("allocations", {}).items()}
            desired = data.get("desired")
            if desired is not None and not isinstance(desired, dict):
                raise StateFileError(f"{self.path}: desired state is not an object")
            return PersistedState(desired, allocations)
        except StateFileError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StateFileError(f"{self.path} is corrupt: {exc}") from exc

    def quarantine(self) -> Path | None:
        """Move a bad file aside (kept for the operator), so the next save starts clean."""
        if not self.path.exists():
            return None
        target = self.path.with_name(f"{self.path.name}.bad-{int(time.time())}")
        os.replace(self.path, target)
        return target

    def _encode(self, state: PersistedState) -> bytes:
        """The file's JSON: {"format", "version", "desired", "allocations"}, assembled
        from texts already at hand where there are some (one POST of a thousand
        load balancers re-encoded all of them, 10-20 ms, before its 202)."""
        desired = state.desired_text if state.desired_text is not None else desired_json(state.desired)
        allocations = ",".join(
            f"{json.dumps(lb_id)}:{allocation.json_text}" for lb_id, allocation in sorted(state.allocations.items())
        )
        return (
            f'{{"format":{json.dumps(FORMAT)},"version":{VERSION},"desired":{desired},"allocations":{{{allocations}}}}}'
        ).encode()

    def save(self, state: PersistedState) -> None:
        data = self._encode(state)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR_MODE)
        fd, tmp_name = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        STATE_WRITES.inc()


def ipv6_addresses(vip6: str | None, allocation: Allocation | None) -> dict[str, str | None]:
    """Status's `vip6`, `inner6` and `outer6` of a load balancer: the pair only with the VIP it serves."""
    served = vip6 is not None and allocation is not None
    return {
        "vip6": vip6,
        "inner6": allocation.inner6 if served and allocation else None,
        "outer6": allocation.outer6 if served and allocation else None,
    }
