"""Backups and health check ports in a load balancer's namespace rules: the
kernel's udp balancing sends new flows to backups only while no other member
is up, and a group's health_check_port is reached through a port on INNER."""

from __future__ import annotations

from lbagent.desired.memberoptions import check_port_key, options_of, probed_port
from lbagent.desired.model import LoadBalancer, Subnet
from lbagent.ovnhost.nat import backend_key_from_comment
from lbagent.state import Allocation
from lbagent.workers.allocator import assign_ports
from lbagent.workers.plan import group_targets, host_spec, member_keys, members_by_group

SUBNET = Subnet(id="net-1", cidr="198.18.0.0/24", gateway="198.18.0.1")
ALLOCATION = Allocation("169.254.0.100", "169.254.0.101")


def lb_with(listener_type="udp", **group):
    return LoadBalancer.model_validate(
        {
            "id": "lb-1",
            "network": {"subnet_id": "net-1", "ip": "198.18.0.12", "mac": "00:22:0a:00:00:12"},
            "listeners": [{"id": "l", "listener_type": listener_type, "listener_port": 53, "backend_group_id": "bg-1"}],
            "backend_groups": [
                {
                    "id": "bg-1",
                    "backends": [
                        {"id": "main", "address": "198.18.0.21", "port": 53},
                        {"id": "spare", "address": "198.18.0.22", "port": 53, "weight": 2, "backup": True},
                    ],
                    **group,
                }
            ],
        }
    )


def spec_of(lb, unhealthy=None):
    targets = group_targets(lb, [])
    ports = assign_ports({}, member_keys(targets))
    return host_spec(lb, SUBNET, ALLOCATION, members_by_group(targets, ports), True, unhealthy), ports


def udp_targets(lb, unhealthy=None):
    spec, _ = spec_of(lb, unhealthy)
    return [rule.to for rule in spec.nat if rule.protocol == "udp" and rule.target == "DNAT"]


def test_udp_flows_skip_a_backup_while_another_member_is_up():
    assert udp_targets(lb_with()) == ["198.18.0.21:53"]


def test_udp_flows_go_to_the_backups_once_no_other_member_is_up():
    assert udp_targets(lb_with(), unhealthy={"l": {"main"}}) == ["198.18.0.22:53"]


def test_a_drained_member_counts_as_not_up_for_the_backups():
    lb = lb_with()
    drained = lb.backend_groups[0].backends[0].model_copy(update={"weight": 0})
    group = lb.backend_groups[0].model_copy(update={"backends": [drained, lb.backend_groups[0].backends[1]]})
    assert udp_targets(lb.model_copy(update={"backend_groups": [group]})) == ["198.18.0.22:53"]


def test_a_health_check_port_gets_a_port_on_inner_leading_to_it():
    spec, ports = spec_of(lb_with("tcp", health_check_port=8081))
    assert list(ports) == ["main", check_port_key("main"), "spare", check_port_key("spare")]
    dnat = {rule.dport: rule.to for rule in spec.nat if rule.dst == ALLOCATION.inner}
    assert dnat == {
        ports["main"]: "198.18.0.21:53",
        ports[check_port_key("main")]: "198.18.0.21:8081",
        ports["spare"]: "198.18.0.22:53",
        ports[check_port_key("spare")]: "198.18.0.22:8081",
    }
    # Read back from the rules' comments like every member's port.
    keys = {backend_key_from_comment(rule.comment) for rule in spec.nat if rule.dst == ALLOCATION.inner}
    assert keys == set(ports)


def test_without_a_health_check_port_members_take_one_port_and_are_probed_on_theirs():
    targets = group_targets(lb_with("tcp"), [])
    assert member_keys(targets) == ["main", "spare"]
    members = members_by_group(targets, assign_ports({}, member_keys(targets)))["bg-1"]
    assert [probed_port(m) for m in members] == [53, 53]
    assert [options_of(m).backup for m in members] == [False, True]
    checked = group_targets(lb_with("tcp", health_check_port=8081, slow_start=20), [])
    members = members_by_group(checked, assign_ports({}, member_keys(checked)))["bg-1"]
    assert [(probed_port(m), options_of(m).slow_start) for m in members] == [(8081, 20), (8081, 20)]
