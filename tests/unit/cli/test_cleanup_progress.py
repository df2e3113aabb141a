"""`lbagent cleanup` says how far it is while it removes thousands of objects."""

from __future__ import annotations

from lbagent.cli.cleanup import _delete_ports, _in_threads


async def test_removals_on_threads_report_each_one_done_and_keep_their_order():
    seen: list[str] = []
    lines = await _in_threads(lambda n: [f"removed {n}"], [3, 1, 2], seen.append, "namespaces")
    assert lines == ["removed 3", "removed 1", "removed 2"]
    assert sorted(seen) == ["namespaces: 1/3", "namespaces: 2/3", "namespaces: 3/3"]


async def test_ports_report_progress_per_transaction(monkeypatch):
    import lbagent.cli.cleanup as cleanup

    monkeypatch.setattr(cleanup, "PORTS_PER_TRANSACTION", 2)

    class Ovs:
        def delete_ports(self, names):
            return [name != "gone" for name in names]

    seen: list[str] = []
    lines = await _delete_ports(Ovs(), ["a", "gone", "c"], seen.append)
    assert lines == ["removed OVS port a", "removed OVS port c"]
    assert seen == ["OVS ports: 2/3", "OVS ports: 3/3"]
