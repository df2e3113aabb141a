"""devtools.topology refuses VPC addresses outside the test ranges or their subnet, before creating anything."""

from __future__ import annotations

import pytest

from devtools.topology import Vpc


class RecordingNorthbound:
    """A northbound database and OVS that only record the commands they are given."""

    def __init__(self) -> None:
        self.commands: list[tuple[str, ...]] = []

    def nbctl(self, *args: str, timeout: float = 30) -> str:
        self.commands.append(args)
        return ""

    def nb_db_running(self) -> bool:
        return True

    def vsctl(self, *args: str, timeout: float = 30) -> str:
        self.commands.append(args)
        return ""

    def ovs_db_running(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("cidr6", "gateway6", "message"),
    [
        ("fd00::/64", "fd00::1", "outside 2001:db8::/32"),
        ("2001:db8:0:1::/64", "2001:db8:0:2::1", "not in 2001:db8:0:1::/64"),
        ("2001:db8:0:1::/64", "", "both cidr6 and gateway6"),
    ],
)
def test_a_bad_ipv6_subnet_is_refused_before_anything_is_created(cidr6: str, gateway6: str, message: str) -> None:
    northbound = RecordingNorthbound()
    with pytest.raises(ValueError, match=message):
        Vpc(northbound, "t", cidr6=cidr6, gateway6=gateway6)
    assert northbound.commands == []


def test_the_router_port_gets_both_networks_and_ports_both_addresses() -> None:
    northbound = RecordingNorthbound()
    vpc = Vpc(northbound, "t", cidr6="2001:db8:0:1::/64", gateway6="2001:db8:0:1::1")
    router_ports = [c for c in northbound.commands if "lrp-add" in c]
    assert router_ports and "198.18.0.1/24" in router_ports[0] and "2001:db8:0:1::1/64" in router_ports[0]
    vpc.add_lb_port("lb-1", "00:22:0a:00:00:12", "198.18.0.12", ip6="2001:db8:0:1:0::12")
    assert northbound.commands[-1][-1] == "00:22:0a:00:00:12 198.18.0.12 2001:db8:0:1::12"


@pytest.mark.parametrize(
    ("ip6", "message"),
    [("2001:db8:0:9::12", "not in subnet 2001:db8:0:1::/64"), ("fd00::12", "outside 2001:db8::/32")],
)
def test_a_load_balancer_address_outside_the_ipv6_subnet_is_refused(ip6: str, message: str) -> None:
    vpc = Vpc(RecordingNorthbound(), "t", cidr6="2001:db8:0:1::/64", gateway6="2001:db8:0:1::1")
    with pytest.raises(ValueError, match=message):
        vpc.add_lb_port("lb-1", "00:22:0a:00:00:12", "198.18.0.12", ip6=ip6)


def test_an_ipv6_address_needs_a_subnet_with_an_ipv6_prefix() -> None:
    vpc = Vpc(RecordingNorthbound(), "t")
    with pytest.raises(ValueError, match="has no IPv6 prefix"):
        vpc.add_lb_port("lb-1", "00:22:0a:00:00:12", "198.18.0.12", ip6="2001:db8::12")
