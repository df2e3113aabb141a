"""A member's health as the status document tells it: a word, why, and since when.

`ServerHealth` is the status word haproxy's `show stat` gives a server (or the
word the UDP checker gives a member) and still compares and prints as that
word; it also carries `reason`, the status document's `health_reason`, and
`since`, when the server last changed between up and down.

haproxy's reasons come from the check columns of `show stat`: `check_status`
(L4CON, L7STS, ...; a leading "* " marks a check under way) and `check_code`.
"""

from __future__ import annotations

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

    def __new__(cls, word: str, reason: str | None = None, since: datetime | None = None) -> ServerHealth:
        health = super().__new__(cls, word)
        health.reason = reason
        health.since = since
        return health


def reason_of(health: str) -> str | None:
    return health.reason if isinstance(health, ServerHealth) else None


def since_of(health: str) -> str | None:
    """When the health last changed, ISO 8601 in UTC to the second; None when not known."""
    since = health.since if isinstance(health, ServerHealth) else None
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


def from_stat_row(row: dict[str, str], now: datetime) -> ServerHealth:
    """The health of one server row of `show stat` read at `now`."""
    status = row.get("status") or ""
    lastchg = row.get("lastchg") or ""
    since = now - timedelta(seconds=int(lastchg)) if lastchg.isdigit() else None
    return ServerHealth(status, check_reason(status, row.get("check_status") or "", row.get("check_code") or ""), since)
