"""end_process: a child that leaves on SIGTERM, one that ignores it, one already gone."""

import subprocess
import sys

from devtools.procs import end_process

IGNORES_TERM = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
)


def test_a_child_is_terminated_and_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    end_process(child)
    assert child.returncode == -15


def test_a_child_that_ignores_sigterm_is_killed():
    child = subprocess.Popen([sys.executable, "-c", IGNORES_TERM], stdout=subprocess.PIPE)
    child.stdout.readline()  # its handler is in place
    end_process(child, timeout=0.5)
    assert child.returncode == -9


def test_a_child_already_gone_is_left_alone():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(10)
    end_process(child)
    assert child.returncode == 0
