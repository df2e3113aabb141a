"""TLS termination of https listeners: cipher policies, and the certificate files haproxy reads.

Certificates of one listener (its own, then those its rules carry, in that
order) become one directory `<lb id>/<listener id>/` of PEM files, each the
certificate followed by its private key. The bind line names the directory
(`crt <lb id>/<listener id>`, relative to the base file's `crt-base`): haproxy
loads every file in it in name order, picks a certificate by SNI among their
names, and falls back to the first file. A zero-padded index leads every file
name so that the first certificate of the listener is that first file.

Mutual TLS adds two files beside that directory, `<listener id>.ca.pem` and,
with a revocation list, `<listener id>.crl.pem` (ids hold no '.', so neither
can be a listener's directory), named by the bind line's `ca-file` and
`crl-file` relative to the base file's `ca-base`. haproxy verifies the client
certificate; the frontend passes its subject and the result to the backend.

The files are handed to the manager next to the config text (`HaproxyConfig`),
which writes them mode 0600 and removes them with the listener; nothing here
logs or returns their content other than through that mapping.
"""

from __future__ import annotations

from dataclasses import dataclass

from lbagent.haproxy.errors import HaproxyError, RenderError
from lbagent.haproxy.files import check_file_name

# Strong: forward secrecy (ECDHE) and AEAD ciphers only.
STRICT_CIPHERS = ":".join(
    [
        "ECDHE-ECDSA-AES128-GCM-SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305",
        "ECDHE-RSA-CHACHA20-POLY1305",
    ]
)
# Compatible: the strict list first, then CBC and RSA key exchange for older
# clients (no RC4, 3DES, MD5, export or anonymous ciphers).
COMPATIBLE_CIPHERS = ":".join(
    [
        STRICT_CIPHERS,
        "ECDHE-ECDSA-AES128-SHA256",
        "ECDHE-RSA-AES128-SHA256",
        "ECDHE-ECDSA-AES256-SHA384",
        "ECDHE-RSA-AES256-SHA384",
        "ECDHE-ECDSA-AES128-SHA",
        "ECDHE-RSA-AES128-SHA",
        "ECDHE-ECDSA-AES256-SHA",
        "ECDHE-RSA-AES256-SHA",
        "AES128-GCM-SHA256",
        "AES256-GCM-SHA384",
        "AES128-SHA256",
        "AES256-SHA256",
        "AES128-SHA",
        "AES256-SHA",
    ]
)
# OpenSSL 3 refuses TLS 1.0 and 1.1 at any security level above 0 (their
# handshake signs with SHA-1): a policy that admits them must lower it.
LEGACY_LEVEL = ":@SECLEVEL=0"


@dataclass(frozen=True)
class TlsPolicy:
    min_version: str  # haproxy's ssl-min-ver word
    ciphers: str  # TLS <= 1.2 cipher list; TLS 1.3 keeps OpenSSL's suites, all of them AEAD


TLS_POLICIES = {
    "tls_cipher_policy_1_0": TlsPolicy("TLSv1.0", COMPATIBLE_CIPHERS + LEGACY_LEVEL),
    "tls_cipher_policy_1_1": TlsPolicy("TLSv1.1", COMPATIBLE_CIPHERS + LEGACY_LEVEL),
    "tls_cipher_policy_1_2": TlsPolicy("TLSv1.2", COMPATIBLE_CIPHERS),
    "tls_cipher_policy_1_2_strict": TlsPolicy("TLSv1.2", STRICT_CIPHERS),
}
ALPN_H2 = "h2,http/1.1"


@dataclass(frozen=True)
class ClientCertView:
    ca_file: str  # relative to ca-base
    verify: str  # haproxy's: "required" or "optional"
    crl_file: str | None


@dataclass(frozen=True)
class TlsBindView:
    crt: str  # certificate directory, relative to crt-base
    alpn: str | None
    min_version: str
    ciphers: str
    client: ClientCertView | None = None


def certificates_of(listener) -> list:
    """The listener's certificates, then its rules', in order: the first is the default."""
    return [*listener.certificates, *(cert for rule in listener.rules for cert in rule.certificates)]


def tls_bind(lb_id: str, listener) -> TlsBindView:
    policy = TLS_POLICIES.get(listener.tls_cipher_policy)
    if policy is None:
        raise RenderError(f"unsupported tls_cipher_policy: {listener.tls_cipher_policy!r}")
    if not certificates_of(listener):
        # haproxy would refuse a missing directory; say why instead.
        raise RenderError(f"https listener {listener.id} has no certificate")
    return TlsBindView(
        crt=f"{lb_id}/{listener.id}",
        alpn=ALPN_H2 if listener.http2 else None,
        min_version=policy.min_version,
        ciphers=policy.ciphers,
        client=_client_cert_view(lb_id, listener),
    )


def _client_cert_view(lb_id: str, listener) -> ClientCertView | None:
    client = listener.client_certificate
    if client is None:
        return None
    names = client_cert_file_names(listener)
    return ClientCertView(
        ca_file=f"{lb_id}/{names[0]}",
        verify=client.verify,
        crl_file=f"{lb_id}/{names[1]}" if len(names) > 1 else None,
    )


def client_cert_file_names(listener) -> list[str]:
    """The CA file, then the CRL file if there is one, relative to the load balancer's directory."""
    client = listener.client_certificate
    if client is None:
        return []
    return [f"{listener.id}.ca.pem"] + ([f"{listener.id}.crl.pem"] if client.crl else [])


def client_cert_files(listener) -> dict[str, bytes]:
    """Relative path -> PEM of the CA and the revocation list of a listener with mutual TLS."""
    client = listener.client_certificate
    if client is None:
        return {}
    contents = [client.ca, client.crl]
    files = {}
    for name, content in zip(client_cert_file_names(listener), contents):
        _check_name(name)
        files[name] = (content.strip() + "\n").encode("ascii")
    return files


def _check_name(name: str) -> None:
    try:
        check_file_name(name)  # ids become file names: defence in depth, as token() is for config words
    except HaproxyError as exc:
        raise RenderError(str(exc)) from None


def certificate_files(listener) -> dict[str, bytes]:
    """Relative path (under the load balancer's directory) -> PEM of certificate and key."""
    certificates = certificates_of(listener)
    width = len(str(len(certificates)))
    files = {}
    for index, cert in enumerate(certificates):
        name = f"{listener.id}/{index:0{width}d}-{cert.id}.pem"
        _check_name(name)
        files[name] = _pem(cert.certificate, cert.private_key)
    return files


def _pem(certificate: str, private_key: str) -> bytes:
    return (certificate.strip() + "\n" + private_key.strip() + "\n").encode("ascii")
