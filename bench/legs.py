"""The benchmark's legs after P1: P2 and P6 (an idle window: writes, reloads, CPU, memory), P3 (a
change reaching a polling client), P4 (throughput against proxies in the load balancer's namespace,
with the direct and OVN native paths as context), P5 (requests during reloads and live changes)."""

from __future__ import annotations

import statistics
import subprocess
import threading
import time

import psutil

from bench import nslegs, p4rounds, report
from bench.common import (
    BACKEND_HOSTS,
    DRIFT_REPAIR_LIMIT,
    LISTENER_PORTS,
    OVN_LB_VIP,
    P3_CHANGE_LIMIT,
    P3_GIVE_UP,
    P3_POLL_SAMPLE,
    P5_RELOAD_LIMIT,
    SPARE_HOSTS,
    SPARE_HOSTS6,
    four_backends,
    say,
)
from bench.measure import (
    CpuSplit,
    Poller,
    applied_after,
    last_emergency,
    metric,
)
from bench.traffic import BACKEND_PORT, LoadLoop, http_text, run_load
from devtools.sandbox import wait_for
from lbagent.haproxy.files import HaproxyPaths
from lbagent.workers.lb_task import JITTER

from lbstate import backend


class TrafficLegs:
    def _p3(self, n: int, resize: bool = False) -> dict:
        """P3's figures at N=n: each change replaces the fourth backend of the first load balancer
        with a spare. In the IPv6 leg (`dual_stack`) the spare comes in by its IPv6 address and the
        client polls the IPv6 VIP."""
        family = "ip6" if self.dual_stack else "ip"
        spares = SPARE_HOSTS6 if self.dual_stack else SPARE_HOSTS
        if resize:
            self.lbs = [self._lb(i) for i in range(n)]
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
        vip = self.lbs[0]["network"][family]
        wait_for(lambda vip=vip: self.pool.call(http_text, vip, 80) in BACKEND_HOSTS, 30, f"{vip} port 80 answering")
        poller = Poller(self.pool, vip, 80)
        # How long one round of requests (one per client) takes on the data path
        # alone at this N: the resolution of every latency below, and part of each.
        requests_before, poll_started = poller.requests, time.monotonic()
        threading.Event().wait(P3_POLL_SAMPLE)
        rounds = max(1.0, (poller.requests - requests_before) / poller.clients)
        poll_ms = (time.monotonic() - poll_started) / rounds * 1000
        latencies, posts, missed, posted_at = [], [], 0, []
        # Profiled at the largest N only: that is where the POST and the reload grow.
        profile = (
            self._profile_start(f"p3-n{n}", changes * 1.5) if n == self.config.ns[-1] and not self.dual_stack else None
        )
        try:
            for k in range(1, changes + 1):
                # Three spares in turn: the one a change brings in was taken out two
                # changes before, which the change in between (seen answering) proves
                # is over. With two, a change could be "seen" on the spare the last
                # change was still taking out.
                spare = f"s{k % 3 + 1}"
                members = four_backends()[:3] + [backend(f"be-x{k}", spares[spare], BACKEND_PORT)]
                self.lbs[0] = self._lb(0, members)
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
        self.lbs[0] = self._lb(0)
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
        applied = applied_after(self.agent.log_path, self.lbs[0]["id"], posted_at)
        if applied:
            entry["agent_p50"] = round(report.percentile(applied, 0.5), 4)
            entry["agent_p99"] = round(report.percentile(applied, 0.99), 4)
        if not latencies:
            entry["p50"] = entry["p99"] = float("inf")
        if profile is not None:
            entry["profile"] = self._profile_finish(profile)
        say(
            f"    p50 {entry['p50'] * 1000:.0f} ms, p99 {entry['p99'] * 1000:.0f} ms (POST p50 "
            f"{entry['post_p50'] * 1000:.0f} ms to 202; {poller.failures} failed polls of {poller.requests}; "
            f"{missed} not seen within {P3_CHANGE_LIMIT:.0f} s)"
        )
        return entry

    def _p4(self, n: int) -> None:
        """Direct to the backends (context), then the agent's leg in rounds with its references."""
        self.results["p4"] = {"n": n, "rounds": self.config.p4_rounds}
        self._p4_leg("direct", [(ip, BACKEND_PORT) for ip in BACKEND_HOSTS.values()])
        self._p4_rounds()

    def _p4_load(self, label: str, targets: list[tuple[str, int]], more: dict[str, list[int]] | None = None) -> dict:
        """Keep-alive load on `targets` for wrk_seconds, and where the machine's cores went meanwhile."""
        seconds, conns = self.config.wrk_seconds, self.config.connections
        say(f"==> P4 {label}: {conns} keep-alive connections for {seconds:.0f} s")
        split = CpuSplit({**self._processes(), **(more or {})})
        result = run_load(self.client, targets, seconds, conns, pool=self.pool)
        figures = {**result.as_dict(), "cpu_cores": split.finish()}
        say(
            f"    {result.rps:,.0f} requests/s ({result.errors} errors); cores busy: "
            + ", ".join(f"{k} {v:.2f}" for k, v in figures["cpu_cores"].items())
        )
        return figures

    def _p4_leg(
        self,
        leg: str,
        targets: list[tuple[str, int]],
        more: dict[str, list[int]] | None = None,
        into: dict | None = None,
    ) -> None:
        """One leg of P4, once; its figures go to `into`[leg], results["p4"][leg] by default."""
        (self.results["p4"] if into is None else into)[leg] = self._p4_load(leg, targets, more)

    def _p4_rounds(self) -> None:
        """The agent's leg and the reference legs (bench/nslegs.py) back to back, p4_rounds times,
        every other round in the reverse order, so that a drift within a round favours no leg
        (bench/p4rounds.py). A reference is a proxy in the load balancer's namespace on the VIP, at
        a port the agent's NAT leaves alone: the client's path through OVN is the agent leg's; only
        the veth hop to the host and the NAT are missing. A reference that fails is reported as
        not measured; the others go on."""
        lb = self.agent.lb(self.lbs[0]["id"])
        legs: dict[str, tuple[list[tuple[str, int]], dict[str, list[int]]]] = {
            "loadbalancer": ([(self.lbs[0]["network"]["ip"], 80)] * 4, {})
        }
        servers: dict[str, nslegs.InNamespace] = {}
        try:
            for leg in report.P4_REFERENCES:
                started = self._start_reference(leg, lb)
                if started is not None:
                    servers[leg], legs[leg] = started
            rounds = self._run_rounds(legs)
        finally:
            for leg, server in servers.items():
                self._stop_reference(leg, server)
        for leg in legs:
            self.results["p4"][leg] = {**p4rounds.summary(rounds[leg]), **self.results["p4"].get(leg, {})}
            if leg in servers:
                self.results["p4"][leg]["pid"] = servers[leg].pid  # stopped by now

    def _run_rounds(self, legs: dict[str, tuple[list[tuple[str, int]], dict[str, list[int]]]]) -> dict[str, list]:
        """Each leg's figures, round by round; a reference that fails leaves `legs` (the agent's leg raises)."""
        rounds: dict[str, list[dict]] = {leg: [] for leg in legs}
        for number in range(1, self.config.p4_rounds + 1):
            order = list(legs) if number % 2 else list(reversed(legs))
            for leg in order:
                targets, more = legs[leg]
                try:
                    rounds[leg].append(self._p4_load(f"{leg}, round {number}", targets, more))
                except (RuntimeError, OSError, ValueError) as exc:
                    if leg == "loadbalancer":
                        raise
                    del legs[leg], rounds[leg]
                    self._p4_not_measured(leg, exc)
        return rounds

    def _start_reference(
        self, leg: str, lb: dict
    ) -> tuple[nslegs.InNamespace, tuple[list[tuple[str, int]], dict[str, list[int]]]] | None:
        """The reference proxy started and answering, with its leg's targets; None (reported) if not."""
        try:
            server, port = self._namespace_server(leg, lb)
            server.__enter__()
        except (RuntimeError, OSError, ValueError) as exc:
            self._p4_not_measured(leg, exc)
            return None
        try:
            wait_for(
                lambda: server.check_running() or self.pool.call(http_text, lb["vip"], port) in BACKEND_HOSTS,
                15,
                f"{leg} answering on {lb['vip']}:{port} in {lb['netns']}",
            )
        except (RuntimeError, OSError, TimeoutError, ValueError) as exc:
            self._stop_reference(leg, server)
            self._p4_not_measured(leg, exc)
            return None
        return server, ([(lb["vip"], port)] * 4, {leg: [server.pid]})

    def _stop_reference(self, leg: str, server: nslegs.InNamespace) -> None:
        """Stop it by its pid; a stop that fails is said and kept with the leg's figures, not raised."""
        try:
            server.__exit__(None, None, None)
        except (RuntimeError, OSError, TimeoutError, subprocess.TimeoutExpired) as exc:
            self.results["p4"].setdefault(leg, {})["stop_error"] = str(exc)[:300]
            say(f"    {leg} not stopped cleanly: {exc}")

    def _p4_not_measured(self, leg: str, exc: Exception) -> None:
        self.results["p4"][leg] = {"rps": 0.0, "error": str(exc)[:300]}
        say(f"    {leg} not measured: {exc}")

    def _namespace_server(self, leg: str, lb: dict) -> tuple[nslegs.InNamespace, int]:
        directory = self.workdir / leg
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / ("haproxy.cfg" if leg == "ns_haproxy" else "nginx.conf")
        if leg == "ns_haproxy":
            paths = HaproxyPaths(self.agent.run_dir)
            config.write_text(
                nslegs.namespace_haproxy_config(
                    paths.base_cfg.read_text(),
                    paths.lb_file(lb["id"]).read_text(),
                    outer=lb["outer"],
                    inner=lb["inner"],
                    vip=lb["vip"],
                    members={b["mapped_port"]: f"{b['address']}:{b['port']}" for b in lb["backends"]},
                )
            )
            argv, port = nslegs.haproxy_argv(config), LISTENER_PORTS[0] + nslegs.NS_HAPROXY_OFFSET
        else:
            port = nslegs.NGINX_STREAM_PORT
            members = [f"{b['address']}:{b['port']}" for b in lb["backends"]]
            config.write_text(nslegs.nginx_stream_config(directory, lb["vip"], port, members))
            argv = nslegs.nginx_argv(directory, config)
        return nslegs.InNamespace(lb["netns"], argv, config, directory / "output.log"), port

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
        self._attach_ovn_lb(True)
        try:
            self._p4_leg("ovn_lb", [(OVN_LB_VIP, 80)] * 4)
        except RuntimeError as exc:
            self.results["p4"]["ovn_lb"] = {"rps": 0.0, "error": str(exc)[:300]}
        daemon = self._vswitchd()
        if not daemon.running():
            crash = last_emergency(daemon.logfile)
            self.results["p4"]["ovn_lb"] = {
                **self.results["p4"]["ovn_lb"],
                "rps": 0.0,
                "error": f"ovs-vswitchd crashed: {crash}",
            }
            say(f"    ovs-vswitchd crashed ({crash}); restarting it for the teardown")
            self.sandbox.restart("ovs-vswitchd")
        self._attach_ovn_lb(False)

    def _p5(self, n: int) -> None:
        # Reloads, then the same scale-out and -in alone, which the running
        # haproxy takes without a reload.
        self.results["p5"] = self._reloads_under_load(n)
        self.results["p5"]["live"] = self._changes_under_load(
            n, "live backend changes", "lbagent_haproxy_live_updates_total", reload=False
        )

    def _p5_largest(self, n: int) -> None:
        """The reloads again with every load balancer of the largest N in haproxy's configuration:
        a reload there re-reads all of them while the old worker still serves."""
        self.results["p5_largest"] = self._reloads_under_load(n)

    def _reloads_under_load(self, n: int) -> dict:
        """A listener timeout alternates (a change only a reload applies) while a fifth backend comes
        and goes; the load balancer is left as it was found."""
        result = self._changes_under_load(n, "reloads", "lbagent_haproxy_reloads_total", reload=True)
        self.lbs[0] = self._lb(0)
        self._post(wait=P5_RELOAD_LIMIT)
        return result

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
                self.lbs[0] = self._lb(0, members, **listener)
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


class IdleLegs:
    def _drift_repair(self, n: int) -> None:
        """P2's drift repair: the OVN-side veth of one load balancer deleted on the host, and the
        time until its VIP answers the client again."""
        lb = self.lbs[n // 2]
        lb_id, vip = lb["id"], lb["network"]["ip"]
        host_end = self.agent.lb(lb_id)["interfaces"]["ovn"][1]
        interval = self.agent.status()["agent"]["resync_interval"]
        say(f"==> P2 drift repair at N={n}: {host_end} of {lb_id} deleted (resync interval {interval:.0f} s)")
        started = time.monotonic()
        subprocess.run(["ip", "link", "del", host_end], check=True)
        try:
            wait_for(
                lambda: self.pool.call(http_text, vip, 80) in BACKEND_HOSTS,
                DRIFT_REPAIR_LIMIT,
                f"{vip} port 80 answering again",
                interval=0.05,
            )
            seconds: float | None = round(time.monotonic() - started, 2)
        except TimeoutError:
            seconds = None
        self.results["drift"] = {"n": n, "seconds": seconds, "resync_interval": interval}
        say(f"    answering again after {seconds:.2f} s" if seconds is not None else "    NOT answering again")

    def _p2_p6(self, n: int) -> None:
        seconds = self.config.p2_seconds
        interval = self.agent.status()["agent"]["resync_interval"]
        # The first resync of a load balancer is a whole pass (no look to compare
        # with yet), and so is the next if the first came while P1 was still
        # changing the host around it: the window starts once every load balancer
        # has been resynced since P1 ended, each at most one jittered interval later.
        settled_at = getattr(self, "p1_finished", time.monotonic()) + interval * (1 + JITTER) + 1
        say(
            f"==> P2 a converged agent at N={n}: every load balancer resynced once since P1 "
            f"(every {interval:.0f} s, {max(0.0, settled_at - time.monotonic()):.0f} s to go)"
        )
        threading.Event().wait(max(0.0, settled_at - time.monotonic()))
        say(f"    idle for {seconds:.0f} s")
        status = self.agent.status()
        checks = self.agent.resync_checks()
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
        looked = {result: count - checks[result] for result, count in self.agent.resync_checks().items()}
        self.results["p2"] = {
            "n": n,
            "seconds": round(wall1 - wall0, 1),
            "writes": writes,
            "reloads": after["agent"]["haproxy"]["reloads"] - before["haproxy"]["reloads"],
            "cpu_seconds": round(cpu1 - cpu0, 2),
            "cpu_percent": round((cpu1 - cpu0) / (wall1 - wall0) * 100, 2),
            "passes": passes,
            "resync_checks": looked,  # how each resync's first look found its load balancer
            "cpu_ms_per_pass": round((cpu1 - cpu0) * 1000 / passes, 2) if passes else None,
            "ready": sum(lb["state"] == "ready" for lb in after["loadbalancers"]),
            "resync_interval": after["agent"]["resync_interval"],
        }
        if profile is not None:
            self.results["p2"]["profile"] = self._profile_finish(profile)
        peak = max([e.get("peak_rss_mb", 0) for e in self.results["p1"]] + [rss])
        self.results["p6"] = {"n": n, "rss_mb": round(rss, 1), "peak_rss_mb": round(peak, 1)}
        p2 = self.results["p2"]
        say(
            f"    writes {writes}, reloads {p2['reloads']}, CPU {p2['cpu_percent']:.1f} % of a core "
            f"({passes} passes, {looked['unchanged']:.0f} of them found unchanged at their first look); "
            f"P6 RSS {rss:.0f} MB"
        )
