"""`make bench`: issue 7's figures, all measured in one run on a private OVS/OVN sandbox.

    .venv/bin/python -m bench.run [--n 100 1000] [--p2-seconds 60] [--wrk-seconds 10]
                                  [--changes 20] [--reloads 20] [--profile] [--output bench/results.json]

What it builds (every name carries one random prefix; everything is removed
afterwards, also on failure): a sandbox (devtools.sandbox), a VPC
198.18.0.0/16 with gateway .1, four backends .21-.24 and two spares .25-.26
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
- at the smallest N, P3 at --p3-small load balancers; at the largest N:
  P2 (an idle window of --p2-seconds), P6, P3, P4 and P5.

The table goes to stdout and, with every raw figure, to --output.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import re
import resource
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "functional"))  # the functional tests' agent runner and bodies

from bench import floor, report  # noqa: E402
from bench.traffic import BACKEND_PORT, Backends, LoadLoop, NetnsPool, http_text, run_load, set_sysctl_in  # noqa: E402
from devtools.sandbox import INTEGRATION_BRIDGE, OvnSandbox, wait_for, which  # noqa: E402
from devtools.topology import Vpc, lb_port_name  # noqa: E402
from lbagent.naming import interface_names  # noqa: E402

from agentproc import LBAGENT, AgentProcess  # noqa: E402
from lbstate import backend, desired, loadbalancer, tcp_listener  # noqa: E402

SUBNET = {"id": "net-1", "cidr": "198.18.0.0/16", "gateway": "198.18.0.1", "mtu": 1442}
BACKEND_HOSTS = {"b1": "198.18.0.21", "b2": "198.18.0.22", "b3": "198.18.0.23", "b4": "198.18.0.24"}
SPARE_HOSTS = {"s1": "198.18.0.25", "s2": "198.18.0.26"}
CLIENT = ("client", "198.18.0.31")
FIRST_VIP = ipaddress.IPv4Address("198.18.4.1")
OVN_LB_VIP = "198.19.0.10"
LISTENER_PORTS = (80, 81)
PROFILE_DIR = Path("/var/tmp/lbagent-bench-profiles")
P3_CHANGE_LIMIT = 60.0  # seconds one change may take to reach the client before it counts as missed
P3_GIVE_UP = 3  # changes missed before P3 stops trying
P3_POLL_SAMPLE = 1.0  # seconds of polling before the changes, to time one round of requests on the data path
P5_RELOAD_LIMIT = 60.0  # seconds one change may take to show up as a reload
P1_REPEAT_UP_TO = 200  # N up to which P1 is measured `p1_runs` times (a run of 100 takes seconds)
RETIRE_BY_AGENT = 200  # above this many load balancers the teardown does not wait for the agent


@dataclass
class BenchConfig:
    ns: list[int] = field(default_factory=lambda: [100, 1000])
    p3_small: int = 10
    p2_seconds: float = 60.0
    changes: int = 20
    reloads: int = 20
    wrk_seconds: float = 10.0
    connections: int = 32
    converge_timeout: float = 300.0
    policy_rules: bool = True
    p1_only: bool = False  # for profiling convergence: no P2-P6
    p1_runs: int = 3  # floor-then-agent pairs at each N up to P1_REPEAT_UP_TO; the median pair is the figure
    profile: bool = False
    output: Path | None = REPO / "bench" / "results.json"

    def __post_init__(self) -> None:
        self.ns = sorted(set(self.ns))
        if not self.ns or self.ns[0] < 1 or self.ns[-1] > 60000:
            raise ValueError("every N must be between 1 and 60000")
        if self.p1_runs < 1:
            raise ValueError("p1_runs must be at least 1")


_T0 = time.monotonic()


def say(message: str) -> None:
    """Progress lines carry the seconds since start, so a daemon's log can be lined up with them."""
    if message.startswith("==>"):
        message = f"[{time.monotonic() - _T0:7.1f}s] {message}"
    print(message, flush=True)


def lb_id(prefix: str, index: int) -> str:
    return f"{prefix}-{index:05d}"


def four_backends() -> list[dict]:
    return [backend(f"be-{k}", ip, BACKEND_PORT) for k, ip in enumerate(BACKEND_HOSTS.values(), 1)]


def lb_body(prefix: str, index: int, members: list[dict] | None = None, **listener) -> dict:
    vip = FIRST_VIP + index
    mac = "0a:5a:" + ":".join(f"{b:02x}" for b in vip.packed)
    listeners = [tcp_listener(f"l{port}", port, **listener) for port in LISTENER_PORTS]
    return loadbalancer(lb_id(prefix, index), str(vip), mac, listeners, {"bg-1": members or four_backends()})


# --------------------------------------------------------------------------
# watching the agent


class AgentWatch:
    """Samples the agent while it converges: ready count (/metrics), ports bound, CPU, RSS."""

    def __init__(self, agent: AgentProcess, sandbox: OvnSandbox, interval: float = 1.0):
        self.agent, self.sandbox, self.interval = agent, sandbox, interval
        self.proc = psutil.Process(agent.proc.pid)
        self.started = time.monotonic()
        self.samples: list[dict] = []
        self.bound_at: float | None = None
        self.want_bound = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-watch", daemon=True)

    def start(self, want_bound: int) -> AgentWatch:
        self.want_bound = want_bound
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def ready_count(self) -> int | None:
        value = metric(self.agent, 'lbagent_loadbalancers{state="ready"}')
        return None if value is None else int(value)

    def bound_count(self) -> int:
        out = self.sandbox.vsctl(
            "--format=csv",
            "--no-headings",
            "--columns=name",
            "find",
            "Interface",
            f"external_ids:lbagent-owner=lbagent/{self.agent.host}",
            'external_ids:ovn-installed="true"',
            timeout=60,
        )
        return len(out.split())

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            now = time.monotonic() - self.started
            try:
                memory = self.proc.memory_info().rss / 2**20
                cpu = sum(self.proc.cpu_times()[:2])
                bound = self.bound_count() if self.bound_at is None else self.want_bound
                ready = self.ready_count()
            except Exception as exc:  # noqa: BLE001 - a missed sample is no reason to stop
                self.samples.append({"t": round(now, 1), "error": str(exc)[:200]})
                continue
            if self.bound_at is None and bound >= self.want_bound:
                self.bound_at = now
            self.samples.append(
                {"t": round(now, 1), "ready": ready, "bound": bound, "rss_mb": round(memory, 1), "cpu_s": round(cpu, 2)}
            )

    @property
    def peak_rss_mb(self) -> float:
        return max((s["rss_mb"] for s in self.samples if "rss_mb" in s), default=0.0)


def metric(agent: AgentProcess, sample: str) -> float | None:
    """One sample of the agent's /metrics (cheap next to /v1/status at a thousand load balancers)."""
    code, text = agent.request("GET", "/metrics", timeout=60)
    if code != 200 or not isinstance(text, str):
        return None
    found = re.search(r"^" + re.escape(sample) + r" ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else None


class CpuSplit:
    """Where the machine's CPU went while a load ran: cores busy per role, the load generator
    (our children, e.g. wrk), the kernel's softirq work, and what stayed idle."""

    def __init__(self, roles: dict[str, list[int]], reaped: bool = False):
        # reaped: count what a process's exited children used too (haproxy's
        # workers replaced by reloads, the agent's `haproxy -c` checks).
        self.reaped = reaped
        self.roots = roles
        self.procs = {role: self._tree(pids) for role, pids in roles.items()}
        self.before = {role: self._cpu(procs) for role, procs in self.procs.items()}
        self.system = psutil.cpu_times()
        self.children = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.started = time.monotonic()

    @staticmethod
    def _tree(pids: list[int]) -> list[psutil.Process]:
        procs = []
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                procs += [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
        return procs

    def _cpu(self, procs: list[psutil.Process]) -> dict[int, float]:
        seconds = {}
        for proc in procs:
            try:
                seconds[proc.pid] = sum(proc.cpu_times()[: 4 if self.reaped else 2])
            except psutil.NoSuchProcess:
                continue
        return seconds

    def finish(self) -> dict[str, float]:
        wall = time.monotonic() - self.started
        cores = {}
        for role, procs in self.procs.items():
            # The tree again: a process that started inside the window (the
            # worker a reload made, a check) counts whole.
            now = {proc.pid: proc for proc in [*procs, *self._tree(self.roots[role])]}
            after = self._cpu(list(now.values()))
            cores[role] = sum(after[pid] - self.before[role].get(pid, 0.0) for pid in after) / wall
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cores["load generator"] = (
            children.ru_utime + children.ru_stime - self.children.ru_utime - self.children.ru_stime
        ) / wall
        system = psutil.cpu_times()
        cores["softirq"] = (system.softirq - self.system.softirq) / wall
        cores["idle"] = (system.idle - self.system.idle) / wall
        return {role: round(value, 2) for role, value in cores.items()}


class Poller:
    """Clients in the client namespace asking one VIP over and over, each on a new
    connection; notes when the first of them gets an expected answer.

    There are as many clients as the load balancer has backends: round robin
    hands four connections in a row to four backends, so a new backend is
    seen within a round or two of the clients' requests once haproxy has it
    (a request already on its way finishes first; for a moment the old and
    the new backend are both in rotation). A single client needed up to four
    requests in a row, and at a thousand ports one takes ~20 ms. Each
    client starts a request at most every `interval` seconds, so that where
    the data path is fast the poller does not load the machine more than a
    single client did (about a thousand requests a second)."""

    def __init__(self, pool: NetnsPool, ip: str, port: int, clients: int = 4, interval: float = 0.004):
        self.ip, self.port, self.clients, self.interval = ip, port, clients, interval
        self.expect: str | None = None
        self.seen_at: float | None = None
        self.seen = threading.Event()
        self.requests = self.failures = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._futures = [pool.submit(self._run) for _ in range(clients)]

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                text = http_text(self.ip, self.port, timeout=1.0)
            except OSError:
                with self._lock:
                    self.failures += 1
                self._stop.wait(0.01)
                continue
            answered = time.monotonic()
            with self._lock:
                self.requests += 1
                if self.expect is not None and text == self.expect and not self.seen.is_set():
                    self.seen_at = answered
                    self.seen.set()
            self._stop.wait(max(0.0, started + self.interval - answered))

    def watch_for(self, text: str) -> None:
        with self._lock:
            self.seen.clear()
            self.seen_at = None
            self.expect = text

    def close(self) -> None:
        self._stop.set()
        for future in self._futures:
            future.result(timeout=10)


# --------------------------------------------------------------------------
# the benchmark


class Bench:
    def __init__(self, sandbox: OvnSandbox, prefix: str, workdir: Path, config: BenchConfig):
        self.sandbox, self.prefix, self.workdir, self.config = sandbox, prefix, Path(workdir), config
        self.results: dict[str, Any] = {
            "p1": [],
            "p3": [],
            "config": {
                "n": config.ns,
                "p3_small": config.p3_small,
                "p2_seconds": config.p2_seconds,
                "changes": config.changes,
                "reloads": config.reloads,
                "wrk_seconds": config.wrk_seconds,
                "connections": config.connections,
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
        self.floor_plan: list[floor.FloorLb] = []

    # -- the whole run ----------------------------------------------------------

    def run(self) -> dict[str, Any]:
        try:
            self._setup()
            if self.config.policy_rules:
                self._policy_rules()
            for n in self.config.ns:
                self._phase(n, smallest=n == self.config.ns[0], largest=n == self.config.ns[-1])
        finally:
            self._teardown()
        self.results["rows"] = report.evaluate(self.results)
        return self.results

    def _setup(self) -> None:
        say(
            f"==> VPC {SUBNET['cidr']} ({self.prefix}): 4 backends, 2 spares, a client "
            f"({self.backends.kind} backends, {'wrk' if which('wrk') else 'Python'} load)"
        )
        self.vpc = Vpc(self.sandbox, self.prefix, SUBNET["cidr"], SUBNET["gateway"])
        for name, ip in {**BACKEND_HOSTS, **SPARE_HOSTS}.items():
            host = self.vpc.add_host(name, ip)
            self.backends.start(self.vpc, host, name)
        self.client = self.vpc.add_host(*CLIENT)
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
                body = lb_body(self.prefix, index)
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
                    f"{body['network']['mac']} {body['network']['ip']}",
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
            raise RuntimeError(f"ovs-vswitchd died during {after}: {_last_emergency(daemon.logfile)}")

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
        self._check_sandbox(f"P1 at N={n}")
        if self.config.p1_only:
            self._retire_agent()
            return
        converged = entry["agent_seconds"] is not None
        if largest:
            self._p2_p6(n)
            if converged:
                self._p3(n)
                self._check_sandbox("P3")
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
            self._p3(small, resize=True)
            self._check_sandbox("P3")
            self._p4(small)
            self._check_sandbox("P4")
            self._p5(small)
            self._check_sandbox("P5")
            self._p4_ovn()
        self._retire_agent()

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
        self.floor_plan = floor.plan_floor(self.prefix, bodies, SUBNET, _host_addresses())
        try:
            entry["floor_seconds"] = round(floor.build_floor(self.floor_plan, tx_checksum_off=True), 3)
            entry["floor_ovs_seconds"] = round(
                floor.add_ovs_ports(self.sandbox.vsctl, INTEGRATION_BRIDGE, self.floor_plan), 3
            )
            _check_floor(self.floor_plan[-1])
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
        say(f"==> P1 agent, N={n}: a fresh agent, one POST of {n} load balancers")
        base = self.workdir / (f"agent-{n}-{attempt}" if attempt else f"agent-{n}")
        self.agent = AgentProcess(base, self.sandbox.ovs_db, host=f"{self.prefix}-gw{n}", env=self.sandbox.env)
        self.agent.start()
        self.lbs = [lb_body(self.prefix, i) for i in range(n)]
        watch = AgentWatch(self.agent, self.sandbox).start(want_bound=n)
        profile = (
            self._profile_start(f"p1-n{n}", min(self.config.converge_timeout, 120))
            if profiled and n == self.config.ns[-1]
            else None
        )
        cpu_before = _cpu_seconds(self.agent)
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
            entry["cpu_seconds"] = round(_cpu_seconds(self.agent) - cpu_before, 2)
            entry["peak_rss_mb"] = watch.peak_rss_mb
            entry["timeline"] = watch.samples
            if profile is not None:
                entry["profile"] = self._profile_finish(profile, stop=True)
        entry["ratio"] = (
            round(entry["agent_seconds"] / entry["floor_seconds"], 2)
            if entry["agent_seconds"] is not None and entry["floor_seconds"]
            else None
        )
        if entry["agent_seconds"] is None:
            say(
                f"    NOT converged within {limit:.0f} s: {entry['ready_at_timeout']} of {n} ready; agent CPU "
                f"{entry['cpu_seconds']:.1f} s; peak RSS {entry['peak_rss_mb']:.0f} MB"
            )
            return
        for index in sorted({0, n // 2, n - 1}):
            vip = self.lbs[index]["network"]["ip"]
            wait_for(lambda vip=vip: self.pool.call(http_text, vip, 80) in BACKEND_HOSTS, 30, f"{vip}:80 answering")
        say(
            f"    agent {entry['agent_seconds']:.2f} s ({entry['agent_seconds'] / entry['floor_seconds']:.1f}× "
            f"the floor); all ports ovn-installed at {entry['ovn_installed_seconds']:.1f} s; agent CPU "
            f"{entry['cpu_seconds']:.1f} s; peak RSS {entry['peak_rss_mb']:.0f} MB"
        )

    def _body(self) -> bytes:
        """The next generation's complete desired state, encoded (the region controller's work)."""
        self.generation += 1
        return json.dumps(desired(self.generation, *self.lbs, subnets=[SUBNET])).encode()

    def _post(self, wait: float | None = 60, body: bytes | None = None) -> tuple[int, Any]:
        path = "/v1/refresh" + (f"?wait={wait:g}" if wait is not None else "")
        return self.agent.request("POST", path, raw=body or self._body(), timeout=(wait or 0) + 60)

    def _post_accepted(self, body: bytes | None = None) -> None:
        code, answer = self._post(wait=None, body=body)
        if code != 202:
            raise RuntimeError(f"POST /v1/refresh answered {code}: {str(answer)[:300]}")

    # -- P2 and P6 ---------------------------------------------------------------

    def _p2_p6(self, n: int) -> None:
        seconds = self.config.p2_seconds
        say(f"==> P2 a converged agent at N={n}, idle for {seconds:.0f} s")
        status = self.agent.status()
        before = status["agent"]
        passes_before = sum(lb["passes"] for lb in status["loadbalancers"])
        proc = psutil.Process(self.agent.proc.pid)
        profile = self._profile_start(f"p2-n{n}", seconds)
        cpu0, wall0 = sum(proc.cpu_times()[:2]), time.monotonic()
        # The window itself is the measurement: nothing to wait for but time.
        threading.Event().wait(seconds)
        cpu1, wall1 = sum(proc.cpu_times()[:2]), time.monotonic()
        rss = proc.memory_info().rss / 2**20
        after = self.agent.status()
        writes = {k: after["agent"]["writes"][k] - before["writes"][k] for k in before["writes"]}
        passes = sum(lb["passes"] for lb in after["loadbalancers"]) - passes_before
        self.results["p2"] = {
            "n": n,
            "seconds": round(wall1 - wall0, 1),
            "writes": writes,
            "reloads": after["agent"]["haproxy"]["reloads"] - before["haproxy"]["reloads"],
            "cpu_seconds": round(cpu1 - cpu0, 2),
            "cpu_percent": round((cpu1 - cpu0) / (wall1 - wall0) * 100, 2),
            "passes": passes,
            "ready": sum(lb["state"] == "ready" for lb in after["loadbalancers"]),
        }
        if profile is not None:
            self.results["p2"]["profile"] = self._profile_finish(profile)
        peak = max([e.get("peak_rss_mb", 0) for e in self.results["p1"]] + [rss])
        self.results["p6"] = {"n": n, "rss_mb": round(rss, 1), "peak_rss_mb": round(peak, 1)}
        p2 = self.results["p2"]
        say(
            f"    writes {writes}, reloads {p2['reloads']}, CPU {p2['cpu_percent']:.1f} % of a core "
            f"({passes} passes); P6 RSS {rss:.0f} MB"
        )

    # -- P3 -------------------------------------------------------------------------

    def _p3(self, n: int, resize: bool = False) -> None:
        if resize:
            self.lbs = [lb_body(self.prefix, i) for i in range(n)]
            say(f"==> P3 at N={n}: the agent now holds {n} load balancers")
            self._post_accepted()
            wait_for(
                lambda: (
                    metric(self.agent, 'lbagent_loadbalancers{state="ready"}') == n
                    and metric(self.agent, 'lbagent_loadbalancers{state="deleting"}') == 0
                ),
                self.config.converge_timeout,
                f"{n} load balancers ready, the others deleted",
                interval=0.5,
            )
        changes = self.config.changes
        say(
            f"==> P3 N={n}: {changes} POSTs that replace one backend of {self.lbs[0]['id']}, "
            "each timed to the first answer from the new backend"
        )
        vip = self.lbs[0]["network"]["ip"]
        wait_for(lambda vip=vip: self.pool.call(http_text, vip, 80) in BACKEND_HOSTS, 30, f"{vip}:80 answering")
        poller = Poller(self.pool, vip, 80)
        # How long one round of requests (one per client) takes on the data path
        # alone at this N: the resolution of every latency below, and part of each.
        requests_before, poll_started = poller.requests, time.monotonic()
        threading.Event().wait(P3_POLL_SAMPLE)
        rounds = max(1.0, (poller.requests - requests_before) / poller.clients)
        poll_ms = (time.monotonic() - poll_started) / rounds * 1000
        latencies, posts, missed, posted_at = [], [], 0, []
        # Profiled at the largest N only: that is where the POST and the reload grow.
        profile = self._profile_start(f"p3-n{n}", changes * 1.5) if n == self.config.ns[-1] else None
        try:
            for k in range(1, changes + 1):
                spare = "s1" if k % 2 else "s2"
                members = four_backends()[:3] + [backend(f"be-x{k}", SPARE_HOSTS[spare], BACKEND_PORT)]
                self.lbs[0] = lb_body(self.prefix, 0, members)
                body = self._body()
                poller.watch_for(spare)
                posted_at.append(time.time())
                started = time.monotonic()
                self._post_accepted(body)
                posts.append(time.monotonic() - started)
                # The answer from the new backend is the signal; the POST itself only says "accepted".
                if poller.seen.wait(P3_CHANGE_LIMIT):
                    latencies.append(poller.seen_at - started)
                else:
                    missed += 1
                    if missed >= P3_GIVE_UP:  # an agent this far behind: more changes only take longer
                        say(f"    {missed} changes not seen within {P3_CHANGE_LIMIT:.0f} s each: giving up")
                        break
        finally:
            poller.close()
        self.lbs[0] = lb_body(self.prefix, 0)
        self._post_accepted()
        if not missed:
            wait_for(
                lambda: self.pool.call(http_text, vip, 80) == "b4", P3_CHANGE_LIMIT, f"{vip} back on b4", interval=0.05
            )
        entry = {
            "n": n,
            "changes": len(latencies) + missed,
            "missed": missed,
            "p50": round(report.percentile(latencies, 0.5), 4) if latencies else None,
            "p99": round(report.percentile(latencies, 0.99), 4) if latencies else None,
            "max": round(max(latencies), 4) if latencies else None,
            "post_p50": round(statistics.median(posts), 4),
            "latencies": [round(x, 4) for x in latencies],
            "poll_requests": poller.requests,
            "poll_failures": poller.failures,
            "poll_ms": round(poll_ms, 1),
            "poll_clients": poller.clients,
        }
        # When the agent had each change in haproxy, from its own log: what the
        # rest of each latency is (the data path, and the poller catching up).
        applied = _applied_after(self.agent.log_path, self.lbs[0]["id"], posted_at)
        if applied:
            entry["agent_p50"] = round(report.percentile(applied, 0.5), 4)
            entry["agent_p99"] = round(report.percentile(applied, 0.99), 4)
        if not latencies:
            entry["p50"] = entry["p99"] = float("inf")
        if profile is not None:
            entry["profile"] = self._profile_finish(profile)
        self.results["p3"].append(entry)
        say(
            f"    p50 {entry['p50'] * 1000:.0f} ms, p99 {entry['p99'] * 1000:.0f} ms (POST p50 "
            f"{entry['post_p50'] * 1000:.0f} ms to 202; {poller.failures} failed polls of {poller.requests}; "
            f"{missed} not seen within {P3_CHANGE_LIMIT:.0f} s)"
        )

    # -- P4 and P5 --------------------------------------------------------------

    def _p4(self, n: int) -> None:
        seconds, conns = self.config.wrk_seconds, self.config.connections
        vip = self.lbs[0]["network"]["ip"]
        legs = {"loadbalancer": [(vip, 80)] * 4, "direct": [(ip, BACKEND_PORT) for ip in BACKEND_HOSTS.values()]}
        self.results["p4"] = {"n": n}
        for leg, targets in legs.items():
            say(f"==> P4 {leg}: {conns} keep-alive connections for {seconds:.0f} s")
            split = CpuSplit(self._processes())
            result = run_load(self.client, targets, seconds, conns, pool=self.pool)
            self.results["p4"][leg] = {**result.as_dict(), "cpu_cores": split.finish()}
            say(
                f"    {result.rps:,.0f} requests/s ({result.errors} errors); cores busy: "
                + ", ".join(f"{k} {v:.2f}" for k, v in self.results["p4"][leg]["cpu_cores"].items())
            )

    def _processes(self) -> dict[str, list[int]]:
        """The processes that do P1's and P4's work, by role (their children, e.g. workers, included)."""
        by_role = {
            "ovs-vswitchd": [self._vswitchd().pid()],
            "ovn-controller": [next(d for d in self.sandbox.daemons if d.name == "ovn-controller").pid()],
            "nginx": [proc.pid for proc in self.backends.processes()],
            "agent": [self.agent.proc.pid] if self.agent else [],
        }
        if self.agent is not None:
            by_role["haproxy"] = [self.agent.status()["agent"]["haproxy"]["pid"]]
        return {role: [p for p in pids if p] for role, pids in by_role.items()}

    def _p4_ovn(self) -> None:
        """The OVN native load balancer leg, last: OVS 3.1's userspace conntrack has been seen to
        assert under this load, and a crash must not take the other figures with it."""
        seconds, conns = self.config.wrk_seconds, self.config.connections
        say(f"==> P4 ovn_lb: {conns} keep-alive connections for {seconds:.0f} s")
        self._attach_ovn_lb(True)
        try:
            split = CpuSplit(self._processes())
            result = run_load(self.client, [(OVN_LB_VIP, 80)] * 4, seconds, conns, pool=self.pool)
            self.results["p4"]["ovn_lb"] = {**result.as_dict(), "cpu_cores": split.finish()}
            say(
                f"    {result.rps:,.0f} requests/s ({result.errors} errors); cores busy: "
                + ", ".join(f"{k} {v:.2f}" for k, v in self.results["p4"]["ovn_lb"]["cpu_cores"].items())
            )
        except RuntimeError as exc:
            self.results["p4"]["ovn_lb"] = {"rps": 0.0, "error": str(exc)[:300]}
        daemon = self._vswitchd()
        if not daemon.running():
            crash = _last_emergency(daemon.logfile)
            self.results["p4"]["ovn_lb"] = {
                **self.results["p4"]["ovn_lb"],
                "rps": 0.0,
                "error": f"ovs-vswitchd crashed: {crash}",
            }
            say(f"    ovs-vswitchd crashed ({crash}); restarting it for the teardown")
            self.sandbox.restart("ovs-vswitchd")
        self._attach_ovn_lb(False)

    def _p5(self, n: int) -> None:
        # Reloads: a listener timeout alternates (a change only a reload applies)
        # while a fifth backend comes and goes. Then the same scale-out and -in
        # alone, which the running haproxy takes without a reload.
        self.results["p5"] = self._changes_under_load(n, "reloads", "lbagent_haproxy_reloads_total", reload=True)
        self.lbs[0] = lb_body(self.prefix, 0)  # as P5 found it: the live changes start from there
        self._post(wait=P5_RELOAD_LIMIT)
        self.results["p5"]["live"] = self._changes_under_load(
            n, "live backend changes", "lbagent_haproxy_live_updates_total", reload=False
        )

    def _changes_under_load(self, n: int, what: str, counter: str, reload: bool) -> dict:
        changes = self.config.reloads
        conns = max(4, self.config.connections // 4)
        vip = self.lbs[0]["network"]["ip"]
        say(f"==> P5 {changes} {what} under steady load: {conns} clients, a new connection per request")
        stop = threading.Event()
        load = LoadLoop(self.pool, [(vip, 80)], conns, stop)
        done = 0
        try:
            load.wait_for_requests(50, 30)  # the load is under way before the first change
            for k in range(changes):
                # Every backend answers 200 all along.
                members = four_backends()
                if k % 2 == 0:
                    members.append(backend("be-p5", SPARE_HOSTS["s1"], BACKEND_PORT))
                listener = {"timeouts": {"client_idle": 60 + k % 2}} if reload else {}
                self.lbs[0] = lb_body(self.prefix, 0, members, **listener)
                before = metric(self.agent, counter) or 0
                self._post_accepted()
                try:
                    wait_for(
                        lambda before=before: (metric(self.agent, counter) or 0) > before,
                        P5_RELOAD_LIMIT,
                        f"change {k + 1} ({counter})",
                        interval=0.1,
                    )
                except TimeoutError:
                    break
                done += 1
                load.wait_for_requests(load.requests + 20, 10)  # steady load between changes
        finally:
            stop.set()
            result = load.finish()
        say(
            f"    {result.errors} failed of {result.requests:,} requests during {done} {what} "
            f"({result.rps:,.0f} requests/s)"
        )
        return {
            "n": n,
            "reloads_wanted": changes,
            "reloads": done,
            "failed": result.errors,
            **{k: v for k, v in result.as_dict().items() if k != "errors"},
        }

    # -- agent lifetime ------------------------------------------------------------

    def _retire_agent(self) -> None:
        """Stop the agent and remove what it made.

        Up to RETIRE_BY_AGENT load balancers the agent deletes them itself
        (a timed, bounded POST of an empty state); then it stops, our own
        `lb-<prefix>-*` namespaces go (their veths with them) and `lbagent
        cleanup` removes the rest (OVS ports, policy rules, haproxy, state).
        """
        agent, self.agent = self.agent, None
        if agent is None:
            return
        count = len(self.lbs)
        try:
            if agent.proc is not None and agent.proc.poll() is None and count <= RETIRE_BY_AGENT:
                self.generation += 1
                started = time.monotonic()
                code, _ = agent.request(
                    "POST", "/v1/refresh?wait=120", desired(self.generation, subnets=[SUBNET]), timeout=180
                )
                if code == 200:
                    self.results.setdefault("teardown_seconds", {})[str(count)] = round(time.monotonic() - started, 2)
                    # What the agent's own deletion left behind while it still runs (should be nothing).
                    ids = [lb_id(self.prefix, i) for i in range(count)]
                    present = set(os.listdir("/sys/class/net"))
                    left = sorted(
                        name
                        for i in ids
                        for names in [interface_names(i)]
                        for name in (names.ovn_host, names.haproxy_host)
                        if name in present
                    )
                    self.results.setdefault("left_after_delete", {}).setdefault(str(count), []).extend(left)
        finally:
            self.lbs = []
            agent.stop()
            for netns in Path("/run/netns").glob(f"lb-{self.prefix}-*"):
                floor.delete_netns(netns.name)
            result = subprocess.run(
                [LBAGENT, "cleanup", "--yes", "--config", str(agent.config_path)],
                capture_output=True,
                text=True,
                timeout=600,
                env=agent.env,
            )
            if result.returncode != 0:
                raise RuntimeError(f"lbagent cleanup failed: {result.stdout[-300:]} {result.stderr[-300:]}")
            if os.environ.get("LBAGENT_KEEP_AGENT_DIRS") is None:
                shutil.rmtree(agent.base, ignore_errors=True)

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
            attempt("VPC", self.vpc.cleanup)
        if problems:
            raise RuntimeError("benchmark teardown incomplete: " + "; ".join(problems))

    # -- profiling (py-spy, when asked for and installed) ------------------------------

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


# --------------------------------------------------------------------------
# helpers


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run whose agent/floor ratio is the median (the upper one of an even
    count); a run that did not converge counts as the slowest."""
    ranked = sorted(runs, key=lambda run: math.inf if run.get("ratio") is None else run["ratio"])
    return ranked[len(ranked) // 2]


def _applied_after(log_path: Path, lb: str, posted_at: list[float]) -> list[float]:
    """Seconds from each POST (wall clock) to the agent's next log line saying
    it applied a change of `lb` to haproxy live; [] if it logged none."""
    marker = f"object=haproxy action=live lb={lb} "
    times = []
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        match = _LOG_TIME.match(line)
        if match and marker in line:
            stamp = time.mktime(time.strptime(match.group(1)[:19], "%Y-%m-%d %H:%M:%S"))
            times.append(stamp + int(match.group(1)[20:]) / 1000)
    applied = []
    for posted in posted_at:
        later = [t for t in times if t >= posted]
        if later:
            applied.append(min(later) - posted)
    return applied if len(applied) == len(posted_at) else []


def _host_addresses() -> set[str]:
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    return {a["local"] for link in json.loads(out or "[]") for a in link.get("addr_info", [])}


def _check_floor(last: floor.FloorLb) -> None:
    """The floor made what it claims: the last namespace has its address and its rules."""
    out = subprocess.run(
        ["ip", "netns", "exec", last.netns, "sh", "-c", "ip -br addr; iptables-legacy-save -t nat"],
        capture_output=True,
        text=True,
    ).stdout
    if last.vip not in out or "DNAT" not in out:
        raise RuntimeError(f"the floor's namespace {last.netns} is incomplete:\n{out}")


def _last_emergency(logfile: Path) -> str:
    """The last EMER/ERR line of a daemon's log (why it died), or a pointer to the log."""
    try:
        lines = [
            line for line in logfile.read_text(errors="replace").splitlines() if "|EMER|" in line or "|ERR|" in line
        ]
    except OSError:
        lines = []
    return lines[-1].split("|", 4)[-1] if lines else f"see {logfile}"


def _cpu_seconds(agent: AgentProcess) -> float:
    try:
        return sum(psutil.Process(agent.proc.pid).cpu_times()[:2])
    except psutil.NoSuchProcess:
        return float("nan")


def summarize_profile(path: Path, top: int = 15) -> dict:
    """py-spy's raw (collapsed) stacks → where the samples were: by leaf function and by lbagent frame."""
    leaf: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        samples = int(count)
        total += samples
        frames = [f for f in stack.split(";") if f]
        if frames:
            leaf[frames[-1]] = leaf.get(frames[-1], 0) + samples
        for frame in {f for f in frames if "lbagent/" in f or "pyroute2" in f or "iptc" in f or "ovsdbapp" in f}:
            inclusive[frame] = inclusive.get(frame, 0) + samples

    def ranked(counts: dict[str, int]) -> list[str]:
        best = sorted(counts.items(), key=lambda item: -item[1])[:top]
        return [f"{100 * c / total:5.1f}%  {frame}" for frame, c in best]

    return {"file": str(path), "samples": total, "leaf": ranked(leaf), "inclusive": ranked(inclusive)}


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
    results["machine"] = report.machine()
    results["seconds"] = round(time.monotonic() - started, 1)
    results["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S %z")
    if config.output is not None:
        config.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000], help="P1 sizes; the largest runs P2-P6")
    parser.add_argument("--p3-small", type=int, default=10, help="N of the small P3 (default 10)")
    parser.add_argument("--p2-seconds", type=float, default=60.0)
    parser.add_argument("--changes", type=int, default=20, help="P3 backend changes per N")
    parser.add_argument("--reloads", type=int, default=20, help="P5 reloads")
    parser.add_argument("--wrk-seconds", type=float, default=10.0, help="P4 duration of each leg")
    parser.add_argument("--connections", type=int, default=32, help="P4 concurrent connections")
    parser.add_argument(
        "--converge-timeout", type=float, default=300.0, help="P1 gives up (and says so) after this many seconds"
    )
    parser.add_argument("--no-policy-rules", action="store_true", help="skip bench/policy_rules.py")
    parser.add_argument("--p1-only", action="store_true", help="measure P1 only (profiling convergence)")
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
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results.json")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        say("the benchmark needs root (network namespaces, OVS); run it as root")
        return 2
    config = BenchConfig(
        ns=args.n,
        p3_small=args.p3_small,
        p2_seconds=args.p2_seconds,
        changes=args.changes,
        reloads=args.reloads,
        wrk_seconds=args.wrk_seconds,
        connections=args.connections,
        converge_timeout=args.converge_timeout,
        policy_rules=not args.no_policy_rules,
        p1_only=args.p1_only,
        p1_runs=args.p1_runs,
        profile=args.profile,
        output=args.output,
    )
    results = run_benchmark(config)
    machine = results["machine"]
    say(
        f"\nlbagent benchmark, {time.strftime('%Y-%m-%d')}: {machine['cpus']} CPUs ({machine['cpu_model']}), "
        f"{machine['memory_gib']} GiB, Linux {machine['kernel']}; {machine['ovs']}; {machine['ovn']}; "
        f"{machine['haproxy']}\n"
    )
    say(report.table(results["rows"]))
    say(f"\nall figures: {args.output}")
    missed = [r["figure"] for r in results["rows"] if r["result"] == "MISSED"]
    if missed:
        say(f"missed: {'; '.join(missed)}")
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
