"""Connection logs of udp and tcp listeners, from the conntrack events of the load balancer's namespace.

Every flow to a listener's VIP:port passes the namespace's DNAT, so conntrack
there sees each one begin and end. `ConnectionLogs` subscribes to the
namespace's conntrack events while at least one enabled udp or tcp listener of
the load balancer has `access_log`, and writes two lines per flow to that
listener's protocol, VIP and port: `event=start` when conntrack creates the
flow and `event=end` when it forgets it, with the packets and bytes each way
and the duration. Both go through the same per-listener cap
(`AccessLogReader.admit`) and logger (`lbagent.access`) as haproxy's lines. An
event is matched to a listener and capped by its destination alone, read
without decoding the rest: only the lines that are written cost a full decode.

A udp flow's lines name the member it was sent to (the kernel balances udp);
a tcp connection's reply comes from haproxy on the host, whose own line, once
the connection ends, names the backend and server. http and https listeners
log per request, through haproxy only.

When the end line comes is conntrack's business: a udp flow ends once its
timeout (`nf_conntrack_udp_timeout`, 30 s, or `..._udp_timeout_stream`, 120 s,
after answers went both ways) has passed without a datagram, a closed tcp
connection after `nf_conntrack_tcp_timeout_time_wait` (120 s), and then when
the kernel's garbage collection noticed, which may take tens of seconds more.

There is one subscription per load balancer, opened on a namespace thread
and read by the event loop (the socket is non-blocking and read only when it
has something). It is closed when no listener wants it any more, before the
namespace is removed (an open socket would keep a deleted namespace alive),
and reopened when the namespace was replaced under it. A subscription that
cannot be opened is said in the log and tried again at the next pass: the
data path does not depend on it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from lbagent.errors import LbAgentError
from lbagent.haproxy.accesslog import AccessLine, AccessLogReader, emit
from lbagent.ovnhost.conntrack import ConntrackError, ConntrackEvents, FlowEvent, RawEvent, open_events
from lbagent.ovnhost.netns import netns_path

log = logging.getLogger(__name__)

# Seconds between two warnings of lost events of one subscription: a flood
# overflows the queue at every read, and must not flood the log too.
LOST_EVERY = 10.0


@dataclass(frozen=True)
class LoggedListener:
    listener_id: str
    protocol: str  # "udp" | "tcp": what conntrack calls the flows to it
    port: int
    rate: int  # its access_log_rate


def logged_listeners(lb) -> list[LoggedListener]:
    """The enabled udp and tcp listeners of `lb` that want connection lines."""
    if not lb.enabled:
        return []
    return [
        LoggedListener(ls.id, ls.kind.transport, ls.listener_port, ls.access_log_rate)
        for ls in lb.listeners
        if ls.enabled and ls.access_log and not ls.kind.is_http
    ]


def flow_line(lb_id: str, listener: LoggedListener, event: FlowEvent) -> AccessLine:
    """The access line of one flow event of `listener`."""
    original = event.original
    fields = {"event": event.kind, "proto": event.protocol, "client": f"{original.src}:{original.sport}"}
    if event.protocol == "udp":  # a tcp connection's reply comes from haproxy, not a member
        fields["member"] = f"{event.reply.src}:{event.reply.sport}"
    if event.kind == "end":
        for direction, counters in (("in", event.sent), ("out", event.received)):
            if counters is not None:
                fields[f"packets_{direction}"] = str(counters.packets)
                fields[f"bytes_{direction}"] = str(counters.bytes)
        if event.duration_ms is not None:
            fields["duration_ms"] = str(event.duration_ms)
    return AccessLine(lb_id, listener.listener_id, listener.rate, fields)


def namespace_inode(netns: str) -> int | None:
    try:
        return os.stat(netns_path(netns)).st_ino
    except FileNotFoundError:
        return None


@dataclass
class _Subscription:
    netns: str
    events: ConntrackEvents
    # (protocol, VIP, port) -> the listener there; a flow to anything else is not logged.
    listeners: dict[tuple[str, str, int], LoggedListener] = field(default_factory=dict)
    lost: int = 0  # overflows as last said in the log
    lost_said_at: float = -LOST_EVERY


class ConnectionLogs:
    """The conntrack subscriptions of the load balancers whose udp or tcp listeners log."""

    def __init__(
        self,
        namespaces,
        access: AccessLogReader,
        open_subscription: Callable[[], ConntrackEvents] = open_events,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._namespaces = namespaces  # a NamespaceExecutor
        self._access = access  # whose per-listener cap the lines go through
        self._open = open_subscription  # run on a thread inside the namespace
        self._subscriptions: dict[str, _Subscription] = {}
        self._clock = clock

    def subscribed(self, lb_id: str) -> bool:
        return lb_id in self._subscriptions

    async def sync(self, lb_id: str, netns: str, vip: str, listeners: list[LoggedListener]) -> None:
        """Subscribe `lb_id`'s namespace while `listeners` (see `logged_listeners`) is not empty."""
        if not listeners:
            self.forget(lb_id)
            return
        subscription = self._subscriptions.get(lb_id)
        if subscription is not None:
            current = await self._namespaces.run(None, namespace_inode, netns)
            if subscription.netns != netns or subscription.events.namespace != current:
                log.info("lb=%s object=access action=resubscribe reason=namespace_replaced", lb_id)
                self.forget(lb_id)
                subscription = None
        if subscription is None:
            try:
                events = await self._namespaces.run(netns, self._open)
            except LbAgentError as exc:
                log.error("lb=%s object=access action=subscribe result=error error=%r", lb_id, str(exc))
                return
            if lb_id in self._subscriptions:  # never: one load balancer's passes do not overlap
                events.close()
                return
            subscription = _Subscription(netns, events)
            self._subscriptions[lb_id] = subscription
            asyncio.get_running_loop().add_reader(events.fileno(), self._readable, lb_id)
            log.info("lb=%s object=access action=subscribe netns=%s", lb_id, netns)
        subscription.listeners = {(listener.protocol, vip, listener.port): listener for listener in listeners}

    def forget(self, lb_id: str) -> None:
        """Close the subscription of `lb_id`, if any (before its namespace goes)."""
        subscription = self._subscriptions.pop(lb_id, None)
        if subscription is None:
            return
        asyncio.get_running_loop().remove_reader(subscription.events.fileno())
        subscription.events.close()
        log.info("lb=%s object=access action=unsubscribe", lb_id)

    def stop(self) -> None:
        for lb_id in list(self._subscriptions):
            self.forget(lb_id)

    def _readable(self, lb_id: str) -> None:
        subscription = self._subscriptions.get(lb_id)
        if subscription is None:
            return
        try:
            events = subscription.events.read()
        except LbAgentError as exc:
            # Reading again would fail again, at once: the next pass subscribes anew.
            log.error("lb=%s object=access action=read_conntrack result=error error=%r", lb_id, str(exc))
            self.forget(lb_id)
            return
        now = self._clock()
        if subscription.events.lost != subscription.lost and now >= subscription.lost_said_at + LOST_EVERY:
            log.warning(
                "lb=%s object=access action=read_conntrack result=lost overflows=%d",
                lb_id,
                subscription.events.lost - subscription.lost,
            )
            subscription.lost, subscription.lost_said_at = subscription.events.lost, now
        for event in events:
            self._received(lb_id, subscription, event)

    def _received(self, lb_id: str, subscription: _Subscription, raw: RawEvent) -> None:
        # Matched and capped on the destination alone: a flow nobody logs, or a line the
        # cap drops, costs no decoding.
        destination = raw.destination
        if destination is None:
            return
        listener = subscription.listeners.get((destination.protocol, destination.address, destination.port))
        if listener is None:
            return
        dropped = self._access.admit(lb_id, listener.listener_id, listener.rate)
        if dropped is None:
            return
        try:
            event = raw.decode()
        except ConntrackError as exc:
            log.warning("lb=%s object=access action=read_conntrack result=undecodable error=%r", lb_id, str(exc))
            return
        if event is not None:
            emit(flow_line(lb_id, listener, event), dropped)
