"""The namespace's gateway routes of each family, computed without the kernel."""

import socket

from lbagent.naming import interface_names
from lbagent.ovnhost.iplib import KernelRoute
from lbagent.ovnhost.links import Ipv6Spec, LinkSpec, _gateway_routes

IPV6 = Ipv6Spec("2001:db8::12", 64, "2001:db8::1", "fd4c:4241::4", "fd4c:4241::5")


def spec(routes, ipv6: Ipv6Spec | None = None) -> LinkSpec:
    return LinkSpec(
        names=interface_names("lb-1", 0),
        mac="00:22:0a:00:00:12",
        vip="198.18.0.12",
        prefixlen=24,
        gateway="198.18.0.1",
        mtu=1442,
        routes=tuple(routes),
        inner="169.254.0.100",
        outer="169.254.0.101",
        tx_checksum_off=False,
        ipv6=ipv6,
    )


def ipv4_routes(routes, oif: int) -> list[KernelRoute]:
    return _gateway_routes(spec(routes), oif, socket.AF_INET)


def test_the_default_route_comes_first_and_the_others_in_order():
    routes = ipv4_routes([("198.19.2.0/24", "198.18.0.254"), ("198.19.1.0/24", "198.18.0.253")], 7)
    assert routes == [
        KernelRoute("0.0.0.0/0", "198.18.0.1", 7, None),
        KernelRoute("198.19.1.0/24", "198.18.0.253", 7, None),
        KernelRoute("198.19.2.0/24", "198.18.0.254", 7, None),
    ]


def test_a_subnet_route_to_everything_takes_the_gateways_place():
    routes = ipv4_routes([("198.19.1.0/24", "198.18.0.253"), ("0.0.0.0/0", "198.18.0.254")], 3)
    assert routes == [
        KernelRoute("0.0.0.0/0", "198.18.0.254", 3, None),
        KernelRoute("198.19.1.0/24", "198.18.0.253", 3, None),
    ]


def test_each_family_gets_its_own_default_route_and_only_its_own_routes():
    subnet_routes = [("198.19.1.0/24", "198.18.0.253"), ("2001:db8:1::/64", "2001:db8::fe")]
    dual = spec(subnet_routes, IPV6)
    assert _gateway_routes(dual, 4, socket.AF_INET) == [
        KernelRoute("0.0.0.0/0", "198.18.0.1", 4, None),
        KernelRoute("198.19.1.0/24", "198.18.0.253", 4, None),
    ]
    assert _gateway_routes(dual, 4, socket.AF_INET6) == [
        KernelRoute("::/0", "2001:db8::1", 4, None),
        KernelRoute("2001:db8:1::/64", "2001:db8::fe", 4, None),
    ]
    replaced = spec([("::/0", "2001:db8::fd")], IPV6)
    assert _gateway_routes(replaced, 4, socket.AF_INET6) == [KernelRoute("::/0", "2001:db8::fd", 4, None)]
