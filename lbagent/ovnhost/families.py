"""Address families of the addresses the agent writes, told from their text."""

from __future__ import annotations

import socket


def family_of(address: str) -> int:
    """AF_INET6 for an IPv6 address or prefix (in the canonical text the agent uses), else AF_INET."""
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def host_prefixlen(family: int) -> int:
    return 128 if family == socket.AF_INET6 else 32


def unspecified(family: int) -> str:
    return "::" if family == socket.AF_INET6 else "0.0.0.0"
