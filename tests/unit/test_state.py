"""StateStore: what it writes reads back, whether it encodes the desired state
itself or saves the text the agent received; what it writes is private and
nothing planted in its directory is followed."""

from __future__ import annotations

import json
import logging
import os
import stat

import pytest

from lbagent.state import Allocation, PersistedState, StateFileError, StateStore, private_dir

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


def test_the_ipv6_pair_reads_back_and_a_file_without_one_still_loads(tmp_path):
    store = StateStore(tmp_path)
    dual = Allocation("169.254.0.100", "169.254.0.101", 0, {"be-1": 1025}, "fd4c:4241::2", "fd4c:4241::3")
    store.save(PersistedState(DESIRED, {"lb-1": dual, "lb-2": Allocation("169.254.0.102", "169.254.0.103")}))
    assert store.load().allocations == {"lb-1": dual, "lb-2": Allocation("169.254.0.102", "169.254.0.103")}
    written = json.loads(store.path.read_bytes())["allocations"]
    assert (written["lb-1"]["inner6"], written["lb-1"]["outer6"]) == ("fd4c:4241::2", "fd4c:4241::3")
    assert "inner6" not in written["lb-2"]  # as files without IPv6 pairs have it


@pytest.mark.parametrize(
    "pair", [{"inner6": "fd4c:4241::2"}, {"inner6": "fd4c:4241::2", "outer6": "169.254.0.101"}, {"outer6": 7}]
)
def test_a_broken_ipv6_pair_is_a_corrupt_file(tmp_path, pair):
    store = StateStore(tmp_path)
    store.save(PersistedState(DESIRED, {"lb-1": Allocation("169.254.0.100", "169.254.0.101")}))
    data = json.loads(store.path.read_bytes())
    data["allocations"]["lb-1"].update(pair)
    store.path.write_text(json.dumps(data))
    with pytest.raises(StateFileError, match="inner6 and outer6"):
        store.load()


def test_a_symlink_at_the_old_temporary_name_is_not_followed(tmp_path):
    state_dir, outside = tmp_path / "state", tmp_path / "outside.txt"
    state_dir.mkdir(mode=0o700)
    outside.write_text("untouched")
    (state_dir / ".state.json.tmp").symlink_to(outside)
    store = StateStore(state_dir)
    store.save(PersistedState(DESIRED))
    assert outside.read_text() == "untouched"
    assert not store.path.is_symlink()
    assert store.load().desired == DESIRED


def test_prepare_removes_what_is_at_the_old_temporary_name_without_following_it(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("untouched")
    (tmp_path / ".state.json.tmp").symlink_to(outside)
    StateStore(tmp_path).prepare()
    assert not (tmp_path / ".state.json.tmp").is_symlink()
    assert outside.read_text() == "untouched"


def test_a_world_writable_file_at_the_old_temporary_name_does_not_become_the_state_file(tmp_path):
    planted = tmp_path / ".state.json.tmp"
    planted.write_text("{}")
    planted.chmod(0o666)
    store = StateStore(tmp_path)
    store.save(PersistedState(DESIRED))
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert store.load().desired == DESIRED


def test_the_state_file_is_private_and_no_temporary_file_is_left(tmp_path):
    store = StateStore(tmp_path / "state")
    store.save(PersistedState(DESIRED))
    store.save(PersistedState(DESIRED))
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert os.listdir(store.path.parent) == ["state.json"]


def test_a_loose_state_dir_is_tightened_to_0700_and_logged(tmp_path, caplog):
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    state_dir.chmod(0o777)
    caplog.set_level(logging.WARNING, logger="lbagent.state")
    StateStore(state_dir).prepare()
    assert stat.S_IMODE(state_dir.stat().st_mode) == 0o700
    assert [r.getMessage() for r in caplog.records if "tighten_dir" in r.getMessage()] == [
        f"action=tighten_dir path={state_dir} mode=777 new_mode=700"
    ]
    caplog.clear()
    StateStore(state_dir).prepare()
    assert not caplog.records


def test_a_missing_private_dir_is_made_0700(tmp_path):
    run_dir = tmp_path / "run" / "lbagent"
    private_dir(run_dir)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700


def test_an_existing_run_dir_open_to_others_is_tightened(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_dir.chmod(0o755)
    private_dir(run_dir)
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
