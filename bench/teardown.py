"""The benchmark's end: retiring the agent, removing everything the run made, and py-spy profiles."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench import floor
from bench.common import (
    PROFILE_DIR,
    RETIRE_BY_AGENT,
    lb_id,
    say,
)
from bench.measure import (
    summarize_profile,
)
from devtools.sandbox import INTEGRATION_BRIDGE
from lbagent.naming import interface_names

from agentproc import LBAGENT
from lbstate import desired


class TeardownAndProfiles:
    def _retire_agent(self, timed_cleanup: bool = False) -> None:
        """Stop the agent and remove what it made.

        Up to RETIRE_BY_AGENT load balancers the agent deletes them itself
        (a timed, bounded POST of an empty state); then it stops, our own
        `lb-<prefix>-*` namespaces go (their veths with them) and `lbagent
        cleanup` removes the rest (OVS ports, policy rules, haproxy, state).
        With `timed_cleanup` (P8 of the scale run) the agent stops with every
        load balancer in place and `lbagent cleanup` alone removes them, timed.
        """
        agent, self.agent = self.agent, None
        if agent is None:
            return
        count = len(self.lbs)
        try:
            if not timed_cleanup and agent.proc is not None and agent.proc.poll() is None and count <= RETIRE_BY_AGENT:
                self.generation += 1
                started = time.monotonic()
                code, _ = agent.request(
                    "POST", "/v1/refresh?wait=300", desired(self.generation, subnets=[self.subnet]), timeout=360
                )
                if code == 200:
                    self.results.setdefault("teardown_seconds", {})[str(count)] = round(time.monotonic() - started, 2)
                    # What the agent's own deletion left behind while it still runs (should be nothing).
                    self.results.setdefault("left_after_delete", {}).setdefault(str(count), []).extend(
                        self._left_behind(count)
                    )
        finally:
            self.lbs = []
            agent.stop()
            if timed_cleanup:
                say(f"==> P8 lbagent cleanup of N={count} load balancers, the agent stopped")
                seconds = self._lbagent_cleanup(agent)
                left = self._left_behind(count)
                self.results["cleanup"] = {"n": count, "seconds": round(seconds, 2), "left": left}
                say(f"    {seconds:.1f} s; {len(left)} links, ports or namespaces left")
            else:
                for netns in Path("/run/netns").glob(f"lb-{self.prefix}-*"):
                    floor.delete_netns(netns.name)
                self._lbagent_cleanup(agent)
            if os.environ.get("LBAGENT_KEEP_AGENT_DIRS") is None:
                shutil.rmtree(agent.base, ignore_errors=True)

    def _lbagent_cleanup(self, agent) -> float:
        """`lbagent cleanup --yes` of the agent's host; the seconds it took."""
        started = time.monotonic()
        result = subprocess.run(
            [LBAGENT, "cleanup", "--yes", "--config", str(agent.config_path)],
            capture_output=True,
            text=True,
            timeout=600,
            env=agent.env,
        )
        if result.returncode != 0:
            raise RuntimeError(f"lbagent cleanup failed: {result.stdout[-300:]} {result.stderr[-300:]}")
        return time.monotonic() - started

    def _left_behind(self, count: int) -> list[str]:
        """The host links, integration bridge ports and namespaces of the first `count` load balancers still there."""
        present = set(os.listdir("/sys/class/net"))
        present.update(self.sandbox.vsctl("list-ports", INTEGRATION_BRIDGE).split())
        left = sorted(
            name
            for index in range(count)
            for names in [interface_names(lb_id(self.prefix, index))]
            for name in (names.ovn_host, names.haproxy_host)
            if name in present
        )
        return left + sorted(p.name for p in Path("/run/netns").glob(f"lb-{self.prefix}-*"))

    def _teardown(self) -> None:
        problems: list[str] = []

        def attempt(what: str, fn, *args) -> None:
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - every step is tried; all problems reported
                problems.append(f"{what}: {exc}")

        say("==> removing everything the benchmark created")
        attempt("agent", self._retire_agent)
        if self.floor_plan:
            attempt("floor", floor.remove_floor, self.floor_plan, self.sandbox.vsctl, INTEGRATION_BRIDGE)
        if self.ovn_lb:
            attempt("OVN load balancer", self.sandbox.nbctl, "--if-exists", "lb-del", self.ovn_lb)
        if self.pool is not None:
            attempt("client threads", self.pool.close)
        attempt("backends", self.backends.stop)
        if self.vpc is not None:
            # After thousands of ports went, ovs-vswitchd takes minutes to catch up.
            attempt("VPC", self.vpc.cleanup, 600.0 if self.config.scale else 30.0)
        if problems:
            raise RuntimeError("benchmark teardown incomplete: " + "; ".join(problems))

    def _profile_start(self, name: str, seconds: float):
        spy = Path(sys.executable).with_name("py-spy")
        if not self.config.profile or not spy.exists():
            return None
        PROFILE_DIR.mkdir(parents=True, exist_ok=True)
        out = PROFILE_DIR / f"{name}.txt"
        proc = subprocess.Popen(
            [
                str(spy),
                "record",
                "--pid",
                str(self.agent.proc.pid),
                "--duration",
                str(int(seconds)),
                "--rate",
                "50",
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return proc, out, seconds

    def _profile_finish(self, profile, stop: bool = False) -> dict:
        """The summary of a profile; `stop`: end the recording now rather than
        at its duration (P1's ends when all are ready, before the resyncs)."""
        proc, out, seconds = profile
        if stop and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
        try:
            proc.wait(timeout=seconds + 60)
        except subprocess.TimeoutExpired:
            proc.terminate()
            proc.wait(10)
        return summarize_profile(out) if out.exists() else {"error": "py-spy wrote nothing"}
