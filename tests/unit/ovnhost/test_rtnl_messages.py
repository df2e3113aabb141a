"""Answers read on demand give what pyroute2's full decode gives, for every field the agent reads."""

import struct

import pytest
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from lbagent.ovnhost.rtnl_messages import ADDRESS, LINK, ROUTE, Message


def encoded(msg_class, fields: dict, attrs: list):
    msg = msg_class()
    for name, value in fields.items():
        msg[name] = value
    msg["attrs"] = attrs
    msg.encode()
    data = bytes(msg.data)
    reference = msg_class(data)
    reference.decode()
    return data, reference


LINKS = [
    (
        {"index": 7, "flags": 0x1043},
        [
            ("IFLA_IFNAME", "h1234abcd0"),
            ("IFLA_ADDRESS", "00:22:0a:00:00:12"),
            ("IFLA_MTU", 1442),
            ("IFLA_LINK", 9),
            ("IFLA_IFALIAS", "lbagent:gw-1"),
            ("IFLA_LINKINFO", {"attrs": [("IFLA_INFO_KIND", "veth")]}),
        ],
    ),
    ({"index": 1, "flags": 0x9}, [("IFLA_IFNAME", "lo"), ("IFLA_MTU", 65536)]),
]
ADDRESSES = [
    (
        {"family": 2, "prefixlen": 16, "flags": 0x80, "index": 7},
        [("IFA_ADDRESS", "169.254.0.101"), ("IFA_LOCAL", "169.254.0.101"), ("IFA_FLAGS", 0x280)],
    ),
    ({"family": 2, "prefixlen": 24, "index": 3}, [("IFA_LOCAL", "198.18.0.12"), ("IFA_BROADCAST", "198.18.0.255")]),
]
ROUTES = [
    (
        {"family": 2, "dst_len": 32, "table": 252, "proto": 4, "scope": 253, "type": 1},
        [("RTA_DST", "169.254.0.100"), ("RTA_OIF", 12), ("RTA_PREFSRC", "169.254.0.101"), ("RTA_TABLE", 3735928559)],
    ),
    (
        {"family": 2, "dst_len": 0, "table": 254, "proto": 3, "scope": 0, "type": 1},
        [("RTA_GATEWAY", "198.18.0.1"), ("RTA_OIF", 4), ("RTA_PRIORITY", 100)],
    ),
]


@pytest.mark.parametrize(
    ("msg_class", "kind", "cases"), [(ifinfmsg, LINK, LINKS), (ifaddrmsg, ADDRESS, ADDRESSES), (rtmsg, ROUTE, ROUTES)]
)
def test_every_field_read_is_what_pyroute2_decodes(msg_class, kind, cases):
    for fields, attrs in cases:
        data, reference = encoded(msg_class, fields, attrs)
        message = Message(data, kind)
        for name in kind.fields:
            assert message[name] == reference[name], name
        for name in kind.attributes:
            if name == "IFLA_LINKINFO":
                info = reference.get(name)
                expected = {"IFLA_INFO_KIND": info.get("IFLA_INFO_KIND")} if info else None
                assert message.get(name) == expected
            else:
                assert message.get(name) == reference.get(name), name


def test_an_attribute_not_read_is_none_and_a_truncated_list_ends_it():
    data, _ = encoded(rtmsg, {"family": 2, "dst_len": 32}, [("RTA_DST", "198.18.0.1"), ("RTA_OIF", 3)])
    message = Message(data, ROUTE)
    assert message.get("RTA_MARK") is None and message.get("RTA_GATEWAY", "none") == "none"
    cut = Message(data[:-4], ROUTE)  # RTA_OIF's length now runs past the end
    assert cut.get("RTA_DST") == "198.18.0.1" and cut.get("RTA_OIF") is None


def _attribute(number: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, number) + payload + b"\0" * ((-length) % 4)


def test_a_links_per_family_settings_are_arrays_by_family():
    inet = _attribute(1, struct.pack("=3i", 1, 0, 0))  # IFLA_INET_CONF: forwarding first
    inet6 = _attribute(1, struct.pack("=I", 0)) + _attribute(2, struct.pack("=4i", 1, 64, 1500, -1))
    other = _attribute(7, b"\0" * 4)  # a family with no settings array the agent reads
    af_spec = _attribute(26, _attribute(2, inet) + _attribute(10, inet6) + _attribute(45, other))
    data, _ = encoded(ifinfmsg, {"index": 3, "flags": 1}, [("IFLA_IFNAME", "lb0")])
    data += af_spec
    data = struct.pack("=I", len(data)) + data[4:]  # the netlink header's length
    message = Message(data, LINK)
    assert message.get("IFLA_IFNAME") == "lb0"
    assert message.get("IFLA_AF_SPEC") == {2: (1, 0, 0), 10: (1, 64, 1500, -1)}
