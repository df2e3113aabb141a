"""The objects the agent keeps for every load balancer (thousands on a host)
carry no instance dict, and members without options share one."""

from dataclasses import astuple, replace

import pytest

from lbagent.desired.memberoptions import NO_OPTIONS, GroupMember, TrafficOptions
from lbagent.desired.members import Member
from lbagent.naming import interface_names
from lbagent.ovnhost.host import HostLook, HostObservation
from lbagent.ovnhost.iptables import WantedNat
from lbagent.ovnhost.nat import NatRule
from lbagent.state import Allocation
from lbagent.workers.ovn_worker import LbRuntime
from lbagent.workers.plan import Target, members_by_group

KEPT = [
    Allocation("169.254.0.2", "169.254.0.3", ports={"be-1": 1025}),
    Target("be-1", "198.18.0.20", 80, 1),
    Member("be-1", "198.18.0.20", 80, 1, "off", False, 1025),
    GroupMember("be-1", "198.18.0.20", 80, 1, "off", False, 1025),
    TrafficOptions(backup=True),
    interface_names("lb-1"),
    HostObservation("o-port", True),
    HostLook("lb-1", "lb-lb-1", None, WantedNat("0" * 64, frozenset())),  # links: any value will do here
    WantedNat("0" * 64, frozenset()),
    LbRuntime(),
]


@pytest.mark.parametrize("kept", KEPT, ids=lambda kept: type(kept).__name__)
def test_kept_objects_have_no_instance_dict(kept):
    assert not hasattr(kept, "__dict__")


def test_what_was_computed_once_comes_with_the_object():
    # The hashes of rules already in the kernel's tables stay what they were.
    rule = NatRule("LB-PRE", "listener", "DNAT", to="169.254.0.3:80")
    assert rule.comment == "c12b2fe6baa9:listener"
    assert replace(rule, src="10.0.0.0/8", family=6).hash == "ac609cf18b59"
    assert rule == NatRule("LB-PRE", "listener", "DNAT", to="169.254.0.3:80")
    allocation = Allocation("169.254.0.2", "169.254.0.3", ports={"be-1": 1025})
    assert allocation.json_text == '{"inner":"169.254.0.2","outer":"169.254.0.3","salt":0,"ports":{"be-1":1025}}'


def test_a_targets_values_are_its_fields_in_order():
    target = Target("be-1", "198.18.0.20", 80, 1, check_port=8080)
    assert target.values() == astuple(target) == ("be-1", "198.18.0.20", 80, 1, "off", False, False, 0, 8080)


def test_members_without_options_share_one():
    targets = {"bg": [Target("be-1", "198.18.0.20", 80, 1), Target("be-2", "198.18.0.21", 80, 1, backup=True)]}
    plain, backup = members_by_group(targets, {"be-1": 1025, "be-2": 1026})["bg"]
    assert plain.options is NO_OPTIONS
    assert backup.options == TrafficOptions(backup=True) and backup.options is not NO_OPTIONS
