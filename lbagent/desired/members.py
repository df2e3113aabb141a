"""Resolved backend-group members: what a listener actually balances over.

A backend group's members come from its explicit backends or, later, from the
pods its selector matches. Both the namespace (DNAT of INNER:mapped_port to the
real backend) and haproxy (server INNER:mapped_port) are driven from this one
list, so the two can never disagree about which port means which backend.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Member:
    key: str  # stable identity: backend id, or "<group id>/<pod id>"
    address: str  # the backend's real address in the VPC
    port: int  # the backend's real port
    weight: int
    send_proxy: str
    ssl: bool
    mapped_port: int  # port on INNER that the namespace DNATs to address:port
