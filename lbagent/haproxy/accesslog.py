"""Access logs of listeners with `access_log`: haproxy writes them to a socket the agent reads.

haproxy's global `log` line (present while a frontend logs) sends to a UDP socket of the agent's on a
loopback address of its own (`log_address`), at level info only, so nothing
but access lines come (haproxy's own notices and alerts are of other levels). A frontend with
`access_log` says `log global` and the `log-format` of `log_format`: `LINE_TAG`
and `key=value` fields, its frontend name, then per request (http, https) or
per connection once it ends (tcp) what `HTTP_FIELDS` or `TCP_FIELDS` list, and
last the listener's `access_log_rate`.

`AccessLogReader` turns each line into one record of the agent's log
(`logger lbagent.access`, `object=access lb=<id> listener=<id> ...`), so the
agent's `log_format` applies to it, and caps each listener at its rate (its
`admit` caps the conntrack flow lines of udp and tcp listeners too): lines
beyond it are dropped and counted in the `dropped` field of the next line let
through. Only known fields are copied, each re-quoted, so that nothing a client
sent can pose as another field.

Why UDP on loopback rather than a UNIX socket: haproxy's workers resolve a
socket path at every line, inside their chroot, which must stay empty. The
address is one of 127/8 picked by a digest of the run directory, so that it
stays the same across restarts (the base file does not change) and agents with
other run directories on one machine do not collide.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lbagent.haproxy.files import HaproxyPaths
from lbagent.logs import message_fields

log = logging.getLogger(__name__)
access_log = logging.getLogger("lbagent.access")

LOG_PORT = 5514
LOG_GLOBAL = "\n    log global\n"  # how templates/macros.j2 writes it in a frontend that logs
LINE_TAG = "lbagent-access"
# Field -> what haproxy's log-format puts there.
HTTP_FIELDS = {
    "client": "%ci:%cp",
    "method": "%HM",
    "path": "%{+Q}HP",
    "status": "%ST",
    "request_ms": "%TR",
    "queue_ms": "%Tw",
    "connect_ms": "%Tc",
    "response_ms": "%Tr",
    "total_ms": "%Ta",
    "backend": "%b",
    "server": "%s",
    "bytes": "%B",
}
TCP_FIELDS = {
    "client": "%ci:%cp",
    "start": "%t",
    "duration_ms": "%Tt",
    "connect_ms": "%Tc",
    "backend": "%b",
    "server": "%s",
    "bytes_in": "%U",
    "bytes_out": "%B",
    "termination": "%ts",
}
_KNOWN = frozenset(HTTP_FIELDS) | frozenset(TCP_FIELDS)
MAX_DATAGRAM = 8192


def wants_access_log(files_text: str) -> bool:
    """Whether a frontend in the load balancers' files logs (the base file then names the socket)."""
    return LOG_GLOBAL in files_text


def log_format(mode: str, rate: int) -> str:
    """The frontend's log-format (one quoted haproxy word once the template quotes it)."""
    fields = HTTP_FIELDS if mode == "http" else TCP_FIELDS
    return " ".join([LINE_TAG, "fe=%f", *(f"{key}={value}" for key, value in fields.items()), f"rate={int(rate)}"])


def log_address(paths: HaproxyPaths) -> tuple[str, int]:
    """The loopback address and port the agent reads access lines on, for this run directory."""
    digest = hashlib.sha256(str(paths.run_dir).encode()).digest()
    return f"127.{digest[0]}.{digest[1]}.{max(1, digest[2])}", LOG_PORT


def log_target(paths: HaproxyPaths) -> str:
    """`log_address` as haproxy's `log` line names it."""
    address, port = log_address(paths)
    return f"{address}:{port}"


@dataclass
class _Bucket:
    tokens: float
    at: float
    dropped: int = 0


@dataclass
class RateCap:
    """A token bucket per listener: `rate` lines a second, bursts of up to one second's worth."""

    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def admit(self, key: str, rate: int) -> int | None:
        """None if the line is dropped; else how many of the key's lines were dropped before it."""
        now = self.clock()
        bucket = self._buckets.setdefault(key, _Bucket(float(rate), now))
        bucket.tokens = min(float(rate), bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1:
            bucket.dropped += 1
            return None
        bucket.tokens -= 1
        dropped, bucket.dropped = bucket.dropped, 0
        return dropped


@dataclass(frozen=True)
class AccessLine:
    lb_id: str
    listener_id: str
    rate: int
    fields: dict[str, str]

    def message(self, dropped: int) -> str:
        parts = [f"object=access lb={self.lb_id} listener={self.listener_id}"]
        parts += [f"{key}={_quoted(value)}" for key, value in self.fields.items()]
        if dropped:
            parts.append(f"dropped={dropped}")
        return " ".join(parts)


def _quoted(value: str) -> str:
    if value and all(c.isprintable() and not c.isspace() and c not in "\"'\\" for c in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_line(text: str) -> AccessLine | None:
    """One of our access lines as haproxy sent it; None for anything else."""
    if not text.startswith(LINE_TAG + " "):
        return None
    fields = message_fields(text.removeprefix(LINE_TAG))
    kind, _, rest = fields.get("fe", "").partition(":")
    lb_id, _, listener_id = rest.partition(":")
    rate = fields.get("rate", "")
    if kind != "fe" or not lb_id or not listener_id or not rate.isdigit():
        return None
    known = {key: value for key, value in fields.items() if key in _KNOWN}
    return AccessLine(lb_id, listener_id, int(rate), known)


class AccessLogReader:
    """Reads haproxy's access lines from the socket and writes them, capped, to the agent's log."""

    def __init__(self, address: tuple[str, int], cap: RateCap | None = None):
        self._address = address
        self._cap = cap or RateCap()
        self._transport: asyncio.DatagramTransport | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self._address

    async def start(self) -> None:
        """Bind the socket; an address taken already only costs the access lines (said in the log)."""
        if self._transport is not None:
            return
        loop = asyncio.get_running_loop()
        try:
            self._transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), local_addr=self._address)
        except OSError as exc:
            log.error("object=haproxy action=read_access_log result=error address=%s error=%r", self._address, str(exc))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def received(self, data: bytes) -> None:
        line = parse_line(data.decode("utf-8", "replace").strip())
        if line is None:
            log.debug("object=haproxy action=read_access_log result=ignored")
            return
        self.write(line)

    def write(self, line: AccessLine) -> None:
        """Log `line` unless its listener is over its rate."""
        dropped = self.admit(line.lb_id, line.listener_id, line.rate)
        if dropped is not None:
            emit(line, dropped)

    def admit(self, lb_id: str, listener_id: str, rate: int) -> int | None:
        """The listener's cap (see `RateCap.admit`), which the conntrack flow lines
        (`workers.connlog`) go through too, before they are even decoded."""
        return self._cap.admit(f"{lb_id}/{listener_id}", rate)


def emit(line: AccessLine, dropped: int) -> None:
    """Write an admitted line to the agent's log."""
    access_log.info("%s", line.message(dropped))


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, reader: AccessLogReader):
        self._reader = reader

    def datagram_received(self, data: bytes, addr: object) -> None:
        self._reader.received(data[:MAX_DATAGRAM])
