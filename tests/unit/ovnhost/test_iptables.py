"""The rules the agent builds are the bytes python-iptables' own append path would build.

`iptables.build_rule` runs the extensions' final checks itself instead of
python-iptables' `Rule.final_check`, which re-parses every option first.
Building a rule reads nothing from the kernel (libxtables only), so this
needs no namespace; the jumps to our chains need the chains and are covered
by tests/functional/test_kernel_datapath.py.
"""

import ctypes
import gc
import weakref

import iptc
import pytest

from lbagent.desired.members import Member
from lbagent.ovnhost import iptables, iptdigest
from lbagent.ovnhost.iptables import TableId
from lbagent.ovnhost.nat import NatPlan, UdpAcl, UdpListener, nat_rules

MEMBERS = (
    Member("be-1", "198.18.0.21", 8000, 3, "off", False, 1025),
    Member("be-2", "198.18.0.22", 8001, 1, "off", False, 1026),
    Member("be-3", "2001:db8::21", 8000, 3, "off", False, 1027),
    Member("be-4", "2001:db8::22", 8001, 1, "off", False, 1028),
)
PLAN = NatPlan(
    "oabc0",
    "habc0",
    "198.18.0.12",
    "169.254.0.100",
    "169.254.0.101",
    (80, 443),
    MEMBERS,
    udp=(
        UdpListener(53, MEMBERS),
        UdpListener(54, MEMBERS, source_hash=True, acl=UdpAcl("white", ("198.18.0.0/24", "2001:db8::/64"))),
        UdpListener(55, MEMBERS, acl=UdpAcl("black", ("198.18.0.31/32", "2001:db8::31/128"))),
    ),
    vip6="2001:db8::12",
    inner6="fd4c:4241::100",
    outer6="fd4c:4241::101",
)
# Every rule but the jumps to our chains, which need the chains to exist.
RULES = [rule for rule in nat_rules(PLAN) if not rule.target.startswith("LBAGENT-")]


@pytest.fixture(autouse=True)
def no_tables():
    """python-iptables asks every table it believes exists whether a target is a chain
    of it, opening (and so making) the tables it has not seen: here, in the host's
    namespace. Told that none exists, it opens none."""
    iptables._declare_open(None)


def _as_python_iptables_appends(spec, monkeypatch) -> bytes:
    with monkeypatch.context() as patched:
        patched.setattr(iptables, "_final_check", lambda rule: None)
        rule = iptables.build_rule(spec)
    rule.final_check()  # what Chain.append_rule runs: re-parse every option, then check
    return bytes(rule.rule)


def test_the_rules_cover_every_kind_the_agent_writes():
    kinds = {
        (r.table, r.target, r.protocol, bool(r.probability), bool(r.mark), bool(r.src), bool(r.out_interface))
        for r in RULES
    }
    assert kinds == {
        ("nat", "DNAT", "tcp", False, False, False, False),
        ("nat", "DNAT", "udp", True, False, False, False),
        ("nat", "DNAT", "udp", False, False, False, False),
        ("nat", "HMARK", "udp", False, False, False, False),
        ("nat", "DNAT", "udp", False, True, False, False),
        ("nat", "SNAT", "", False, False, False, True),
        ("filter", "RETURN", "udp", False, False, True, False),
        ("filter", "DROP", "udp", False, False, False, False),
        ("filter", "DROP", "udp", False, False, True, False),
    }
    assert kinds == {  # and each kind in both families
        (r.table, r.target, r.protocol, bool(r.probability), bool(r.mark), bool(r.src), bool(r.out_interface))
        for r in RULES
        if r.family == 6
    }


@pytest.mark.parametrize("spec", RULES, ids=lambda r: r.tag)
def test_a_rule_is_the_bytes_python_iptables_would_append(spec, monkeypatch):
    ours = bytes(iptables.build_rule(spec).rule)
    assert ours == _as_python_iptables_appends(spec, monkeypatch)


@pytest.mark.parametrize("spec", RULES, ids=lambda r: r.tag)
def test_the_entry_appended_is_the_rules_bytes(spec):
    assert bytes(iptables.rule_entry(spec)) == bytes(iptables.build_rule(spec).rule)


@pytest.fixture
def no_collector():
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def _built_rules(monkeypatch) -> list:
    """Weak references to the python-iptables rules built from here on."""
    built, build = [], iptables.build_rule
    monkeypatch.setattr(iptables, "build_rule", lambda spec: _recorded(build(spec), built))
    return built


def _recorded(rule, built: list):
    built.append(weakref.ref(rule))
    return rule


def test_a_rule_whose_entry_was_taken_is_freed_without_the_cyclic_collector(monkeypatch, no_collector):
    built = _built_rules(monkeypatch)
    for spec in RULES:
        assert len(bytes(iptables.rule_entry(spec))) > 0
    assert built and all(ref() is None for ref in built)


def test_a_rule_left_to_itself_waits_for_the_cyclic_collector(monkeypatch, no_collector):
    # Why the test above can fail: python-iptables' own rule is cyclic garbage.
    built = _built_rules(monkeypatch)
    for spec in RULES:
        assert len(bytes(iptables.build_rule(spec).rule)) > 0
    assert all(ref() is not None for ref in built)
    gc.collect()
    assert all(ref() is None for ref in built)


def test_ipv6_rules_are_ipv6_entries_with_bracketed_destinations():
    dnat = next(r for r in RULES if r.family == 6 and r.target == "DNAT" and r.protocol == "tcp")
    rule = iptables.build_rule(dnat)
    assert isinstance(rule, iptc.Rule6)
    assert rule.dst == "2001:db8::12/128"
    assert dnat.to == "[fd4c:4241::101]:80"


def test_hmark_hashes_the_whole_source_address_of_its_family():
    hmarks = {r.family: iptables.build_rule(r).target for r in RULES if r.target == "HMARK"}
    assert {family: target.hmark_src_prefix for family, target in hmarks.items()} == {4: "32", 6: "128"}


def test_the_snat_check_completes_the_target():
    """SNAT's final check sets its range count; the kernel refuses a target without it."""
    snat = next(rule for rule in RULES if rule.target == "SNAT")
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(iptables, "_final_check", lambda rule: None)
        unchecked = bytes(iptables.build_rule(snat).rule)
    assert unchecked != bytes(iptables.build_rule(snat).rule)


def test_a_failing_extension_check_raises():
    rule = iptc.Rule()
    rule.create_match("statistic").parse("mode", "random")  # no probability
    rule.create_target("ACCEPT")
    with pytest.raises(iptc.XTablesError):
        iptables._final_check(rule)


FILTER, NAT, FILTER6, NAT6 = (TableId(4, "filter"), TableId(4, "nat"), TableId(6, "filter"), TableId(6, "nat"))


def _tables(rules, present):
    """The tables a pass converges for `rules`, as a look finds them from what is kept of the rules."""
    return iptables._tables_to_converge(iptables.wanted_nat(rules).tables, present)


def test_the_filter_table_is_converged_first_and_only_when_wanted_or_present():
    nat_only = [rule for rule in RULES if rule.table == "nat" and rule.family == 4]
    assert _tables(nat_only, {NAT}) == [NAT]  # never made without a list
    ipv4 = [rule for rule in RULES if rule.family == 4]
    assert _tables(ipv4, {NAT}) == [FILTER, NAT]  # the lists first
    assert _tables(nat_only, {NAT, FILTER}) == [FILTER, NAT]  # to take ours out


def test_the_ipv6_tables_are_converged_only_when_wanted_or_present():
    ipv4 = [rule for rule in RULES if rule.family == 4 and rule.table == "nat"]
    assert _tables(ipv4, {NAT, FILTER}) == [FILTER, NAT]  # no ip6tables state made
    assert _tables(RULES, {NAT}) == [FILTER, FILTER6, NAT, NAT6]  # lists of both first
    assert _tables(ipv4, {NAT, NAT6}) == [NAT, NAT6]  # to take ours out again


@pytest.fixture
def tables_read(monkeypatch):
    """`nat_state` on made-up tables: those present, and a digest per table read, each read recorded."""
    read = []

    def digest(name, family):
        read.append(TableId(family, name))
        return f"digest of {family} {name}"

    monkeypatch.setattr(iptables, "_present", lambda: {NAT, FILTER})
    monkeypatch.setattr(iptables, "table_digest", digest)
    return read


def test_what_is_kept_of_the_rules_gives_the_state_the_rules_give(tables_read):
    nat4 = [rule for rule in RULES if rule.family == 4 and rule.table == "nat"]
    for rules in (RULES, nat4, []):
        kept = iptables.wanted_nat(reversed(rules))  # the order of the rules does not count
        assert iptables.nat_state(kept) == iptables.nat_state(rules)
    assert tables_read == [FILTER, NAT] * 6
    assert iptables.nat_state(nat4).split(":")[1:] == ["digest of 4 filter", "digest of 4 nat"]
    assert "no 6 nat" in iptables.nat_state(RULES)  # wanted, not there yet: not read, which would make it
    assert iptables.wanted_nat(RULES) != iptables.wanted_nat(nat4)


def test_what_is_kept_of_the_rules_is_small_and_shares_its_table_sets():
    first = iptables.wanted_nat(RULES)
    again = iptables.wanted_nat(list(RULES))
    assert first == again and first.tables is again.tables
    assert first.tables == {FILTER, FILTER6, NAT, NAT6}
    assert not hasattr(first, "__dict__") and len(first.digest) == 64


def test_the_digest_layouts_match_the_kernel_structures():
    """iptdigest reads entries without libiptc; python-iptables' ctypes structures are the reference."""
    for family, entry in ((4, iptc.ip4tc.ipt_entry), (6, iptc.ip6tc.ip6t_entry)):
        layout = iptdigest.LAYOUTS[family]
        assert layout.next_offset == entry.next_offset.offset
        assert layout.volatile == slice(entry.comefrom.offset, entry.counters.offset + entry.counters.size)
        assert layout.volatile.stop == ctypes.sizeof(entry)  # the matches follow
