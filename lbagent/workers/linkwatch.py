"""Drift repair on the kernel's word: a load balancer whose veth is deleted is
reconciled at once, not at its next resync.

The periodic resync checks every load balancer, but with thousands of them
each is checked only every few minutes (`OvnWorker.resync_interval`), and a
deleted veth takes a load balancer off the network. The host announces every
link deletion (`ovnhost.linkevents`); deleting either end of a veth deletes
both, and the host end is always on the host. This watch kicks the pass of
the load balancer whose host end went. Deletions the agent makes itself (a
teardown, a namespace made anew) kick a pass that finds nothing to do, or
none once the load balancer is gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from lbagent.errors import LbAgentError
from lbagent.naming import interface_names, names_from_interface
from lbagent.ovnhost.linkevents import LinkEvents, open_link_events

log = logging.getLogger(__name__)


class LinkWatch:
    def __init__(
        self,
        owners: Callable[[], Iterable[tuple[str, int]]],
        kick: Callable[[str], None],
        open_events: Callable[[], LinkEvents] = open_link_events,
    ):
        """`owners()`: (load balancer id, interface-name salt) of every load balancer with links."""
        self._owners = owners
        self._kick = kick
        self._open = open_events
        self._events: LinkEvents | None = None
        self._by_tag: dict[str, str] = {}  # interface-name tag -> load balancer id, rebuilt on a miss

    def start(self) -> None:
        """Subscribe, on the event loop's thread (the host's namespace). Without the
        subscription, the resync is left to repair deleted links, as it always does."""
        try:
            self._events = self._open()
        except LbAgentError as exc:
            log.error("action=watch_links result=error error=%r", str(exc))
            return
        asyncio.get_running_loop().add_reader(self._events.fileno(), self._readable)

    def stop(self) -> None:
        if self._events is not None:
            asyncio.get_running_loop().remove_reader(self._events.fileno())
            self._events.close()
            self._events = None

    @property
    def lost(self) -> int:
        return self._events.lost if self._events is not None else 0

    def _readable(self) -> None:
        assert self._events is not None
        try:
            deleted = self._events.deleted()
        except LbAgentError as exc:
            # Reading again would fail again, at once.
            log.error("action=watch_links result=error error=%r", str(exc))
            self.stop()
            return
        gone = {}
        for name in deleted:
            names = names_from_interface(name)
            if names is not None and name in names.host_ends:
                gone[names.tag] = name
        if not gone.keys() <= self._by_tag.keys():  # once a read: a teardown deletes thousands
            self._by_tag = {interface_names(lb_id, salt).tag: lb_id for lb_id, salt in self._owners()}
        for tag, name in gone.items():
            lb_id = self._by_tag.get(tag)
            if lb_id is not None:
                log.info("lb=%s action=kick reason=link_deleted link=%s", lb_id, name)
                self._kick(lb_id)
