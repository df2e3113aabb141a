"""The benchmark's header: the machine, the versions on the data path and the commit measured."""

from bench.report import commit_id, header, machine

VERSIONS = {
    "ovs-vswitchd": "ovs-vswitchd (Open vSwitch) 3.1.0",
    "ovn-controller": "ovn-controller 23.03.1",
    "haproxy": "HAProxy version 2.6.12-1+deb12u4 2026/10/17 - https://haproxy.org/",
    "nginx": "nginx version: nginx/1.22.1",
    "wrk": "wrk 4.1.0 [epoll] Copyright (C) 2012 Will Glozer",
}


def fake_first_line(tool: str, *args: str) -> str:
    return VERSIONS[tool]


def fake_git(dirty: str | None = ""):
    def git(*args: str) -> str | None:
        if args == ("rev-parse", "HEAD"):
            return "a5a4b94c0ffee\n"
        assert args == ("status", "--porcelain"), args
        return dirty

    return git


def test_a_clean_tree_is_its_commit():
    assert commit_id(fake_git("")) == "a5a4b94c0ffee"


def test_a_changed_tree_says_dirty():
    assert commit_id(fake_git(" M bench/run.py\n")) == "a5a4b94c0ffee+dirty"
    # A tree git cannot describe is not claimed clean.
    assert commit_id(fake_git(None)) == "a5a4b94c0ffee+dirty"


def test_no_repository_is_unknown():
    assert commit_id(lambda *args: None) == "unknown"


def test_the_header_names_every_version_the_machine_and_the_commit():
    found = machine(first_line=fake_first_line, git=fake_git(""))
    for key in ("cpus", "cpu_model", "memory_gib", "kernel", "python", "pyroute2"):
        assert found[key] and found[key] != "unknown", (key, found)
    text = header(found, "2026-12-04 20:00:00 +0000")
    assert "commit a5a4b94c0ffee" in text.splitlines()[0]
    for line in VERSIONS.values():
        assert line in text
    assert f"Python {found['python']}" in text and f"pyroute2 {found['pyroute2']}" in text
    assert f"Linux {found['kernel']}" in text and f"{found['cpus']} CPUs" in text
