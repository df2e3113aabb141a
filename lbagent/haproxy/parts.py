"""What the parts of `HaproxyManager` share, and the base class that hands it to each.

Every part (`changes`, `reloads`, `liveapply`, `lifecycle`) works on the same
few objects: the layout on disk, the master process, the pools and locks
where its work runs (`work`), what the running worker may lack of the disk
(`worker`) and the counters (`counters`). The manager makes them once, as a
`Shared`; a `Part` has them as its own attributes.
"""

from __future__ import annotations

import logging

from lbagent.haproxy.counters import HaproxyCounters
from lbagent.haproxy.files import HaproxyPaths
from lbagent.haproxy.process import HaproxyProcess
from lbagent.haproxy.work import HaproxyWork
from lbagent.haproxy.worker import WorkerState

# Every part logs under the manager's name, as one logger: what haproxy did
# reads the same in the logs (logger=...) whichever part did it.
log = logging.getLogger("lbagent.haproxy.manager")


class Shared:
    """The objects every part works on; the manager makes one for all of them."""

    def __init__(self, paths: HaproxyPaths, process: HaproxyProcess):
        self.paths = paths
        self.process = process
        self.work = HaproxyWork()
        self.worker = WorkerState(paths, process)
        self.counters = HaproxyCounters()


class Part:
    def __init__(self, shared: Shared):
        self._paths = shared.paths
        self._process = shared.process
        self._work = shared.work
        self._worker = shared.worker
        self._counters = shared.counters
