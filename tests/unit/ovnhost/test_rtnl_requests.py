"""The read requests encoded with struct are the bytes pyroute2 would send."""

import socket

import pytest
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from lbagent.ovnhost import rtnl_requests

HEADER_SIZE = 16


def pyroute2_body(msg_class, fields: dict, attrs: list) -> bytes:
    msg = msg_class()
    for name, value in fields.items():
        msg[name] = value
    msg["attrs"] = attrs
    msg.encode()
    return bytes(msg.data)[HEADER_SIZE:]


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (rtnl_requests.get_link("o1234abcd0"), (ifinfmsg, {}, [("IFLA_IFNAME", "o1234abcd0")])),
        (rtnl_requests.get_link("lo"), (ifinfmsg, {}, [("IFLA_IFNAME", "lo")])),
        (
            rtnl_requests.get_route("169.254.0.100"),
            (rtmsg, {"family": socket.AF_INET, "dst_len": 32}, [("RTA_DST", "169.254.0.100")]),
        ),
        (
            rtnl_requests.get_route("198.18.0.31", "169.254.0.101"),
            (
                rtmsg,
                {"family": socket.AF_INET, "dst_len": 32, "src_len": 32},
                [("RTA_DST", "198.18.0.31"), ("RTA_SRC", "169.254.0.101")],
            ),
        ),
        (
            rtnl_requests.get_route("fd4c:4241::1"),
            (rtmsg, {"family": socket.AF_INET6, "dst_len": 128}, [("RTA_DST", "fd4c:4241::1")]),
        ),
        (
            rtnl_requests.dump_addresses(7, socket.AF_INET6),
            (ifaddrmsg, {"family": socket.AF_INET6, "index": 7}, []),
        ),
        (
            rtnl_requests.dump_routes(254, None, socket.AF_INET),
            (rtmsg, {"family": socket.AF_INET, "table": 254}, [("RTA_TABLE", 254)]),
        ),
        (
            rtnl_requests.dump_routes(0x4C420101, 9, socket.AF_INET6),
            (rtmsg, {"family": socket.AF_INET6, "table": 252}, [("RTA_TABLE", 0x4C420101), ("RTA_OIF", 9)]),
        ),
    ],
)
def test_each_request_is_what_pyroute2_encodes(ours, theirs):
    assert ours == pyroute2_body(*theirs)
