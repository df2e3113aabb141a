import pytest

from lbagent.desired.model import LoadBalancer, Pod, PodSelector, Subnet
from lbagent.ovnhost.iptables import TableId, wanted_nat
from lbagent.state import Allocation
from lbagent.workers.plan import Target, group_targets, host_spec, members_by_group, selected_pods


def pod(pod_id, ip, ready=True, namespace="shop", labels=None, ports=None):
    return Pod(
        id=pod_id,
        namespace=namespace,
        ip=ip,
        ready=ready,
        labels=labels or {"app": "web"},
        ports=ports if ports is not None else [{"name": "http", "port": 8080, "protocol": "tcp"}],
    )


def test_selects_ready_pods_in_the_namespace_with_all_labels():
    pods = [
        pod("p1", "198.18.0.21"),
        pod("p2", "198.18.0.22", ready=False),
        pod("p3", "198.18.0.23", namespace="other"),
        pod("p4", "198.18.0.24", labels={"app": "db"}),
        pod("p5", "198.18.0.25", labels={"app": "web", "tier": "front"}),
    ]
    selector = PodSelector(namespace="shop", labels={"app": "web"}, port=9000, weight=3)
    assert selected_pods(selector, pods) == [Target("p1", "198.18.0.21", 9000, 3), Target("p5", "198.18.0.25", 9000, 3)]


def test_named_port_is_looked_up_per_pod_and_pods_without_it_are_skipped():
    pods = [
        pod("p1", "198.18.0.21"),
        pod("p2", "198.18.0.22", ports=[{"name": "http", "port": 8081, "protocol": "tcp"}]),
        pod("p3", "198.18.0.23", ports=[{"name": "metrics", "port": 9100, "protocol": "tcp"}]),
    ]
    selector = PodSelector(namespace="shop", labels={"app": "web"}, port="http")
    assert [(t.key, t.port) for t in selected_pods(selector, pods)] == [("p1", 8080), ("p2", 8081)]


def test_members_come_in_pod_id_order_whatever_the_list_order():
    pods = [pod("p3", "198.18.0.23"), pod("p1", "198.18.0.21"), pod("p2", "198.18.0.22")]
    selector = PodSelector(namespace="shop", labels={"app": "web"}, port="http")
    assert [t.key for t in selected_pods(selector, pods)] == ["p1", "p2", "p3"]
    assert selected_pods(selector, pods) == selected_pods(selector, list(reversed(pods)))


def _udp_lb(**listener):
    return LoadBalancer.model_validate(
        {
            "id": "lb-1",
            "network": {"subnet_id": "net-1", "ip": "198.18.0.12", "mac": "00:22:0a:00:00:12"},
            "listeners": [
                {"id": "dns", "listener_type": "udp", "listener_port": 53, "backend_group_id": "bg-1", **listener}
            ],
            "backend_groups": [
                {
                    "id": "bg-1",
                    "backends": [
                        {"id": "be-1", "address": "198.18.0.21", "port": 53},
                        {"id": "be-2", "address": "198.18.0.22", "port": 53},
                    ],
                }
            ],
        }
    )


def _udp_rules(lb, unhealthy=None):
    targets = group_targets(lb, [])
    ports = {"be-1": 1025, "be-2": 1026}
    subnet = Subnet(id="net-1", cidr="198.18.0.0/24", gateway="198.18.0.1")
    spec = host_spec(
        lb, subnet, Allocation("169.254.0.100", "169.254.0.101"), members_by_group(targets, ports), True, unhealthy
    )
    return [rule for rule in spec.nat if rule.protocol == "udp"]


def test_a_udp_listener_with_sch_hashes_client_addresses():
    rules = _udp_rules(_udp_lb(scheduler="sch"))
    assert [(r.target, r.to, r.mark) for r in rules] == [
        ("HMARK", "", ""),
        ("DNAT", "198.18.0.21:53", "0x0/0xffffffff"),
        ("DNAT", "198.18.0.22:53", ""),
    ]
    assert all(rule.table == "nat" for rule in rules)
    for scheduler in ("rr", "wrr", "wlc", "tch"):  # keep the weighted random split
        assert [r.target for r in _udp_rules(_udp_lb(scheduler=scheduler))] == ["DNAT", "DNAT"]


def test_a_udp_listener_access_list_becomes_filter_rules():
    rules = _udp_rules(_udp_lb(acl={"type": "white", "cidrs": ["198.18.0.32/32"]}))
    acl = [(r.target, r.src, r.ct_orig_dst, r.ct_orig_dport) for r in rules if r.table == "filter"]
    assert acl == [("RETURN", "198.18.0.32/32", "198.18.0.12", 53), ("DROP", "", "198.18.0.12", 53)]
    black = _udp_rules(_udp_lb(acl={"type": "black", "cidrs": ["198.18.0.31/32"]}))
    assert [(r.target, r.src) for r in black if r.table == "filter"] == [("DROP", "198.18.0.31/32")]
    assert not [r for r in _udp_rules(_udp_lb()) if r.table == "filter"]


def test_unhealthy_members_leave_the_hash_too():
    rules = _udp_rules(_udp_lb(scheduler="sch"), unhealthy={"dns": {"be-1"}})
    assert [(r.target, r.to) for r in rules] == [("DNAT", "198.18.0.22:53")]


# --- dual stack ----------------------------------------------------------------------

DUAL_SUBNET = Subnet(
    id="net-1", cidr="198.18.0.0/24", gateway="198.18.0.1", cidr6="2001:db8:0:1::/64", gateway6="2001:db8:0:1::1"
)
PAIR6 = Allocation("169.254.0.100", "169.254.0.101", inner6="fd4c:4241::4", outer6="fd4c:4241::5")


def _web_lb(ip6=None):
    network = {"subnet_id": "net-1", "ip": "198.18.0.12", "mac": "00:22:0a:00:00:12"}
    if ip6:
        network["ip6"] = ip6
    return LoadBalancer.model_validate(
        {
            "id": "lb-1",
            "network": network,
            "listeners": [{"id": "web", "listener_type": "http", "listener_port": 80, "backend_group_id": "bg-1"}],
            "backend_groups": [
                {"id": "bg-1", "pod_selector": {"namespace": "shop", "labels": {"app": "web"}, "port": "http"}}
            ],
        }
    )


def test_a_load_balancer_without_ip6_takes_only_ipv4_pods():
    pods = [pod("p1", "198.18.0.21"), pod("p2", "2001:db8:0:1::22")]
    assert [t.address for t in group_targets(_web_lb(), pods)["bg-1"]] == ["198.18.0.21"]
    dual = group_targets(_web_lb("2001:db8:0:1::12"), pods)["bg-1"]
    assert [t.address for t in dual] == ["198.18.0.21", "2001:db8:0:1::22"]


def test_a_dual_stack_host_spec_carries_the_ipv6_half_and_its_nat_rules():
    lb = _web_lb("2001:db8:0:1::12")
    targets = group_targets(lb, [pod("p1", "198.18.0.21"), pod("p2", "2001:db8:0:1::22")])
    members = members_by_group(targets, {"bg-1/p1": 1025, "bg-1/p2": 1026})
    spec = host_spec(lb, DUAL_SUBNET, PAIR6, members, True)
    ipv6 = spec.links.ipv6
    assert ipv6 is not None
    assert (ipv6.vip, ipv6.prefixlen, ipv6.gateway, ipv6.inner, ipv6.outer) == (
        "2001:db8:0:1::12",
        64,
        "2001:db8:0:1::1",
        "fd4c:4241::4",
        "fd4c:4241::5",
    )
    assert {(r.family, r.to) for r in spec.nat if r.target == "DNAT"} == {
        (4, "169.254.0.101:80"),
        (4, "198.18.0.21:8080"),  # each member in its own family only
        (6, "[fd4c:4241::5]:80"),
        (6, "[2001:db8:0:1::22]:8080"),
    }
    assert host_spec(_web_lb(), DUAL_SUBNET, PAIR6, members, True).links.ipv6 is None
    look = spec.look()  # what is kept for the resyncs' looks: the rules' digest, not the rules
    assert (look.lb_id, look.netns, look.links) == (spec.lb_id, spec.netns, spec.links)
    assert look.nat == wanted_nat(spec.nat) and look.nat.tables == {TableId(4, "nat"), TableId(6, "nat")}


def test_ip6_without_an_ipv6_subnet_or_pair_is_refused_rather_than_half_built():
    lb = _web_lb("2001:db8:0:1::12")
    ipv4_subnet = Subnet(id="net-1", cidr="198.18.0.0/24", gateway="198.18.0.1")
    with pytest.raises(ValueError, match="has ip6 without"):
        host_spec(lb, ipv4_subnet, PAIR6, {}, True)
    with pytest.raises(ValueError, match="has ip6 without"):
        host_spec(lb, DUAL_SUBNET, Allocation("169.254.0.100", "169.254.0.101"), {}, True)
