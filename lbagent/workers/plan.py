"""From desired state plus allocations to what the host and haproxy must hold.

Pure functions: no I/O, so the whole mapping from the API's view of a load
balancer to namespaces, links, rules and haproxy servers is unit-testable.
"""

from __future__ import annotations

import ipaddress

from lbagent.members import Member
from lbagent.naming import interface_names, netns_name
from lbagent.ovnhost.datapath import LinkSpec
from lbagent.ovnhost.host import HostSpec
from lbagent.ovnhost.nat import NatPlan, nat_rules
from lbagent.state import Allocation

TCP_CLASS = ("tcp", "http", "https")


def member_keys(lb) -> list[str]:
    """Every key that needs a port on INNER, in a stable order."""
    keys: list[str] = []
    for group in lb.backend_groups:
        for backend in group.backends:
            if backend.id not in keys:
                keys.append(backend.id)
    return keys


def members_by_group(lb, ports: dict[str, int]) -> dict[str, list[Member]]:
    return {
        group.id: [
            Member(b.id, b.address, b.port, b.weight, b.send_proxy, b.ssl, ports[b.id]) for b in group.backends
        ]
        for group in lb.backend_groups
    }


def host_spec(lb, subnet, allocation: Allocation, members: dict[str, list[Member]], tx_checksum_off: bool) -> HostSpec:
    names = interface_names(lb.id, allocation.salt)
    network = ipaddress.IPv4Network(subnet.cidr)
    links = LinkSpec(
        names=names,
        mac=lb.network.mac.lower(),
        vip=lb.network.ip,
        prefixlen=network.prefixlen,
        gateway=subnet.gateway,
        mtu=subnet.mtu,
        routes=tuple((r.cidr, r.nexthop) for r in subnet.routes),
        inner=allocation.inner,
        outer=allocation.outer,
        tx_checksum_off=tx_checksum_off,
    )
    tcp_ports = tuple(sorted(
        listener.listener_port
        for listener in lb.listeners
        if listener.status == "enabled" and listener.listener_type in TCP_CLASS
    ))
    unique: dict[str, Member] = {}
    for group_members in members.values():
        for member in group_members:
            unique.setdefault(member.key, member)
    nat = NatPlan(names.ovn_ns, names.haproxy_ns, lb.network.ip, allocation.inner, allocation.outer,
                  tcp_ports, tuple(unique.values()))
    return HostSpec(lb.id, netns_name(lb.id), links, tuple(nat_rules(nat)))
