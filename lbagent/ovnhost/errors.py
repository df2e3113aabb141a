"""Typed errors raised at the edges of the host: the kernel's (netlink,
namespaces, iptables: `HostError`) and OVSDB's (`OvsdbError`).

Two families, both `LbAgentError`s: the kernel answers every request at once
and for itself, while OVSDB is a server that may not answer at all
(`OvsdbUnavailable`) and whose refusals name a transaction, not a device.

Reconcile logic catches these per load balancer, records `str(error)` as the
readable `last_error` and retries with backoff; nothing here is fatal to the
agent.
"""

from __future__ import annotations

import errno as errno_mod
import os

from lbagent.errors import LbAgentError


class HostError(LbAgentError):
    """A kernel operation for one load balancer failed."""


class NetlinkError(HostError):
    def __init__(self, op: str, code: int, target: str = ""):
        self.op = op
        self.code = code
        self.target = target
        name = errno_mod.errorcode.get(code, str(code))
        where = f" {target}" if target else ""
        super().__init__(f"netlink {op}{where}: {name} ({os.strerror(code)})")


class LinkNotFound(NetlinkError):
    pass


class AlreadyExists(NetlinkError):
    pass


class NamespaceError(HostError):
    pass


class IptablesError(HostError):
    pass


class OvsdbError(LbAgentError):
    """An OVSDB request failed: refused, or (`OvsdbUnavailable`) not answered."""


class OvsdbUnavailable(OvsdbError):
    """OVSDB did not answer (not connected, or a timeout): nothing any one
    request did, so a batch of requests is not retried one by one."""


def netlink_error(op: str, code: int, target: str = "") -> NetlinkError:
    """The typed exception for a netlink request the kernel answered with errno `code`."""
    cls = {errno_mod.ENODEV: LinkNotFound, errno_mod.EEXIST: AlreadyExists}.get(code, NetlinkError)
    return cls(op, code, target)
