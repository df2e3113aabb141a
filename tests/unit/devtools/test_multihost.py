"""The multi-host sandbox's plan (names, addresses) and its record of what was made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devtools import multihost, namespaces
from devtools.multihost import MultiHost, underlay_plan
from devtools.namespaces import Ledger
from devtools.procs import required_tools


def test_the_central_is_first_and_hosts_follow_from_eleven_in_order():
    central, hosts = underlay_plan(["gw-1", "gw-2", "cl"])

    assert central == "198.19.255.1"
    assert hosts == {"gw-1": "198.19.255.11", "gw-2": "198.19.255.12", "cl": "198.19.255.13"}


def test_hosts_beyond_the_underlay_are_refused():
    underlay_plan([f"h{i}" for i in range(244)])  # .11 .. .254
    with pytest.raises(ValueError, match="at most 244 hosts"):
        underlay_plan([f"h{i}" for i in range(245)])


def test_names_follow_the_prefix_and_links_fit_in_fifteen_characters(tmp_path_factory: pytest.TempPathFactory):
    tmp_path = tmp_path_factory.mktemp("mh")  # short: the control sockets go below it
    longest = "h" * 12
    mh = MultiHost(tmp_path, "t123456", ["gw-1", longest])
    gw1 = mh.host("gw-1")

    assert (gw1.netns, gw1.chassis, gw1.underlay_ip) == ("t123456-h-gw-1", "t123456-gw-1", "198.19.255.11")
    assert (mh.central.netns, mh.underlay_netns) == ("t123456-c", "t123456-ul")
    assert gw1.base == tmp_path / "hosts" / "gw-1"
    assert len(mh.host(longest).plan.underlay_peer) <= 15
    assert mh.central.nb_remote == "tcp:198.19.255.1:6641" and mh.central.sb_remote == "tcp:198.19.255.1:6642"
    assert gw1.env["OVN_NB_DB"] == mh.central.nb_remote
    assert mh.central.nb_db == f"unix:{tmp_path / 'central' / 'run' / 'ovnnb_db.sock'}"


@pytest.mark.parametrize(
    ("prefix", "hosts", "message"),
    [
        ("t1234567", ["a"], "prefix"),  # its VPCs add a digit to an 8-character limit
        ("1t", ["a"], "prefix"),
        ("t1", ["h" * 13], "host name"),
        ("t1", ["Gw"], "host name"),
        ("t1", ["a", "a"], "distinct"),
        ("t1", [], "distinct"),
    ],
)
def test_names_that_would_not_fit_are_refused(tmp_path: Path, prefix: str, hosts: list[str], message: str):
    with pytest.raises(ValueError, match=message):
        MultiHost(tmp_path, prefix, hosts)


def test_a_base_too_long_for_the_hosts_control_sockets_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="unix socket"):
        MultiHost(tmp_path / ("d" * 80), "t1", ["gw-1"])


def test_the_ledger_is_on_disk_after_each_change(tmp_path: Path):
    ledger = Ledger(tmp_path / "made.json", prefix="t1", hosts=["a"])
    ledger.add("namespaces", "t1-ul")
    ledger.add("namespaces", "t1-ul")  # once only
    ledger.add("processes", {"host": "a", "pid": 42, "expect": "agent.toml"})

    assert json.loads((tmp_path / "made.json").read_text())["namespaces"] == ["t1-ul"]
    loaded = Ledger.load(tmp_path / "made.json")
    assert loaded == ledger

    loaded.discard("namespaces", "t1-ul")
    assert Ledger.load(tmp_path / "made.json").namespaces == []


def test_restore_rebuilds_the_sandbox_from_its_record(tmp_path: Path):
    Ledger(tmp_path / "multihost.json", prefix="t9", hosts=["gw-1", "cl"]).save()

    mh = MultiHost.restore(tmp_path)

    assert mh.prefix == "t9"
    assert {name: h.underlay_ip for name, h in mh.hosts.items()} == {"gw-1": "198.19.255.11", "cl": "198.19.255.12"}


class _Machine:
    """Every namespace exists; commands are recorded, not run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.commands: list[tuple[str, ...]] = []
        monkeypatch.setattr(namespaces, "netns_exists", lambda name: True)
        for module in (namespaces, multihost):
            monkeypatch.setattr(module, "run", self.run)

    def run(self, *argv, **kwargs) -> str:
        self.commands.append(tuple(str(a) for a in argv))
        return "[]"


def test_stop_removes_only_what_the_record_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    ledger = Ledger(tmp_path / "multihost.json", prefix="t9", hosts=["gw-1"], namespaces=["t9-ul"])
    ledger.save()
    (tmp_path / "hosts" / "gw-1" / "run").mkdir(parents=True)
    machine = _Machine(monkeypatch)

    MultiHost.restore(tmp_path).stop()

    deleted = [argv[-1] for argv in machine.commands if argv[:3] == ("ip", "netns", "del")]
    assert deleted == ["t9-ul"]  # not t9-c nor t9-h-gw-1: someone else's under our names
    assert not (tmp_path / "multihost.json").exists() and not (tmp_path / "hosts").exists()


def test_stop_before_start_is_a_no_op(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    machine = _Machine(monkeypatch)

    MultiHost(tmp_path, "t9", ["gw-1"]).stop()

    assert machine.commands == []


def test_the_functional_tests_ask_for_the_tools_that_enter_namespaces():
    assert {"nsenter", "unshare"} <= set(required_tools())
