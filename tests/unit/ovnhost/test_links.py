"""The namespace's gateway routes, computed without the kernel."""

from lbagent.naming import interface_names
from lbagent.ovnhost.iplib import KernelRoute
from lbagent.ovnhost.links import LinkSpec, _gateway_routes


def spec(routes) -> LinkSpec:
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
    )


def test_the_default_route_comes_first_and_the_others_in_order():
    routes = _gateway_routes(spec([("198.19.2.0/24", "198.18.0.254"), ("198.19.1.0/24", "198.18.0.253")]), 7)
    assert routes == [
        KernelRoute("0.0.0.0/0", "198.18.0.1", 7, None),
        KernelRoute("198.19.1.0/24", "198.18.0.253", 7, None),
        KernelRoute("198.19.2.0/24", "198.18.0.254", 7, None),
    ]


def test_a_subnet_route_to_everything_takes_the_gateways_place():
    routes = _gateway_routes(spec([("198.19.1.0/24", "198.18.0.253"), ("0.0.0.0/0", "198.18.0.254")]), 3)
    assert routes == [
        KernelRoute("0.0.0.0/0", "198.18.0.254", 3, None),
        KernelRoute("198.19.1.0/24", "198.18.0.253", 3, None),
    ]
