"""The iptables rules of one load balancer's namespace, as data.

Each rule carries a comment `<hash>:<tag>`; the hash covers the rule and its
tag, so "is this exact rule present?" is a set lookup on comments and any
edit of a rule (by hand or by an older agent) shows up as an unknown hash.
Tags are built only from validated ids and fixed words.

Most rules live in the nat table. UDP access lists are filter rules: the nat
table sees only the first datagram of a flow and is no place to drop
anything, while the filter table's FORWARD chain sees every datagram a
listener forwards, so a list that changes applies to flows already under way.

A dual-stack load balancer (a `vip6`) gets the same set of rules again in the
IPv6 tables (family 6), built from its IPv6 addresses and its IPv6 members;
an address of one family is never written into a table of the other.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from typing import Literal

from lbagent.desired.fields import family_of
from lbagent.desired.memberoptions import check_port_key, options_of
from lbagent.desired.members import Member

HASH_CHARS = 12
PRE_CHAIN = "LBAGENT-PRE"
POST_CHAIN = "LBAGENT-POST"
ACL_CHAIN = "LBAGENT-ACL"
# Our chains hang off the built-in ones; the jumps are hashed rules too.
CHAIN_HOOKS = {PRE_CHAIN: "PREROUTING", POST_CHAIN: "POSTROUTING"}  # the nat table's
# Per table, the agent's own chains and the built-in chain each hangs off. A
# table other than nat is touched only while a rule wants it (or it exists).
TABLE_HOOKS = {"nat": CHAIN_HOOKS, "filter": {ACL_CHAIN: "FORWARD"}}
# The seed of the source hash of `sch` UDP listeners: fixed, so a client keeps
# its member across agent restarts and on every host of a load balancer.
HMARK_SEED = "0x6c62736b"

Family = Literal[4, 6]


def address_port(address: str, port: int) -> str:
    """`address:port` as DNAT's to-destination takes it: an IPv6 address in
    brackets, or its last group would read as the port."""
    return f"[{address}]:{port}" if family_of(address) == 6 else f"{address}:{port}"


@dataclass(frozen=True, slots=True)  # slots: thousands of rules, a third smaller each
class NatRule:
    chain: str
    tag: str
    target: str  # DNAT | SNAT | HMARK | DROP | RETURN | a chain name to jump to
    to: str = ""  # DNAT/SNAT address[:port]
    in_interface: str = ""
    out_interface: str = ""
    protocol: str = ""
    dst: str = ""
    dport: int = 0
    probability: str = ""  # statistic match in random mode; "" for none
    table: str = "nat"
    src: str = ""  # a source prefix
    mark: str = ""  # mark match "value/mask"; "" for none
    hmark_mod: int = 0  # HMARK target: the packet's mark becomes a hash of its source modulo this
    ct_orig_dst: str = ""  # conntrack match: original direction, to this address ...
    ct_orig_dport: int = 0  # ... and port
    family: Family = 4  # 6: the rule lives in the IPv6 (ip6tables) table of that name
    # Made once with the rule: a rule is compared by its hash at every check of its table.
    hash: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "hash", self._hash())

    def _hash(self) -> str:
        fields = (
            self.chain,
            self.target,
            self.to,
            self.in_interface,
            self.out_interface,
            self.protocol,
            self.dst,
            self.dport,
            self.probability,
            self.tag,
        )
        # Fields added later count only when set, so the hashes of the rules
        # that existed before them (and the rules in the tables) stay as they were.
        extra = tuple(
            (name, value)
            for name, value in (
                ("table", "" if self.table == "nat" else self.table),
                ("src", self.src),
                ("mark", self.mark),
                ("hmark", f"{self.hmark_mod} {HMARK_SEED}" if self.hmark_mod else ""),
                ("ct_orig", f"{self.ct_orig_dst}:{self.ct_orig_dport}" if self.ct_orig_dst else ""),
                ("family", "6" if self.family == 6 else ""),
            )
            if value
        )
        material = repr(fields + extra if extra else fields)
        return hashlib.sha256(material.encode()).hexdigest()[:HASH_CHARS]

    @property
    def comment(self) -> str:
        return f"{self.hash}:{self.tag}"


def comment_hash(comment: str) -> str | None:
    head, sep, _ = comment.partition(":")
    return head if sep and len(head) == HASH_CHARS else None


BACKEND_TAG = "backend "


def backend_key_from_comment(comment: str) -> str | None:
    _, sep, tag = comment.partition(":")
    return tag[len(BACKEND_TAG) :] if sep and tag.startswith(BACKEND_TAG) else None


def jump_rules(table: str = "nat", family: Family = 4) -> list[NatRule]:
    return [
        NatRule(chain=hook, tag=f"jump {chain}", target=chain, table=table, family=family)
        for chain, hook in TABLE_HOOKS[table].items()
    ]


@dataclass(frozen=True)
class UdpAcl:
    type: Literal["white", "black"]  # white: only these sources; black: all but these
    cidrs: tuple[str, ...]


@dataclass(frozen=True)
class UdpListener:
    port: int
    members: tuple[Member, ...]  # the healthy ones
    source_hash: bool = False  # `sch`: a client address always gets the same member
    acl: UdpAcl | None = None


@dataclass(frozen=True)
class NatPlan:
    """Inputs of a load balancer's NAT rules."""

    ovn_ns: str
    haproxy_ns: str
    vip: str
    inner: str
    outer: str
    tcp_ports: tuple[int, ...]  # enabled TCP-class listener ports
    members: tuple[Member, ...]  # every member of every group, unique by key
    udp: tuple[UdpListener, ...] = ()  # the enabled UDP listeners
    # IPv6 ("" = IPv4 only): the VIP, and the pair haproxy binds and dials from
    # (OUTER6 on the host, INNER6 in the namespace), like the 169.254 pair.
    vip6: str = ""
    inner6: str = ""
    outer6: str = ""

    def __post_init__(self) -> None:
        if self.vip6 and not (self.inner6 and self.outer6):
            raise ValueError(f"an IPv6 VIP needs an IPv6 inner/outer pair: {self.ovn_ns}")


@dataclass(frozen=True)
class Side:
    """One family of a load balancer: its addresses in that family."""

    family: Family
    vip: str
    inner: str
    outer: str


def sides(plan: NatPlan) -> list[Side]:
    """IPv4 always; IPv6 when the load balancer has an IPv6 VIP."""
    ipv4 = Side(4, plan.vip, plan.inner, plan.outer)
    return [ipv4, Side(6, plan.vip6, plan.inner6, plan.outer6)] if plan.vip6 else [ipv4]


def nat_rules(plan: NatPlan) -> list[NatRule]:
    rules: list[NatRule] = []
    filters: list[NatRule] = []
    for side in sides(plan):
        rules += _nat_table_rules(plan, side)
        acl = [rule for listener in plan.udp for rule in udp_acl_rules(plan, side, listener)]
        if acl:
            filters += jump_rules("filter", side.family) + acl
    return rules + filters


def _nat_table_rules(plan: NatPlan, side: Side) -> list[NatRule]:
    rules = jump_rules("nat", side.family)
    for port in plan.tcp_ports:
        rules.append(
            _tcp_dnat(side, f"listener tcp/{port}", plan.ovn_ns, side.vip, port, address_port(side.outer, port))
        )
    for member in plan.members:
        rules += backend_rules(plan, side, member)
    for listener in plan.udp:
        rules += udp_listener_rules(plan, side, listener)
    rules.append(NatRule(POST_CHAIN, "to vpc", "SNAT", side.vip, out_interface=plan.ovn_ns, family=side.family))
    return rules


def _tcp_dnat(side: Side, tag: str, in_interface: str, dst: str, dport: int, to: str) -> NatRule:
    return NatRule(
        PRE_CHAIN,
        tag,
        "DNAT",
        to,
        in_interface=in_interface,
        protocol="tcp",
        dst=dst,
        dport=dport,
        family=side.family,
    )


def backend_rules(plan: NatPlan, side: Side, member: Member) -> list[NatRule]:
    """INNER:mapped_port leads to the member, in the member's family only; a
    health check port of its own has a port on INNER too, tagged like a member
    so that it is read back alike."""
    if family_of(member.address) != side.family:
        return []
    at = address_port(member.address, member.port)
    backend = _tcp_dnat(side, f"{BACKEND_TAG}{member.key}", plan.haproxy_ns, side.inner, member.mapped_port, at)
    options = options_of(member)
    if options.check_port is None or options.mapped_check_port is None:
        return [backend]
    check = replace(
        backend,
        tag=f"{BACKEND_TAG}{check_port_key(member.key)}",
        to=address_port(member.address, options.check_port),
        dport=options.mapped_check_port,
    )
    return [backend, check]


def serving_members(members: tuple[Member, ...]) -> list[Member]:
    """The members that take new flows: the healthy ones with a weight, and of
    those the backups only while no other one is left."""
    live = [m for m in members if m.weight > 0]
    primaries = [m for m in live if not options_of(m).backup]
    return primaries or live


def udp_listener_rules(plan: NatPlan, side: Side, listener: UdpListener) -> list[NatRule]:
    """UDP is balanced by the kernel: new flows pick a member at random in
    proportion to its weight (rule i matches with w_i / (w_i + ... + w_n), the
    last always), or with `source_hash` by a hash of the client's address
    (`mark_blocks`); conntrack keeps a flow on its member. The tag carries a
    hash of the whole set, so any change replaces all of the listener's rules
    and they are appended again in order. Each family balances over its own
    members: a VIP of one family DNATs only to members of that family."""
    live = serving_members(tuple(m for m in listener.members if family_of(m.address) == side.family))
    material = [(m.address, m.port, m.weight) for m in live]
    source_hash = listener.source_hash and len(live) > 1
    set_tag = _short_hash(("sch", material) if source_hash else material)
    port = listener.port
    base = NatRule(
        PRE_CHAIN, "", "DNAT", in_interface=plan.ovn_ns, protocol="udp", dst=side.vip, dport=port, family=side.family
    )
    rules = []
    if not source_hash:
        remaining = sum(m.weight for m in live)
        for index, member in enumerate(live):
            last = index == len(live) - 1
            probability = "" if last else f"{member.weight / remaining:.6f}"
            remaining -= member.weight
            rules.append(
                replace(
                    base,
                    tag=f"listener udp/{port} {set_tag} {index}",
                    to=address_port(member.address, member.port),
                    probability=probability,
                )
            )
        return rules
    divisor = math.gcd(*(m.weight for m in live))
    weights = [m.weight // divisor for m in live]
    rules.append(replace(base, tag=f"listener udp/{port} {set_tag} hash", target="HMARK", hmark_mod=sum(weights)))
    start = 0
    for index, (member, weight) in enumerate(zip(live, weights, strict=True)):
        dnat = replace(base, tag=f"listener udp/{port} {set_tag} {index}", to=address_port(member.address, member.port))
        if index == len(live) - 1:  # the rest: whatever mark the hash left
            rules.append(dnat)
        else:
            rules += [
                replace(dnat, mark=f"0x{value:x}/0x{mask:x}") for value, mask in mark_blocks(start, start + weight)
            ]
        start += weight
    return rules


def mark_blocks(start: int, end: int) -> list[tuple[int, int]]:
    """The marks start..end-1 as (value, mask) pairs for the mark match, which
    compares mark & mask with value: aligned blocks of powers of two, the
    largest first (at most two per bit of `end`)."""
    blocks = []
    while start < end:
        size = start & -start if start else 1 << (end.bit_length())
        while start + size > end:
            size //= 2
        blocks.append((start, 0xFFFFFFFF ^ (size - 1)))
        start += size
    return blocks


def udp_acl_rules(plan: NatPlan, side: Side, listener: UdpListener) -> list[NatRule]:
    """The access list of a UDP listener, in the filter table's FORWARD path:
    datagrams that a client sent to VIP:port (conntrack's original direction,
    before the DNAT that sent them on) from a refused source are dropped. A
    white list returns for each admitted prefix and then drops, so its rules
    must stay in order: like the balancing rules, the tag carries a hash of
    the whole list.

    Each family's table holds the list's prefixes of that family, under the
    list's type: a white list of IPv6 prefixes only admits no IPv4 source
    (the IPv4 table drops them all), a black list of IPv6 prefixes only
    refuses no IPv4 source (the IPv4 table needs no rule)."""
    acl = listener.acl
    if acl is None:
        return []
    port = listener.port
    cidrs = tuple(cidr for cidr in acl.cidrs if family_of(cidr) == side.family)
    tag = f"acl udp/{port} {acl.type} {_short_hash((acl.type, cidrs))}"
    base = NatRule(
        ACL_CHAIN,
        tag,
        "DROP",
        table="filter",
        in_interface=plan.ovn_ns,
        protocol="udp",
        ct_orig_dst=side.vip,
        ct_orig_dport=port,
        family=side.family,
    )
    listed = "RETURN" if acl.type == "white" else "DROP"
    rules = [replace(base, tag=f"{tag} {i}", target=listed, src=cidr) for i, cidr in enumerate(cidrs)]
    if acl.type == "white":
        rules.append(replace(base, tag=f"{tag} others"))
    return rules


def _short_hash(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:8]
