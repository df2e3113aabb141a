"""StateStore: what it writes reads back, whether it encodes the desired state
itself or saves the text the agent received."""

from __future__ import annotations

import json

from lbagent.state import Allocation, PersistedState, StateStore

DESIRED = {"generation": 3, "loadbalancers": [{"id": "lb-1", "weight": 1.0, "name": "caf\u00e9"}]}


def test_the_received_text_is_saved_as_it_came_and_reads_back_the_same(tmp_path):
    text = '{ "generation": 3,\n  "loadbalancers": [{"id": "lb-1", "weight": 1.0, "name": "caf\u00e9"}] }'
    store = StateStore(tmp_path)
    store.save(
        PersistedState(
            DESIRED, {"lb-1": Allocation("169.254.0.100", "169.254.0.101", 0, {"be-1": 1025})}, desired_text=text
        )
    )
    assert text in store.path.read_text(encoding="utf-8")
    loaded = store.load()
    assert loaded.desired == DESIRED
    assert loaded.allocations == {"lb-1": Allocation("169.254.0.100", "169.254.0.101", 0, {"be-1": 1025})}


def test_kept_allocation_texts_write_what_a_fresh_store_writes(tmp_path):
    first = {
        f"lb-{i}": Allocation(f"169.254.0.{100 + 2 * i}", f"169.254.0.{101 + 2 * i}", i, {"be": 1025 + i})
        for i in range(3)
    }
    store = StateStore(tmp_path / "kept")
    store.save(PersistedState(DESIRED, first))
    second = {**first, "lb-1": Allocation("169.254.0.102", "169.254.0.103", 1, {"be": 1026, "be-2": 1027})}
    del second["lb-2"]
    store.save(PersistedState(DESIRED, second))
    fresh = StateStore(tmp_path / "fresh")
    fresh.save(PersistedState(DESIRED, second))
    assert store.path.read_bytes() == fresh.path.read_bytes()
    assert store.load().allocations == second
    assert json.loads(store.path.read_bytes())["allocations"]["lb-1"]["ports"] == {"be": 1026, "be-2": 1027}
