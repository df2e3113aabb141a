"""Typed errors of the haproxy side, so callers can tell a refused config from a failed reload."""

from __future__ import annotations

from lbagent.errors import LbAgentError

# haproxy's complaint is copied into status and logs: keep it to a readable size.
MAX_OUTPUT_CHARS = 2000


def trim_output(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """haproxy's output without its version banner ([NOTICE] lines), at most `limit` characters."""
    lines = [line for line in text.strip().splitlines() if not line.startswith("[NOTICE]")]
    text = "\n".join(lines).strip() or text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


class HaproxyError(LbAgentError):
    """Anything that went wrong talking to or running haproxy."""


class RenderError(HaproxyError):
    """A value that cannot be put in a config line safely (defence in depth: input is validated upstream)."""


class HaproxyCheckError(HaproxyError):
    """`haproxy -c` refused a configuration; `output` is what haproxy said, trimmed."""

    def __init__(self, output: str, what: str = "configuration") -> None:
        self.output = trim_output(output)
        super().__init__(f"haproxy rejected the {what}: {self.output}")


class HaproxyReloadError(HaproxyError):
    """The master did not start, or did not replace its workers with ones running the new files."""


class HaproxyAnswerError(HaproxyError, OSError):
    """haproxy's answer on a socket was unusable (too large). An OSError too, as
    every other way `send_command` can fail is: its callers catch OSError."""
