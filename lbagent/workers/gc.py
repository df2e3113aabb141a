"""Mark-and-sweep garbage collection of what the agent left behind.

An orphan is an object carrying the agent's marks that no known load
balancer uses: a namespace with our mark file, a host veth whose ifalias is
our mark, an OVS port with our owner key, an haproxy file in our run
directory. A name alone proves nothing: an `lb-` namespace or a veth named
like ours that someone else made is not in the inventory, so never swept
(see `ovnhost.netns` and `ovnhost.links` for the marks). It is deleted only when a second pass still
finds it orphaned, so nothing being created right now is swept, and at most
`max_deletions` go per pass. The caller runs this only once the complete
desired state is known: a half-known world never triggers cleanup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Protocol

from lbagent.ovnhost.inventory import Inventory

log = logging.getLogger(__name__)


class MarkedHost(Protocol):
    """What the collector uses of the `OvnHost`."""

    async def inventory(self) -> Inventory: ...
    async def delete_orphan(self, kind: str, name: str) -> None: ...


class HaproxyFiles(Protocol):
    """What the collector uses of the `HaproxyManager`."""

    def lb_ids_on_disk(self) -> Iterable[str]: ...
    async def apply(self, lb_id: str, text: str | None) -> object: ...


@dataclass
class GarbageCollector:
    host: MarkedHost
    haproxy: HaproxyFiles
    max_deletions: int = 50
    marked: set[tuple[str, str]] = field(default_factory=set)

    async def run_once(self, in_use: Callable[[], Inventory]) -> list[tuple[str, str]]:
        found = await self.host.inventory()
        found = replace(found, haproxy=frozenset(self.haproxy.lb_ids_on_disk()))
        # Asked after the inventory, and again before each deletion: a load
        # balancer added meanwhile claims its objects back.
        orphans = found.minus(in_use())
        # haproxy first: it must stop binding an address before the link goes.
        due = sorted(orphans & self.marked, key=lambda item: (item[0] != "haproxy", item))
        self.marked = orphans - set(due[: self.max_deletions])
        deleted = []
        for kind, name in due[: self.max_deletions]:
            if (kind, name) not in found.minus(in_use()):
                continue
            try:
                if kind == "haproxy":
                    await self.haproxy.apply(name, None)
                else:
                    await self.host.delete_orphan(kind, name)
            except Exception as exc:  # try again next pass
                log.warning("action=gc object=%s name=%s result=error error=%r", kind, name, str(exc))
                self.marked.add((kind, name))
                continue
            log.info("action=gc object=%s name=%s result=deleted", kind, name)
            deleted.append((kind, name))
        return deleted
