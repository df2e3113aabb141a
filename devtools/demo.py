"""The demo: `python -m devtools.demo up|down` (what `make demo` / `make demo-down` run).

`up` builds, under /var/tmp/lbagent-demo, a private OVS/OVN sandbox and a
dual-stack VPC (the same `devtools` code the functional tests use) with two
HTTP backends and a client namespace, starts the agent against that sandbox,
pushes examples/demo-state.json to it and shows the load balancer answering
round robin from the client, on its IPv4 VIP and then on its IPv6 one. `down`
undoes all of it, and only it: the agent and every process are stopped by the
pids recorded in the demo directory.

This module owns the demo directory and its layout, the agent's demo
configuration and token, and the agent process of the demo.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.sandbox import CommandError, OvnSandbox, SandboxBusy, WaitAborted, run, stop_pid, wait_for
from devtools.topology import Vpc, VpcHost

DEMO_DIR = Path("/var/tmp/lbagent-demo")
REPO = Path(__file__).resolve().parent.parent
DESIRED_STATE = REPO / "examples" / "demo-state.json"
PREFIX = "demo"
API_HOST, API_PORT = "127.0.0.1", 9680
BACKENDS = {"backend-a": "198.18.0.21", "backend-b": "198.18.0.22"}
BACKEND_PORT = 8000
CLIENT = ("client", "198.18.0.31")
CLIENT6 = "2001:db8:0:1::31"
CURLS = 6
CURLS6 = 2  # the same backends, reached from the client's IPv6 address


class DemoError(WaitAborted):
    """The demo cannot go on; the message says why and what to do.

    A WaitAborted, so that raised inside a `wait_for` it ends the wait at once.
    """


@dataclass(frozen=True)
class DemoPaths:
    """Everything the demo keeps, under one directory so `down` finds it all."""

    root: Path = DEMO_DIR

    sandbox = property(lambda self: self.root / "sandbox")
    vpc_state = property(lambda self: self.root / "vpc.json")
    config = property(lambda self: self.root / "lbagent.toml")
    token = property(lambda self: self.root / "token")
    agent_log = property(lambda self: self.root / "agent.log")
    agent_pid = property(lambda self: self.root / "agent.pid")
    state_dir = property(lambda self: self.root / "state")
    run_dir = property(lambda self: self.root / "run")


def lbagent_bin() -> Path:
    # sys.prefix is the venv when run as .venv/bin/python (the Makefile does).
    return Path(sys.prefix) / "bin" / "lbagent"


def say(message: str) -> None:
    print(message, flush=True)


# --------------------------------------------------------------------------
# up


def up(paths: DemoPaths = DemoPaths(), keep_on_failure: bool = False) -> None:
    if paths.root.exists():
        raise DemoError(f"a demo is already set up in {paths.root}; run `make demo-down` first")
    _check_port_free()
    desired = json.loads(DESIRED_STATE.read_text())
    paths.root.mkdir(parents=True)
    try:
        _up(paths, desired)
    except BaseException:
        say("\n!! the demo failed")
        _show_agent_log(paths)
        if keep_on_failure:
            say(f"left in place for inspection; remove with `make demo-down` ({paths.root})")
        else:
            say("tearing down what was set up ...")
            try:
                down(paths)
            except Exception as exc:  # noqa: BLE001 - the original failure matters more
                say(f"!! {exc}")
        raise


def _up(paths: DemoPaths, desired: dict[str, Any]) -> None:
    subnet = desired["subnets"][0]
    say(f"==> starting a private OVS + OVN in {paths.sandbox}")
    sandbox = OvnSandbox(paths.sandbox)
    sandbox.start()

    say(f"==> VPC {subnet['cidr']} and {subnet['cidr6']} (gateways {subnet['gateway']}, {subnet['gateway6']})")
    vpc = Vpc(
        sandbox,
        PREFIX,
        subnet["cidr"],
        subnet["gateway"],
        cidr6=subnet["cidr6"],
        gateway6=subnet["gateway6"],
        state_file=paths.vpc_state,
    )
    for name, ip in BACKENDS.items():
        vpc.add_host(name, ip, http_text=name, http_port=BACKEND_PORT)
        say(f"    {PREFIX}-{name:<10} {ip}:{BACKEND_PORT} answers {name!r}")
    client = vpc.add_host(*CLIENT, ip6=CLIENT6)
    say(f"    {client.netns:<15} {client.ip} {client.ip6}")
    for lb in desired["loadbalancers"]:
        network = lb["network"]
        port = vpc.add_lb_port(lb["id"], network["mac"], network["ip"], ip6=network.get("ip6", ""))
        say(f"    logical switch port {port} for VIPs {network['ip']} {network.get('ip6', '')}")

    token = _write_agent_config(paths, sandbox)
    say(f"==> starting the agent: {lbagent_bin()} run --config {paths.config}")
    agent = _start_agent(paths, sandbox)
    wait_for(
        lambda: _agent_healthy(agent, token),
        30,
        f"the agent to answer GET /healthz (log: {paths.agent_log})",
        interval=0.3,
    )

    say(f"==> POST {DESIRED_STATE.relative_to(REPO)} to /v1/refresh?wait=60")
    status, body = _api("POST", "/v1/refresh?wait=60", token, DESIRED_STATE.read_bytes(), timeout=75)
    say(f"    {status}: {json.dumps(body)}")
    if status != 200:
        raise DemoError(f"the agent did not converge (HTTP {status})")

    for lb in desired["loadbalancers"]:
        _curl_listeners(client, lb)

    say(f"==> {lbagent_bin().name} status --config {paths.config}")
    say(_lbagent("status", paths).rstrip())
    _print_next_steps(paths, client, desired)


def _check_port_free() -> None:
    # Otherwise /healthz could be answered by whatever already listens there.
    with socket.socket() as probe:
        try:
            probe.bind((API_HOST, API_PORT))
        except OSError as exc:
            raise DemoError(
                f"{API_HOST}:{API_PORT} is in use ({exc.strerror}); is a demo or an agent already running?"
            ) from None


def _write_agent_config(paths: DemoPaths, sandbox: OvnSandbox) -> str:
    token = secrets.token_urlsafe(32)
    fd = os.open(paths.token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    paths.config.write_text(
        "# Written by `python -m devtools.demo up`; removed by `make demo-down`.\n"
        "[agent]\n"
        f'state_dir = "{paths.state_dir}"\n'
        f'run_dir = "{paths.run_dir}"\n'
        # The machine's neighbour tables are not the demo's to raise: one load balancer fits them.
        "size_neighbour_tables = false\n"
        "\n[api]\n"
        f'listen = "{API_HOST}:{API_PORT}"\n'
        f'token_file = "{paths.token}"\n'
        "\n[ovs]\n"
        f'db = "{sandbox.ovs_db}"\n'
    )
    return token


def _start_agent(paths: DemoPaths, sandbox: OvnSandbox) -> subprocess.Popen:
    binary = lbagent_bin()
    if not binary.exists():
        raise DemoError(f"{binary} is missing: run `make venv` first")
    with open(paths.agent_log, "ab") as log:
        agent = subprocess.Popen(
            [str(binary), "run", "--config", str(paths.config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # It outlives `up` and must not get the terminal's Ctrl-C; the
            # sandbox environment keeps any OVS tool it runs on our sandbox.
            start_new_session=True,
            env=sandbox.env,
        )
    paths.agent_pid.write_text(f"{agent.pid}\n")
    return agent


def _agent_healthy(agent: subprocess.Popen, token: str) -> bool:
    if agent.poll() is not None:
        raise DemoError(f"the agent exited with status {agent.returncode}")
    try:
        return _api("GET", "/healthz", token, timeout=2)[0] == 200
    except OSError:  # not listening yet
        return False


def _api(method: str, path: str, token: str, body: bytes | None = None, timeout: float = 10) -> tuple[int, Any]:
    """One request to the agent's API; (status, decoded JSON or text)."""
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(f"http://{API_HOST}:{API_PORT}{path}", data=body, method=method, headers=headers)
    # No proxies: an http_proxy in the environment must not see the token.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def _curl_listeners(client: VpcHost, lb: dict[str, Any]) -> None:
    vips = [(lb["network"]["ip"], CURLS)]
    if lb["network"].get("ip6"):
        vips.append((f"[{lb['network']['ip6']}]", CURLS6))
    for listener in lb.get("listeners", []):
        for vip, count in vips:
            url = f"http://{vip}:{listener['listener_port']}/"
            say(f"==> {count} x curl {url} from {client.netns}")
            for i in range(1, count + 1):
                say(f"    {i}: {client.curl(url).strip()}")


def _lbagent(command: str, paths: DemoPaths, env: dict[str, str] | None = None, timeout: float = 120) -> str:
    return run(lbagent_bin(), command, "--config", paths.config, env=env, timeout=timeout)


def _print_next_steps(paths: DemoPaths, client: VpcHost, desired: dict[str, Any]) -> None:
    vip = desired["loadbalancers"][0]["network"]["ip"]
    vip6 = desired["loadbalancers"][0]["network"].get("ip6", "-")
    port = desired["loadbalancers"][0]["listeners"][0]["listener_port"]
    say(f"""
The demo is up. Next steps:
  curl the VIP from the client:  ip netns exec {client.netns} curl -s http://{vip}:{port}/
  and its IPv6 VIP:              ip netns exec {client.netns} curl -sg http://[{vip6}]:{port}/
  agent status:                  {lbagent_bin()} status --config {paths.config}
  API (token in {paths.token}):
      curl -s -H "Authorization: Bearer $(cat {paths.token})" http://{API_HOST}:{API_PORT}/v1/status
  agent log:                     {paths.agent_log}
  tear it all down:              make demo-down""")


def _show_agent_log(paths: DemoPaths, lines: int = 30) -> None:
    if paths.agent_log.exists():
        tail = paths.agent_log.read_text(errors="replace").splitlines()[-lines:]
        say(f"--- last {len(tail)} lines of {paths.agent_log} ---")
        say("\n".join(tail))


# --------------------------------------------------------------------------
# down


def down(paths: DemoPaths = DemoPaths()) -> None:
    """Undo `up` (also a partial one). Idempotent; the directory goes only if all went well."""
    if not paths.root.exists():
        say(f"no demo at {paths.root}: nothing to do")
        return
    problems: list[str] = []
    sandbox = OvnSandbox(paths.sandbox)

    def step(what: str, fn, *args) -> None:
        say(f"==> {what}")
        try:
            fn(*args)
        except Exception as exc:  # noqa: BLE001 - report, keep tearing down
            say(f"    failed: {exc}")
            problems.append(f"{what}: {exc}")

    step("stopping the agent", _stop_agent, paths)
    step("lbagent cleanup (what the agent created, haproxy included)", _agent_cleanup, paths, sandbox)
    if paths.vpc_state.exists():
        step(
            "removing the VPC (namespaces, links, ports, HTTP servers)",
            lambda: Vpc.restore(sandbox, paths.vpc_state).cleanup(),
        )
    step("stopping the OVS/OVN sandbox", sandbox.stop)
    if problems:
        raise DemoError(
            f"demo teardown incomplete, {paths.root} kept; fix and rerun `make demo-down`: " + "; ".join(problems)
        )
    shutil.rmtree(paths.root)
    say(f"==> removed {paths.root}")


def _stop_agent(paths: DemoPaths) -> None:
    try:
        pid = int(paths.agent_pid.read_text())
    except (FileNotFoundError, ValueError):
        return
    # The config path in its command line proves the pid is still our agent.
    stop_pid(pid, expect=str(paths.config), timeout=15, what="the demo agent")
    paths.agent_pid.unlink()


def _agent_cleanup(paths: DemoPaths, sandbox: OvnSandbox) -> None:
    # A warning, not a failure: the agent may never have started, or be an
    # older build; what it leaves is its own (lb-* namespaces, haproxy).
    if not paths.config.exists():
        return
    if not lbagent_bin().exists():
        say(f"    warning: {lbagent_bin()} is missing; skipped")
        return
    if not sandbox.ovs_db_running():
        say("    warning: the sandbox's OVS is not running; the agent's OVS ports went with it")
    try:
        say(_lbagent("cleanup", paths, env=sandbox.env).rstrip())
    except CommandError as exc:
        say(f"    warning: {exc.summary}")


# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.demo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up_parser = sub.add_parser("up", help="set up the demo and show it working")
    up_parser.add_argument("--keep-on-failure", action="store_true", help="leave a failed demo in place for inspection")
    sub.add_parser("down", help="tear the demo down (idempotent)")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        say("the demo needs root (network namespaces, OVS); run it as root")
        return 2
    try:
        if args.command == "up":
            up(keep_on_failure=args.keep_on_failure)
        else:
            down()
    except (WaitAborted, SandboxBusy, CommandError, TimeoutError) as exc:
        say(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
