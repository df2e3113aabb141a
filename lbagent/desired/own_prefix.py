"""Addresses of a desired state that fall in the agent's own IPv6 prefix (`[agent] inner_prefix6`).

The IPv6 inner/outer pairs of the load balancers live in that prefix, on the
veths between each namespace and the host: a VIP, gateway, next hop, route,
backend or pod there would be routed to the host instead of the VPC, and a
backend there would reach another load balancer's haproxy past its access
list. The prefix is configuration, not part of the body, so this check is
the agent's (like 169.254/16 for IPv4, which the model refuses by itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import IPv6Network, ip_address

from lbagent.desired.details import Location, json_pointer
from lbagent.desired.fields import family_of
from lbagent.desired.model import DesiredState


def own_prefix_problems(desired: DesiredState, inner_prefix6: str) -> list[dict[str, str]]:
    """The api.md error details of the IPv6 values inside `inner_prefix6`."""
    prefix = IPv6Network(inner_prefix6)
    message = f"must not lie in {prefix}, the agent's own prefix for its IPv6 pairs ([agent] inner_prefix6)"
    return [{"path": json_pointer(at), "message": message} for at in _inside(desired, prefix)]


def _inside(desired: DesiredState, prefix: IPv6Network) -> Iterator[Location]:
    for s, subnet in enumerate(desired.subnets):
        if subnet.network6 is not None and subnet.network6.overlaps(prefix):
            yield ("subnets", s, "cidr6")
        for r, route in enumerate(subnet.routes):
            if isinstance(route.network, IPv6Network) and route.network.subnet_of(prefix):
                yield ("subnets", s, "routes", r, "cidr")
    for p, pod in enumerate(desired.pods):
        if _in(pod.ip, prefix):
            yield ("pods", p, "ip")
    for i, lb in enumerate(desired.loadbalancers):
        for g, group in enumerate(lb.backend_groups):
            for b, backend in enumerate(group.backends):
                if _in(backend.address, prefix):
                    yield ("loadbalancers", i, "backend_groups", g, "backends", b, "address")


def _in(address: str, prefix: IPv6Network) -> bool:
    return family_of(address) == 6 and ip_address(address) in prefix
