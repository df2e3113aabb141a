"""What a member takes from its group and its backend beyond an address and a port.

`backup`, `slow_start` and a separate health check port travel with each
resolved member (`GroupMember`), so that haproxy's server lines, the
namespace's DNAT rules and the UDP checker read them from the one list that
`lbagent.desired.members` describes. A plain `Member` has none of them.

A health check port other than the member's own is reached, like the member
itself, through a port on INNER of its own: the allocation key of that port is
`check_port_key(member key)`, which no member key can equal (':' is in no id).
"""

from __future__ import annotations

from dataclasses import dataclass

from lbagent.desired.members import Member

CHECK_KEY_SUFFIX = ":check"


@dataclass(frozen=True, slots=True)
class TrafficOptions:
    backup: bool = False  # serves only while no other member of its group is up
    slow_start: int = 0  # seconds over which it ramps up to its weight
    check_port: int | None = None  # the port its health checks probe; None: its own port
    mapped_check_port: int | None = None  # its port on INNER that the namespace DNATs to address:check_port


NO_OPTIONS = TrafficOptions()


@dataclass(frozen=True, slots=True)
class GroupMember(Member):
    options: TrafficOptions = NO_OPTIONS


def options_of(member: Member) -> TrafficOptions:
    return member.options if isinstance(member, GroupMember) else NO_OPTIONS


def check_port_key(member_key: str) -> str:
    """The allocation key of the port on INNER that leads to the member's health check port."""
    return member_key + CHECK_KEY_SUFFIX


def probed_port(member: Member) -> int:
    """The port a health check of the member connects to on its address."""
    return options_of(member).check_port or member.port
