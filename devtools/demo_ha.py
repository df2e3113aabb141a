"""The high-availability demo: `python -m devtools.demo_ha` (what `make demo-ha` runs).

It builds, under /var/tmp/lbagent-demo-ha, a multi-host sandbox
(devtools.multihost: an OVN central and the hosts gw-1, gw-2 and cl), a VPC
whose backend and client live on cl, and an agent on each gateway; pushes
one load balancer with `ha` to both agents, as the region controller does;
shows which host is active, starts a client making a new connection to the
VIP every 20 ms, kills the active host (its agent, ovn-controller,
ovs-vswitchd and haproxy) and prints the failover the client saw and the new
roles; brings the killed host back as the standby; and removes everything.
It runs to completion, and removes everything on a failure or Ctrl-C too.

This module owns the demo's directory and its story; the load balancer, the
agents and the client are the high-availability benchmark's (bench/ha.py).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from bench.ha import (
    BACKEND_IP,
    CLIENT_HOST,
    CLIENT_IP,
    GATEWAYS,
    VIP,
    VIP_MAC,
    WAIT,
    ha_lb,
    ha_of,
    linger,
    wait_bound,
    wait_roles,
)
from bench.ha_probe import ANSWER_TIMEOUT, CONNECT_TIMEOUT
from bench.ha_report import first_answer_after, outage, outcomes_between
from bench.ha_watch import Probe
from devtools.multihost import MultiHost, MultiHostError
from devtools.procs import CommandError, WaitAborted, wait_for
from tests.functional.hostagent import HostAgent

from lbstate import SUBNET, desired

DEMO_DIR = Path("/var/tmp/lbagent-demo-ha")
PREFIX = "dha"
LB_ID = "demo-ha"
LEASE = 1.5
CURLS = 3


def say(message: str) -> None:
    print(message, flush=True)


class Interrupted(KeyboardInterrupt):
    """SIGTERM, taken as Ctrl-C: the sandbox is removed on the way out."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted()


def run_demo(base: Path = DEMO_DIR) -> None:
    _remove_leftovers(base)
    say(f"==> a multi-host sandbox in {base}: an OVN central and the hosts {', '.join(GATEWAYS)} and {CLIENT_HOST}")
    try:
        with MultiHost(base, PREFIX, [*GATEWAYS, CLIENT_HOST]) as mh:
            try:
                _story(mh)
            finally:
                say("==> removing the sandbox: agents, haproxy, namespaces, OVS and OVN")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    say("==> done; nothing is left")


def _remove_leftovers(base: Path) -> None:
    """A demo killed outright leaves its record behind: what it names goes first."""
    if not base.exists():
        return
    say(f"==> {base} is left from an earlier demo: removing what it recorded")
    try:
        MultiHost.restore(base).stop()
    except (OSError, ValueError) as exc:
        say(f"    no record to go by ({exc})")
    shutil.rmtree(base, ignore_errors=True)


def _story(mh: MultiHost) -> None:
    vpc = mh.vpc(SUBNET["cidr"], SUBNET["gateway"])
    say(f"==> VPC {SUBNET['cidr']}: a backend {BACKEND_IP} (answers 'web') and a client {CLIENT_IP}, both on cl")
    vpc.add_host("web", BACKEND_IP, http_text="web", on=CLIENT_HOST)
    client = vpc.add_host("client", CLIENT_IP, on=CLIENT_HOST)
    lsp = vpc.add_lb_port(LB_ID, VIP_MAC, VIP)
    say(f"    logical switch port {lsp} for the VIP {VIP}, without requested-chassis: the agents decide")

    agents = {name: HostAgent(mh, mh.host(name), lease=LEASE) for name in GATEWAYS}
    for name, agent in agents.items():
        say(f"==> the agent of {name}: lbagent run --config {agent.config_path} (lease_seconds {LEASE:g})")
        agent.start()

    body = desired(1, ha_lb(LB_ID, VIP, VIP_MAC), subnets=[SUBNET])
    say(f"==> POST /v1/refresh?wait=60 to both agents: {LB_ID} with ha.hosts {list(GATEWAYS)}")
    for name, agent in agents.items():
        code, answer = agent.refresh(body, wait=WAIT)
        states = [lb["state"] for lb in answer.get("loadbalancers", [])] if isinstance(answer, dict) else answer
        say(f"    {name}: {code} {states}")
        if code != 200:
            raise WaitAborted(f"{name} did not converge (HTTP {code})")
    active, standby = GATEWAYS
    wait_roles(agents, LB_ID, active)
    wait_bound(mh, lsp, active)
    _show_roles(mh, agents, lsp)
    say(f"==> {CURLS} x curl http://{VIP}/ from the client")
    for i in range(1, CURLS + 1):
        say(f"    {i}: {client.curl(f'http://{VIP}/').strip()}")

    probe = Probe(mh.host(CLIENT_HOST), client, VIP).start()
    try:
        _fail_over(mh, agents, lsp, probe, active, standby)
    finally:
        probe.stop()

    say(f"==> {active} comes back: its OVS and ovn-controller, then its agent; no preempt, so it stands by")
    mh.host(active).revive()
    agents[active].start()
    wait_roles(agents, LB_ID, standby)
    _show_roles(mh, agents, lsp)
    say(f"==> lbagent status on {active}")
    say(agents[active].cli("status").stdout.rstrip())


def _fail_over(mh: MultiHost, agents: dict[str, HostAgent], lsp: str, probe: Probe, active: str, standby: str) -> None:
    started = time.monotonic()
    wait_for(lambda: probe.answering(started), WAIT, f"the client's first answer from {VIP}", interval=0.02)
    say(f"==> the client makes a new connection to {VIP}:80 every 20 ms; killing {active}, the active host")
    called = time.monotonic()
    mh.host(active).crash()
    killed = time.monotonic()
    answered = wait_for(
        lambda: first_answer_after(probe.attempts(), killed), WAIT, f"an answer through {standby}", interval=0.02
    )
    wait_roles(agents, LB_ID, standby, among=[standby])
    wait_bound(mh, lsp, standby)
    # The connections made during the outage end (answered late, or timed out) within the probe's timeouts.
    linger(answered + CONNECT_TIMEOUT + ANSWER_TIMEOUT)
    seen = outcomes_between(probe.attempts(), called, answered)
    client_outage = outage(probe.attempts(), called)
    say(f"    first answer through {standby} {answered - killed:.2f} s after the kill (lease {LEASE:g} s)")
    if client_outage is not None:
        say(
            f"    the client's outage: {client_outage:.2f} s, from its first failed or slow connection "
            "to the next answer"
        )
    say(
        f"    connections started in that time: {seen['ok']} answered ({seen['slow']} late), "
        f"{seen['refused']} not connected, {seen['broken']} broken mid-request"
    )
    _show_roles(mh, agents, lsp)


def _show_roles(mh: MultiHost, agents: dict[str, HostAgent], lsp: str) -> None:
    say(f"==> roles of {LB_ID}")
    for name, agent in agents.items():
        ha = ha_of(agent, LB_ID)
        if ha is None:
            say(f"    {name}: its agent is down")
            continue
        failover = ha.get("last_failover_s")
        say(
            f"    {name}: {ha.get('role')}, term {ha.get('term')}, active host {ha.get('active_host')}"
            + (f", last failover took {failover:.2f} s" if failover is not None else "")
        )
    bound = mh.central.port_binding_chassis(lsp)
    say(f"    SB binds {lsp} to chassis {bound}")


def exit_status(demo: Callable[[], None]) -> int:
    """Run the demo; its exit status, with what stopped it said."""
    try:
        demo()
    except KeyboardInterrupt:
        say("interrupted; the sandbox was removed")
        return 130
    except (WaitAborted, MultiHostError, CommandError, TimeoutError) as exc:
        say(f"the demo failed: {exc}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.demo_ha", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    if os.geteuid() != 0:
        say("the demo needs root (network namespaces, OVS); run it as root")
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    return exit_status(run_demo)


if __name__ == "__main__":
    sys.exit(main())
