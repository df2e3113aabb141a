"""A load balancer whose pass fails for a real reason is retried by its own
task with the backoff of the contract (1 s, doubling, up to 5 min), its
`retries` and `last_error` shown in status; when the cause goes away the next
retry succeeds by itself, with no new refresh, and both are cleared."""

from __future__ import annotations

import os
import time

from lbagent.naming import netns_name

from agentproc import wait_until
from helpers import MAC, VIP
from lbstate import backend, desired, loadbalancer, tcp_listener


class DirectoryInTheWay:
    """A directory, not a namespace, holding the load balancer's namespace name in /run/netns."""

    def __init__(self, lb_id: str):
        self.path = os.path.join("/run/netns", netns_name(lb_id))

    def create(self) -> None:
        os.makedirs("/run/netns", exist_ok=True)
        os.mkdir(self.path)

    def remove(self) -> None:
        if os.path.isdir(self.path) and not os.path.ismount(self.path):
            os.rmdir(self.path)


def test_a_failing_pass_backs_off_then_heals_by_itself(agent_factory, vpc, prefix):
    lb_id = f"{prefix}-retry"
    vpc.add_lb_port(lb_id, MAC, VIP)
    # Something else holds the namespace's name: each pass fails to create it.
    obstacle = DirectoryInTheWay(lb_id)
    obstacle.create()
    try:
        agent = agent_factory()
        lb = loadbalancer(lb_id, VIP, MAC, [tcp_listener("lsn-80", 80)], {"bg-1": [backend("be-a", "198.18.0.21")]})
        code, body = agent.refresh(desired(1, lb), wait=None)
        assert code == 202, body

        # When `retries` first reads 1, 2, 3, 4: the gaps between them are the backoff.
        seen: dict[int, float] = {}
        errors: set[str] = set()

        def fourth_failure() -> bool:
            status = agent.lb(lb_id)
            if status["retries"] and status["retries"] not in seen:
                seen[status["retries"]] = time.monotonic()
            if status["state"] == "error":
                errors.add(status["last_error"])
            assert status["state"] != "ready", status
            return status["retries"] >= 4

        wait_until(fourth_failure, 20, "four failed passes", interval=0.05)
        assert sorted(seen)[:4] == [1, 2, 3, 4], seen  # one failure at a time, none skipped
        gaps = [seen[n + 1] - seen[n] for n in (1, 2, 3)]
        for gap, expected in zip(gaps, (1, 2, 4), strict=True):
            assert 0.8 * expected <= gap <= 1.3 * expected + 0.5, gaps
        assert len(errors) == 1 and netns_name(lb_id) in next(iter(errors)), errors  # says what is in the way
        failing = agent.lb(lb_id)
        assert failing["state"] == "error" and failing["last_error"] in errors, failing

        # The cause goes away; the next retry (8 s after the fourth failure) succeeds.
        obstacle.remove()
        last: list[dict] = []

        def ready() -> dict | None:
            last[:] = [agent.lb(lb_id)]
            return last[0] if last[0]["state"] == "ready" else None

        try:
            healed = wait_until(ready, 15, "the retry to succeed")
        except TimeoutError:
            raise AssertionError(f"not healed: {last}\n{agent.log()[-3000:]}") from None
        assert healed["retries"] == 0 and healed["last_error"] is None, healed
        assert healed["generation"] == 1 and healed["ovn_installed"], healed
    finally:
        obstacle.remove()
