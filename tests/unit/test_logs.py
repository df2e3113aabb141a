"""Logs: key=value text or JSON with the pairs lifted into fields, and secrets
(private keys, the API token) redacted from every line, tracebacks included."""

import io
import json
import logging

import pytest

from lbagent.logs import REDACTED, make_handler, message_fields, setup_logging

TOKEN = "c2VjcmV0LXRva2VuLWZvci10ZXN0cw=="
KEY = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nBKcwggSjAgEAAoIBAQC7\n-----END PRIVATE KEY-----\n"
RSA_KEY = KEY.replace("PRIVATE KEY", "RSA PRIVATE KEY")
CERT = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----"


@pytest.fixture(params=["text", "json"])
def capture(request):
    stream = io.StringIO()
    logger = logging.getLogger(f"lbagent.test.{request.param}")
    logger.handlers[:] = [make_handler(request.param, secrets=[TOKEN, None, "short"], stream=stream)]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    yield logger, stream
    logger.handlers.clear()


@pytest.mark.parametrize(
    "message, args",
    [
        ("lb=%s action=refresh body=%r", ("web", {"private_key": KEY})),
        ("key in text: %s", (RSA_KEY,)),
        ("truncated repr: %s", (KEY[:60],)),  # no END line: still redacted to the end
        ("header Authorization: Bearer %s", (TOKEN,)),
        ("token inside %s", (f"x{TOKEN}y",)),
    ],
)
def test_secrets_never_reach_a_line(capture, message, args):
    logger, stream = capture
    logger.info(message, *args)
    text = stream.getvalue()
    assert REDACTED in text
    assert TOKEN not in text and "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" not in text
    assert "BEGIN PRIVATE KEY-----\\n" not in text and "BEGIN RSA PRIVATE KEY-----\n" not in text


def test_secrets_in_tracebacks_are_redacted(capture):
    logger, stream = capture
    try:
        raise ValueError(f"bad key {KEY} for token {TOKEN}")
    except ValueError:
        logger.exception("action=load result=error")
    text = stream.getvalue()
    assert "ValueError" in text and TOKEN not in text and "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" not in text


def test_certificates_and_short_words_are_kept(capture):
    logger, stream = capture
    logger.info("cert=%s word=short", CERT)
    text = stream.getvalue()
    assert "MIIBszCCAVmgAwIBAgIU" in text and "short" in text and REDACTED not in text


def test_json_lines_carry_the_key_value_pairs_as_fields():
    stream = io.StringIO()
    logger = logging.getLogger("lbagent.test.fields")
    logger.handlers[:] = [make_handler("json", stream=stream)]
    logger.propagate = False
    logger.warning("lb=%s object=haproxy action=reload result=error error=%r", "web-1", "it's broken")
    entry = json.loads(stream.getvalue())
    assert entry["level"] == "warning" and entry["logger"] == "lbagent.test.fields"
    assert {k: entry[k] for k in ("lb", "object", "action", "result")} == {
        "lb": "web-1",
        "object": "haproxy",
        "action": "reload",
        "result": "error",
    }
    assert entry["error"] == "it's broken"
    logger.handlers.clear()


def test_message_fields():
    assert message_fields("lb=a action=x msg=ignored error='a b' n=3") == {
        "lb": "a",
        "action": "x",
        "msg": "ignored",
        "error": "a b",
        "n": "3",
    }
    assert message_fields("no pairs here") == {}


@pytest.fixture
def root_kept():
    """setup_logging sets up the root logger: the other tests get theirs back."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_the_writer_thread_writes_each_line_redacted_with_its_traceback(fmt, root_kept):
    stream = io.StringIO()
    logger = logging.getLogger("lbagent.test.queued")
    with setup_logging("debug", fmt, secrets=[TOKEN], stream=stream):
        try:
            raise ValueError(f"bearer {TOKEN}")
        except ValueError:
            logger.exception("lb=%s action=reload token=%s", "web-1", TOKEN)
        logger.debug("lb=%s action=pass", "web-2")
    text = stream.getvalue()
    assert TOKEN not in text and REDACTED in text
    assert "Traceback" in text and "ValueError" in text
    assert "lb=web-1" in text and "lb=web-2" in text
    if fmt == "json":
        first, second = map(json.loads, text.splitlines()[:1] + text.splitlines()[-1:])
        assert first["lb"] == "web-1" and "ValueError" in first["exc"] and second["lb"] == "web-2"


def test_a_critical_line_is_written_before_the_writer_thread_gets_to_it(root_kept):
    stream = io.StringIO()
    logger = logging.getLogger("lbagent.test.critical")
    with setup_logging("info", "text", stream=stream):
        logger.critical("action=abort reason=%s", "namespace thread lost")
        # Written by the caller itself: no waiting for the writer thread.
        assert "action=abort reason=namespace thread lost" in stream.getvalue()
