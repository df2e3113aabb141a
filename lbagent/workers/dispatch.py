"""The keys of the agent's one work queue and where each kind of key goes.

OvnWorker and the sibling controllers share one `WorkQueue` (one rate
limit, one place to see what waits). This module owns its key format,
"<kind>/<name>" (ids and provider-network names never contain "/"), and the
`Dispatcher` that hands a key's name to the `reconcile(name)` of its kind.
The controllers' reconcile functions know nothing of the queue.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

LOADBALANCER = "loadbalancer"
SUBNET = "subnet"
POD = "pod"
PROVIDER_NETWORK = "provider_network"
SEPARATOR = "/"

Handler = Callable[[str], object]  # returns an awaitable, or nothing (a mere kick)


def key(kind: str, name: str) -> str:
    return f"{kind}{SEPARATOR}{name}"


def kind_of(queue_key: str) -> str:
    return queue_key.partition(SEPARATOR)[0]


class Dispatcher:
    """The queue's handler: `handlers` maps a kind to the reconcile of that kind."""

    def __init__(self, handlers: Mapping[str, Handler]):
        self._handlers = dict(handlers)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(self._handlers)

    async def __call__(self, queue_key: str) -> None:
        kind, _, name = queue_key.partition(SEPARATOR)
        handler = self._handlers.get(kind)
        if handler is None or not name:
            # A retry could not help (no code would ever handle it): say so and drop it.
            log.error("queue_key=%s action=dispatch result=error error='no handler for this key'", queue_key)
            return
        result = handler(name)
        if inspect.isawaitable(result):
            await result
