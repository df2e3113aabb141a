"""Link notifications: the names of deleted links, whatever else the socket carries."""

import errno

import pytest
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from lbagent.ovnhost import linkevents
from lbagent.ovnhost.errors import NetlinkError
from lbagent.ovnhost.linkevents import RTM_DELLINK, LinkEvents

RTM_NEWLINK = 16


def notification(kind: int, name: str) -> bytes:
    msg = ifinfmsg()
    msg["index"] = 9
    msg["header"]["type"] = kind
    msg["attrs"] = [("IFLA_IFNAME", name), ("IFLA_MTU", 1442)]
    msg.encode()
    return bytes(msg.data)


def test_only_deletions_are_named_and_a_cut_message_ends_the_datagram():
    data = notification(RTM_NEWLINK, "o1234abcd1") + notification(RTM_DELLINK, "h1234abcd1")
    assert linkevents.deleted_links(data) == ["h1234abcd1"]
    cut = notification(RTM_DELLINK, "o1234abcd1") + notification(RTM_DELLINK, "h1234abcd1")[:-8]
    assert linkevents.deleted_links(cut) == ["o1234abcd1"]


class Socket:
    def __init__(self, *answers):
        self.answers = list(answers)
        self.closed = False

    def recv(self, size):
        if not self.answers:
            raise BlockingIOError
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def fileno(self):
        return 99

    def close(self):
        self.closed = True


def test_an_overflow_is_counted_and_reading_goes_on():
    overflow = OSError(errno.ENOBUFS, "No buffer space available")
    events = LinkEvents(Socket(notification(RTM_DELLINK, "a"), overflow, notification(RTM_DELLINK, "b")))
    assert events.deleted() == ["a", "b"] and events.lost == 1
    assert events.deleted() == [] and events.fileno() == 99


def test_a_failed_read_is_a_netlink_error():
    events = LinkEvents(Socket(OSError(errno.EBADF, "Bad file descriptor")))
    with pytest.raises(NetlinkError):
        events.deleted()


def test_a_subscription_hears_this_namespace():
    events = linkevents.open_link_events()
    try:
        assert events.deleted() == []  # nothing queued: returns at once
    finally:
        events.close()
