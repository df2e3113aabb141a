"""Log set-up: one line per event, key=value text or JSON, to stderr (journald).

Messages are written as `key=value` pairs (`lb=... object=... action=...`);
the JSON format lifts those pairs into fields of the entry. A filter on the
handler redacts secrets from every record whatever logger it comes from: PEM
private key blocks and the configured bearer token never reach a log line,
even inside an exception's text.
"""

from __future__ import annotations

import copy
import json
import logging
import logging.handlers
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from queue import SimpleQueue

REDACTED = "[REDACTED]"
# A whole key block, or from BEGIN to the end when the END line is missing (a
# truncated repr still holds key material).
_PRIVATE_KEY = re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.DOTALL)
# key=value with a bare value or a Python-repr quoted one ('..' or "..").
_FIELD = re.compile(r"""(?:^|\s)([a-z_][a-z0-9_]*)=('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|\S*)""")
_BASE_FIELDS = frozenset({"ts", "level", "logger", "msg", "exc", "stack"})
# Shorter "secrets" would redact ordinary words; a real token is far longer.
MIN_SECRET_LEN = 8


class RedactingFilter(logging.Filter):
    def __init__(self, secrets: Iterable[str | None] = ()):
        super().__init__()
        self._secrets = sorted({s for s in secrets if s and len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)
        self._exc_formatter = logging.Formatter()

    def redact(self, text: str) -> str:
        text = _PRIVATE_KEY.sub(f"-----{REDACTED} PRIVATE KEY-----", text)
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = self.redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            # Formatters use exc_text when it is set: the redacted text is what gets written.
            record.exc_text = self._exc_formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


def message_fields(message: str) -> dict[str, str]:
    """The key=value pairs of a message; quoted values are unquoted."""
    fields = {}
    for key, value in _FIELD.findall(message):
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        fields[key] = value
    return fields


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        entry = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": message,
        }
        entry.update((k, v) for k, v in message_fields(message).items() if k not in _BASE_FIELDS)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry)


def make_handler(fmt: str = "text", secrets: Iterable[str | None] = (), stream=None) -> logging.Handler:
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"))
    handler.addFilter(RedactingFilter(secrets))
    return handler


class _Enqueue(logging.handlers.QueueHandler):
    """Hands each record to the writer thread with its message and traceback
    made text (the objects they name may change or go meanwhile); the writer's
    handler formats and redacts it there. A critical record is written at
    once as well: it may be the last before the process aborts."""

    def __init__(self, queue: SimpleQueue, writer: logging.Handler):
        super().__init__(queue)
        self._writer = writer
        self._exc_formatter = logging.Formatter()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record = copy.copy(record)
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = record.exc_text or self._exc_formatter.formatException(record.exc_info)
            record.exc_info = None
        return record

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.CRITICAL:
            self._writer.handle(self.prepare(record))
        else:
            super().emit(record)


@contextmanager
def setup_logging(
    level: str = "info", fmt: str = "text", secrets: Iterable[str | None] = (), stream=None
) -> Iterator[None]:
    """Log to stderr (or `stream`) in `fmt` while the block runs; `secrets` (the
    API token) are redacted wherever they appear. Lines are written by a thread
    of their own: a write to a busy journal, or the handler's lock held by the
    thread writing, kept the event loop waiting (a tenth of its time in a cold
    start of a thousand load balancers). What is queued is written on exit."""
    root = logging.getLogger()
    writer = make_handler(fmt, secrets, stream)
    queue: SimpleQueue = SimpleQueue()
    listener = logging.handlers.QueueListener(queue, writer)
    root.handlers[:] = [_Enqueue(queue, writer)]
    root.setLevel(level.upper())
    # ovsdbapp and the ovs IDL are chatty at info about every reconnect attempt.
    logging.getLogger("ovsdbapp").setLevel(max(root.level, logging.WARNING))
    listener.start()
    try:
        yield
    finally:
        listener.stop()
        root.handlers[:] = [writer]
