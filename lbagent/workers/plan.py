"""From desired state plus allocations to what the host and haproxy must hold.

Pure functions: no I/O, so the whole mapping from the API's view of a load
balancer to namespaces, links, rules and haproxy servers is unit-testable.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from lbagent.desired.fields import family_of
from lbagent.desired.memberoptions import NO_OPTIONS, GroupMember, TrafficOptions, check_port_key
from lbagent.desired.members import Member
from lbagent.naming import interface_names, netns_name
from lbagent.ovnhost.host import HostSpec
from lbagent.ovnhost.links import Ipv6Spec, LinkSpec
from lbagent.ovnhost.nat import NatPlan, UdpAcl, UdpListener, nat_rules
from lbagent.state import Allocation


@dataclass(frozen=True, slots=True)
class Target:
    """A group member before it has a port on INNER."""

    key: str
    address: str
    port: int
    weight: int
    send_proxy: str = "off"
    ssl: bool = False
    backup: bool = False
    slow_start: int = 0  # the group's
    check_port: int | None = None  # the group's health_check_port

    def values(self) -> tuple:
        """Its fields' values, in their order."""
        return tuple(getattr(self, name) for name in self.__slots__)


def selected_pods(selector, pods) -> list[Target]:
    """The ready pods in the selector's namespace carrying all its labels, on
    its port (a number, or a name looked up on each pod; pods without it are
    skipped), in pod id order: the order the region controller lists pods in
    means nothing, and must not look like a change of the load balancers."""
    targets = []
    for pod in pods:
        if not pod.ready or pod.namespace != selector.namespace:
            continue
        if any(pod.labels.get(k) != v for k, v in selector.labels.items()):
            continue
        port = (
            selector.port
            if isinstance(selector.port, int)
            else next((p.port for p in pod.ports if p.name == selector.port), None)
        )
        if port is not None:
            targets.append(Target(pod.id, pod.ip, port, selector.weight))
    return sorted(targets, key=lambda t: t.key)


def group_targets(lb, pods) -> dict[str, list[Target]]:
    """The members of each group. A load balancer without an IPv6 VIP has no
    IPv6 source to reach an IPv6 member from: the pods it selects are taken
    in its own family only (its backends are checked so when they arrive)."""
    groups = {}
    if lb.network.ip6 is None:
        pods = [pod for pod in pods if family_of(pod.ip) == 4]
    for group in lb.backend_groups:
        from_group = {"slow_start": group.slow_start, "check_port": group.health_check_port}
        targets = [
            Target(b.id, b.address, b.port, b.weight, b.send_proxy, b.ssl, b.backup, **from_group)
            for b in group.backends
        ]
        if group.pod_selector is not None:
            targets += [
                Target(f"{group.id}/{t.key}", t.address, t.port, t.weight, **from_group)
                for t in selected_pods(group.pod_selector, pods)
            ]
        groups[group.id] = targets
    return groups


def _keys_of(target: Target) -> tuple[str, ...]:
    return (target.key,) if target.check_port is None else (target.key, check_port_key(target.key))


def member_keys(targets: dict[str, list[Target]]) -> list[str]:
    """Every key that needs a port on INNER, in a stable order: each member's,
    and the one leading to its health check port where its group has one."""
    return list(dict.fromkeys(key for group in targets.values() for t in group for key in _keys_of(t)))


def _member(target: Target, ports: dict[str, int]) -> GroupMember:
    options = TrafficOptions(
        backup=target.backup,
        slow_start=target.slow_start,
        check_port=target.check_port,
        mapped_check_port=None if target.check_port is None else ports[check_port_key(target.key)],
    )
    if options == NO_OPTIONS:  # most members: one shared object rather than thousands of equal ones
        options = NO_OPTIONS
    t = target
    return GroupMember(t.key, t.address, t.port, t.weight, t.send_proxy, t.ssl, ports[t.key], options=options)


def members_by_group(targets: dict[str, list[Target]], ports: dict[str, int]) -> dict[str, list[Member]]:
    return {group_id: [_member(t, ports) for t in group] for group_id, group in targets.items()}


def udp_listeners(lb):
    if not lb.enabled:
        return []
    return [ls for ls in lb.listeners if ls.enabled and not ls.kind.through_haproxy]


def host_spec(
    lb,
    subnet,
    allocation: Allocation,
    members: dict[str, list[Member]],
    tx_checksum_off: bool,
    unhealthy: dict[str, set[str]] | None = None,
) -> HostSpec:
    """`unhealthy` names, per UDP listener id, the members its health check
    has taken out: they get no new flows."""
    unhealthy = unhealthy or {}
    names = interface_names(lb.id, allocation.salt)
    network = ipaddress.IPv4Network(subnet.cidr)
    ipv6 = ipv6_spec(lb, subnet, allocation)
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
        ipv6=ipv6,
    )
    tcp_ports = tuple(
        sorted(
            listener.listener_port for listener in lb.listeners if listener.enabled and listener.kind.through_haproxy
        )
    )
    unique: dict[str, Member] = {}
    for group_members in members.values():
        for member in group_members:
            unique.setdefault(member.key, member)
    udp = tuple(
        UdpListener(
            listener.listener_port,
            tuple(
                m for m in members.get(listener.backend_group_id, []) if m.key not in unhealthy.get(listener.id, set())
            ),
            source_hash=listener.scheduler == "sch",
            acl=UdpAcl(listener.acl.type, tuple(listener.acl.cidrs)) if listener.acl is not None else None,
        )
        for listener in udp_listeners(lb)
    )
    nat = NatPlan(
        names.ovn_ns,
        names.haproxy_ns,
        lb.network.ip,
        allocation.inner,
        allocation.outer,
        tcp_ports,
        tuple(unique.values()),
        udp,
        **({"vip6": ipv6.vip, "inner6": ipv6.inner, "outer6": ipv6.outer} if ipv6 is not None else {}),
    )
    return HostSpec(lb.id, netns_name(lb.id), links, tuple(nat_rules(nat)))


def ipv6_spec(lb, subnet, allocation: Allocation) -> Ipv6Spec | None:
    """The IPv6 half of a dual-stack load balancer; None for an IPv4-only one."""
    if lb.network.ip6 is None:
        return None
    if subnet.network6 is None or subnet.gateway6 is None or allocation.inner6 is None or allocation.outer6 is None:
        # The desired state's checks and the allocation at apply make this impossible.
        raise ValueError(f"load balancer {lb.id} has ip6 without an IPv6 subnet or pair")
    return Ipv6Spec(lb.network.ip6, subnet.network6.prefixlen, subnet.gateway6, allocation.inner6, allocation.outer6)
