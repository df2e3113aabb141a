"""HaproxyProcess tells its master from anyone else's process: by command line
once, then by the start time of the same pid; a zombie or a gone pid is not it."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from lbagent.haproxy import process as process_module
from lbagent.haproxy.process import HaproxyProcess


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return []


@pytest.fixture
def lookalike(tmp_path):
    """A process whose command line is that of a master loading `haproxy`'s base file."""
    haproxy = HaproxyProcess("haproxy", tmp_path)
    code = "import time; time.sleep(60)"
    proc = subprocess.Popen(
        ["bash", "-c", f'exec -a haproxy {sys.executable} -c "{code}" "$0"', str(haproxy.paths.base_cfg)]
    )
    deadline = time.monotonic() + 10
    while _cmdline(proc.pid)[:1] != ["haproxy"]:
        assert time.monotonic() < deadline, "the look-alike never became haproxy"
        time.sleep(0.01)
    yield haproxy, proc
    proc.kill()
    proc.wait()


def test_the_master_is_known_by_its_start_time_once_its_command_line_said_so(lookalike, monkeypatch):
    haproxy, proc = lookalike
    assert haproxy._is_ours(proc.pid)

    def no_command_line(pid):
        raise AssertionError("the command line was read again")

    monkeypatch.setattr(process_module.psutil, "Process", no_command_line)
    assert haproxy._is_ours(proc.pid)


def test_another_process_a_zombie_and_a_gone_pid_are_not_the_master(lookalike):
    haproxy, proc = lookalike
    assert not haproxy._is_ours(os.getpid())  # alive, but no haproxy
    assert haproxy._is_ours(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:  # not reaped: a zombie
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not haproxy._is_ours(proc.pid)
    proc.wait()
    assert not haproxy._is_ours(proc.pid)
