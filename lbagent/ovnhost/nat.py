"""The NAT rules of one load balancer's namespace, as data.

Each rule carries a comment `<hash>:<tag>`; the hash covers the rule and its
tag, so "is this exact rule present?" is a set lookup on comments and any
edit of a rule (by hand or by an older agent) shows up as an unknown hash.
Tags are built only from validated ids and fixed words.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from lbagent.desired.members import Member

HASH_CHARS = 12
PRE_CHAIN = "LBAGENT-PRE"
POST_CHAIN = "LBAGENT-POST"
# Our chains hang off the built-in ones; the jumps are hashed rules too.
CHAIN_HOOKS = {PRE_CHAIN: "PREROUTING", POST_CHAIN: "POSTROUTING"}


@dataclass(frozen=True)
class NatRule:
    chain: str
    tag: str
    target: str  # DNAT | SNAT | a chain name to jump to
    to: str = ""  # DNAT/SNAT address[:port]
    in_interface: str = ""
    out_interface: str = ""
    protocol: str = ""
    dst: str = ""
    dport: int = 0
    probability: str = ""  # statistic match in random mode; "" for none

    @property
    def hash(self) -> str:
        material = repr(
            (
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
        )
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


def jump_rules() -> list[NatRule]:
    return [NatRule(chain=hook, tag=f"jump {chain}", target=chain) for chain, hook in CHAIN_HOOKS.items()]


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
    udp: tuple[tuple[int, tuple[Member, ...]], ...] = ()  # (port, healthy members) per UDP listener


def nat_rules(plan: NatPlan) -> list[NatRule]:
    rules = jump_rules()
    for port in plan.tcp_ports:
        rules.append(
            NatRule(
                PRE_CHAIN,
                f"listener tcp/{port}",
                "DNAT",
                f"{plan.outer}:{port}",
                in_interface=plan.ovn_ns,
                protocol="tcp",
                dst=plan.vip,
                dport=port,
            )
        )
    for member in plan.members:
        rules.append(
            NatRule(
                PRE_CHAIN,
                f"{BACKEND_TAG}{member.key}",
                "DNAT",
                f"{member.address}:{member.port}",
                in_interface=plan.haproxy_ns,
                protocol="tcp",
                dst=plan.inner,
                dport=member.mapped_port,
            )
        )
    for port, members in plan.udp:
        rules += udp_listener_rules(plan, port, members)
    rules.append(NatRule(POST_CHAIN, "to vpc", "SNAT", plan.vip, out_interface=plan.ovn_ns))
    return rules


def udp_listener_rules(plan: NatPlan, port: int, members: tuple[Member, ...]) -> list[NatRule]:
    """UDP is balanced by the kernel: new flows pick a member at random in
    proportion to its weight (rule i matches with w_i / (w_i + ... + w_n), the
    last always); conntrack keeps a flow on its member. The tag carries a hash
    of the whole set, so any change replaces all of the listener's rules and
    they are appended again in order."""
    live = [m for m in members if m.weight > 0]
    material = repr([(m.address, m.port, m.weight) for m in live])
    set_tag = hashlib.sha256(material.encode()).hexdigest()[:8]
    remaining = sum(m.weight for m in live)
    rules = []
    for index, member in enumerate(live):
        last = index == len(live) - 1
        probability = "" if last else f"{member.weight / remaining:.6f}"
        remaining -= member.weight
        rules.append(
            NatRule(
                PRE_CHAIN,
                f"listener udp/{port} {set_tag} {index}",
                "DNAT",
                f"{member.address}:{member.port}",
                in_interface=plan.ovn_ns,
                protocol="udp",
                dst=plan.vip,
                dport=port,
                probability=probability,
            )
        )
    return rules
