"""Mutual TLS on https listeners (client_certificate): the model's checks, the bind line and
files, and the real haproxy asking for, verifying and passing on client certificates."""

from __future__ import annotations

import contextlib
import json
import ssl
import subprocess
import sys
import time
from http.client import HTTPSConnection
from pathlib import Path

import pytest
from cryptography import x509

from devtools.programs import HTTPD_CODE
from lbagent.desired.members import Member
from lbagent.desired.model import parse_desired_state
from lbagent.errors import InvalidDesiredState
from lbagent.haproxy.render import render_config
from lbagent.haproxy.tls import client_cert_file_names
from tests.unit.haproxy.clientca import Authority, pem_of
from tests.unit.haproxy.test_render_http import port_accepts, running_haproxy
from tests.unit.samples import WAIT, certificate, free_port, only_loadbalancer, state, write_checkable


@pytest.fixture(scope="module")
def authority() -> Authority:
    return Authority()


def mtls_listener(port: int, ca: str, verify: str = "required", crl: str = "") -> dict:
    return {
        "id": "tls",
        "listener_type": "https",
        "listener_port": port,
        "backend_group_id": "g",
        "certificates": [{"id": "srv", **certificate("www.example.com")}],
        "client_certificate": {"ca": ca, "verify": verify, "crl": crl},
    }


def mtls_config(port: int, backend_port: int, **client):
    groups = [{"id": "g", "backends": [{"id": "be-1", "address": "198.18.0.21", "port": 80}]}]
    lb = only_loadbalancer("lb-m", [mtls_listener(port, **client)], groups)
    members = {"g": [Member("be-1", "198.18.0.21", 80, 1, "off", False, backend_port)]}
    return render_config(lb, "127.0.0.1", members, inner="127.0.0.1")


# --- the model ---------------------------------------------------------------------------------


def test_a_crl_that_is_no_crl_is_refused_at_its_path(authority):
    listener = mtls_listener(8443, pem_of(authority.cert), crl=pem_of(authority.cert))
    lb = {
        "id": "lb-m",
        "network": {"subnet_id": "net-1", "ip": "198.18.0.12", "mac": "00:22:0a:00:00:12"},
        "listeners": [listener],
        "backend_groups": [{"id": "g"}],
    }
    with pytest.raises(InvalidDesiredState) as refused:
        parse_desired_state(state(1, [lb]))
    assert [d["path"] for d in refused.value.details] == ["/loadbalancers/0/listeners/0/client_certificate/crl"]
    listener["client_certificate"]["crl"] = authority.crl()
    assert parse_desired_state(state(1, [lb])).loadbalancers[0].listeners[0].client_certificate.verify == "required"


# --- rendering -----------------------------------------------------------------------------------


def test_the_bind_line_asks_for_a_client_certificate_and_names_the_ca_and_crl_files(authority):
    config = mtls_config(8443, 1025, ca=pem_of(authority.cert), verify="optional", crl=authority.crl())
    assert " ca-file lb-m/tls.ca.pem verify optional crl-file lb-m/tls.crl.pem" in config.text
    assert "http-request set-header X-SSL-Client-Verify none if !{ ssl_c_used }" in config.text
    assert set(config.files) == {"tls/0-srv.pem", "tls.ca.pem", "tls.crl.pem"}
    assert config.files["tls.ca.pem"].decode().strip() == pem_of(authority.cert).strip()

    without_crl = mtls_config(8443, 1025, ca=pem_of(authority.cert))
    assert "crl-file" not in without_crl.text and "tls.crl.pem" not in without_crl.files
    assert client_cert_file_names(parse_state_listener(authority)) == ["tls.ca.pem"]


def parse_state_listener(authority):
    lb = only_loadbalancer("lb-m", [mtls_listener(8443, pem_of(authority.cert))], [{"id": "g"}])
    return lb.listeners[0]


# --- the real haproxy ----------------------------------------------------------------------------


@contextlib.contextmanager
def header_backend():
    """devtools' HTTP server on 127.0.0.1, answering with the request's headers (echo); its port."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", HTTPD_CODE, "mtls", str(port), json.dumps({"echo": True})])
    try:
        deadline = time.monotonic() + WAIT
        while not port_accepts(port):
            assert server.poll() is None and time.monotonic() < deadline, "the echo backend did not start"
            time.sleep(0.02)
        yield port
    finally:
        server.terminate()
        server.wait(WAIT)


def client_headers(port: int, tmp_path: Path, client: tuple[x509.Certificate, str] | None = None) -> dict:
    """The X-SSL-Client-* headers the backend saw for one request (names in lowercase);
    ssl.SSLError if the handshake fails."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if client is not None:
        cert_file, key_file = tmp_path / "client.pem", tmp_path / "client.key"
        cert_file.write_text(pem_of(client[0]))
        key_file.write_text(client[1])
        context.load_cert_chain(cert_file, key_file)
    conn = HTTPSConnection("127.0.0.1", port, timeout=WAIT, context=context)
    try:
        conn.request("GET", "/", headers={"X-SSL-Client-Verify": "forged"})
        seen = json.loads(conn.getresponse().read().decode().split("\n")[1])["headers"]
        return {k.lower(): v for k, v in seen.items() if k.lower().startswith("x-ssl-client")}
    finally:
        conn.close()


def refused(port: int, tmp_path: Path, client=None) -> bool:
    # TLS 1.3 reports a refused client certificate after the handshake, on the first read.
    try:
        client_headers(port, tmp_path, client)
    except (ssl.SSLError, ConnectionError):
        return True
    return False


def serve(tmp_path: Path, backend_port: int, **client) -> tuple[int, contextlib.AbstractContextManager]:
    port = free_port()
    paths = write_checkable(tmp_path, mtls_config(port, backend_port, **client), "lb-m")
    return port, running_haproxy(paths, [port])


def test_required_refuses_a_client_without_a_certificate_and_passes_a_verified_subject(tmp_path, authority):
    with header_backend() as backend:
        port, running = serve(tmp_path, backend, ca=pem_of(authority.cert))
        with running:
            assert refused(port, tmp_path)
            headers = client_headers(port, tmp_path, authority.issue("alice"))
            assert headers == {"x-ssl-client-dn": "/CN=alice", "x-ssl-client-verify": "0"}
            assert refused(port, tmp_path, Authority("Other CA").issue("mallory"))


def test_optional_admits_a_client_without_a_certificate_and_says_so(tmp_path, authority):
    with header_backend() as backend:
        port, running = serve(tmp_path, backend, ca=pem_of(authority.cert), verify="optional")
        with running:
            assert client_headers(port, tmp_path) == {"x-ssl-client-dn": "", "x-ssl-client-verify": "none"}
            assert client_headers(port, tmp_path, authority.issue("bob"))["x-ssl-client-verify"] == "0"


def test_a_revoked_client_certificate_is_refused(tmp_path, authority):
    carol, dave = authority.issue("carol"), authority.issue("dave")
    with header_backend() as backend:
        port, running = serve(tmp_path, backend, ca=pem_of(authority.cert), crl=authority.crl([carol[0]]))
        with running:
            assert refused(port, tmp_path, carol)
            assert client_headers(port, tmp_path, dave)["x-ssl-client-dn"] == "/CN=dave"


async def test_the_ca_and_crl_are_written_0600_and_go_with_the_listener(manager, authority):
    port = free_port()
    config = mtls_config(port, 1025, ca=pem_of(authority.cert), crl=authority.crl())
    await manager.apply("lb-m", config.text, config.files)
    directory = manager.paths.lb_files_dir("lb-m")
    for name in ("tls.ca.pem", "tls.crl.pem"):
        assert (directory / name).stat().st_mode & 0o777 == 0o600
    groups = [{"id": "g", "backends": [{"id": "be-1", "address": "198.18.0.21", "port": 80}]}]
    plain = {**mtls_listener(port, pem_of(authority.cert)), "client_certificate": None}
    members = {"g": [Member("be-1", "198.18.0.21", 80, 1, "off", False, 1025)]}
    without = render_config(only_loadbalancer("lb-m", [plain], groups), "127.0.0.1", members, inner="127.0.0.1")
    await manager.apply("lb-m", without.text, without.files)
    assert sorted(p.name for p in directory.rglob("*") if p.is_file()) == ["0-srv.pem"]
