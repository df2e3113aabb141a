from lbagent.desired.members import Member
from lbagent.ovnhost.nat import NatPlan, NatRule, comment_hash, nat_rules


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
    rules = [r for r in nat_rules(plan(udp=((53, members),))) if r.protocol == "udp"]
    assert [(r.to, r.probability) for r in rules] == [("198.18.0.21:53", "0.250000"), ("198.18.0.22:53", "")]
    assert all(r.dst == "198.18.0.12" and r.dport == 53 and r.in_interface == "oabc0" for r in rules)
    fewer = [r for r in nat_rules(plan(udp=((53, members[1:]),))) if r.protocol == "udp"]
    assert not {r.hash for r in rules} & {r.hash for r in fewer}  # replaced together, in order
    assert [r for r in nat_rules(plan(udp=((53, ()),))) if r.protocol == "udp"] == []
