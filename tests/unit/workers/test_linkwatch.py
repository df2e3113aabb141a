"""A deleted host end kicks its load balancer's pass, once a read, and nothing else."""

import os

from lbagent.naming import interface_names
from lbagent.ovnhost.errors import NetlinkError
from lbagent.workers.linkwatch import LinkWatch


class Events:
    def __init__(self, *batches):
        self.batches = list(batches)
        self.read, self.write = os.pipe()
        self.lost = 3
        self.closed = False

    def fileno(self):
        return self.read

    def deleted(self):
        batch = self.batches.pop(0)
        if isinstance(batch, Exception):
            raise batch
        return batch

    def close(self):
        self.closed = True
        os.close(self.read)
        os.close(self.write)


async def test_a_deleted_host_end_kicks_its_load_balancer():
    owners = {"lb-a": 0, "lb-b": 2}
    lookups = []

    def listed():
        lookups.append(1)
        return owners.items()

    a, b = interface_names("lb-a"), interface_names("lb-b", 2)
    events = Events(
        # both ends of a's pairs, a namespace end of b's (never on the host), a foreign link
        [a.ovn_host, a.haproxy_host, b.ovn_ns, "eth0", interface_names("gone").ovn_host],
        [b.haproxy_host],
    )
    kicked = []
    watch = LinkWatch(listed, kicked.append, open_events=lambda: events)
    watch.start()
    watch._readable()
    assert kicked == ["lb-a"] and len(lookups) == 1  # one lookup for the read's unknown tags
    watch._readable()
    assert kicked == ["lb-a", "lb-b"] and watch.lost == 3
    watch.stop()
    assert events.closed and watch.lost == 0
    watch.stop()  # twice is harmless


async def test_a_watch_that_cannot_subscribe_or_read_leaves_it_to_the_resync():
    def refused():
        raise NetlinkError("subscribe to link events", 1)

    watch = LinkWatch(dict().items, print, open_events=refused)
    watch.start()
    watch.stop()
    events = Events(NetlinkError("read link events", 9))
    watch = LinkWatch(dict().items, print, open_events=lambda: events)
    watch.start()
    watch._readable()
    assert events.closed
