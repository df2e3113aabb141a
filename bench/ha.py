"""`make bench-ha`: high availability measured on a multi-host sandbox, H1-H6, one table.

    .venv/bin/python -m bench.ha [--crashes 10] [--restarts 10] [--handovers 3] [--h6-n 50]
                                 [--h6-window 30] [--output bench/results-ha.json]

What it builds (devtools.multihost; everything is removed afterwards, also on
failure or Ctrl-C): a central and the hosts gw-1, gw-2 and cl; a VPC
198.18.0.0/16 whose backend (198.18.0.21, answering "web") and client
(198.18.0.30) live on cl; an agent on each gateway (`[ovn] lease_seconds`
1.5, tests/functional/hostagent.py) and one load balancer with `ha` on both,
VIP 198.18.0.100:80. The client (bench/ha_probe.py) makes a new connection
to the VIP every 20 ms from start to end; the SB binding and both agents'
roles are sampled every 50 ms (bench/ha_watch.py).

- H1: the active host crashes (SimHost.crash()) --crashes times; from the
  kill to the first answer through the standby. The crashed host is revived
  and its agent started, and it is the standby of the next round.
- H2: over H1, the samples in which both hosts said `active` for one term,
  and the binding changes of each failover.
- H3: the active agent is restarted (SIGTERM, start, lease renewed without
  grace) --restarts times: the term, the binding and every request unchanged.
- H4: the active host's underlay is cut until the standby answers, then
  healed: the old active says `standby` and the binding moved once.
- H5: `lbagent ha handover` on the active host --handovers times: new
  connections refused at connect and broken mid-request.
- H6: --h6-n more load balancers with `ha` on both gateways; over a
  --h6-window idle window the central's NB transactions per second (its RAFT
  log) and the CPU of the active and the standby agent. A smaller --h6-n than
  1,000 is extrapolated to 1,000 in the table (a straight line through a
  baseline window with one load balancer and the measured one), and labelled
  so. Only a settled state is measured: every load balancer with one active
  host, both agents in contact with NB.

The table goes to stdout and, with every raw figure, the machine, the
versions and the commit, to --output. LBAGENT_KEEP_BENCH_DIR=1 keeps the
working directory, with the agents' and the central's logs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from bench import ha_report, report
from bench.common import FIRST_VIP, REPO, SUBNET, say
from bench.ha_watch import Probe, Sampler
from devtools.multihost import MultiHost
from devtools.procs import wait_for
from devtools.topology import Vpc, lb_port_name
from tests.functional.hostagent import HostAgent

from lbstate import backend, desired, loadbalancer, tcp_listener

GATEWAYS = ("gw-1", "gw-2")
CLIENT_HOST = "cl"
BACKEND_IP, CLIENT_IP = "198.18.0.21", "198.18.0.30"
VIP, VIP_MAC = "198.18.0.100", "0a:5b:c6:12:00:64"
WAIT = 60.0  # seconds any one expected change may take before the run gives up on it
IN_FLIGHT_SECONDS = 3.0  # after a handover, how long connections made on the old host may take to end
H4_WATCH_LEASES = 4  # lease times watched after the heal, for a binding that flaps back
H4_STEP_DOWN_WAIT = 30.0  # seconds a cut-off host may go on saying `active` before the run stops waiting


@dataclass
class HaConfig:
    crashes: int = 10
    restarts: int = 10
    handovers: int = 3
    cuts: int = 1  # H4 is one cut (0: skipped)
    # Each simulated host's underlay (its NB and SB sessions too) crosses its own userspace
    # ovs-vswitchd, whose main loop here slows with every port: at 100 load balancers per host it
    # took seconds and the agents lost the Northbound database. A smaller N, extrapolated, labelled.
    h6_n: int = 50
    h6_n_wanted: int = 1000
    h6_window: float = 30.0
    h6_timeout: float = 600.0
    lease_seconds: float = 1.5
    restart_grace: float = 30.0
    probe_interval: float = 0.02
    sample_interval: float = 0.05

    def __post_init__(self) -> None:
        if min(self.crashes, self.restarts, self.handovers, self.cuts, self.h6_n) < 0:
            raise ValueError("counts must not be negative")


def ha_lb(lb_id: str, vip: str, mac: str) -> dict:
    return loadbalancer(
        lb_id,
        vip,
        mac,
        [tcp_listener("lsn-80", 80)],
        {"bg-1": [backend("be-web", BACKEND_IP)]},
        ha={"hosts": list(GATEWAYS), "preempt": False},
    )


def h6_address(index: int) -> tuple[str, str]:
    """VIP and MAC of the index-th load balancer of H6."""
    vip = FIRST_VIP + index
    return str(vip), "0a:5c:" + ":".join(f"{b:02x}" for b in vip.packed)


def ha_of(agent: HostAgent, lb_id: str) -> dict[str, Any] | None:
    """The `ha` of the agent's load balancer `lb_id` (None: the agent does not answer)."""
    try:
        code, body = agent.request("GET", f"/v1/loadbalancers/{lb_id}", timeout=5)
    except OSError:
        return None
    return (body.get("ha") or {}) if code == 200 and isinstance(body, dict) else {}


def role_of(agent: HostAgent, lb_id: str) -> str | None:
    ha = ha_of(agent, lb_id)
    return "down" if ha is None else ha.get("role")


def wait_roles(agents: dict[str, HostAgent], lb_id: str, active: str, among: list[str] | None = None) -> None:
    """Until `active` says active for `lb_id` and the others (or only those `among`) standby."""
    names = among or list(agents)

    def settled() -> bool:
        return all(role_of(agents[name], lb_id) == ("active" if name == active else "standby") for name in names)

    wait_for(settled, WAIT, f"{active} active for {lb_id}" + ("" if among else ", the others standby"))


def wait_bound(mh: MultiHost, lsp: str, name: str) -> None:
    chassis = mh.host(name).chassis
    wait_for(lambda: mh.central.port_binding_chassis(lsp) == chassis, WAIT, f"{lsp} bound on {name}")


def linger(until: float) -> None:
    """Let the watchers (the client, the sampler: threads and processes of their own) run until `until`."""
    time.sleep(max(0.0, until - time.monotonic()))


class HaBench:
    def __init__(self, mh: MultiHost, prefix: str, config: HaConfig, log_dir: Path):
        self.mh, self.prefix, self.config, self.log_dir = mh, prefix, config, log_dir
        self.lb_id = f"{prefix}-ha"
        self.generation = 0
        self.lbs: list[dict] = [ha_lb(self.lb_id, VIP, VIP_MAC)]
        self.results: dict[str, Any] = {"config": asdict(config)}
        self.vpc: Vpc | None = None
        self.lsp = ""
        self.agents: dict[str, HostAgent] = {}
        self.probe: Probe | None = None
        self.sampler: Sampler | None = None
        self._t0 = time.monotonic()

    # -- the whole run ----------------------------------------------------------

    def run(self) -> dict[str, Any]:
        try:
            self._setup()
            self._phase("H1/H2", self.config.crashes, self._h1)
            self._phase("H3", self.config.restarts, self._h3)
            self._phase("H4", self.config.cuts, self._h4)
            self._phase("H5", self.config.handovers, self._h5)
            self._stop_watching()
            self._phase("H6", self.config.h6_n, self._h6)
        finally:
            self._stop_watching()
            self._stop_agents()
        self.results["rows"] = ha_report.evaluate(self.results)
        return self.results

    def _phase(self, name: str, count: int, measure: Callable[[], None]) -> None:
        if count <= 0:
            return
        try:
            measure()
        except (TimeoutError, RuntimeError, OSError) as exc:
            # One phase that goes wrong must not cost the figures of the others.
            say(f"!! {name} failed: {exc}")
            self.results.setdefault("errors", {})[name] = str(exc)
            if self.probe is not None:
                self._recover()

    def _setup(self) -> None:
        say(f"==> VPC {SUBNET['cidr']} on {CLIENT_HOST}: backend {BACKEND_IP}, client {CLIENT_IP}")
        self.vpc = self.mh.vpc(SUBNET["cidr"], SUBNET["gateway"])
        self.vpc.add_host("web", BACKEND_IP, http_text="web", on=CLIENT_HOST)
        client = self.vpc.add_host("client", CLIENT_IP, on=CLIENT_HOST)
        self.lsp = self.vpc.add_lb_port(self.lb_id, VIP_MAC, VIP)
        say(f"==> agents on {', '.join(GATEWAYS)} (lease {self.config.lease_seconds:g} s); {self.lb_id} on both")
        for name in GATEWAYS:
            agent = HostAgent(
                self.mh, self.mh.host(name), lease=self.config.lease_seconds, grace=self.config.restart_grace
            )
            self.agents[name] = agent.start()
        self._push()
        self._wait_roles(GATEWAYS[0])
        self._wait_bound(GATEWAYS[0])
        self.probe = Probe(self.mh.host(CLIENT_HOST), client, VIP, interval=self.config.probe_interval).start()
        started = time.monotonic()
        wait_for(lambda: self.probe.answering(started), WAIT, f"the client's first answer from {VIP}")
        self.sampler = Sampler(self.mh, self.lsp, self.lb_id, self.agents, self.config.sample_interval).start()

    # -- H1 and H2 --------------------------------------------------------------

    def _h1(self) -> None:
        rounds: list[dict[str, Any]] = []
        self.results["h1"] = {"rounds": rounds}
        first_sample = len(self.sampler.samples)
        for index in range(self.config.crashes):
            rounds.append(self._crash_round(index))
        samples = self.sampler.samples[first_sample:]
        durations = self.sampler.durations[first_sample:]
        self.results["h1"].update(
            samples=len(samples),
            sample_ms_p50=ha_report.percentile([d * 1000 for d in durations], 0.5) if durations else 0.0,
            split_brain_moments=ha_report.split_brain_moments(samples),
            two_active_moments=ha_report.two_active_moments(samples),
            split_brain_at=[self._rel(s.at) for s in samples if ha_report.split_brain_moments([s])],
        )

    def _crash_round(self, index: int) -> dict[str, Any]:
        active, standby = self._active_and_standby()
        term = self._term(active)
        self._wait_answering()
        called = time.monotonic()
        self.mh.host(active).crash()
        # Every process of the host is dead now; before, crash() was still finding them.
        killed = time.monotonic()
        answered = wait_for(
            lambda: ha_report.first_answer_after(self.probe.attempts(), killed),
            WAIT,
            f"an answer through {standby} after {active} crashed",
            interval=0.02,
        )
        self._wait_roles(standby, among=[standby])
        self._wait_bound(standby)
        moved = time.monotonic()
        say(f"    crash {index + 1}: {active} killed, {standby} answered after {answered - killed:.2f} s")
        self._revive(active)
        self._wait_roles(standby)
        self._wait_built(active)
        ended = time.monotonic()
        # Read after the revival: the connections of the outage have ended (or timed out) by now.
        outage = ha_report.outage(self.probe.attempts(), called)
        window = ha_report.samples_between(self.sampler.samples, called, ended)
        return {
            "crashed": active,
            "took_over": standby,
            "killed_at": self._rel(killed),
            "crash_call_seconds": round(killed - called, 3),
            "failover_seconds": round(answered - killed, 3),
            "client_outage_seconds": None if outage is None else round(outage, 3),
            "binding_moved_seconds": round(moved - killed, 3),
            "term_before": term,
            "term_after": self._term(standby),
            "binding_changes": ha_report.binding_changes(window),
            "bindings": ha_report.binding_sequence(window),
            "unbound_seconds": round(ha_report.unbound_seconds(window), 3),
            "last_failover_s": self.agents[standby].ha(self.lb_id).get("last_failover_s"),
            "outcomes": ha_report.outcomes_between(self.probe.attempts(), called, ended),
            "revived_seconds": round(ended - moved, 2),
        }

    def _revive(self, name: str) -> None:
        self.mh.host(name).revive()
        self.agents[name].start()

    # -- H3 -----------------------------------------------------------------------

    def _h3(self) -> None:
        rounds: list[dict[str, Any]] = []
        self.results["h3"] = {"rounds": rounds}
        for index in range(self.config.restarts):
            active, _ = self._active_and_standby()
            term = self._term(active)
            self._wait_answering()
            began = time.monotonic()
            self.agents[active].stop()
            self.agents[active].start()
            wait_for(lambda: "lbagent:grace" not in self._lease(), WAIT, f"{active} to renew without grace")
            restarted = time.monotonic()
            self._wait_roles(active)
            self._wait_answering()
            ended = time.monotonic()
            window = ha_report.samples_between(self.sampler.samples, began, ended)
            rounds.append(
                {
                    "host": active,
                    "restart_seconds": round(restarted - began, 2),
                    "term_before": term,
                    "term_after": self._term(active),
                    "binding_changes": ha_report.binding_changes(window),
                    "outcomes": ha_report.outcomes_between(self.probe.attempts(), began, ended),
                }
            )
            say(
                f"    restart {index + 1} of {active}: {rounds[-1]['outcomes']}, "
                f"term {term} -> {rounds[-1]['term_after']}"
            )

    # -- H4 -----------------------------------------------------------------------

    def _h4(self) -> None:
        active, standby = self._active_and_standby()
        self._wait_answering()
        host = self.mh.host(active)
        host.cut_underlay()
        cut = time.monotonic()  # connections started before this may still have gone through the host
        h4: dict[str, Any] = {"cut_host": active, "answer_seconds": None}
        self.results["h4"] = h4
        try:
            answered = wait_for(
                lambda: ha_report.first_answer_after(self.probe.attempts(), cut),
                WAIT,
                f"an answer through {standby} with {active} cut off",
                interval=0.02,
            )
            h4["answer_seconds"] = round(answered - cut, 3)
            self._wait_roles(standby, among=[standby])
            h4.update(self._cut_host_steps_down(active, cut))
        finally:
            host.heal_underlay()
        healed = time.monotonic()
        h4["cut_seconds"] = round(healed - cut, 2)
        say(f"    {active} cut: {standby} answered after {h4['answer_seconds']:.2f} s; healed")
        self._wait_roles(standby)
        h4["standby_again_seconds"] = round(time.monotonic() - healed, 2)
        # Watch a few lease times more: a binding that flaps back would show here.
        self._linger(healed + H4_WATCH_LEASES * self.config.lease_seconds)
        ended = time.monotonic()
        window = ha_report.samples_between(self.sampler.samples, cut, ended)
        h4.update(
            old_active_role=self._role(active),
            watched_seconds=round(ended - healed, 1),
            binding_changes=ha_report.binding_changes(window),
            bindings=ha_report.binding_sequence(window),
            split_brain_moments=ha_report.split_brain_moments(window),
            two_active_moments=ha_report.two_active_moments(window),
            roles_seen={name: sorted({str(s.roles[name][0]) for s in window}) for name in self.agents},
            outcomes=ha_report.outcomes_between(self.probe.attempts(), cut, ended),
        )

    def _cut_host_steps_down(self, name: str, cut: float) -> dict[str, Any]:
        """How long the cut-off host goes on saying `active`, out of contact (bounded)."""
        try:
            role = wait_for(
                lambda: (role := self._role(name)) != "active" and role,
                H4_STEP_DOWN_WAIT,
                f"{name}, cut off, to stop saying active",
                interval=0.05,
            )
        except TimeoutError:
            return {"role_while_cut": "active", "active_while_cut_seconds": None}
        return {"role_while_cut": role, "active_while_cut_seconds": round(time.monotonic() - cut, 2)}

    # -- H5 -----------------------------------------------------------------------

    def _h5(self) -> None:
        rounds: list[dict[str, Any]] = []
        self.results["h5"] = {"rounds": rounds}
        for index in range(self.config.handovers):
            active, standby = self._active_and_standby()
            self._wait_answering()
            began = time.monotonic()
            done = self.agents[active].cli("ha", "handover", self.lb_id, timeout=WAIT)
            answered = time.monotonic()
            self._wait_bound(standby)
            moved = time.monotonic()
            self._wait_roles(standby)
            self._wait_answering(since=moved)
            self._linger(moved + IN_FLIGHT_SECONDS)
            ended = time.monotonic()
            line = done.stdout.strip()
            rounds.append(
                {
                    "from": active,
                    "to": standby,
                    "said": line,
                    "result": line.split(": ", 1)[-1].split(" ", 1)[0],
                    "command_seconds": round(answered - began, 3),
                    "moved_seconds": round(moved - began, 3),
                    "outcomes": ha_report.outcomes_between(self.probe.attempts(), began, ended),
                }
            )
            say(f"    handover {index + 1} {active} -> {standby}: {line}; {rounds[-1]['outcomes']}")

    # -- H6 -----------------------------------------------------------------------

    def _h6(self) -> None:
        n = self.config.h6_n
        h6: dict[str, Any] = {"n": n, "n_wanted": self.config.h6_n_wanted}
        self.results["h6"] = h6
        if n < self.config.h6_n_wanted:
            say(f"==> H6 baseline: {self.config.h6_window:g} s idle with one load balancer")
            h6["baseline"] = self._h6_window(*self._active_and_standby())
        say(f"==> H6: {n} more load balancers with ha on both gateways (their ports in one ovn-nbctl call)")
        began = time.monotonic()
        self._add_h6_ports(n)
        self.lbs += [ha_lb(f"{self.prefix}-{i:05d}", *h6_address(i)) for i in range(n)]
        self._push()
        try:
            wait_for(self._all_ready, self.config.h6_timeout, f"{n + 1} load balancers ready on both hosts", interval=2)
        except TimeoutError:
            h6["error"] = f"not ready after {self.config.h6_timeout:.0f} s: {self._ready_counts()}"
            say(f"    {h6['error']}")
            return
        h6["build_seconds"] = round(time.monotonic() - began, 1)
        try:
            wait_for(self._one_active_each, WAIT, "one active host for every load balancer", interval=2)
        except TimeoutError:
            pass  # said below, from the roles and the contact as they are
        h6["settled_seconds"] = round(time.monotonic() - began, 1)
        h6.update(self._h6_roles())
        say(f"    built in {h6['build_seconds']:.0f} s; roles {h6['roles']}; now {self.config.h6_window:g} s idle")
        h6.update(self._h6_window(h6["active_host"], h6["standby_host"]))
        after = self._h6_roles()
        h6["after_window"] = {"roles": after["roles"], "agents_ha": after["agents_ha"]}
        unsettled = [
            f"{name}: {when}"
            for when, seen in (("before the window", h6), ("after it", after))
            for name, ha in seen["agents_ha"].items()
            if not ha["in_contact"]
        ]
        if sum(counts.get("active", 0) for counts in h6["roles"].values()) != len(self.lbs):
            unsettled.append("not every load balancer had an active host")
        if unsettled:
            h6["out_of_contact"] = unsettled
        say(
            f"    NB {h6['nb_txn_per_second']:.1f} txn/s; agents {h6['active_cpu_percent']:.1f} % (active) "
            f"{h6['standby_cpu_percent']:.1f} % (standby)" + (f"; NOT SETTLED: {unsettled}" if unsettled else "")
        )

    def _h6_roles(self) -> dict[str, Any]:
        roles = self._roles_by_host()
        active = max(roles, key=lambda name: roles[name].get("active", 0))
        standby = next(name for name in GATEWAYS if name != active)
        agents_ha = {name: agent.status()["agent"]["ha"] for name, agent in self.agents.items()}
        for ha in agents_ha.values():
            ha["last_error"] = (ha.get("last_error") or "")[:300] or None
        return {
            "active_host": active,
            "standby_host": standby,
            "active_holds": roles[active].get("active", 0),
            "standby_holds": roles[standby].get("active", 0),
            "roles": roles,
            "agents_ha": agents_ha,
            "nb_memory": self.mh.central.appctl("ovnnb_db", "memory/show").strip(),
        }

    def _one_active_each(self) -> bool:
        roles = self._roles_by_host()
        return sum(counts.get("active", 0) for counts in roles.values()) == len(self.lbs)

    def _add_h6_ports(self, n: int) -> None:
        args: list[str] = []
        for index in range(n):
            lb_id = f"{self.prefix}-{index:05d}"
            vip, mac = h6_address(index)
            name = lb_port_name(lb_id)
            self.vpc.lb_ports[lb_id] = self.vpc.switch  # Vpc.cleanup() deletes them
            args += ["--", "lsp-add", self.vpc.switch, name, "--", "lsp-set-addresses", name, f"{mac} {vip}"]
        self.mh.central.nbctl(*args[1:], timeout=300)

    def _ready_counts(self) -> dict[str, int]:
        counts = {}
        for name, agent in self.agents.items():
            lbs = agent.request("GET", "/v1/status", timeout=60)[1]["loadbalancers"]
            counts[name] = sum(lb["state"] == "ready" for lb in lbs)
        return counts

    def _all_ready(self) -> bool:
        return all(count == len(self.lbs) for count in self._ready_counts().values())

    def _roles_by_host(self) -> dict[str, dict[str, int]]:
        """How many load balancers each agent holds as active, standby, unknown, ..."""
        counts: dict[str, dict[str, int]] = {}
        for name, agent in self.agents.items():
            lbs = agent.request("GET", "/v1/status", timeout=60)[1]["loadbalancers"]
            counts[name] = dict(Counter(str((lb.get("ha") or {}).get("role")) for lb in lbs))
        return counts

    def _h6_window(self, active: str, standby: str) -> dict[str, Any]:
        window = self.config.h6_window
        processes = {
            "active": psutil.Process(self.agents[active].proc.pid),
            "standby": psutil.Process(self.agents[standby].proc.pid),
            "nb": psutil.Process(self._nb_pid()),
        }
        cpu_before = {who: _cpu_seconds(p) for who, p in processes.items()}
        index_before, coverage_before = self._nb_commit_index(), self._nb_coverage()
        began = time.monotonic()
        self._linger(began + window)
        elapsed = time.monotonic() - began
        index_after, coverage_after = self._nb_commit_index(), self._nb_coverage()
        cpu = {who: (_cpu_seconds(p) - cpu_before[who]) / elapsed * 100 for who, p in processes.items()}
        coverage = {k: coverage_after[k] - coverage_before.get(k, 0) for k in coverage_after}
        return {
            "window_seconds": round(elapsed, 1),
            "nb_txn_per_second": round((index_after - index_before) / elapsed, 2),
            "nb_txn_source": "entries of its RAFT log",
            "nb_log_index": [index_before, index_after],
            "nb_coverage_delta": {k: v for k, v in coverage.items() if v},
            "nb_cpu_percent": round(cpu["nb"], 2),
            "active_cpu_percent": round(cpu["active"], 2),
            "standby_cpu_percent": round(cpu["standby"], 2),
        }

    def _nb_pid(self) -> int:
        daemon = next(d for d in self.mh.central.daemons if d.name == "ovnnb_db")
        pid = daemon.pid()
        if pid is None:
            raise RuntimeError("the central's NB ovsdb-server is not running")
        return pid

    def _nb_commit_index(self) -> int:
        """The last entry of the NB's RAFT log: one per committed transaction (and a few of RAFT's own)."""
        status = self.mh.central.appctl("ovnnb_db", "cluster/status", "OVN_Northbound")
        found = re.search(r"^Log: \[(\d+), (\d+)\]", status, re.MULTILINE)
        if found is None:
            raise RuntimeError(f"no Log line in cluster/status: {status[:300]}")
        return int(found.group(2))

    def _nb_coverage(self) -> dict[str, int]:
        """The NB ovsdb-server's coverage counters (totals), for the record."""
        text = self.mh.central.appctl("ovnnb_db", "coverage/show")
        counts = {}
        for line in text.splitlines():
            found = re.match(r"^(\S+)\s+.*total:\s*(\d+)", line)
            if found:
                counts[found.group(1)] = int(found.group(2))
        return counts

    # -- the agents and the load balancer ------------------------------------------

    def _push(self) -> None:
        self.generation += 1
        body = desired(self.generation, *self.lbs, subnets=[SUBNET])
        for name, agent in self.agents.items():
            code, answer = agent.refresh(body, wait=None)
            if code != 202:
                raise RuntimeError(f"{name} answered {code} to the refresh: {str(answer)[:300]}")

    def _role(self, name: str) -> str | None:
        return role_of(self.agents[name], self.lb_id)

    def _term(self, name: str) -> int | None:
        return self.agents[name].ha(self.lb_id).get("term")

    def _active_and_standby(self) -> tuple[str, str]:
        def settled() -> tuple[str, str] | None:
            roles = {name: self._role(name) for name in GATEWAYS}
            active = [name for name, role in roles.items() if role == "active"]
            standby = [name for name, role in roles.items() if role == "standby"]
            return (active[0], standby[0]) if len(active) == 1 and len(standby) == 1 else None

        return wait_for(settled, WAIT, f"one active and one standby host for {self.lb_id}")

    def _wait_roles(self, active: str, among: list[str] | None = None) -> None:
        wait_roles(self.agents, self.lb_id, active, among)

    def _wait_bound(self, name: str) -> None:
        wait_bound(self.mh, self.lsp, name)

    def _wait_built(self, name: str) -> None:
        wait_for(lambda: self.agents[name].lb(self.lb_id)["state"] == "ready", WAIT, f"the copy on {name} built")

    def _wait_answering(self, since: float | None = None) -> None:
        moment = time.monotonic() if since is None else since
        wait_for(lambda: self.probe.answering(moment), WAIT, f"the client answered from {VIP}", interval=0.02)

    def _lease(self) -> dict[str, str]:
        text = self.mh.central.nbctl("get", "Logical_Switch_Port", self.lsp, "external_ids")
        pairs = (item.split("=", 1) for item in text.strip().strip("{}").replace('"', "").split(", ") if "=" in item)
        return {k: v for k, v in pairs if k.startswith("lbagent:")}

    def _recover(self) -> None:
        """After a failed phase: every host back up with its agent, so that the next phase can run."""
        for name in GATEWAYS:
            host = self.mh.host(name)
            try:
                host.heal_underlay()
                if self._role(name) == "down":
                    if not all(daemon.running() for daemon in host.daemons):  # crashed
                        host.revive()
                    self.agents[name].start()
            except (TimeoutError, RuntimeError, OSError) as exc:
                say(f"!! could not bring {name} back: {exc}")

    @staticmethod
    def _linger(until: float) -> None:
        linger(until)

    def _rel(self, moment: float) -> float:
        return round(moment - self._t0, 3)

    # -- the end -------------------------------------------------------------------

    def _stop_watching(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.results["samples"] = [
                [self._rel(s.at), s.chassis, {k: list(v) for k, v in s.roles.items()}] for s in self.sampler.samples
            ]
            self.sampler = None
        if self.probe is not None:
            self.probe.stop()
            self.results["attempts"] = [
                [self._rel(a.start), round(a.end - a.start, 4), a.outcome] for a in self.probe.attempts()
            ]
            self.probe = None

    def _stop_agents(self) -> None:
        # The sandbox's stop removes what they made on their hosts (namespaces, haproxy, OVS),
        # and their logs: those are kept with the benchmark's directory.
        for name, agent in self.agents.items():
            agent.stop()
            if agent.log_path.exists():
                shutil.copy(agent.log_path, self.log_dir / f"agent-{name}.log")
        for log in self.mh.central.dirs["log"].glob("*.log"):
            shutil.copy(log, self.log_dir / f"central-{log.name}")


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def commit_id() -> dict[str, Any]:
    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10)
        return out.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--", "lbagent"))}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_ha_benchmark(config: HaConfig, output: Path | None, workdir: Path | None = None) -> dict[str, Any]:
    """The whole benchmark on a multi-host sandbox of its own, removed afterwards."""
    prefix = "h" + secrets.token_hex(3)[:5]
    own_dir = workdir is None
    # Short: the hosts' unix sockets live under it.
    workdir = Path(workdir or tempfile.mkdtemp(prefix="lbh", dir="/var/tmp"))
    started = time.monotonic()
    load_before = load_average()
    try:
        say(f"==> multi-host sandbox {prefix} in {workdir}: central, {', '.join(GATEWAYS)}, {CLIENT_HOST}")
        with MultiHost(workdir / "mh", prefix, [*GATEWAYS, CLIENT_HOST]) as mh:
            try:
                results = HaBench(mh, prefix, config, workdir).run()
            finally:
                say("==> removing the sandbox")
    finally:
        if own_dir and os.environ.get("LBAGENT_KEEP_BENCH_DIR") is None:
            shutil.rmtree(workdir, ignore_errors=True)
    results.update(
        prefix=prefix,
        machine=report.machine(),
        git=commit_id(),
        load_average={"before": load_before, "after": load_average()},
        seconds=round(time.monotonic() - started, 1),
        finished_at=time.strftime("%Y-%m-%d %H:%M:%S %z"),
    )
    if output is not None:
        output.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return results


def parse_args(argv: list[str] | None) -> tuple[HaConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="python -m bench.ha", description=__doc__.splitlines()[0])
    defaults = HaConfig()
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results-ha.json")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed or a phase failed")
    parser.add_argument("--crashes", type=int, default=defaults.crashes, help="H1 crashes of the active host")
    parser.add_argument("--restarts", type=int, default=defaults.restarts, help="H3 restarts of the active agent")
    parser.add_argument("--handovers", type=int, default=defaults.handovers, help="H5 planned handovers")
    parser.add_argument("--no-cut", action="store_true", help="skip H4")
    parser.add_argument(
        "--h6-n", type=int, default=defaults.h6_n, help="H6 load balancers per host (the table extrapolates to 1,000)"
    )
    parser.add_argument("--h6-window", type=float, default=defaults.h6_window, help="H6 idle window, seconds")
    parser.add_argument("--h6-timeout", type=float, default=defaults.h6_timeout, help="H6 gives up building after")
    args = parser.parse_args(argv)
    config = HaConfig(
        crashes=args.crashes,
        restarts=args.restarts,
        handovers=args.handovers,
        cuts=0 if args.no_cut else 1,
        h6_n=args.h6_n,
        h6_window=args.h6_window,
        h6_timeout=args.h6_timeout,
    )
    return config, args


def headline(results: dict[str, Any]) -> str:
    m, load = results["machine"], results["load_average"]
    return (
        f"lbagent high-availability benchmark, {time.strftime('%Y-%m-%d')}: {m['cpus']} CPUs ({m['cpu_model']}), "
        f"Linux {m['kernel']}; {m['ovs']}; {m['ovn']}; {m['haproxy']}; commit {results['git']['commit'][:12]}"
        f"{' (lbagent/ modified)' if results['git']['dirty'] else ''}\n"
        f"load average {' '.join(map(str, load['before']))} before, {' '.join(map(str, load['after']))} after "
        f"(a shared machine: figures under load are noisy)"
    )


def main(argv: list[str] | None = None) -> int:
    config, args = parse_args(argv)
    if os.geteuid() != 0:
        say("the high-availability benchmark needs root (namespaces, OVS, OVN); run it as root")
        return 2
    results = run_ha_benchmark(config, args.output)
    say(f"\n{headline(results)}\n")
    say(report.table(results["rows"]))
    if results.get("errors"):
        say("\nphases that failed: " + "; ".join(f"{k}: {v}" for k, v in results["errors"].items()))
    say(f"\nall figures: {args.output}")
    missed = [r["figure"] for r in results["rows"] if r["result"] == "MISSED"]
    return 1 if args.strict and (missed or results.get("errors")) else 0


if __name__ == "__main__":
    sys.exit(main())
