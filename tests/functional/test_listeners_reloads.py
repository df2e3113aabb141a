"""Changes reach haproxy checked, batched and hitless: a change haproxy refuses
leaves its load balancer and every other one serving; a refresh touching 100
load balancers costs a handful of reloads; a steady load across 20 reloads
loses no request; a backend replaced or reweighted reaches the running
haproxy with no reload at all."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from devtools.topology import self_signed_certificate

from agentproc import wait_until
from lbstate import backend, loadbalancer
from listenerenv import BACKEND_ADDRESSES, listener_env, openssl, request

WEB = ("198.18.0.12", "00:22:0a:00:00:12")
OTHER = ("198.18.0.13", "00:22:0a:00:00:13")
MANY = 100
HANDFUL = 8  # reloads allowed for a refresh that changes MANY load balancers (5-6 seen on 2 cores)
WRK_SECONDS = 300  # an upper bound only: the test stops wrk as soon as its reloads are done


def http(listener_id: str, port: int, group: str = "bg-ab", idle: int | None = None, **fields) -> dict:
    # A listener's idle timeout is a change only a reload applies.
    timeouts = {"timeouts": {"client_idle": idle}} if idle else {}
    return {
        "id": listener_id,
        "listener_type": "http",
        "listener_port": port,
        "backend_group_id": group,
        "scheduler": "wrr",
        **timeouts,
        **fields,
    }


def group(weight_a: int = 1, members: str = "ab") -> dict:
    return {"bg-ab": [backend(f"be-{m}", BACKEND_ADDRESSES[m], weight=weight_a if m == "a" else 1) for m in members]}


# What haproxy refuses after the API accepted it is rare by design (the API
# decodes certificates and keys and checks what it can); the agent must still
# survive it. This haproxy refuses, when checking, any configuration with
# this idle timeout, as it would refuse something the API could not foresee.
REFUSED_IDLE = 3333
REFUSING_HAPROXY = f"""#!/bin/sh
case " $* " in
  *" -c "*)
    for arg in "$@"; do
      if [ -e "$arg" ] && grep -rqs "timeout client {REFUSED_IDLE}s" "$arg"; then
        echo "[ALERT] (test) timeout client {REFUSED_IDLE}s refused" >&2
        exit 1
      fi
    done;;
esac
exec {shutil.which("haproxy")} "$@"
"""


@pytest.fixture(scope="module")
def env(sandbox, tmp_path_factory):
    base = tmp_path_factory.mktemp("reloads")
    wrapper = base / "haproxy-refusing"
    wrapper.write_text(REFUSING_HAPROXY)
    wrapper.chmod(0o755)
    with listener_env(
        sandbox,
        base / "env",
        backends=("a", "b", "c"),
        lb_ports={"web": WEB[::-1], "other": OTHER[::-1]},
        extra_config=f'[haproxy]\nbinary = "{wrapper}"\n',
    ) as e:
        e.web_id, e.other_id = f"{e.vpc.prefix}-web", f"{e.vpc.prefix}-other"
        cert, key = self_signed_certificate("web.example.com")
        e.cert = {"id": "web", "certificate": cert, "private_key": key}
        e.apply(web_lb(e), other_lb(e))
        yield e


def web_lb(env, weight_a: int = 1, cert: dict | None = None, idle: int | None = None, members: str = "ab") -> dict:
    listeners = [
        http("http", 80, idle=idle),
        {**http("tls", 443), "listener_type": "https", "certificates": [cert or env.cert]},
    ]
    return loadbalancer(env.web_id, *WEB, listeners, group(weight_a, members))


def other_lb(env, weight_a: int = 1) -> dict:
    return loadbalancer(env.other_id, *OTHER, [http("http", 80)], group(weight_a))


def reloads(env) -> int:
    return env.agent.status()["agent"]["haproxy"]["reloads"]


def live_updates(env) -> int:
    return env.agent.status()["agent"]["haproxy"]["live_updates"]


def served_certificate(env) -> str | None:
    result = openssl(env.client, f"{WEB[0]}:443", "-servername", "web.example.com")
    match = re.search(r"subject=.*?CN\s*=\s*([\w.-]+)", result.stdout)
    return match.group(1) if match else None


def serving(env, vip: str) -> bool:
    return request(env.client, f"http://{vip}/").backend in {"backend-a", "backend-b"}


def test_a_refused_change_leaves_it_and_the_others_serving(env):
    answer = env.push(web_lb(env, weight_a=2, idle=REFUSED_IDLE), other_lb(env, weight_a=0))
    states = {lb["id"]: lb for lb in answer["loadbalancers"]}
    assert states[env.other_id]["state"] == "ready", answer
    assert states[env.web_id]["state"] == "error", answer
    status = env.agent.lb(env.web_id)
    assert "haproxy rejected the configuration of load balancer" in status["last_error"], status
    assert f"timeout client {REFUSED_IDLE}s refused" in status["last_error"], status

    # The refused one keeps its last good configuration, the other took its change.
    conf = Path(env.agent.run_dir) / "haproxy" / "conf.d" / f"{env.web_id}.cfg"
    assert f"{REFUSED_IDLE}s" not in conf.read_text()
    assert served_certificate(env) == "web.example.com"
    assert serving(env, WEB[0])
    assert {request(env.client, f"http://{OTHER[0]}/").backend for _ in range(4)} == {"backend-b"}

    # Fixed, it converges.
    env.apply(web_lb(env), other_lb(env))
    assert env.agent.lb(env.web_id)["last_error"] is None
    assert served_certificate(env) == "web.example.com" and serving(env, OTHER[0])


def many(idle: int | None = None) -> list[dict]:
    return [
        loadbalancer(
            f"many-{i}", f"198.18.0.{100 + i}", f"00:22:0a:00:01:{i:02x}", [http("http", 80, idle=idle)], group()
        )
        for i in range(MANY)
    ]


def test_a_refresh_touching_100_load_balancers_takes_a_handful_of_reloads(env):
    for lb in many():  # ready means ovn-installed: each needs its logical switch port
        env.vpc.add_lb_port(lb["id"], lb["network"]["mac"], lb["network"]["ip"])
    try:
        env.apply(web_lb(env), other_lb(env), *many())
        before = reloads(env)
        env.apply(web_lb(env), other_lb(env), *many(idle=77))  # every one of them changes
        changed = reloads(env) - before
        # The passes reach haproxy one by one over many seconds (host-side work): the
        # batches close on the reloads' pacing, not on one reload per load balancer.
        assert 1 <= changed <= HANDFUL, changed
        conf = Path(env.agent.run_dir) / "haproxy" / "conf.d" / f"many-{MANY - 1}.cfg"
        assert "timeout client 77s" in conf.read_text()
    finally:
        before = reloads(env)
        env.apply(web_lb(env), other_lb(env))
        for lb in many():
            env.vpc.del_lb_port(lb["id"])
    assert 1 <= reloads(env) - before <= HANDFUL
    assert serving(env, WEB[0]) and serving(env, OTHER[0])


def test_steady_load_across_20_reloads_fails_no_request(env):
    url = f"http://{WEB[0]}/"
    assert serving(env, WEB[0])
    # A new connection per request: each one meets whichever worker holds the socket then.
    wrk = subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            env.client.netns,
            "wrk",
            "-t1",
            "-c4",
            f"-d{WRK_SECONDS}s",
            "-H",
            "Connection: close",
            url,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        before = reloads(env)
        for i in range(20):
            env.apply(web_lb(env, idle=60 + i % 2), other_lb(env))
        assert reloads(env) - before == 20
    finally:
        wrk.send_signal(signal.SIGINT)  # wrk reports what it saw so far and exits
        output, _ = wrk.communicate(timeout=30)
    assert wrk.returncode == 0, output
    done = re.search(r"(\d+) requests in", output)
    assert done and int(done.group(1)) >= 200, output
    assert "Socket errors" not in output and "Non-2xx" not in output, output
    wait_until(lambda: serving(env, WEB[0]), 5, "the load balancer after the run")


def test_a_backend_replaced_or_reweighted_goes_live_with_no_reload(env):
    env.apply(web_lb(env, members="a"), other_lb(env))
    assert {request(env.client, f"http://{WEB[0]}/").backend for _ in range(4)} == {"backend-a"}
    before_reloads, before_live = reloads(env), live_updates(env)

    env.apply(web_lb(env, members="c"), other_lb(env))  # be-a out, be-c in: one server list each
    assert {request(env.client, f"http://{WEB[0]}/").backend for _ in range(4)} == {"backend-c"}
    env.apply(web_lb(env, members="ac", weight_a=0), other_lb(env))  # be-a back, drained by weight 0
    assert {request(env.client, f"http://{WEB[0]}/").backend for _ in range(6)} == {"backend-c"}
    assert reloads(env) == before_reloads
    assert live_updates(env) - before_live == 2  # one per pass: it edits every backend of the load balancer
    # haproxy knows the servers added live (status reads their health from it).
    health = {b["id"]: b["health"] for b in env.agent.lb(env.web_id)["backends"]}
    assert set(health) == {"be-a", "be-c"} and "unknown" not in health.values(), health

    # What a reload loads from the files on disk is what was applied live.
    env.apply(web_lb(env, members="ac", weight_a=0, idle=45), other_lb(env))
    assert reloads(env) == before_reloads + 1
    assert {request(env.client, f"http://{WEB[0]}/").backend for _ in range(6)} == {"backend-c"}
    env.apply(web_lb(env), other_lb(env))
    assert serving(env, WEB[0])
