"""OvnHost's resync looks: shared jobs, the OVS port looked up only after OVSDB changed, failures as None."""

import asyncio
from types import SimpleNamespace

from lbagent.ovnhost import host as host_module
from lbagent.ovnhost.errors import NetlinkError
from lbagent.ovnhost.host import OvnHost
from lbagent.ovnhost.ovs import PortState


class CountingOvs:
    owner = ""  # no marks: nothing to look for but the namespace

    def __init__(self):
        self.count = 1
        self.lookups = 0

    def change_count(self):
        return self.count

    def observe_port(self, name):
        self.lookups += 1
        return PortState("br-int", {"iface-id": f"iface-{name}", "ovn-installed": "true"}, 7)


class InlineExecutor:
    """Runs each job at once, counting them."""

    def __init__(self):
        self.jobs = 0

    async def run(self, netns, fn, *args):
        self.jobs += 1
        return fn(*args)


def make_host():
    ovs = CountingOvs()
    namespaces = InlineExecutor()
    return OvnHost(ovs, namespaces, InlineExecutor()), ovs, namespaces


async def test_looks_that_come_together_share_one_job(monkeypatch):
    host, _, namespaces = make_host()
    monkeypatch.setattr(host, "_snapshot", lambda spec, also, sock: f"look of {spec.lb_id}".encode())
    looks = await asyncio.gather(*(host.snapshot(SimpleNamespace(lb_id=n), lambda: b"") for n in ("a", "b", "c")))
    assert looks == [b"look of a", b"look of b", b"look of c"] and namespaces.jobs == 1


async def test_a_look_that_fails_is_none_and_fails_no_other(monkeypatch):
    host, _, _ = make_host()

    def look(spec, also, sock):
        if spec.lb_id == "bad":
            raise NetlinkError("dump links", 1)
        if spec.lb_id == "worse":
            raise OSError("gone")
        return b"fine"

    monkeypatch.setattr(host, "_snapshot", look)
    looks = await asyncio.gather(
        *(host.snapshot(SimpleNamespace(lb_id=n), lambda: b"") for n in ("bad", "good", "worse"))
    )
    assert looks == [None, b"fine", None]


async def test_the_looks_of_one_job_ask_the_host_over_one_socket_closed_after_them(monkeypatch):
    host, _, _ = make_host()
    sockets = []
    monkeypatch.setattr(host, "_snapshot", lambda spec, also, sock: sockets.append(sock) or b"look")
    await asyncio.gather(*(host.snapshot(SimpleNamespace(lb_id=n), lambda: b"") for n in ("a", "b")))
    assert len(sockets) == 2 and sockets[0] is sockets[1] and sockets[0].fileno() == -1


async def test_without_a_host_socket_every_look_of_the_job_is_none(monkeypatch):
    host, _, _ = make_host()

    def refused(strict):
        raise NetlinkError("open socket", 24)

    monkeypatch.setattr(host_module, "open_socket", refused)
    monkeypatch.setattr(host, "_snapshot", lambda spec, also, sock: b"never")
    looks = await asyncio.gather(*(host.snapshot(SimpleNamespace(lb_id=n), lambda: b"") for n in ("a", "b")))
    assert looks == [None, None]


def test_the_ovs_port_is_looked_up_again_only_after_ovsdb_changed():
    host, ovs, _ = make_host()
    first = host._port_seen("ovn-port")
    assert host._port_seen("ovn-port") == first and ovs.lookups == 1
    ovs.count += 1
    assert host._port_seen("ovn-port") == first and ovs.lookups == 2
    assert b"ovn-installed" in first and host._port_seen("other-port") != first
