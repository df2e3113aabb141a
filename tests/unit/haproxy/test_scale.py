"""The count of load balancers does not bound haproxy: 2,500 of them, with long ids, serve and reload.

haproxy's master re-executes itself on every reload with the list of its
configuration files in one environment variable, which the kernel caps at
128 KiB. One file per load balancer passed that near 2,000 of them: every
reload failed and the restarted master died. Ids here are 64 characters, the
longest the API accepts, so the old layout would fail well below this count.
"""

import asyncio
import random

from lbagent.haproxy.manager import HaproxyManager
from tests.unit.samples import HAPROXY, echo_through, free_port, lb_text

COUNT = 2500


def lb_id(index: int) -> str:
    return f"{index:06d}-" + "x" * 57  # 64 characters


def outer(index: int) -> str:
    """An address of its own per load balancer, all on one port: no other test binds 127.1/16."""
    return f"127.1.{index // 250}.{index % 250 + 1}"


async def test_thousands_of_load_balancers_serve_and_reload(run_dir, echo_port):
    port = free_port()
    mgr = HaproxyManager(HAPROXY, run_dir)
    await mgr.start()
    try:
        reloaded = await asyncio.gather(
            *(mgr.apply(lb_id(i), lb_text(lb_id(i), port, echo_port, outer=outer(i))) for i in range(COUNT))
        )
        assert all(reloaded)
        sample = sorted(random.sample(range(COUNT), 20)) + [0, COUNT - 1]
        assert all([await echo_through(port, host=outer(i)) for i in sample])
        listed = sum(len(str(mgr.paths.lb_file(lb_id(i)))) + 1 for i in range(COUNT))
        assert listed > 128 * 1024  # what one file per load balancer would have put in HAPROXY_CFGFILES

        # One more change: a reload of a master that serves all of them.
        before = mgr.status()
        assert await mgr.apply(lb_id(COUNT), lb_text(lb_id(COUNT), port, echo_port, outer=outer(COUNT)))
        after = mgr.status()
        assert after["reloads"] > before["reloads"] and after["failed_reloads"] == before["failed_reloads"]
        assert after["running"]
        assert all([await echo_through(port, host=outer(i)) for i in (*sample, COUNT)])
    finally:
        await mgr.stop()
