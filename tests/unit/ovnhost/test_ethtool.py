"""The SIOCETHTOOL reads, on a socket of their own or on one the caller already has."""

import pytest

from lbagent.ovnhost import ethtool
from lbagent.ovnhost.errors import NetlinkError
from lbagent.ovnhost.rtnl_socket import open_socket


def test_a_netlink_socket_serves_the_ioctl_as_one_of_its_own_does():
    sock = open_socket()
    try:
        assert ethtool.tx_checksum_enabled("lo", sock) is ethtool.tx_checksum_enabled("lo")
        with pytest.raises(NetlinkError, match="lbagent-none0"):
            ethtool.tx_checksum_enabled("lbagent-none0", sock)
        assert sock.fileno() != -1  # the caller's socket stays open
    finally:
        sock.close()
