"""The host's link notifications as the agent hears them: deletions only, filtered by the kernel."""

import select
import subprocess

from lbagent.ovnhost.linkevents import deleted_links, open_link_events


def test_only_deletions_reach_the_socket(prefix):
    events = open_link_events()
    ends = (f"{prefix}a", f"{prefix}b")
    try:
        subprocess.run(["ip", "link", "add", ends[0], "type", "veth", "peer", "name", ends[1]], check=True)
        subprocess.run(["ip", "link", "set", ends[0], "up", "mtu", "1400"], check=True)
    finally:
        subprocess.run(["ip", "link", "del", ends[0]], check=False)
    names: list[str] = []
    datagrams = 0
    # The kernel queues both notifications before `ip link del` returns.
    while select.select([events.fileno()], [], [], 2)[0] and set(ends) - set(names):
        data = events._sock.recv(65536)
        datagrams += 1
        names += deleted_links(data)
    events.close()
    assert set(ends) <= set(names)
    # Every datagram was a deletion: the additions and changes never came.
    assert datagrams == len(names)
