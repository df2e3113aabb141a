"""The API's event loop while a large refresh body is taken in: its worst stall.

    .venv/bin/python -m bench.loopstall

The API application (lbagent.api.app, served as `lbagent run` serves it)
runs in this process over an agent that accepts every state without applying
it; /healthz is asked every 5 ms on a connection of its own while the largest
bodies the limits accept are posted, one after the other:

- one load balancer at the server budget: 64 http listeners of 15 rules
  each, every listener and rule routing to a group of 4 backends (4,096
  servers), with every field of a listener set;
- the benchmark's own largest host: 3,000 load balancers of 2 tcp listeners
  over 4 backends.

The worst gap between two answers of /healthz is the figure: what a probe
(or a load balancer's pass) waits for while a body is decoded, validated and
checked against the server budget. The garbage collector is set up as the
agent sets it up at start (lbagent.support.heap): its full collections, not
the validation, are what stops every thread for long. Needs no root and
takes a few seconds.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any

import aiohttp
from aiohttp import web

from bench.common import SUBNET, lb_body, say
from lbagent.api.app import create_app
from lbagent.api.server import runner_options
from lbagent.desired.budget import MAX_SERVERS_PER_LB
from lbagent.desired.fields import MAX_LISTENERS_PER_LB
from lbagent.support.heap import HeapKeeper

POLL_INTERVAL = 0.005
STALL_TARGET = 0.100  # seconds
FIGURE = "API event loop's worst stall while a refresh body is taken in"
TARGET = f"< {STALL_TARGET * 1000:.0f} ms"
HOST_LBS = 3000
GROUP = 4


class AcceptingAgent:
    """Takes every state it is given, applies none."""

    def __init__(self) -> None:
        self.generation = 0

    async def refresh(self, desired, raw, raw_text=None) -> int:
        self.generation = desired.generation
        return desired.generation

    async def wait_settled(self, generation: int, timeout: float) -> bool:
        return True

    def not_ready_reason(self) -> str | None:
        return None


class Reporter:
    async def status(self) -> dict:
        return {}

    async def loadbalancer_status(self, lb_id: str) -> dict | None:
        return None

    def results(self, generation: int) -> dict:
        return {"generation": generation, "loadbalancers": []}


def budget_lb(rules_per_listener: int = MAX_SERVERS_PER_LB // (MAX_LISTENERS_PER_LB * GROUP) - 1) -> dict:
    """One load balancer at the server budget: every listener and rule is a haproxy backend of GROUP servers."""
    listeners = [
        {
            "id": f"l{k}",
            "name": f"listener {k}",
            "listener_type": "http",
            "listener_port": 1000 + k,
            "backend_group_id": "bg-1",
            "health_check": {"type": "http", "uri": "/healthz", "rise": 2, "fall": 3, "interval": 2, "timeout": 1},
            "sticky_session": {"type": "insert", "cookie": "SRV", "cookie_timeout": 3600},
            "acl": {"type": "white", "cidrs": ["198.18.0.0/16"]},
            "x_forwarded_for": True,
            "timeouts": {"client_request": 10, "client_idle": 90, "backend_connect": 5, "backend_idle": 90},
            "rules": [
                {"id": f"r{k}-{r}", "domain": f"d{r}.example.com", "path": f"/p{r}", "backend_group_id": "bg-1"}
                for r in range(rules_per_listener)
            ],
        }
        for k in range(MAX_LISTENERS_PER_LB)
    ]
    lb = lb_body("stall", 0)
    lb["listeners"] = listeners
    return lb


def bodies() -> dict[str, bytes]:
    host = [lb_body("stall", index) for index in range(1, HOST_LBS + 1)]
    return {
        "one load balancer at the server budget": _encoded([budget_lb()]),
        f"{HOST_LBS} load balancers": _encoded(host),
    }


def _encoded(lbs: list[dict]) -> bytes:
    return json.dumps({"generation": 1, "subnets": [SUBNET], "loadbalancers": lbs}).encode()


class HealthPoller:
    """Asks /healthz every POLL_INTERVAL; `worst` is the longest wait from one answer to the next."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url
        self.worst = 0.0
        self.answers = 0
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> HealthPoller:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        last = time.monotonic()
        while True:
            async with self.session.get(self.url) as resp:
                await resp.read()
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            self.answers += 1
            last = now
            await asyncio.sleep(POLL_INTERVAL)


class AgentHealthPoller:
    """`HealthPoller` on a thread of its own, against a running agent: its worst
    gap while the agent applies a body (passes, renders, reloads), not only
    while the API takes it in."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.worst = 0.0
        self.answers = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="healthz-poller", daemon=True)

    def start(self) -> AgentHealthPoller:
        self._thread.start()
        return self

    def stop(self) -> float:
        """The worst gap, in milliseconds."""
        self._stop.set()
        self._thread.join(10)
        return round(self.worst * 1000, 1)

    def _run(self) -> None:
        target = urllib.parse.urlsplit(self._url)
        conn = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        last = time.monotonic()
        while not self._stop.wait(POLL_INTERVAL):
            try:
                conn.request("GET", "/healthz")
                conn.getresponse().read()
            except (OSError, http.client.HTTPException):
                self.errors += 1
                conn.close()
                continue
            now = time.monotonic()
            self.worst = max(self.worst, now - last)
            self.answers += 1
            last = now
        conn.close()


async def take_in(posted: dict[str, bytes]) -> dict[str, Any]:
    app = create_app(AcceptingAgent(), None, max_body_bytes=16 * 1024 * 1024, reporter=Reporter())
    runner = web.AppRunner(app, **runner_options())
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    site = web.SockSite(runner, sock)
    await site.start()
    base = f"http://127.0.0.1:{port}"
    figures = []
    try:
        async with aiohttp.ClientSession() as polling, aiohttp.ClientSession() as posting:
            for generation, (name, body) in enumerate(posted.items(), start=1):
                body = body.replace(b'"generation": 1', f'"generation": {generation}'.encode(), 1)
                async with HealthPoller(polling, base + "/healthz") as poller:
                    started = time.monotonic()
                    headers = {"Content-Type": "application/json"}
                    async with posting.post(base + "/v1/refresh", data=body, headers=headers) as resp:
                        status = resp.status
                        await resp.read()
                    seconds = time.monotonic() - started
                figures.append(
                    {
                        "body": name,
                        "bytes": len(body),
                        "status": status,
                        "post_seconds": round(seconds, 3),
                        "worst_gap_ms": round(poller.worst * 1000, 1),
                        "health_answers": poller.answers,
                    }
                )
    finally:
        await runner.cleanup()
    return {"bodies": figures, "worst_gap_ms": max(f["worst_gap_ms"] for f in figures)}


def measure(posted: dict[str, bytes] | None = None) -> dict[str, Any]:
    """The figures of every body (default: `bodies()`), and the worst gap of all."""
    posted = posted if posted is not None else bodies()
    HeapKeeper(quiet=lambda: True).freeze_start()
    return asyncio.run(take_in(posted))


def measured_or_error() -> dict[str, Any]:
    """`measure()`, or what kept it from being measured: the rest of a benchmark run stands without it."""
    try:
        return measure()
    except Exception as exc:  # noqa: BLE001 - a figure not measured is reported, not raised
        return {"error": f"{type(exc).__name__}: {exc}"}


def row_of(stall: dict[str, Any]) -> tuple[str, str, str, bool | None, str]:
    """(figure, measured, target, met, note) of the report's row."""
    if "error" in stall:
        return (FIGURE, "not measured", TARGET, None, stall["error"])
    refused = [f["body"] for f in stall["bodies"] if f["status"] != 202]
    note = "; ".join(
        f"{f['body']}: {f['bytes'] / 2**20:.1f} MiB answered in {f['post_seconds'] * 1000:.0f} ms, "
        f"worst /healthz gap {f['worst_gap_ms']:.0f} ms"
        for f in stall["bodies"]
    )
    met = stall["worst_gap_ms"] < STALL_TARGET * 1000 and not refused
    if refused:
        note += "; not accepted: " + ", ".join(refused)
    return (FIGURE, f"{stall['worst_gap_ms']:.0f} ms", TARGET, met, note)


def main() -> int:
    stall = measure()
    figure, measured, target, met, note = row_of(stall)
    verdict = "n/a" if met is None else "met" if met else "MISSED"
    say(f"{figure}: {measured} (target {target}, {verdict}); {note}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
