"""Traffic for the benchmark: backends, clients and load, all inside VPC namespaces.

- `Backends`: nginx (one master + one worker per backend namespace, its own
  config, pid and log files under the run's directory) answering its name on
  port 8000; the devtools Python HTTP server when nginx is not installed.
- `NetnsPool`: threads that enter one namespace for good (setns affects only
  the calling thread), so the benchmark's own requests (`http_text`) leave
  from the client namespace without a fork per request.
- `run_load`: HTTP load from the client namespace for a bounded time; wrk
  when it is installed (one process per target URL, started with
  `ip netns exec`), a bounded loop of Python requests otherwise. Both say
  how many requests succeeded and how many failed.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import os
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from devtools.sandbox import run, stop_pid, wait_for, which
from devtools.topology import Vpc, VpcHost

BACKEND_PORT = 8000
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


# --------------------------------------------------------------------------
# requests from inside a namespace


class NetnsPool:
    """Threads that live in one network namespace; `submit` runs a callable there."""

    def __init__(self, netns: str, workers: int = 1):
        self.netns = netns
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=f"in-{netns}", initializer=self._enter
        )

    def _enter(self) -> None:
        fd = os.open(f"/run/netns/{self.netns}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.netns}")
        finally:
            os.close(fd)

    def submit(self, fn, *args) -> concurrent.futures.Future:
        return self._pool.submit(fn, *args)

    def call(self, fn, *args, timeout: float = 60):
        return self.submit(fn, *args).result(timeout)

    def close(self) -> None:
        # The threads end with the pool; they never return to the host namespace.
        self._pool.shutdown(wait=True, cancel_futures=True)


def http_text(ip: str, port: int, timeout: float = 1.0) -> str:
    """GET / over a new connection; the first line of a 200 answer's body (OSError otherwise)."""
    with socket.create_connection((ip, port), timeout=timeout) as sock:
        sock.sendall(b"GET / HTTP/1.0\r\nHost: bench\r\nConnection: close\r\n\r\n")
        chunks = []
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200")):
        raise OSError(f"unexpected answer: {head[:40]!r}")
    return body.decode(errors="replace").split("\n", 1)[0]


# --------------------------------------------------------------------------
# backends


NGINX_CONF = """\
# Written by the lbagent benchmark for one backend namespace; removed with it.
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    server {{
        listen {port} reuseport backlog=4096;
{listen6}        location / {{ default_type text/plain; return 200 "{text}\\n"; }}
    }}
}}
"""


@dataclass
class Backends:
    """HTTP servers answering their names in VPC host namespaces."""

    workdir: Path
    kind: str = field(init=False)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.kind = "nginx" if which("nginx") else "python"

    def start(self, vpc: Vpc, host: VpcHost, text: str) -> None:
        if self.kind == "python":
            host.start_http(text, BACKEND_PORT)
            return
        directory = self.workdir / f"nginx-{host.name}"
        directory.mkdir(parents=True, exist_ok=True)
        conf = directory / "nginx.conf"
        # A host with an IPv6 address serves on it too (nginx's bare port is IPv4 only).
        listen6 = f"        listen [::]:{BACKEND_PORT} reuseport backlog=4096;\n" if host.ip6 else ""
        conf.write_text(NGINX_CONF.format(dir=directory, port=BACKEND_PORT, text=text, listen6=listen6))
        with open(directory / "stderr.log", "wb") as err:
            proc = subprocess.Popen(
                [
                    which("ip") or "ip",
                    "netns",
                    "exec",
                    host.netns,
                    which("nginx"),
                    "-p",
                    str(directory),
                    "-e",
                    str(directory / "error.log"),
                    "-c",
                    str(conf),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        self._procs[host.name] = proc  # `ip netns exec` execs nginx: this pid is nginx's master
        pool = NetnsPool(host.netns)
        try:

            def answers() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"nginx in {host.netns} exited: {(directory / 'stderr.log').read_text()}")
                return pool.call(http_text, "127.0.0.1", BACKEND_PORT) == text

            wait_for(answers, 15, f"nginx in {host.netns}")
        finally:
            pool.close()

    def processes(self) -> list[subprocess.Popen]:
        return list(self._procs.values())

    def stop(self) -> None:
        for name, proc in list(self._procs.items()):
            conf = self.workdir / f"nginx-{name}" / "nginx.conf"
            # Our nginx master, identified by its config path; its worker follows it.
            stop_pid(proc.pid, expect=str(conf), what=f"nginx of {name}")
            proc.wait(timeout=10)
            del self._procs[name]


# --------------------------------------------------------------------------
# load


@dataclass
class LoadResult:
    tool: str
    seconds: float
    requests: int
    errors: int  # connect/read/write/timeout errors and non-2xx answers
    rps: float
    detail: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "tool": self.tool,
            "seconds": round(self.seconds, 2),
            "requests": self.requests,
            "errors": self.errors,
            "rps": round(self.rps, 1),
            **self.detail,
        }


def run_load(
    client: VpcHost,
    targets: list[tuple[str, int]],
    seconds: float,
    connections: int,
    close: bool = False,
    pool: NetnsPool | None = None,
) -> LoadResult:
    """Load `targets` (one load generator each, connections split evenly) for `seconds`.

    `close`: a new connection per request (what a reload can break), else keep-alive.
    """
    if which("wrk"):
        return _wrk(client, targets, seconds, connections, close)
    return _python_load(pool, targets, seconds, connections)


def http_url(ip: str, port: int) -> str:
    """The URL of `/` at ip:port, an IPv6 address in brackets (RFC 3986)."""
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/"


WRK_NUMBERS = {
    "requests": re.compile(r"(\d+) requests in ([\d.]+)(m?s)"),
    "socket": re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"),
    "non2xx": re.compile(r"Non-2xx or 3xx responses: (\d+)"),
}


def _wrk(client: VpcHost, targets: list[tuple[str, int]], seconds: float, connections: int, close: bool) -> LoadResult:
    per_target = max(1, connections // len(targets))
    duration = max(1, round(seconds))
    procs = []
    for ip, port in targets:
        argv = [
            which("ip") or "ip",
            "netns",
            "exec",
            client.netns,
            which("wrk"),
            "-t1",
            f"-c{per_target}",
            f"-d{duration}s",
            "--timeout",
            "2s",
        ]
        if close:
            argv += ["-H", "Connection: close"]
        procs.append(
            subprocess.Popen(
                argv + [http_url(ip, port)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    requests = errors = 0
    elapsed = 0.0
    detail = {"connect": 0, "read": 0, "write": 0, "timeout": 0, "non2xx": 0}
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=duration + 30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise RuntimeError(f"wrk did not finish within {duration + 30}s: {out[-300:]}") from None
        found = WRK_NUMBERS["requests"].search(out)
        if proc.returncode != 0 or not found:
            raise RuntimeError(f"wrk failed ({proc.returncode}): {out[-500:]}")
        requests += int(found.group(1))
        took = float(found.group(2)) / (1000 if found.group(3) == "ms" else 1)
        elapsed = max(elapsed, took)
        if sock := WRK_NUMBERS["socket"].search(out):
            for key, value in zip(("connect", "read", "write", "timeout"), sock.groups()):
                detail[key] += int(value)
        if non2xx := WRK_NUMBERS["non2xx"].search(out):
            detail["non2xx"] += int(non2xx.group(1))
    errors = sum(detail.values())
    return LoadResult(
        "wrk",
        elapsed,
        requests,
        errors,
        (requests - errors) / elapsed if elapsed else 0.0,
        {"processes": len(targets), "connections": per_target * len(targets), **detail},
    )


def _python_load(
    pool: NetnsPool | None, targets: list[tuple[str, int]], seconds: float, connections: int
) -> LoadResult:
    """A new connection per request from `connections` threads of the client namespace, for `seconds`."""
    if pool is None:
        raise ValueError("the Python load generator needs a NetnsPool of the client namespace")
    deadline = time.monotonic() + seconds
    lock = threading.Lock()
    counts = {"ok": 0, "failed": 0}
    errors: list[str] = []

    def worker(index: int) -> None:
        ip, port = targets[index % len(targets)]
        while time.monotonic() < deadline:
            try:
                http_text(ip, port, timeout=2)
                key = "ok"
            except OSError as exc:
                key = "failed"
                if len(errors) < 5:
                    errors.append(str(exc))
            with lock:
                counts[key] += 1

    started = time.monotonic()
    futures = [pool.submit(worker, i) for i in range(connections)]
    for future in futures:
        future.result(timeout=seconds + 30)
    elapsed = time.monotonic() - started
    total = counts["ok"] + counts["failed"]
    return LoadResult(
        "python",
        elapsed,
        total,
        counts["failed"],
        counts["ok"] / elapsed,
        {"connections": connections, "first_errors": errors},
    )


class LoadLoop:
    """Steady load until told to stop: `clients` threads of the client namespace, each a new
    connection per request, every failure counted (with its first few messages)."""

    def __init__(self, pool: NetnsPool, targets: list[tuple[str, int]], clients: int, stop: threading.Event):
        self.stop = stop
        self.requests = self.failures = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._futures = [pool.submit(self._client, targets[i % len(targets)]) for i in range(clients)]
        self._clients = clients

    def _client(self, target: tuple[str, int]) -> None:
        while not self.stop.is_set():
            try:
                http_text(*target, timeout=2.0)
                failed = False
            except OSError as exc:
                failed = True
                if len(self.errors) < 5:
                    self.errors.append(str(exc))
            with self._lock:
                self.requests += 1
                self.failures += failed

    def wait_for_requests(self, count: int, timeout: float) -> None:
        wait_for(lambda: self.requests >= count, timeout, f"{count} requests of steady load", interval=0.02)

    def finish(self) -> LoadResult:
        self.stop.set()
        for future in self._futures:
            future.result(timeout=30)
        elapsed = time.monotonic() - self._started
        return LoadResult(
            "python",
            elapsed,
            self.requests,
            self.failures,
            (self.requests - self.failures) / elapsed,
            {"connections": self._clients, "first_errors": self.errors},
        )


def set_sysctl_in(host: VpcHost, key: str, value: str) -> None:
    """A sysctl of one of our own VPC namespaces (never the host's)."""
    run("ip", "netns", "exec", host.netns, "sysctl", "-q", "-w", f"{key}={value}")
