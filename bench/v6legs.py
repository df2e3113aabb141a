"""The benchmark's IPv6 leg: dual-stack load balancers, measured against the IPv4 figures of the same run.

At the smallest N, after the IPv4 legs' agent is gone, with SUBNET6 posted
(the subnet with its IPv6 prefix) and every load balancer given its IPv6 VIP:

- P1 dual-stack: fresh agents, one POST of the N load balancers each, timed
  to all ready (repeated like the IPv4 P1 at that N; the median run is the
  figure); held to the IPv4 P1 of the same N;
- P3 with an IPv6 backend: the agent resized to --p3-small, each change
  brings a spare in by its IPv6 address, timed to the first answer from it
  on the IPv6 VIP;
- P4 with an IPv6 client: the IPv4 agent leg's load (tool, connections,
  duration, the four IPv4 backends) aimed at the IPv6 VIP.

The figures go to results["ipv6"]; a leg that fails (e.g. an agent that
refuses IPv6) leaves the IPv4 figures standing and says why in its rows.
"""

from __future__ import annotations

from typing import Any

from bench.common import P1_REPEAT_UP_TO, say
from bench.measure import median_run


class Ipv6Legs:
    def _ipv6_leg(self, n: int) -> None:
        figures: dict[str, Any] = {"n": n}
        self.results["ipv6"] = figures
        self.dual_stack = True
        try:
            try:
                figures["p1"] = self._p1_dual_stack(n)
                if figures["p1"]["agent_seconds"] is None:
                    figures["error"] = "the dual-stack load balancers did not converge"
                    return
                figures["p3"] = self._p3(self.config.p3_small, resize=True)
                self._check_sandbox("P3 with an IPv6 backend")
                vip6 = self.lbs[0]["network"]["ip6"]
                self._p4_leg("p4", [(vip6, 80)] * 4, into=figures)
            except (RuntimeError, TimeoutError, OSError) as exc:
                figures["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                say(f"    the IPv6 leg stopped: {figures['error']}")
            finally:
                self._retire_agent()  # posts the empty state with SUBNET6, as its agent knew it
        finally:
            self.dual_stack = False

    def _p1_dual_stack(self, n: int) -> dict[str, Any]:
        """Fresh agents, as many as the IPv4 P1 of this N had; the run with the median time is the figure.
        The last agent stays for P3 and P4."""
        count = self.config.p1_runs if n <= P1_REPEAT_UP_TO else 1
        runs: list[dict[str, Any]] = []
        for attempt in range(count):
            if attempt:
                self._retire_agent()
            run: dict[str, Any] = {"n": n}
            runs.append(run)
            self._p1_agent(n, run, attempt=attempt, profiled=False)
        entry = dict(median_run(runs, key="agent_seconds"))
        entry.pop("timeline", None)  # the runs' seconds are kept; their samples add nothing to the comparison
        entry["runs"] = [run.get("agent_seconds") for run in runs]
        return entry
