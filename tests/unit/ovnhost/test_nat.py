import hashlib

import pytest

from lbagent.desired.memberoptions import GroupMember, TrafficOptions
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


V4 = Member("be-1", "198.18.0.21", 8000, 1, "off", False, 1025)
V6 = Member("be-6", "2001:db8::21", 8080, 1, "off", False, 1026)
DUAL = dict(vip6="2001:db8::12", inner6="fd4c:4241::100", outer6="fd4c:4241::101")


def _family(rules: list[NatRule], family: int) -> set[tuple]:
    return {(r.table, r.chain, r.target, r.to, r.dst, r.dport) for r in rules if r.family == family}


def test_an_ipv4_only_plan_has_no_ipv6_rules_and_keeps_its_hashes():
    assert {r.family for r in nat_rules(plan(members=(V4, V6)))} == {4}
    assert [r.hash for r in nat_rules(plan(members=(V4, V6)))] == [r.hash for r in nat_rules(plan(members=(V4,)))]
    assert [r.hash for r in nat_rules(plan(members=(V4,), **DUAL)) if r.family == 4] == [
        r.hash for r in nat_rules(plan(members=(V4,)))
    ]


def test_a_dual_stack_plan_repeats_the_rules_in_ipv6():
    rules = nat_rules(plan(members=(V4, V6), **DUAL))
    assert _family(rules, 6) == {
        ("nat", "PREROUTING", "LBAGENT-PRE", "", "", 0),
        ("nat", "POSTROUTING", "LBAGENT-POST", "", "", 0),
        ("nat", "LBAGENT-PRE", "DNAT", "[fd4c:4241::101]:80", "2001:db8::12", 80),
        ("nat", "LBAGENT-PRE", "DNAT", "[2001:db8::21]:8080", "fd4c:4241::100", 1026),
        ("nat", "LBAGENT-POST", "SNAT", "2001:db8::12", "", 0),
    }
    assert _family(rules, 4) == {
        ("nat", "PREROUTING", "LBAGENT-PRE", "", "", 0),
        ("nat", "POSTROUTING", "LBAGENT-POST", "", "", 0),
        ("nat", "LBAGENT-PRE", "DNAT", "169.254.0.101:80", "198.18.0.12", 80),
        ("nat", "LBAGENT-PRE", "DNAT", "198.18.0.21:8000", "169.254.0.100", 1025),
        ("nat", "LBAGENT-POST", "SNAT", "198.18.0.12", "", 0),
    }
    assert len({r.hash for r in rules}) == len(rules)  # the jumps of both families are told apart
    assert [r.in_interface for r in rules if r.dport == 1026] == ["habc0"]
    assert [r.out_interface for r in rules if r.target == "SNAT"] == ["oabc0", "oabc0"]


def test_an_ipv6_vip_needs_its_pair():
    with pytest.raises(ValueError):
        plan(vip6="2001:db8::12")


def test_a_check_port_of_an_ipv6_member_is_bracketed():
    options = TrafficOptions(check_port=9000, mapped_check_port=1027)
    member = GroupMember("be-6", "2001:db8::21", 8080, 1, "off", False, 1026, options=options)
    rules = nat_rules(plan(members=(member,), **DUAL))
    assert {(r.family, r.dport, r.to) for r in rules if r.tag.startswith("backend ")} == {
        (6, 1026, "[2001:db8::21]:8080"),
        (6, 1027, "[2001:db8::21]:9000"),
    }


def test_haproxy_reaches_a_member_at_inner_of_its_family():
    rules = nat_rules(plan(members=(V4, V6), **DUAL))
    backends = {(r.family, r.dst) for r in rules if r.tag.startswith("backend ")}
    assert backends == {(4, "169.254.0.100"), (6, "fd4c:4241::100")}


def _udp(rules: list[NatRule], family: int) -> list[NatRule]:
    return [r for r in rules if r.protocol == "udp" and r.family == family and r.table == "nat"]


def test_udp_balances_each_family_over_its_own_members():
    members = (
        Member("a", "198.18.0.21", 53, 1, "off", False, 0),
        Member("b", "2001:db8::21", 53, 1, "off", False, 0),
        Member("c", "198.18.0.22", 53, 3, "off", False, 0),
        Member("d", "2001:db8::22", 53, 2, "off", False, 0),
        GroupMember("e", "2001:db8::23", 53, 2, "off", False, 0, options=TrafficOptions(backup=True)),
    )
    rules = nat_rules(plan(udp=(UdpListener(53, members),), **DUAL))
    assert [(r.to, r.probability, r.dst) for r in _udp(rules, 4)] == [
        ("198.18.0.21:53", "0.250000", "198.18.0.12"),
        ("198.18.0.22:53", "", "198.18.0.12"),
    ]
    assert [(r.to, r.probability, r.dst) for r in _udp(rules, 6)] == [
        ("[2001:db8::21]:53", "0.333333", "2001:db8::12"),
        ("[2001:db8::22]:53", "", "2001:db8::12"),
    ]
    # the backup serves IPv6 once no IPv6 primary is left, whatever IPv4 has
    only_backup = nat_rules(plan(udp=(UdpListener(53, members[:1] + members[4:]),), **DUAL))
    assert [r.to for r in _udp(only_backup, 6)] == ["[2001:db8::23]:53"]
    assert [r.to for r in _udp(only_backup, 4)] == ["198.18.0.21:53"]
    # and IPv4 rules stay as an IPv4-only group of the same members had them
    ipv4_only = nat_rules(plan(udp=(UdpListener(53, (members[0], members[2])),)))
    assert [r.hash for r in _udp(rules, 4)] == [r.hash for r in _udp(ipv4_only, 4)]


def test_an_ipv6_listener_without_ipv6_members_opens_nothing():
    members = (Member("a", "198.18.0.21", 53, 1, "off", False, 0),)
    assert _udp(nat_rules(plan(udp=(UdpListener(53, members),), **DUAL)), 6) == []


def test_sch_hashes_the_whole_ipv6_source():
    members = (
        Member("a", "2001:db8::21", 53, 1, "off", False, 0),
        Member("b", "2001:db8::22", 53, 2, "off", False, 0),
        Member("c", "198.18.0.21", 53, 1, "off", False, 0),
    )
    rules = nat_rules(plan(udp=(UdpListener(53, members, source_hash=True),), **DUAL))
    ipv6 = _udp(rules, 6)
    assert ipv6[0].target == "HMARK" and ipv6[0].hmark_mod == 3
    assert _members_of(ipv6, range(3)) == ["[2001:db8::21]:53"] + ["[2001:db8::22]:53"] * 2
    assert [(r.target, r.to) for r in _udp(rules, 4)] == [("DNAT", "198.18.0.21:53")]  # one member: no hash


def _acl_by_family(acl: UdpAcl) -> dict[int, list[tuple[str, str, str]]]:
    members = (Member("a", "198.18.0.21", 53, 1, "off", False, 0), Member("b", "2001:db8::21", 53, 1, "off", False, 0))
    rules = [r for r in nat_rules(plan(udp=(UdpListener(53, members, acl=acl),), **DUAL)) if r.table == "filter"]
    return {
        family: [(r.target, r.src, r.ct_orig_dst) for r in rules if r.family == family and r.chain == "LBAGENT-ACL"]
        for family in (4, 6)
    }


def test_a_white_list_of_one_family_refuses_every_source_of_the_other():
    assert _acl_by_family(UdpAcl("white", ("2001:db8:1::/48",))) == {
        4: [("DROP", "", "198.18.0.12")],
        6: [("RETURN", "2001:db8:1::/48", "2001:db8::12"), ("DROP", "", "2001:db8::12")],
    }
    assert _acl_by_family(UdpAcl("white", ("198.18.1.0/24",))) == {
        4: [("RETURN", "198.18.1.0/24", "198.18.0.12"), ("DROP", "", "198.18.0.12")],
        6: [("DROP", "", "2001:db8::12")],
    }


def test_a_black_list_of_one_family_refuses_no_source_of_the_other():
    assert _acl_by_family(UdpAcl("black", ("2001:db8:1::/48", "198.18.1.0/24"))) == {
        4: [("DROP", "198.18.1.0/24", "198.18.0.12")],
        6: [("DROP", "2001:db8:1::/48", "2001:db8::12")],
    }
    assert _acl_by_family(UdpAcl("black", ("2001:db8:1::/48",)))[4] == []


def test_an_ipv6_prefix_changes_only_the_ipv6_list():
    before = _acl(UdpAcl("white", ("198.18.0.0/25",)))
    members = (Member("a", "198.18.0.21", 53, 1, "off", False, 0),)
    after = [
        r
        for r in nat_rules(
            plan(udp=(UdpListener(53, members, acl=UdpAcl("white", ("198.18.0.0/25", "2001:db8::/64"))),))
        )
        if r.table == "filter"
    ]
    assert [r.hash for r in after] == [r.hash for r in before]  # no IPv6 VIP: no IPv6 list either
