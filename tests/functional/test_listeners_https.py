"""https listeners with real traffic from a VPC client: the certificate chosen by
SNI (including one a rule carries), HTTP/2 by ALPN, the cipher policies, and
TLS towards the backends (from http and https listeners). Certificates are
self-signed and made by the test; the agent writes their keys mode 0600."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from devtools.topology import self_signed_certificate

from lbstate import backend, loadbalancer
from listenerenv import BACKEND_ADDRESSES, listener_env, openssl, request, start_backend

VIP, MAC = "198.18.0.12", "00:22:0a:00:00:12"
NAMES = ("one.example.com", "two.example.com", "three.example.com")
LEGACY = "DEFAULT:@SECLEVEL=0"  # lets the client offer TLS 1.0/1.1 and plain RSA key exchange


def https(listener_id: str, port: int, certs: list[dict], group: str = "bg-ab", **fields) -> dict:
    return {
        "id": listener_id,
        "listener_type": "https",
        "listener_port": port,
        "backend_group_id": group,
        "certificates": certs,
        **fields,
    }


@pytest.fixture(scope="module")
def env(sandbox, tmp_path_factory):
    base = tmp_path_factory.mktemp("https")
    with listener_env(sandbox, base, backends=("a", "b", "c"), lb_ports={"tls": (MAC, VIP)}) as e:
        pems = {name: self_signed_certificate(name) for name in NAMES}
        e.certs = {
            name: {"id": name.split(".")[0], "certificate": cert, "private_key": key}
            for name, (cert, key) in pems.items()
        }
        # c serves TLS itself, for the listeners that speak TLS to their backends.
        cert_file, key_file = base / "backend.crt", base / "backend.key"
        cert_file.write_text(pems[NAMES[0]][0])
        key_file.write_text(pems[NAMES[0]][1])
        start_backend(e.backends["c"], "c", port=8443, tls=(str(cert_file), str(key_file)))
        e.lb_id = f"{e.vpc.prefix}-tls"
        e.apply(tls_lb(e.lb_id, e.certs))
        yield e


def tls_lb(lb_id: str, certs: dict) -> dict:
    one, two, three = (certs[name] for name in NAMES)
    listeners = [
        https(
            "sni",
            443,
            [one, two],
            group="bg-b",
            http2=True,
            rules=[{"id": "three", "domain": "three.example.com", "backend_group_id": "bg-a", "certificates": [three]}],
        ),
        https("strict", 8443, [one], tls_cipher_policy="tls_cipher_policy_1_2_strict"),
        https("legacy", 8444, [one], tls_cipher_policy="tls_cipher_policy_1_0"),
        https("to-tls", 8445, [one], group="bg-tls"),
        {"id": "plain-to-tls", "listener_type": "http", "listener_port": 8080, "backend_group_id": "bg-tls"},
    ]
    groups = {
        "bg-ab": [backend("ab-a", BACKEND_ADDRESSES["a"]), backend("ab-b", BACKEND_ADDRESSES["b"])],
        "bg-a": [backend("a-a", BACKEND_ADDRESSES["a"])],
        "bg-b": [backend("b-b", BACKEND_ADDRESSES["b"])],
        "bg-tls": [backend("tls-c", BACKEND_ADDRESSES["c"], port=8443, ssl=True)],
    }
    return loadbalancer(lb_id, VIP, MAC, listeners, groups)


def subject(result) -> str | None:
    match = re.search(r"subject=.*?CN\s*=\s*([\w.-]+)", result.stdout)
    return match.group(1) if match else None


def handshake(env, port: int, *args: str):
    """openssl s_client to VIP:port; (succeeded, negotiated protocol or None, its output)."""
    result = openssl(env.client, f"{VIP}:{port}", *args)
    # "New, TLSv1.2, Cipher is ECDHE-RSA-AES128-GCM-SHA256"; "New, (NONE), Cipher is (NONE)" when it failed.
    # The version there is the cipher's; the session block ("Protocol  : TLSv1.1") names the one
    # negotiated, but s_client prints none for TLS 1.3 before it reads a session ticket.
    session = re.search(r"^New, (\S+), Cipher is (\S+)", result.stdout, re.MULTILINE)
    ok = result.returncode == 0 and session is not None and session.group(2) != "(NONE)"
    protocol = re.search(r"^\s*Protocol\s*:\s*(\S+)", result.stdout, re.MULTILINE)
    negotiated = (protocol or session).group(1) if ok else None
    return ok, negotiated, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("sni", "expected"),
    [
        ("one.example.com", "one.example.com"),
        ("two.example.com", "two.example.com"),
        ("three.example.com", "three.example.com"),  # carried by a rule
        (None, "one.example.com"),  # no SNI: the listener's first certificate
        ("unknown.example.org", "one.example.com"),
    ],
)
def test_sni_picks_the_certificate(env, sni, expected):
    args = ["-servername", sni] if sni else ["-noservername"]
    assert subject(openssl(env.client, f"{VIP}:443", *args)) == expected


def test_https_requests_are_routed_by_host(env):
    resolve = [arg for name in NAMES for arg in ("--resolve", f"{name}:443:{VIP}")]
    assert request(env.client, "https://three.example.com/", "-k", *resolve).backend == "backend-a"
    assert request(env.client, "https://two.example.com/", "-k", *resolve).backend == "backend-b"


def test_http2_is_negotiated_by_alpn(env):
    reply = request(env.client, f"https://{VIP}:443/", "-k", "--http2")
    assert reply.status == 200 and reply.backend == "backend-b"
    version = env.client.run(
        "curl",
        "-sSk",
        "--noproxy",
        "*",
        "--http2",
        "-o",
        "/dev/null",
        "-w",
        "%{http_version}",
        f"https://{VIP}:443/",
        timeout=10,
    )
    assert version == "2"
    # Without http2 the listener offers no ALPN: curl stays on HTTP/1.1.
    version = env.client.run(
        "curl",
        "-sSk",
        "--noproxy",
        "*",
        "--http2",
        "-o",
        "/dev/null",
        "-w",
        "%{http_version}",
        f"https://{VIP}:8443/",
        timeout=10,
    )
    assert version == "1.1"


def test_strict_policy_refuses_what_the_default_policy_accepts(env):
    # RSA key exchange (no forward secrecy): the 1.2 policy takes it, strict does not.
    assert handshake(env, 443, "-tls1_2", "-cipher", "AES128-GCM-SHA256")[0]
    ok, _, said = handshake(env, 8443, "-tls1_2", "-cipher", "AES128-GCM-SHA256")
    assert not ok, said
    assert handshake(env, 8443, "-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256")[:2] == (True, "TLSv1.2")


def test_minimum_tls_version_per_policy(env):
    assert handshake(env, 8444, "-tls1_1", "-cipher", LEGACY)[:2] == (True, "TLSv1.1")
    assert handshake(env, 8444, "-tls1", "-cipher", LEGACY)[:2] == (True, "TLSv1")
    for port in (443, 8443):
        ok, _, said = handshake(env, port, "-tls1_1", "-cipher", LEGACY)
        assert not ok, said
    assert handshake(env, 8443, "-tls1_3")[:2] == (True, "TLSv1.3")


def test_tls_to_backends(env):
    assert request(env.client, f"https://{VIP}:8445/", "-k").backend == "backend-c"
    assert request(env.client, f"http://{VIP}:8080/").backend == "backend-c"


def test_keys_are_private_files_of_this_load_balancer_only(env):
    directory = Path(env.agent.run_dir) / "haproxy" / "certs" / env.lb_id
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    assert [p.relative_to(directory).as_posix() for p in files][:3] == [
        "legacy/0-one.pem",
        "sni/0-one.pem",
        "sni/1-two.pem",
    ]
    assert {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    key = env.certs["three.example.com"]["private_key"]
    assert key.strip() in (directory / "sni" / "2-three.pem").read_text()
    # Never in status or the log.
    key_line = key.splitlines()[1]
    assert key_line not in str(env.agent.status()) and key_line not in env.agent.log()
