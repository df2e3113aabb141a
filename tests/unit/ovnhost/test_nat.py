import hashlib

import pytest

from lbagent.desired.members import Member
from lbagent.ovnhost.nat import (
    NatPlan,
    NatRule,
    UdpAcl,
    UdpListener,
    comment_hash,
    mark_blocks,
    nat_rules,
)


def plan(**kw):
    base = dict(
        ovn_ns="oabc0",
        haproxy_ns="habc0",
        vip="198.18.0.12",
        inner="169.254.0.100",
        outer="169.254.0.101",
        tcp_ports=(80,),
        members=(Member("be-1", "198.18.0.21", 8000, 1, "off", False, 1025),),
    )
    base.update(kw)
    return NatPlan(**base)


def test_hash_covers_rule_and_tag():
    rule = NatRule("LBAGENT-PRE", "t", "DNAT", "1.2.3.4:80")
    assert rule.hash != NatRule("LBAGENT-PRE", "t", "DNAT", "1.2.3.5:80").hash
    assert rule.hash != NatRule("LBAGENT-PRE", "u", "DNAT", "1.2.3.4:80").hash
    assert comment_hash(rule.comment) == rule.hash


def test_comment_hash_rejects_foreign_comments():
    assert comment_hash("hello") is None
    assert comment_hash("abc:tag") is None


def test_rules_of_a_load_balancer():
    rules = nat_rules(plan())
    targets = {(r.chain, r.target, r.to) for r in rules}
    assert ("LBAGENT-PRE", "DNAT", "169.254.0.101:80") in targets
    assert ("LBAGENT-PRE", "DNAT", "198.18.0.21:8000") in targets
    assert ("LBAGENT-POST", "SNAT", "169.254.0.100") not in targets  # haproxy sees the client
    assert ("LBAGENT-POST", "SNAT", "198.18.0.12") in targets
    assert ("PREROUTING", "LBAGENT-PRE", "") in targets
    assert len({r.hash for r in rules}) == len(rules)


def test_changing_a_backend_changes_exactly_its_rule():
    before = {r.hash for r in nat_rules(plan())}
    after = {r.hash for r in nat_rules(plan(members=(Member("be-1", "198.18.0.22", 8000, 1, "off", False, 1025),)))}
    assert len(before - after) == 1 and len(after - before) == 1


def test_udp_rules_split_new_flows_by_weight_and_change_as_a_set():
    members = (
        Member("a", "198.18.0.21", 53, 1, "off", False, 0),
        Member("b", "198.18.0.22", 53, 3, "off", False, 0),
        Member("c", "198.18.0.23", 53, 0, "off", False, 0),
    )
    rules = [r for r in nat_rules(plan(udp=(UdpListener(53, members),))) if r.protocol == "udp"]
    assert [(r.to, r.probability) for r in rules] == [("198.18.0.21:53", "0.250000"), ("198.18.0.22:53", "")]
    assert all(r.dst == "198.18.0.12" and r.dport == 53 and r.in_interface == "oabc0" for r in rules)
    fewer = [r for r in nat_rules(plan(udp=(UdpListener(53, members[1:]),))) if r.protocol == "udp"]
    assert not {r.hash for r in rules} & {r.hash for r in fewer}  # replaced together, in order
    assert [r for r in nat_rules(plan(udp=(UdpListener(53, ()),))) if r.protocol == "udp"] == []


def _old_hash(rule: NatRule) -> str:
    """The hash as agents computed it before rules had a table, a source, marks or conntrack."""
    material = repr(
        (
            rule.chain,
            rule.target,
            rule.to,
            rule.in_interface,
            rule.out_interface,
            rule.protocol,
            rule.dst,
            rule.dport,
            rule.probability,
            rule.tag,
        )
    )
    return hashlib.sha256(material.encode()).hexdigest()[:12]


def test_rules_without_the_new_fields_keep_their_hashes():
    """An upgraded agent finds the rules an older one wrote still in place."""
    members = (Member("a", "198.18.0.21", 53, 1, "off", False, 0), Member("b", "198.18.0.22", 53, 3, "off", False, 0))
    rules = nat_rules(plan(udp=(UdpListener(53, members),)))
    assert [r.hash for r in rules] == [_old_hash(r) for r in rules]
    assert NatRule("C", "t", "DROP", table="filter").hash != NatRule("C", "t", "DROP").hash
    assert NatRule("C", "t", "DROP", src="198.18.0.0/24").hash != NatRule("C", "t", "DROP").hash
    assert NatRule("C", "t", "DNAT", mark="0x0/0x1").hash != NatRule("C", "t", "DNAT", mark="0x1/0x1").hash
    assert NatRule("C", "t", "HMARK", hmark_mod=2).hash != NatRule("C", "t", "HMARK", hmark_mod=3).hash
    assert NatRule("C", "t", "DROP", ct_orig_dst="198.18.0.12", ct_orig_dport=53).hash != (
        NatRule("C", "t", "DROP", ct_orig_dst="198.18.0.12", ct_orig_dport=54).hash
    )


@pytest.mark.parametrize("start,end", [(0, 1), (0, 2), (0, 3), (1, 7), (3, 11), (5, 6), (0, 256), (17, 300)])
def test_mark_blocks_cover_exactly_the_range(start, end):
    covered = [mark for mark in range(1024) if any(mark & mask == value for value, mask in mark_blocks(start, end))]
    assert covered == list(range(start, end))
    assert len(mark_blocks(start, end)) <= 2 * end.bit_length()


def _members_of(rules: list[NatRule], marks: range) -> list[str]:
    """Which member each mark's datagram reaches: the first DNAT rule that matches it."""
    dnat = [r for r in rules if r.target == "DNAT"]
    reached = []
    for mark in marks:
        for rule in dnat:
            if not rule.mark:
                reached.append(rule.to)
                break
            value, mask = (int(part, 16) for part in rule.mark.split("/"))
            if mark & mask == value:
                reached.append(rule.to)
                break
    return reached


def test_sch_hashes_the_source_and_splits_the_marks_by_weight():
    members = (
        Member("a", "198.18.0.21", 53, 2, "off", False, 0),
        Member("b", "198.18.0.22", 53, 6, "off", False, 0),
        Member("c", "198.18.0.23", 53, 0, "off", False, 0),
        Member("d", "198.18.0.24", 53, 4, "off", False, 0),
    )
    rules = [r for r in nat_rules(plan(udp=(UdpListener(53, members, source_hash=True),))) if r.protocol == "udp"]
    hmark = rules[0]
    assert hmark.target == "HMARK" and hmark.hmark_mod == 6  # weights 2:6:4 are 1:3:2
    assert all(r.dst == "198.18.0.12" and r.dport == 53 and r.in_interface == "oabc0" for r in rules)
    assert not any(r.probability for r in rules)
    assert _members_of(rules, range(6)) == ["198.18.0.21:53"] + ["198.18.0.22:53"] * 3 + ["198.18.0.24:53"] * 2
    assert not rules[-1].mark  # the last member takes whatever is left
    rr = [r for r in nat_rules(plan(udp=(UdpListener(53, members),))) if r.protocol == "udp"]
    assert not {r.hash for r in rules} & {r.hash for r in rr}  # a change of scheduler replaces them all


def test_sch_with_one_member_needs_no_hash():
    members = (Member("a", "198.18.0.21", 53, 1, "off", False, 0),)
    rules = [r for r in nat_rules(plan(udp=(UdpListener(53, members, source_hash=True),))) if r.protocol == "udp"]
    assert [(r.target, r.to, r.mark) for r in rules] == [("DNAT", "198.18.0.21:53", "")]


def _acl(acl: UdpAcl | None, port: int = 53) -> list[NatRule]:
    members = (Member("a", "198.18.0.21", 53, 1, "off", False, 0),)
    return [r for r in nat_rules(plan(udp=(UdpListener(port, members, acl=acl),))) if r.table == "filter"]


def test_a_white_list_returns_for_its_prefixes_then_drops():
    rules = _acl(UdpAcl("white", ("198.18.0.0/25", "198.18.1.0/24")))
    assert [(r.chain, r.target, r.src) for r in rules] == [
        ("FORWARD", "LBAGENT-ACL", ""),
        ("LBAGENT-ACL", "RETURN", "198.18.0.0/25"),
        ("LBAGENT-ACL", "RETURN", "198.18.1.0/24"),
        ("LBAGENT-ACL", "DROP", ""),
    ]
    for rule in rules[1:]:
        assert (rule.in_interface, rule.protocol, rule.ct_orig_dst, rule.ct_orig_dport) == (
            "oabc0",
            "udp",
            "198.18.0.12",
            53,
        )
    changed = _acl(UdpAcl("white", ("198.18.0.0/25", "198.18.2.0/24")))
    assert {r.hash for r in rules} & {r.hash for r in changed} == {rules[0].hash}  # the list is replaced whole


def test_an_empty_white_list_drops_everyone():
    assert [(r.target, r.src) for r in _acl(UdpAcl("white", ()))] == [("LBAGENT-ACL", ""), ("DROP", "")]


def test_a_black_list_drops_its_prefixes_only():
    rules = _acl(UdpAcl("black", ("198.18.0.31/32", "198.18.0.64/26")))
    assert [(r.target, r.src) for r in rules] == [
        ("LBAGENT-ACL", ""),
        ("DROP", "198.18.0.31/32"),
        ("DROP", "198.18.0.64/26"),
    ]
    assert _acl(UdpAcl("black", ())) == []  # refuses no one: not even the filter table is needed


def test_no_access_list_no_filter_rules():
    assert _acl(None) == []
    assert {r.table for r in nat_rules(plan())} == {"nat"}
