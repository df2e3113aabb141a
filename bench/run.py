"""`make bench`: every figure of the benchmark, measured in one run on a private OVS/OVN sandbox.

    .venv/bin/python -m bench.run [--n 100 1000] [--p2-seconds 40] [--wrk-seconds 10]
                                  [--changes 20] [--reloads 20] [--profile] [--output bench/results.json]

What it builds (every name carries one random prefix; everything is removed
afterwards, also on failure): a sandbox (devtools.sandbox), a VPC
198.18.0.0/16 with gateway .1, four backends .21-.24 and three spares .25-.27
answering their names (nginx, or the devtools Python server without nginx),
a client .31, an OVN native load balancer 198.19.0.10:80 over the four
backends, and a logical switch port for every load balancer (VIPs from
198.18.4.1 upward). Each load balancer has two TCP listeners (80, 81) on one
group of the four backends.

Per N in --n (smallest first), with a fresh agent each time (`lbagent run`
through tests/functional/agentproc.py, default resync interval):

- P1: the floor (bench/floor.py) is built, timed and removed; then the agent
  gets the N load balancers in one POST ?wait and the time to the answer
  saying all are ready is P1 (and when ovn-controller has bound all ports).
- at the largest N (whose agent resyncs each load balancer every --p2-every
  seconds): P2 (once every load balancer has had its first resync, a window
  of --p2-seconds without changes), P6, P3 and P5's
  reloads; at the smallest N, with the agent resized to --p3-small load
  balancers: P3, P4 (direct; the agent, with haproxy and an nginx stream
  proxy in the load balancer's namespace (bench/nslegs.py) in rounds,
  bench/p4rounds.py; OVN's native load balancer) and P5.

Then, unless --no-ipv6, the IPv6 leg at the smallest N (bench/v6legs.py): the
subnet gets its IPv6 prefix 2001:db8:0:1::/64 (every host and load balancer
port has an address in it from the start) and every load balancer an IPv6
VIP from 2001:db8:0:1::4:1 upward; P1 of those dual-stack load balancers
with fresh agents, against the IPv4 P1 of the same N; P3 where the backend
changed in is an IPv6 one, polled on the IPv6 VIP; P4's agent leg from the
client's IPv6 address, against the IPv4 agent leg.

Last, in this process and without the sandbox, the worst stall of the API's
event loop while the largest bodies the limits accept are taken in
(bench/loopstall.py).

The table goes to stdout and, with every raw figure, to --output.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench import floor, loopstall, report
from bench.common import (
    BACKEND_HOSTS,
    BACKEND_HOSTS6,
    CLIENT,
    CLIENT6,
    OVN_LB_VIP,
    P1_REPEAT_UP_TO,
    PROFILE_DIR,
    REPO,
    SPARE_HOSTS,
    SPARE_HOSTS6,
    SUBNET,
    SUBNET6,
    BenchConfig,
    lb_body,
    say,
)
from bench.legs import IdleLegs, TrafficLegs
from bench.measure import (
    AgentWatch,
    CpuSplit,
    check_floor,
    cpu_seconds,
    host_addresses,
    last_emergency,
    median_run,
)
from bench.teardown import TeardownAndProfiles
from bench.traffic import BACKEND_PORT, Backends, NetnsPool, http_text, set_sysctl_in
from bench.v6legs import Ipv6Legs
from devtools.sandbox import INTEGRATION_BRIDGE, OvnSandbox, wait_for, which
from devtools.topology import Vpc, lb_port_name

from agentproc import AgentProcess
from lbstate import desired
from neighbourlimits import kept_limits

# --------------------------------------------------------------------------
# watching the agent


# --------------------------------------------------------------------------
# the benchmark


class Bench(IdleLegs, TrafficLegs, Ipv6Legs, TeardownAndProfiles):
    def __init__(self, sandbox: OvnSandbox, prefix: str, workdir: Path, config: BenchConfig):
        self.sandbox, self.prefix, self.workdir, self.config = sandbox, prefix, Path(workdir), config
        self.results: dict[str, Any] = {
            "p1": [],
            "p3": [],
            "config": {
                "n": config.ns,
                "p3_small": config.p3_small,
                "p2_seconds": config.p2_seconds,
                "p2_every": config.p2_every,
                "changes": config.changes,
                "reloads": config.reloads,
                "wrk_seconds": config.wrk_seconds,
                "connections": config.connections,
                "p4_rounds": config.p4_rounds,
                "ipv6": config.ipv6,
            },
        }
        self.vpc: Vpc | None = None
        self.backends = Backends(self.workdir)
        self.client = None
        self.pool: NetnsPool | None = None
        self.ovn_lb: str | None = None
        self.agent: AgentProcess | None = None
        self.generation = 0
        self.lbs: list[dict] = []
        self.dual_stack = False  # while the IPv6 leg runs: the subnet and load balancers posted have IPv6 too
        self.floor_plan: list[floor.FloorLb] = []

    # -- the whole run ----------------------------------------------------------

    def run(self) -> dict[str, Any]:
        with kept_limits() if self.config.scale else contextlib.nullcontext():
            try:
                self._setup()
                if self.config.policy_rules:
                    self._policy_rules()
                for n in self.config.ns:
                    self._phase(n, smallest=n == self.config.ns[0], largest=n == self.config.ns[-1])
            finally:
                self._teardown()
        if not self.config.scale:
            say("==> the API's event loop while large bodies are taken in (in this process)")
            self.results["loop_stall"] = loopstall.measured_or_error()
        self.results["rows"] = report.evaluate(self.results)
        return self.results

    def _setup(self) -> None:
        v6 = self.config.ipv6
        say(
            f"==> VPC {SUBNET['cidr']}{' and ' + SUBNET6['cidr6'] if v6 else ''} ({self.prefix}): 4 backends, "
            f"{len(SPARE_HOSTS)} spares, a client ({self.backends.kind} backends, "
            f"{'wrk' if which('wrk') else 'Python'} load)"
        )
        six = {"cidr6": SUBNET6["cidr6"], "gateway6": SUBNET6["gateway6"]} if v6 else {}
        self.vpc = Vpc(self.sandbox, self.prefix, SUBNET["cidr"], SUBNET["gateway"], **six)
        hosts6 = {**BACKEND_HOSTS6, **SPARE_HOSTS6} if v6 else {}
        for name, ip in {**BACKEND_HOSTS, **SPARE_HOSTS}.items():
            host = self.vpc.add_host(name, ip, ip6=hosts6.get(name, ""))
            self.backends.start(self.vpc, host, name)
        self.client = self.vpc.add_host(*CLIENT, ip6=CLIENT6 if v6 else "")
        # Many short connections from one address: let it reuse TIME_WAIT ports.
        set_sysctl_in(self.client, "net.ipv4.tcp_tw_reuse", "1")
        set_sysctl_in(self.client, "net.ipv4.ip_local_port_range", "10000 65000")
        self.pool = NetnsPool(self.client.netns, workers=max(4, min(self.config.connections, 32)) + 2)
        most = max(self.config.ns[-1], self.config.p3_small)
        say(f"==> {most} logical switch ports for the load balancers")
        self._add_lb_ports(most)
        say(f"==> OVN native load balancer {OVN_LB_VIP}:80 over the backends (attached for its P4 leg only)")
        self._add_ovn_lb()

    def _add_lb_ports(self, count: int, chunk: int = 500) -> None:
        for start in range(0, count, chunk):
            args: list[str] = []
            for index in range(start, min(count, start + chunk)):
                # With the IPv6 leg every port has its IPv6 address from the start: the ports are
                # the same for both P1s, and OVN is not asked to change them in between.
                body = lb_body(self.prefix, index, dual_stack=self.config.ipv6)
                name = lb_port_name(body["id"])
                self.vpc.lb_ports[body["id"]] = self.vpc.switch  # Vpc.cleanup() deletes them
                args += [
                    "--",
                    "lsp-add",
                    self.vpc.switch,
                    name,
                    "--",
                    "lsp-set-addresses",
                    name,
                    " ".join(body["network"][key] for key in ("mac", "ip", "ip6") if key in body["network"]),
                ]
            self.sandbox.nbctl(*args[1:], timeout=300)
        self.sandbox.nbctl("--wait=sb", "sync", timeout=300)

    def _add_ovn_lb(self) -> None:
        """The OVN native load balancer, created now but attached to the switch only for its own
        P4 leg: a switch with a load balancer sends all its traffic through conntrack."""
        name = f"{self.prefix}-olb"
        members = ",".join(f"{ip}:{BACKEND_PORT}" for ip in BACKEND_HOSTS.values())
        self.ovn_lb = name
        self.sandbox.nbctl("lb-add", name, f"{OVN_LB_VIP}:80", members, "tcp")

    def _attach_ovn_lb(self, attached: bool) -> None:
        if attached:
            self.sandbox.nbctl("ls-lb-add", self.vpc.switch, self.ovn_lb)
        else:
            self.sandbox.nbctl("ls-lb-del", self.vpc.switch, self.ovn_lb)
        self.sandbox.nbctl("--wait=hv", "sync", timeout=120)
        if attached:
            wait_for(
                lambda: self.pool.call(http_text, OVN_LB_VIP, 80) in BACKEND_HOSTS,
                30,
                "the OVN load balancer to answer",
            )

    def _vswitchd(self):
        return next(d for d in self.sandbox.daemons if d.name == "ovs-vswitchd")

    def _check_sandbox(self, after: str) -> None:
        """A dead ovs-vswitchd makes every later figure meaningless: say so plainly."""
        daemon = self._vswitchd()
        if not daemon.running():
            raise RuntimeError(f"ovs-vswitchd died during {after}: {last_emergency(daemon.logfile)}")

    def _policy_rules(self) -> None:
        """bench/policy_rules.py's figures (a scratch namespace of its own), for context."""
        say("==> bench/policy_rules.py 0 1000 (route lookup cost of the per-LB policy rules)")
        out = subprocess.run(
            [sys.executable, str(REPO / "bench" / "policy_rules.py"), "0", "1000"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        self.results["policy_rules"] = lines if out.returncode == 0 else [f"failed: {out.stderr[-300:]}"]

    # -- one N ------------------------------------------------------------------

    def _phase(self, n: int, smallest: bool, largest: bool) -> None:
        entry: dict[str, Any] = {"n": n}
        self.results["p1"].append(entry)
        self._p1(n, entry)
        self.p1_finished = time.monotonic()
        self._check_sandbox(f"P1 at N={n}")
        if self.config.scale:
            self._settled_memory(n, entry)
            self._retire_agent(timed_cleanup=largest)
            return
        if self.config.p1_only:
            self._retire_agent()
            return
        converged = entry["agent_seconds"] is not None
        if largest:
            self._p2_p6(n)
            if converged:
                self._drift_repair(n)
                self._check_sandbox("the drift repair")
                self.results["p3"].append(self._p3(n))
                self._check_sandbox("P3")
                self._p5_largest(n)
                self._check_sandbox("P5 at the largest N")
            else:
                self.results["p3"].append(
                    {
                        "n": n,
                        "skipped": f"the agent had not converged: "
                        f"{entry['ready_at_timeout']} of {n} ready after {entry['timeout']:.0f} s",
                    }
                )
        if smallest:
            # P3 at the small N, then the data path (P4, P5) with an agent that has little else to do.
            small = self.config.p3_small
            self.results["p3"].append(self._p3(small, resize=True))
            self._check_sandbox("P3")
            self._p4(small)
            self._check_sandbox("P4")
            self._p5(small)
            self._check_sandbox("P5")
            self._p4_ovn()
        self._retire_agent()
        if smallest and self.config.ipv6:  # with fresh agents of its own, after the IPv4 legs' one
            self._ipv6_leg(n)
            self._check_sandbox("the IPv6 leg")

    def _p1(self, n: int, entry: dict) -> None:
        """P1 at this N: a floor, then a fresh agent; at small N that pair is
        repeated (the VM's speed varies by a fifth from one second to the next,
        and a run of 100 takes seconds) and the pair with the median ratio is
        the figure, every pair recorded. The last pair's agent stays for what
        follows."""
        count = self.config.p1_runs if n <= P1_REPEAT_UP_TO else 1
        runs: list[dict[str, Any]] = []
        for index in range(count):
            if index:
                self._retire_agent()
            run: dict[str, Any] = {"n": n}
            runs.append(run)
            self._p1_floor(n, run)
            self._p1_agent(n, run, attempt=index, profiled=index == count - 1)
        entry.update(median_run(runs))
        if "profile" in runs[-1]:
            entry["profile"] = runs[-1]["profile"]  # only the last run is profiled
        if count > 1:
            entry["runs"] = [{k: run.get(k) for k in ("agent_seconds", "floor_seconds", "ratio")} for run in runs]

    def _p1_floor(self, n: int, entry: dict) -> None:
        say(f"==> P1 floor, N={n}: the same kernel objects by one batched in-process netlink client")
        bodies = [lb_body(self.prefix, i) for i in range(n)]
        self.floor_plan = floor.plan_floor(self.prefix, bodies, SUBNET, host_addresses())
        try:
            entry["floor_seconds"] = round(floor.build_floor(self.floor_plan, tx_checksum_off=True), 3)
            entry["floor_ovs_seconds"] = round(
                floor.add_ovs_ports(self.sandbox.vsctl, INTEGRATION_BRIDGE, self.floor_plan), 3
            )
            check_floor(self.floor_plan[-1])
        finally:
            problems = floor.remove_floor(self.floor_plan, self.sandbox.vsctl, INTEGRATION_BRIDGE)
            self.floor_plan = []
            if problems:
                raise RuntimeError("the floor was not removed completely: " + "; ".join(problems))
        say(
            f"    floor {entry['floor_seconds']:.2f} s (+ OVS ports in one transaction "
            f"{entry['floor_ovs_seconds']:.2f} s)"
        )

    def _p1_agent(self, n: int, entry: dict, attempt: int = 0, profiled: bool = True) -> None:
        kind = "dual-stack" if self.dual_stack else "agent"
        say(f"==> P1 {kind}, N={n}: a fresh agent, one POST of {n} load balancers")
        base = self.workdir / (f"{kind}-{n}-{attempt}" if attempt else f"{kind}-{n}")
        # P2's agent: every load balancer resynced every p2_every seconds, whatever N.
        p2 = n == self.config.ns[-1] and not self.dual_stack and not self.config.scale
        resync = {"resync_interval": self.config.p2_every, "resync_rate": n / self.config.p2_every} if p2 else {}
        self.agent = AgentProcess(
            base,
            self.sandbox.ovs_db,
            host=f"{self.prefix}-gw{n}",
            env=self.sandbox.env,
            size_neighbour_tables=self.config.scale,
            **resync,
        )
        self.agent.start()
        self.lbs = [self._lb(i) for i in range(n)]
        watch = AgentWatch(self.agent, self.sandbox).start(want_bound=n)
        profile = (
            self._profile_start(f"p1-n{n}", min(self.config.converge_timeout, 120))
            if profiled and n == self.config.ns[-1] and not self.dual_stack
            else None
        )
        cpu_before = cpu_seconds(self.agent)
        health = loopstall.AgentHealthPoller(self.agent.url).start()
        # Where the machine's 2 cores went until every load balancer was ready.
        split = CpuSplit(self._processes(), reaped=True)
        started = time.monotonic()
        limit = self.config.converge_timeout
        try:
            code, body = self._post(wait=min(300, limit))
            if code not in (200, 504):
                raise RuntimeError(f"POST /v1/refresh answered {code}: {str(body)[:300]}")
            if code == 504 or [lb["state"] for lb in body["loadbalancers"]].count("ready") != n:
                # Not settled within ?wait (or settled with failures): count ready ones until the limit.
                try:
                    wait_for(
                        lambda: watch.ready_count() == n,
                        max(1.0, limit - (time.monotonic() - started)),
                        f"all {n} load balancers ready",
                        interval=1.0,
                    )
                except TimeoutError:
                    pass
            if watch.ready_count() == n:
                entry["agent_seconds"] = round(time.monotonic() - started, 3)
                entry["cpu_cores"] = split.finish()
                if profile is not None:  # the convergence only, not the resyncs after it
                    entry["profile"], profile = self._profile_finish(profile, stop=True), None
                wait_for(lambda: watch.bound_at is not None, 120, f"ovn-installed on all {n} ports", interval=0.5)
                entry["ovn_installed_seconds"] = round(watch.bound_at, 1)
            else:
                entry["agent_seconds"] = None
                entry["timeout"] = limit
                entry["ready_at_timeout"] = watch.ready_count()
        finally:
            watch.stop()
            entry["loop_stall_ms"] = health.stop()
            entry["cpu_seconds"] = round(cpu_seconds(self.agent) - cpu_before, 2)
            entry["peak_rss_mb"] = watch.peak_rss_mb
            entry["timeline"] = watch.samples
            if profile is not None:
                entry["profile"] = self._profile_finish(profile, stop=True)
        floor_seconds = entry.get("floor_seconds")  # the dual-stack P1 is held to the IPv4 one, not a floor
        entry["ratio"] = (
            round(entry["agent_seconds"] / floor_seconds, 2)
            if entry["agent_seconds"] is not None and floor_seconds
            else None
        )
        if entry["agent_seconds"] is None:
            say(
                f"    NOT converged within {limit:.0f} s: {entry['ready_at_timeout']} of {n} ready; agent CPU "
                f"{entry['cpu_seconds']:.1f} s; peak RSS {entry['peak_rss_mb']:.0f} MB"
            )
            return
        for index in sorted({0, n // 2, n - 1}):
            network = self.lbs[index]["network"]
            for vip in (network["ip"], network.get("ip6")):
                if vip:
                    wait_for(
                        lambda vip=vip: self.pool.call(http_text, vip, 80) in BACKEND_HOSTS,
                        30,
                        f"{vip} port 80 answering",
                    )
        say(
            f"    agent {entry['agent_seconds']:.2f} s"
            + (f" ({entry['ratio']:.1f}× the floor)" if entry["ratio"] is not None else "")
            + f"; all ports ovn-installed at {entry['ovn_installed_seconds']:.1f} s; agent CPU "
            f"{entry['cpu_seconds']:.1f} s; peak RSS {entry['peak_rss_mb']:.0f} MB"
        )

    def _settled_memory(self, n: int, entry: dict) -> None:
        """The agent's resident memory once all N are ready and serving (P6 of the scale run)."""
        if entry["agent_seconds"] is None:
            return
        entry["rss_mb"] = round(psutil.Process(self.agent.proc.pid).memory_info().rss / 2**20, 1)
        self.results["p6"] = {"n": n, "rss_mb": entry["rss_mb"], "peak_rss_mb": entry["peak_rss_mb"]}
        say(f"    resident memory once converged {entry['rss_mb']:.0f} MB")

    @property
    def subnet(self) -> dict:
        return SUBNET6 if self.dual_stack else SUBNET

    def _lb(self, index: int, members: list[dict] | None = None, **listener) -> dict:
        """Load balancer `index` as the running leg posts it (dual-stack in the IPv6 leg)."""
        return lb_body(self.prefix, index, members, dual_stack=self.dual_stack, **listener)

    def _body(self) -> bytes:
        """The next generation's complete desired state, encoded (the region controller's work)."""
        self.generation += 1
        return json.dumps(desired(self.generation, *self.lbs, subnets=[self.subnet])).encode()

    def _post(self, wait: float | None = 60, body: bytes | None = None) -> tuple[int, Any]:
        path = "/v1/refresh" + (f"?wait={wait:g}" if wait is not None else "")
        return self.agent.request("POST", path, raw=body or self._body(), timeout=(wait or 0) + 60)

    def _post_accepted(self, body: bytes | None = None) -> None:
        code, answer = self._post(wait=None, body=body)
        if code != 202:
            raise RuntimeError(f"POST /v1/refresh answered {code}: {str(answer)[:300]}")

    # -- P2 and P6 ---------------------------------------------------------------

    # -- P3 -------------------------------------------------------------------------

    # -- P4 and P5 --------------------------------------------------------------

    # -- agent lifetime ------------------------------------------------------------

    # -- profiling (py-spy, when asked for and installed) ------------------------------


# --------------------------------------------------------------------------
# helpers


# --------------------------------------------------------------------------
# entry point


def run_benchmark(
    config: BenchConfig, sandbox: OvnSandbox | None = None, prefix: str | None = None, workdir: Path | None = None
) -> dict[str, Any]:
    """The whole benchmark; with `sandbox` given (the test suite's), that one is used and left running."""
    prefix = prefix or "b" + secrets.token_hex(3)[:5]
    own_dir = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="lbb", dir="/var/tmp"))
    own_sandbox = sandbox is None
    started = time.monotonic()
    # Taken first: the commit as it was when the figures began, before anything can change the tree.
    machine = report.machine()
    say(report.header(machine, time.strftime("%Y-%m-%d %H:%M:%S %z")))
    try:
        if own_sandbox:
            say(
                f"==> private OVS + OVN in {workdir / 'sbx'} (LBAGENT_SANDBOX_WAIT="
                f"{os.environ.get('LBAGENT_SANDBOX_WAIT', '0')} s to queue for it)"
            )
            sandbox = OvnSandbox(workdir / "sbx")
            sandbox.start()
        try:
            results = Bench(sandbox, prefix, workdir, config).run()
        finally:
            if own_sandbox:
                sandbox.stop()
    finally:
        if own_dir and os.environ.get("LBAGENT_KEEP_BENCH_DIR") is None:
            shutil.rmtree(workdir, ignore_errors=True)
    results["machine"] = machine
    results["seconds"] = round(time.monotonic() - started, 1)
    results["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    if config.output is not None:
        config.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n", type=int, nargs="+", help="P1 sizes; the largest runs P2-P6 (default 100 1000; 1000 3000 with --scale)"
    )
    parser.add_argument("--p3-small", type=int, default=10, help="N of the small P3 (default 10)")
    parser.add_argument("--p2-seconds", type=float, default=40.0, help="P2 window, seconds (default 40)")
    parser.add_argument(
        "--p2-every", type=float, default=30.0, help="seconds between two resyncs of each load balancer at P2"
    )
    parser.add_argument("--changes", type=int, default=20, help="P3 backend changes per N")
    parser.add_argument("--reloads", type=int, default=20, help="P5 reloads")
    parser.add_argument("--wrk-seconds", type=float, default=10.0, help="P4 duration of each leg (of each round)")
    parser.add_argument(
        "--p4-rounds",
        type=int,
        default=3,
        help="P4 rounds of the agent's leg and the legs in its namespace, one after the other; "
        "the median ratio is reported",
    )
    parser.add_argument("--connections", type=int, default=32, help="P4 concurrent connections")
    parser.add_argument(
        "--converge-timeout",
        type=float,
        help="P1 gives up (and says so) after this many seconds (default 300; 600 with --scale)",
    )
    parser.add_argument("--no-policy-rules", action="store_true", help="skip bench/policy_rules.py")
    parser.add_argument("--p1-only", action="store_true", help="measure P1 only (profiling convergence)")
    parser.add_argument(
        "--no-ipv6", action="store_true", help="skip the IPv6 leg (dual-stack P1, IPv6 backend P3, IPv6 client P4)"
    )
    parser.add_argument(
        "--p1-runs",
        type=int,
        default=3,
        help=f"P1 floor/agent pairs at each N up to {P1_REPEAT_UP_TO}; the median one is reported",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help=f"py-spy record the agent during P1 (largest N) and P2 into {PROFILE_DIR}",
    )
    parser.add_argument(
        "--scale",
        action="store_true",
        help="P7 (make bench-scale): P1 and the memory once converged at each N, then lbagent cleanup "
        "of the largest N timed; no other leg",
    )
    parser.add_argument(
        "--output", type=Path, help="default bench/results.json (bench/results-scale.json with --scale)"
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        say("the benchmark needs root (network namespaces, OVS); run it as root")
        return 2
    config = BenchConfig(
        ns=args.n or ([1000, 3000] if args.scale else [100, 1000]),
        p3_small=args.p3_small,
        p2_seconds=args.p2_seconds,
        p2_every=args.p2_every,
        changes=args.changes,
        reloads=args.reloads,
        wrk_seconds=args.wrk_seconds,
        connections=args.connections,
        p4_rounds=args.p4_rounds,
        converge_timeout=args.converge_timeout or (600.0 if args.scale else 300.0),
        policy_rules=not (args.no_policy_rules or args.scale),
        p1_only=args.p1_only,
        scale=args.scale,
        ipv6=not (args.no_ipv6 or args.scale),
        p1_runs=args.p1_runs,
        profile=args.profile,
        output=args.output or REPO / "bench" / ("results-scale.json" if args.scale else "results.json"),
    )
    results = run_benchmark(config)
    say("\n" + report.header(results["machine"], results["finished_at"]) + "\n")
    say(report.table(results["rows"]))
    say(f"\nall figures: {config.output}")
    missed = [r["figure"] for r in results["rows"] if r["result"] == "MISSED"]
    if missed:
        say(f"missed: {'; '.join(missed)}")
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
