"""A member's health as the status document tells it: a word, why, and since when.

`ServerHealth` is the status word haproxy's `show stat` gives a server (or the
word the UDP checker gives a member) and still compares and prints as that
word; it also carries `reason`, the status document's `health_reason`,
`since`, when the server last changed between up and down, and `drain_until`,
when the sessions of a server draining (removed, or at weight 0) are shut.

haproxy's reasons come from the check columns of `show stat`: `check_status`
(L4CON, L7STS, ...; a leading "* " marks a check under way) and `check_code`.
"""

from __future__ import annotations

import math
import sys
from datetime import UTC, datetime, timedelta

# check_status -> health_reason; L7STS is "bad_status:<check_code>".
CHECK_REASONS = {
    "L4OK": "ok",
    "L6OK": "ok",
    "L7OK": "ok",
    "L7OKC": "ok",
    "L4CON": "connect_refused",
    "SOCKERR": "connect_refused",
    "L4TOUT": "timeout",
    "L6TOUT": "timeout",
    "L7TOUT": "timeout",
    "L6RSP": "bad_response",
    "L7RSP": "bad_response",
}
# Administrative states say more than the last check.
STATE_REASONS = (("MAINT", "disabled"), ("DRAIN", "draining"), ("NOLB", "draining"))


class ServerHealth(str):
    """A health word that also knows its reason (None: nothing checks it) and since when it holds."""

    reason: str | None
    since: datetime | None
    drain_until: datetime | None

    def __new__(
        cls, word: str, reason: str | None = None, since: datetime | None = None, drain_until: datetime | None = None
    ) -> ServerHealth:
        health = super().__new__(cls, word)
        health.reason = reason
        health.since = since
        health.drain_until = drain_until
        return health


SINCE_WOBBLE = timedelta(seconds=2)  # a whole second of rounding, and the time between reading and parsing


class SteadySince:
    """haproxy says how long ago a server changed in whole seconds, so the
    moment worked out from it moves by up to a second from one read to the
    next, and a status document read twice would differ where nothing
    changed. The moment first worked out for a server's word is kept while
    that word lasts. Used by one thread at a time (the stats thread)."""

    def __init__(self) -> None:
        self._first: dict[tuple[str, str], tuple[str, datetime]] = {}

    def steady(self, states: dict[tuple[str, str], str], complete: bool) -> dict[tuple[str, str], str]:
        """`states` with the moments first seen. `complete`: they are all of
        haproxy's servers, and those not among them are forgotten."""
        first = {} if complete else self._first
        for key, state in states.items():
            since = _since(state)
            if since is None:
                continue
            known = self._first.get(key)
            if known is not None and known[0] == str(state) and abs(since - known[1]) <= SINCE_WOBBLE:
                states[key] = ServerHealth(str(state), reason_of(state), known[1], _drain_until(state))
                first[key] = known
            else:
                # Interned: a few words ("UP", "DOWN", ...) for thousands of servers.
                first[key] = (sys.intern(str(state)), since)
        self._first = first
        return states


def with_drain_deadlines(states: dict[tuple[str, str], str], deadlines: dict[str, float]) -> dict[tuple[str, str], str]:
    """`states` with the deadline of each server draining ("backend/server" -> wall-clock seconds) attached."""
    for target, shut_at in deadlines.items():
        backend, _, server = target.partition("/")
        state = states.get((backend, server))
        if state is not None:
            until = datetime.fromtimestamp(shut_at, UTC)
            states[(backend, server)] = ServerHealth(str(state), reason_of(state), _since(state), until)
    return states


def _since(health: str) -> datetime | None:
    return health.since if isinstance(health, ServerHealth) else None


def _drain_until(health: str) -> datetime | None:
    return health.drain_until if isinstance(health, ServerHealth) else None


def drain_remaining(health: str, now: datetime) -> int | None:
    """Whole seconds until a draining server's sessions are shut (0 once due); None when it is not draining."""
    until = _drain_until(health)
    if until is None:
        return None
    return max(0, math.ceil((until - now).total_seconds()))


def reason_of(health: str) -> str | None:
    return health.reason if isinstance(health, ServerHealth) else None


def since_of(health: str) -> str | None:
    """When the health last changed, ISO 8601 in UTC to the second; None when not known."""
    since = _since(health)
    return since.astimezone(UTC).replace(microsecond=0).isoformat() if since is not None else None


def check_reason(status: str, check_status: str, check_code: str) -> str | None:
    """health_reason from a `show stat` row's status, check_status and check_code."""
    for prefix, reason in STATE_REASONS:
        if status.startswith(prefix):
            return reason
    check = check_status.removeprefix("* ").strip()
    if check == "L7STS":
        return f"bad_status:{check_code}" if check_code else "bad_response"
    return CHECK_REASONS.get(check)


def from_stat_fields(status: str, lastchg: str, check_status: str, check_code: str, now: datetime) -> ServerHealth:
    """The health of one server row of `show stat` read at `now`, from its columns of those names."""
    since = now - timedelta(seconds=int(lastchg)) if lastchg.isdigit() else None
    return ServerHealth(status, check_reason(status, check_status, check_code), since)
