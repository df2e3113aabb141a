from lbagent.ovnhost.inventory import Inventory
from lbagent.workers.gc import GarbageCollector


class FakeHost:
    def __init__(self, inventory):
        self.inv = inventory
        self.deleted = []
        self.fail = set()

    async def inventory(self):
        return self.inv

    async def delete_orphan(self, kind, name):
        if name in self.fail:
            raise RuntimeError("busy")
        self.deleted.append((kind, name))


class FakeHaproxy:
    def __init__(self, ids):
        self.ids = set(ids)
        self.removed = []

    def lb_ids_on_disk(self):
        return self.ids

    async def apply(self, lb_id, text):
        self.removed.append(lb_id)


def make(max_deletions=50):
    host = FakeHost(
        Inventory(frozenset({"lb-a", "lb-old"}), frozenset({"oaaaaaaaa1", "obbbbbbbb1"}), frozenset({"obbbbbbbb1"}))
    )
    haproxy = FakeHaproxy({"a", "old"})
    return GarbageCollector(host, haproxy, max_deletions), host, haproxy


USED = Inventory(frozenset({"lb-a"}), frozenset({"oaaaaaaaa1"}), frozenset(), frozenset({"a"}))


async def test_orphans_go_only_on_the_second_pass():
    gc, host, haproxy = make()
    assert await gc.run_once(lambda: USED) == []
    deleted = await gc.run_once(lambda: USED)
    assert deleted[0] == ("haproxy", "old")  # haproxy first
    assert set(deleted) == {
        ("haproxy", "old"),
        ("netns", "lb-old"),
        ("links", "obbbbbbbb1"),
        ("ovs_ports", "obbbbbbbb1"),
    }
    assert ("netns", "lb-a") not in host.deleted and haproxy.removed == ["old"]


async def test_an_object_claimed_between_passes_survives():
    gc, host, haproxy = make()
    await gc.run_once(lambda: USED)
    claimed = Inventory(USED.netns | {"lb-old"}, USED.links, USED.ovs_ports, USED.haproxy | {"old"})
    deleted = await gc.run_once(lambda: claimed)
    assert ("netns", "lb-old") not in deleted and "old" not in haproxy.removed


async def test_deletions_are_capped_and_failures_retried():
    gc, host, haproxy = make(max_deletions=2)
    host.fail.add("lb-old")
    await gc.run_once(lambda: USED)
    first = await gc.run_once(lambda: USED)
    assert len(first) <= 2
    host.fail.clear()
    rest = await gc.run_once(lambda: USED)
    rest += await gc.run_once(lambda: USED)
    assert ("netns", "lb-old") in first + rest
