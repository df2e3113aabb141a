"""lbagent.ovnhost.iplib reads over a stand-in for pyroute2's IPRoute."""

from __future__ import annotations

import socket

from lbagent.ovnhost.iplib import Netlink


class AddressDumps:
    """Answers address dumps per family, as the kernel does."""

    def __init__(self, by_family: dict[int, list[str]]):
        self.by_family = by_family

    def get_addr(self, family: int) -> list[dict[str, str]]:
        return [{"address": address} for address in self.by_family.get(family, [])]


def test_all_addresses_are_those_of_both_families():
    ipr = AddressDumps({socket.AF_INET: ["198.18.0.1"], socket.AF_INET6: ["fd4c:4241::2", "fe80::1"]})
    assert Netlink(ipr).all_addresses() == {"198.18.0.1", "fd4c:4241::2", "fe80::1"}  # type: ignore[arg-type]
