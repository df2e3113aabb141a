"""Access to the API as an operator configures it: a unix socket (mode 0600, no
token: the file mode is the access control) and TLS on the TCP listener."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import os
import shutil
import ssl
import stat
import subprocess
import tempfile
import urllib.request
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@pytest.fixture
def public_dir(prefix: str):
    """A directory everyone may enter (tmp_path's parents are 0700), so only the socket's own mode guards it."""
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def connect_as_nobody(path: Path) -> subprocess.CompletedProcess:
    code = f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(path)!r}); print('connected')"
    return subprocess.run(
        ["runuser", "-u", "nobody", "--", "python3", "-c", code], capture_output=True, text=True, timeout=30
    )


def test_unix_socket_listener(configured_agent, public_dir):
    sock = public_dir / "api.sock"
    agent = configured_agent(listen=f"unix:{sock}").start()
    assert stat.S_ISSOCK(os.stat(sock).st_mode)
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600

    # Served over the socket, without a token; status readable by the CLI through it.
    code, body = agent.request("GET", "/v1/status", token=None)
    assert code == 200 and body["agent"]["host"] == agent.config.agent.host
    assert agent.refresh({"generation": 1})[0] == 200
    assert json.loads(agent.cli("status", "--json").stdout)["source"] == "agent"

    # Another user cannot connect at all: the mode is what guards the socket.
    refused = connect_as_nobody(sock)
    assert refused.returncode != 0 and "PermissionError" in refused.stderr, refused
    os.chmod(sock, 0o666)  # the control: with a wider mode the same user gets in
    try:
        assert connect_as_nobody(sock).stdout.strip() == "connected"
    finally:
        os.chmod(sock, 0o600)


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lbagent test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "api.crt", directory / "api.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return cert_path, key_path


def test_tls_listener(configured_agent, tmp_path):
    cert, key = self_signed(tmp_path)
    agent = configured_agent(settings={"api": [f'tls_cert_file = "{cert}"', f'tls_key_file = "{key}"']}).start()
    context = ssl.create_default_context(cafile=str(cert))

    def https(path: str, token: str | None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(f"https://127.0.0.1:{agent.port}{path}", headers=headers)
        try:
            with urllib.request.urlopen(request, context=context, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    code, body = https("/v1/status", agent.token)
    assert code == 200 and body["agent"]["host"] == agent.config.agent.host
    assert https("/v1/status", None)[0] == 401
    assert https("/v1/status", "wrong")[0] == 401
    assert https("/healthz", None)[0] == 200

    # Plain HTTP to the TLS port gets no HTTP answer at all.
    plain = http.client.HTTPConnection("127.0.0.1", agent.port, timeout=30)
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        plain.request("GET", "/healthz")
        plain.getresponse()
    plain.close()

    # The CLI reaches it too, trusting the certificate of its own configuration.
    assert json.loads(agent.cli("status", "--json").stdout)["source"] == "agent"
