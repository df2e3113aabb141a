"""Listener options are applied or refused, never silently dropped, with real
traffic from a VPC client through OVN: a tcp listener speaks TLS to a backend
marked `ssl`; `tch` spreads one client's connections over the members by source
port while `sch` keeps them on one; an http-only option on a tcp listener is a
400 naming its path.

Backends a and b answer plain HTTP on 8000, c only HTTPS on 8443."""

from __future__ import annotations

import collections

import pytest

from devtools.topology import self_signed_certificate

from lbstate import SUBNET, backend, loadbalancer, tcp_listener
from listenerenv import BACKEND_ADDRESSES, listener_env, request, start_backend

VIP, MAC = "198.18.0.14", "00:22:0a:00:00:14"
CONNECTIONS = 24  # with two members, all on one by chance: 2 in 2^24


@pytest.fixture(scope="module")
def env(sandbox, tmp_path_factory):
    base = tmp_path_factory.mktemp("options")
    with listener_env(sandbox, base, backends=("a", "b", "c"), lb_ports={"opt": (MAC, VIP)}) as e:
        cert, key = self_signed_certificate("backend.example.com")
        cert_file, key_file = base / "backend.crt", base / "backend.key"
        cert_file.write_text(cert)
        key_file.write_text(key)
        start_backend(e.backends["c"], "c", port=8443, tls=(str(cert_file), str(key_file)))
        e.lb_id = f"{e.vpc.prefix}-opt"
        e.apply(options_lb(e.lb_id))
        yield e


def options_lb(lb_id: str) -> dict:
    listeners = [
        tcp_listener("tls-backend", 9443, group="bg-tls"),
        tcp_listener("tch", 9001, group="bg-ab", scheduler="tch"),
        tcp_listener("sch", 9002, group="bg-ab", scheduler="sch"),
    ]
    groups = {
        "bg-tls": [backend("be-c", BACKEND_ADDRESSES["c"], 8443, ssl=True)],
        "bg-ab": [backend("be-a", BACKEND_ADDRESSES["a"]), backend("be-b", BACKEND_ADDRESSES["b"])],
    }
    return loadbalancer(lb_id, VIP, MAC, listeners, groups)


def test_tcp_listener_speaks_tls_to_a_backend_marked_ssl(env):
    # The client speaks plain HTTP to the VIP; only TLS gets an answer from c.
    reply = request(env.client, f"http://{VIP}:9443/")
    assert reply.status == 200, reply
    assert reply.backend == "backend-c"


def _backends_per_connection(env, port: int) -> collections.Counter:
    # One curl per connection: each one leaves from a new source port of the same client address.
    return collections.Counter(request(env.client, f"http://{VIP}:{port}/").backend for _ in range(CONNECTIONS))


def test_tch_spreads_one_clients_connections_and_sch_keeps_them_on_one_member(env):
    tch = _backends_per_connection(env, 9001)
    assert set(tch) == {"backend-a", "backend-b"}, tch
    sch = _backends_per_connection(env, 9002)
    assert len(sch) == 1 and sum(sch.values()) == CONNECTIONS, sch


def test_an_http_option_on_a_tcp_listener_is_refused_at_its_path(env):
    lb = options_lb(env.lb_id)
    lb["listeners"][0]["gzip"] = True
    body = {"generation": env.generation + 1, "subnets": [SUBNET], "loadbalancers": [lb]}
    code, answer = env.agent.refresh(body)
    assert code == 400, answer
    assert answer["error"] == "invalid_body", answer
    assert {d["path"] for d in answer["details"]} == {"/loadbalancers/0/listeners/0/gzip"}, answer
    # Nothing was applied: the listeners keep serving the accepted generation.
    assert request(env.client, f"http://{VIP}:9443/").backend == "backend-c"
