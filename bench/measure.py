"""What the benchmark measures with: agent watches, CPU splits, pollers, logs and profiles.

Each piece observes something real (the agent's metrics and log, the
processes' CPU times, a VIP's answers, ovs-vswitchd's log, py-spy's output);
bench/run.py composes them into the figures.
"""

from __future__ import annotations

import json
import math
import re
import resource
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from bench import floor
from bench.traffic import NetnsPool, http_text
from devtools.sandbox import OvnSandbox

if TYPE_CHECKING:  # bench/run.py puts the functional tests' runner on the path
    from agentproc import AgentProcess


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


_LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def median_run(runs: list[dict[str, Any]], key: str = "ratio") -> dict[str, Any]:
    """The run whose `key` (the agent/floor ratio) is the median (the upper one
    of an even count); a run without it (not converged) counts as the slowest."""
    ranked = sorted(runs, key=lambda run: math.inf if run.get(key) is None else run[key])
    return ranked[len(ranked) // 2]


def applied_after(log_path: Path, lb: str, posted_at: list[float]) -> list[float]:
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


def host_addresses() -> set[str]:
    out = subprocess.run(["ip", "-j", "-4", "addr"], capture_output=True, text=True, check=True).stdout
    return {a["local"] for link in json.loads(out or "[]") for a in link.get("addr_info", [])}


def check_floor(last: floor.FloorLb) -> None:
    """The floor made what it claims: the last namespace has its address and its rules."""
    out = subprocess.run(
        ["ip", "netns", "exec", last.netns, "sh", "-c", "ip -br addr; iptables-legacy-save -t nat"],
        capture_output=True,
        text=True,
    ).stdout
    if last.vip not in out or "DNAT" not in out:
        raise RuntimeError(f"the floor's namespace {last.netns} is incomplete:\n{out}")


def last_emergency(logfile: Path) -> str:
    """The last EMER/ERR line of a daemon's log (why it died), or a pointer to the log."""
    try:
        lines = [
            line for line in logfile.read_text(errors="replace").splitlines() if "|EMER|" in line or "|ERR|" in line
        ]
    except OSError:
        lines = []
    return lines[-1].split("|", 4)[-1] if lines else f"see {logfile}"


def cpu_seconds(agent: AgentProcess) -> float:
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
