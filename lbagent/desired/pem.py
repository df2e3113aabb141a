"""The certificates and private keys of https listeners, decoded (api.md "Certificates").

Owns what the agent checks beyond their PEM form: every CERTIFICATE block
decodes as X.509, a key is exactly one private key block that decodes and is
strong enough and not too costly (RSA of 2048 to 8192 bits, EC of 256 bits or more), the key
belongs to the first certificate, and when the first certificate is valid
(an expired one is accepted, and reported in status instead).

Decoding is cached by a digest of the text, never the text itself: a
thousand load balancers share a few certificates, and a key of a load
balancer that is gone must not stay in a cache. Errors raise ValueError with
a message that never repeats the input.

cryptography is imported where it is first needed: its bindings (a 15 MB
library with an OpenSSL of its own) add 10 MB to the agent's resident memory,
which a host without https listeners never uses.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric import rsa

MIN_RSA_BITS = 2048
# Every handshake signs with the key in the haproxy all tenants share: 16,384
# bits cost it the better part of a second each.
MAX_RSA_BITS = 8192
MIN_EC_BITS = 256
CACHE_SIZE = 4096

_CERT_BLOCK_RE = re.compile(r"-----BEGIN CERTIFICATE-----[A-Za-z0-9+/=\s]+-----END CERTIFICATE-----")
_KEY_BLOCK_RE = re.compile(r"-----BEGIN ((?:RSA |EC )?PRIVATE KEY)-----[A-Za-z0-9+/=\s]+-----END \1-----")
_ANY_KEY_BEGIN_RE = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----")


@dataclass(frozen=True)
class CertificateChain:
    """What the agent keeps of a decoded `certificate` text: its first certificate's
    public key (to match the private key against) and validity."""

    public_key: bytes  # DER SubjectPublicKeyInfo
    not_before: datetime  # aware, UTC
    not_after: datetime  # aware, UTC
    count: int  # certificates in the chain, the first included


T = TypeVar("T")


class _DigestCache:
    """A bounded map from the SHA-256 of a text to what was decoded from it.

    Locked: bodies are validated on the API's parsing thread while status
    reads validity on the event loop."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._values: OrderedDict[bytes, object] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str, decode: Callable[[str], T]) -> T:
        digest = hashlib.sha256(text.encode()).digest()
        with self._lock:
            if digest in self._values:
                self._values.move_to_end(digest)
                return self._values[digest]  # type: ignore[return-value]
        value = decode(text)  # a refused text raises, and is never kept
        with self._lock:
            self._values[digest] = value
            if len(self._values) > self._size:
                self._values.popitem(last=False)
        return value


_chains = _DigestCache(CACHE_SIZE)
_keys = _DigestCache(CACHE_SIZE)


def certificate_chain(text: str) -> CertificateChain:
    """The decoded chain of a `certificate` text; ValueError if a block does not decode."""
    return _chains.get(text, _decode_chain)


def private_key_public_part(text: str) -> bytes:
    """The public key (DER SubjectPublicKeyInfo) of a `private_key` text; ValueError
    if it is not exactly one private key block that decodes to a strong enough key."""
    return _keys.get(text, _decode_key)


def check_pair(certificate: str, private_key: str) -> None:
    """ValueError unless the key belongs to the chain's first certificate."""
    if certificate_chain(certificate).public_key != private_key_public_part(private_key):
        raise ValueError("does not belong to the first certificate of `certificate`")


def _public_der(key: object) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(  # type: ignore[attr-defined]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _decode_chain(text: str) -> CertificateChain:
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm

    blocks = _CERT_BLOCK_RE.findall(text)
    if not blocks:
        raise ValueError("must contain a PEM certificate")
    certificates = []
    for index, block in enumerate(blocks, start=1):
        try:
            certificates.append(x509.load_pem_x509_certificate(block.encode()))
        except ValueError:
            raise ValueError(f"must hold X.509 certificates: block {index} of {len(blocks)} does not decode") from None
    first = certificates[0]
    try:
        public_key = _public_der(first.public_key())
    except (ValueError, UnsupportedAlgorithm):
        raise ValueError("the first certificate's public key is of a kind the agent does not know") from None
    return CertificateChain(public_key, first.not_valid_before_utc, first.not_valid_after_utc, len(certificates))


def _decode_key(text: str) -> bytes:
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    found = len(_ANY_KEY_BEGIN_RE.findall(text))
    if found != 1:
        raise ValueError(f"must hold exactly one private key block, not {found}")
    block = _KEY_BLOCK_RE.search(text)
    if block is None:
        raise ValueError("must contain a PEM private key")
    try:
        # OpenSSL's own RSA check tests the primes: 70 ms for a 2048-bit key,
        # half a second for 4096, per new key of every refresh. The arithmetic
        # of _check_rsa_numbers finds a damaged key in microseconds.
        key = serialization.load_pem_private_key(
            block.group(0).encode(), password=None, unsafe_skip_rsa_key_validation=True
        )
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise ValueError("must be an unencrypted private key that decodes") from None
    _check_strength(key)
    if isinstance(key, rsa.RSAPrivateKey):
        _check_rsa_numbers(key.private_numbers())
    return _public_der(key.public_key())


def _check_rsa_numbers(numbers: rsa.RSAPrivateNumbers) -> None:
    """ValueError unless the RSA key's numbers fit together (its primes are not tested)."""
    p, q, d = numbers.p, numbers.q, numbers.d
    n, e = numbers.public_numbers.n, numbers.public_numbers.e
    consistent = (
        p > 1
        and q > 1
        and p * q == n
        and (e * d) % (p - 1) == 1
        and (e * d) % (q - 1) == 1
        and numbers.dmp1 == d % (p - 1)
        and numbers.dmq1 == d % (q - 1)
        and (numbers.iqmp * q) % p == 1
    )
    if not consistent:
        raise ValueError("must be an unencrypted private key that decodes (its RSA numbers do not fit together)")


def _check_strength(key: object) -> None:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if isinstance(key, rsa.RSAPrivateKey):
        if not MIN_RSA_BITS <= key.key_size <= MAX_RSA_BITS:
            raise ValueError(f"must be an RSA key of {MIN_RSA_BITS} to {MAX_RSA_BITS} bits, not {key.key_size}")
    elif isinstance(key, ec.EllipticCurvePrivateKey):
        if key.curve.key_size < MIN_EC_BITS:
            raise ValueError(f"must be an EC key of at least {MIN_EC_BITS} bits, not {key.curve.name}")
    else:
        raise ValueError(
            f"must be an RSA key (at least {MIN_RSA_BITS} bits) or an EC key (at least {MIN_EC_BITS} bits), "
            f"not {_kind(key)}"
        )


def _kind(key: object) -> str:
    # The class names of cryptography's key types: DSAPrivateKey, Ed25519PrivateKey, ...
    name = type(key).__name__.removeprefix("_")
    return re.sub(r"PrivateKey$", "", name) or "this kind"


def check_crl(block: str) -> None:
    """ValueError unless one PEM X509 CRL block decodes."""
    from cryptography import x509

    x509.load_pem_x509_crl(block.encode())
