"""The cost of holding N highly available load balancers, on a bare Northbound database.

    .venv/bin/python -m devtools.ha_upkeep [--n 1000] [--window 30] [--lease 1.5]

Starts its own one-member clustered OVN Northbound ovsdb-server (files in a
temporary directory, stopped by pid), N logical switch ports, and two agent
processes that run nothing but the real `HaKeeper` over a real
`NorthboundClient`: gw-1, preferred, takes and holds every lease, gw-2
stands by for all of them (their copies are always built and bound). Once
gw-1 holds all N and gw-2 stands by for all N, it measures over the idle
window each agent's CPU (user + system, from /proc), the lease transactions
each committed, and the server's CPU, and prints one JSON object. This is
H6 without the data path: what the lease upkeep itself costs an agent,
which the multi-host sandbox cannot carry at 1,000 load balancers per host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devtools.procs import end_process, pid_alive, run, stop_pid, wait_for

SCHEMA = "/usr/share/ovn/ovn-nb.ovsschema"
HOSTS = ("gw-1", "gw-2")
PREFIX = "upkeep-"
SWITCH = "ha-upkeep"
REPO = Path(__file__).resolve().parents[1]


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    def __init__(self, base: Path):
        self.base, self.pidfile = base, base / "nb.pid"
        self.remote = f"unix:{base / 'nb.sock'}"

    def start(self) -> None:
        run("ovsdb-tool", "create-cluster", self.base / "nb.db", SCHEMA, f"unix:{self.base}/raft.sock")
        run(
            "ovsdb-server",
            self.base / "nb.db",
            f"--remote=punix:{self.base / 'nb.sock'}",
            "--detach",
            "--no-chdir",
            f"--pidfile={self.pidfile}",
            f"--log-file={self.base}/nb.log",
            f"--unixctl={self.base}/nb.ctl",
        )
        wait_for(lambda: "leader" in self.appctl("cluster/status", "OVN_Northbound"), 10, "the cluster leader")

    def appctl(self, *args: str) -> str:
        return run("ovs-appctl", "-t", self.base / "nb.ctl", *args, check=False)

    @property
    def pid(self) -> int:
        return int(self.pidfile.read_text())

    def stop(self) -> None:
        if self.pidfile.exists() and pid_alive(self.pid):
            stop_pid(self.pid, expect=str(self.pidfile), what="ovsdb-server")

    def add_ports(self, n: int) -> None:
        args = ["ls-add", SWITCH]
        for i in range(n):
            args += ["--", "lsp-add", SWITCH, f"iface/lb/{PREFIX}{i:05d}"]
        run("ovn-nbctl", f"--db={self.remote}", *args, timeout=120)


async def agent(host: str, remote: str, n: int, lease: float, status: Path) -> None:
    """One agent's lease keeper, writing its roles and transactions to `status` every second."""
    from lbagent.desired.ha import HighAvailability
    from lbagent.ovnhost.northbound import NorthboundClient
    from lbagent.workers.ha import HaKeeper
    from lbagent.workers.lease import Copy, Timing

    nb = NorthboundClient(remote, timeout=lease * 2)
    commits = {"transactions": 0}
    real_commit = nb.commit

    def counted(writes):
        commits["transactions"] += 1
        return real_commit(writes)

    nb.commit = counted  # type: ignore[method-assign]
    ha = HighAvailability(hosts=list(HOSTS))
    wanted = {f"{PREFIX}{i:05d}": ha for i in range(n)}
    ready = Copy(built=True, failing=False, bound=True)
    keeper = HaKeeper(nb, host, lambda: f"ch-{host}", Timing(lease), 30.0, lambda: wanted, lambda lb_id: ready)
    runner = asyncio.create_task(keeper.run())
    while not runner.done():
        report = {**keeper.role_counts(), **commits, "decoded": nb.decoded_rows()}
        status.with_suffix(".tmp").write_text(json.dumps(report))
        status.with_suffix(".tmp").rename(status)
        await asyncio.sleep(1)
    runner.result()


def measure(n: int, window: float, lease: float, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="ha-upkeep-") as tmp:
        base = Path(tmp)
        server = Server(base)
        agents: dict[str, subprocess.Popen] = {}
        try:
            server.start()
            server.add_ports(n)
            for host in HOSTS:
                argv = [sys.executable, "-m", "devtools.ha_upkeep", "--agent", host, "--remote", server.remote]
                argv += ["--n", str(n), "--lease", str(lease), "--status", str(base / f"{host}.json")]
                with open(base / f"{host}.log", "w") as log:
                    agents[host] = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)

            def status(host: str) -> dict:
                path = base / f"{host}.json"
                return json.loads(path.read_text()) if path.exists() else {}

            def settled() -> bool:
                for host, proc in agents.items():
                    if proc.poll() is not None:
                        raise RuntimeError(f"{host} exited: {(base / f'{host}.log').read_text()[-2000:]}")
                return status("gw-1").get("active") == n and status("gw-2").get("standby") == n

            began = time.monotonic()
            wait_for(settled, timeout, f"gw-1 to hold and gw-2 to stand by for {n} leases", interval=0.5)
            settled_s = time.monotonic() - began
            time.sleep(2 * lease)  # the takes' aftermath (first beats, binding writes) is not upkeep
            pids = {host: proc.pid for host, proc in agents.items()} | {"server": server.pid}
            before = {who: cpu_seconds(pid) for who, pid in pids.items()}
            txns = {host: status(host)["transactions"] for host in HOSTS}
            started = time.monotonic()
            time.sleep(window)
            elapsed = time.monotonic() - started
            after = {who: cpu_seconds(pid) for who, pid in pids.items()}
            final = {host: status(host) for host in HOSTS}
            if not settled():
                raise RuntimeError(f"roles changed during the window: {final}")
            return {
                "n": n,
                "lease_seconds": lease,
                "window_seconds": round(elapsed, 1),
                "settled_seconds": round(settled_s, 1),
                "cpu_percent": {who: round(100 * (after[who] - before[who]) / elapsed, 2) for who in pids},
                "transactions_per_second": {
                    host: round((final[host]["transactions"] - txns[host]) / elapsed, 2) for host in HOSTS
                },
                "rows_decoded": {host: final[host]["decoded"] for host in HOSTS},
            }
        finally:
            for proc in agents.values():
                end_process(proc)
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="load balancers with ha, held by gw-1")
    parser.add_argument("--window", type=float, default=30.0, help="idle window measured, seconds")
    parser.add_argument("--lease", type=float, default=1.5, help="lease_seconds")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds for the leases to settle")
    parser.add_argument("--agent", help=argparse.SUPPRESS)
    parser.add_argument("--remote", help=argparse.SUPPRESS)
    parser.add_argument("--status", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agent:
        asyncio.run(agent(args.agent, args.remote, args.n, args.lease, args.status))
        return
    print(json.dumps(measure(args.n, args.window, args.lease, args.timeout), indent=2))


if __name__ == "__main__":
    main()
