"""Reading haproxy's answers: line by line within a deadline and a size bound,
and `show stat` rows parsed as they come."""

import socket
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from lbagent.haproxy import sockets
from lbagent.haproxy.errors import HaproxyAnswerError
from lbagent.haproxy.health import reason_of
from lbagent.haproxy.sockets import answer_lines, parse_show_stat, send_command


@pytest.fixture
def answering(tmp_path):
    """A UNIX socket that reads one command and answers with the chunks it is given."""
    path = tmp_path / "stats.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    received = []

    def serve(chunks, hold: threading.Event | None = None, pause: float = 0.0):
        def run():
            connection, _ = server.accept()
            with connection:
                received.append(connection.makefile("rb").readline())
                for chunk in chunks:
                    try:
                        connection.sendall(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        return  # the reader gave up, as some tests want it to
                    time.sleep(pause)  # the pace haproxy answers at, in this test
                if hold is not None:
                    hold.wait(10)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return path

    serve.received = received
    yield serve
    server.close()


def test_an_answer_comes_line_by_line(answering):
    path = answering([b"# a,b\n1,", b"2\n3,4\n", b"5"])
    lines = answer_lines(path, "show stat -1 4 -1")
    assert next(lines) == "# a,b\n"
    assert list(lines) == ["1,2\n", "3,4\n", "5"]
    assert answering.received == [b"show stat -1 4 -1\n"]


def test_send_command_gives_the_whole_answer(answering):
    assert send_command(answering([b"one\n", b"two \xff\n"]), "show info") == "one\ntwo \ufffd\n"


def test_an_answer_past_the_bound_is_refused(answering, monkeypatch):
    monkeypatch.setattr(sockets, "MAX_ANSWER_BYTES", 10)
    with pytest.raises(HaproxyAnswerError):
        list(answer_lines(answering([b"0123\n", b"45678\n", b"9\n"]), "show stat"))
    with pytest.raises(HaproxyAnswerError):  # one line longer than the bound is not read whole either
        list(answer_lines(answering([b"x" * 64 + b"\n"]), "show stat"))


def test_lines_that_come_in_pieces_are_whole_and_the_last_one_too(answering):
    path = answering([b"# pxna", b"me,svname", b"\nbe:a,", b"s1\nbe:a,s2\n", b"\n", b"no newline"])
    assert list(answer_lines(path, "show stat")) == ["# pxname,svname\n", "be:a,s1\n", "be:a,s2\n", "\n", "no newline"]


def test_an_answer_that_drips_in_stops_at_the_deadline(answering):
    # One byte every 0.1 s, never a whole line: each read waits only for what is left.
    path = answering([b"x"] * 40, pause=0.1)
    started = time.monotonic()
    with pytest.raises(OSError):
        list(answer_lines(path, "show stat", timeout=0.5))
    assert time.monotonic() - started < 2


def test_an_answer_that_stops_coming_times_out(answering):
    hold = threading.Event()
    try:
        with pytest.raises(OSError):
            list(answer_lines(answering([b"# a\n"], hold), "show stat", timeout=0.3))
    finally:
        hold.set()


def test_parse_show_stat_reads_lines_as_they_come_and_quoted_fields():
    lines = iter(
        [
            "# pxname,svname,check_desc,status,lastchg,check_status,check_code\n",
            'be:lb-a:l,be-1,"Layer7 wrong status, ""503""",DOWN,12,L7STS,503\n',
            "be:lb-a:l,short\n",  # cut short: what it lacks reads as empty
            ",be-2,,UP,1,L4OK,\n",  # no proxy name: not a server of ours
        ]
    )
    now = datetime.now(UTC)
    states = parse_show_stat(lines)
    assert set(states) == {("be:lb-a:l", "be-1"), ("be:lb-a:l", "short")}
    down = states[("be:lb-a:l", "be-1")]
    assert down == "DOWN" and reason_of(down) == "bad_status:503"
    assert abs((now - timedelta(seconds=12)) - down.since) < timedelta(seconds=2)
    assert states[("be:lb-a:l", "short")] == "" and reason_of(states[("be:lb-a:l", "short")]) is None
    assert parse_show_stat(iter(["# qcur,status\n", "1,UP\n"])) == {}  # no names to key the rows by
    assert parse_show_stat(iter([])) == {}


def test_the_servers_of_one_backend_share_its_name():
    lines = ["# pxname,svname,status\n", "be:lb-a:l,be-1,UP\n", "be:lb-a:l,be-2,UP\n"]
    first, second = parse_show_stat(iter(lines))
    assert first[0] == second[0] == "be:lb-a:l" and first[0] is second[0]
