"""The per-link IP settings of the calling thread's namespace: IPv6 on or off
on a link, and forwarding.

Each is a file under /proc/sys/net; reading four to eight of them took a
quarter of a converged pass. The kernel reports the same values in every
link lookup (IFLA_AF_SPEC, `Link.ipv4_conf` and `Link.ipv6_conf`), and a
pass looks its links up anyway: given the link, a setting already in place
costs nothing, and /proc/sys is read and written only for a difference (or
for a link not looked up, such as `default`).

What a pass has just made is written without a read (`fresh`), and IPv4
forwarding is set on each link with a request (`RtnlBatch.forward_ipv4`):
every namespace has entries of its own under /proc/sys/net by the same
names, and opening a file there compares each name on its path with those of
every other namespace: 11 µs with no other namespace, 108 µs with 1,000. In
a cold start of 1,000, where building a load balancer opened eight such
files, the compares took 5 % of the agent's CPU.
"""

from __future__ import annotations

import errno
from collections.abc import Sequence
from contextlib import closing

from lbagent.metrics import count_write
from lbagent.ovnhost.errors import LinkNotFound
from lbagent.ovnhost.iplib import Link
from lbagent.ovnhost.netns import write_sysctl
from lbagent.ovnhost.rtnl_batch import RtnlBatch
from lbagent.ovnhost.rtnl_socket import open_socket

# IPv6 on an interface of a dual-stack load balancer: no router solicitations
# or advertisements (its routes are the subnet's), and no duplicate address
# detection, which would hold its link-local address back for a second.
# Set in this order: the last one brings IPv6 up with the others in force.
IPV6_ON = (("accept_dad", "0"), ("accept_ra", "0"), ("router_solicitations", "0"), ("disable_ipv6", "0"))
IPV6_OFF = (("disable_ipv6", "1"),)
# Positions in IFLA_INET6_CONF: the kernel's enum DEVCONF_*.
IPV6_CONF_INDEX = {"forwarding": 0, "accept_ra": 3, "router_solicitations": 7, "disable_ipv6": 26, "accept_dad": 27}
# IFLA_INET_CONF holds IPV4_DEVCONF_<x> at <x> - 1; IPV4_DEVCONF_FORWARDING is 1.
IPV4_FORWARDING_INDEX = 0


def _holds(conf: tuple[int, ...], settings: tuple[tuple[str, str], ...]) -> bool:
    return all(IPV6_CONF_INDEX[key] < len(conf) and conf[IPV6_CONF_INDEX[key]] == int(value) for key, value in settings)


def set_ipv6(interface: str, on: bool, link: Link | None = None, fresh: bool = False) -> None:
    """IPv6 on or off on `interface` ("default": on those made from now on); `link`: its lookup;
    `fresh`: a link, or the namespace of `default`, that the pass has just made: written unread.

    Off for a load balancer without an IPv6 VIP. With IPv6 on, each OVN-side veth sends router
    solicitations and MLD reports to multicast groups as it comes up, which OVN floods
    to every port of the logical switch: at 2,500 load balancers on one switch,
    millions of copies through the userspace datapath while it installs their flows.
    A dual-stack load balancer needs it (see `IPV6_ON`), and sends no solicitations."""
    settings = IPV6_ON if on else IPV6_OFF
    if link is not None and _holds(link.ipv6_conf, settings):
        return
    try:
        path = f"net/ipv6/conf/{interface}"
        changed = [key for key, value in settings if write_sysctl(f"{path}/{key}", value, read_first=not fresh)]
    except FileNotFoundError:  # a kernel without IPv6
        if on:
            raise LinkNotFound("turn ipv6 on", errno.EAFNOSUPPORT, interface) from None
        return
    if changed:
        count_write("netlink", what=f"ipv6 {'on' if on else 'off'} on {interface}")


def ensure_forwarding(ipv6: bool, ends: Sequence[Link]) -> None:
    """Forwarding on for the packets that come in on `ends` (their lookups):
    IPv4 link by link, for each end whose own copy is off, with one request
    (`forward_ipv4`); IPv6 for the whole namespace when some end's copy is off.

    Not `ip_forward`: once it reads 1, writing it again changes no link, so
    an end turned off on its own would stay off."""
    off = [link for link in ends if link.ipv4_conf[IPV4_FORWARDING_INDEX : IPV4_FORWARDING_INDEX + 1] != (1,)]
    if off:
        forward_ipv4(off)
    if ipv6 and not all(_holds(link.ipv6_conf, (("forwarding", "1"),)) for link in ends):
        ensure_ipv6_forwarding()


def forward_ipv4(links: Sequence[Link]) -> None:
    """`RtnlBatch.forward_ipv4` for each of these links of the calling thread's namespace."""
    batch = RtnlBatch()
    for link in links:
        batch.forward_ipv4(link.index, link.name)
    with closing(open_socket()) as sock:
        batch.send(sock)


def ensure_ipv6_forwarding() -> None:
    """IPv6 forwarding on in the namespace (`all`: unlike IPv4's, a link's own
    copy does not make the kernel forward IPv6). Written without a read:
    writing `all` sets every link's own copy again, even where it reads 1."""
    write_sysctl("net/ipv6/conf/all/forwarding", "1", read_first=False)
    count_write("netlink", what="ipv6 forwarding on")
