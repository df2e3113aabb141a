"""The agent's exception hierarchy: every error the agent raises on purpose derives from LbAgentError."""

from __future__ import annotations


class LbAgentError(Exception):
    """Base of every deliberate lbagent error, so callers can tell them from bugs."""


class InvalidDesiredState(LbAgentError):
    """A POST /v1/refresh body (or a persisted state) that breaks api.md.

    `details` lists every problem as {"path": JSON pointer, "message": text}, the
    shape of the 400 answer's "details".
    """

    def __init__(self, details: list[dict[str, str]]) -> None:
        self.details = details
        if details:
            first = details[0]
            more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
            summary = f"{first['path'] or 'the body'}: {first['message']}{more}"
        else:
            summary = "no details"
        super().__init__(f"invalid desired state: {summary}")


class ConfigError(LbAgentError):
    """The configuration file is missing, unreadable or names/values a key wrongly."""


class StaleGeneration(LbAgentError):
    """A refresh whose generation is lower than the one already accepted (409)."""

    def __init__(self, offered: int, current: int) -> None:
        super().__init__(f"generation {offered} is lower than the accepted generation {current}")
        self.current = current
