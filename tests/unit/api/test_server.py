"""The unix-socket listener: mode 0600 before anyone can connect, stale sockets
replaced, a live one never stolen."""

import os
import socket
import stat

import pytest

from lbagent.api.server import bind_unix_socket
from lbagent.errors import ConfigError


def test_bound_with_mode_0600_before_listening(tmp_path):
    path = tmp_path / "sub" / "api.sock"
    old_umask = os.umask(0)  # the mode must not depend on the umask
    try:
        sock = bind_unix_socket(path)
    finally:
        os.umask(old_umask)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        with socket.socket(socket.AF_UNIX) as probe, pytest.raises(ConnectionRefusedError):
            probe.connect(str(path))  # not listening yet: nobody is served before the mode is set
    finally:
        sock.close()


def test_a_stale_socket_is_replaced_and_a_live_one_refused(tmp_path):
    path = tmp_path / "api.sock"
    stale = bind_unix_socket(path)
    stale.close()  # bound but closed: what a killed agent leaves behind
    replacement = bind_unix_socket(path)
    replacement.listen()
    try:
        with pytest.raises(ConfigError, match="already listening"):
            bind_unix_socket(path)
        assert path.is_socket()
    finally:
        replacement.close()
