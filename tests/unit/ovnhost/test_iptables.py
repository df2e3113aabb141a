"""The rules the agent builds are the bytes python-iptables' own append path would build.

`iptables.build_rule` runs the extensions' final checks itself instead of
python-iptables' `Rule.final_check`, which re-parses every option first.
Building a rule reads nothing from the kernel (libxtables only), so this
needs no namespace; the jumps to our chains need the chains and are covered
by tests/functional/test_kernel_datapath.py.
"""

import iptc
import pytest

from lbagent.desired.members import Member
from lbagent.ovnhost import iptables
from lbagent.ovnhost.nat import NatPlan, UdpAcl, UdpListener, nat_rules

MEMBERS = (
    Member("be-1", "198.18.0.21", 8000, 3, "off", False, 1025),
    Member("be-2", "198.18.0.22", 8001, 1, "off", False, 1026),
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
        UdpListener(54, MEMBERS, source_hash=True, acl=UdpAcl("white", ("198.18.0.0/24",))),
        UdpListener(55, MEMBERS, acl=UdpAcl("black", ("198.18.0.31/32",))),
    ),
)
# Every rule but the jumps to our chains, which need the chains to exist.
RULES = [rule for rule in nat_rules(PLAN) if not rule.target.startswith("LBAGENT-")]


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


@pytest.mark.parametrize("spec", RULES, ids=lambda r: r.tag)
def test_a_rule_is_the_bytes_python_iptables_would_append(spec, monkeypatch):
    ours = bytes(iptables.build_rule(spec).rule)
    assert ours == _as_python_iptables_appends(spec, monkeypatch)


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


def test_the_filter_table_is_converged_first_and_only_when_wanted_or_present():
    nat_only = [rule for rule in RULES if rule.table == "nat"]
    assert iptables._tables_to_converge(nat_only, {"nat"}) == ["nat"]  # never made without a list
    assert iptables._tables_to_converge(RULES, {"nat"}) == ["filter", "nat"]  # the lists first
    assert iptables._tables_to_converge(nat_only, {"nat", "filter"}) == ["filter", "nat"]  # to take ours out
