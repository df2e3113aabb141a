"""Certificates and keys are decoded at validation (lbagent.desired.pem): chains,
key kinds and sizes, the key matching the first certificate, validity reported
as a warning, and no message showing key material."""

from __future__ import annotations

import copy
import datetime
import functools
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from cryptography.x509.oid import NameOID

from lbagent.desired import pem
from lbagent.desired.model import parse_desired_state
from lbagent.errors import InvalidDesiredState
from tests.unit.samples import EXAMPLE

NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)
CERTS = "/loadbalancers/0/listeners/1/certificates"


@functools.cache
def key_of(kind: str):
    """A private key, made once per kind for the whole module (RSA keys are slow to make)."""
    makers = {
        "rsa2048": lambda: rsa.generate_private_key(65537, 2048),
        "rsa1024": lambda: rsa.generate_private_key(65537, 1024),
        "rsa3072": lambda: rsa.generate_private_key(65537, 3072),
        "p256": lambda: ec.generate_private_key(ec.SECP256R1()),
        "p384": lambda: ec.generate_private_key(ec.SECP384R1()),
        "p192": lambda: ec.generate_private_key(ec.SECP192R1()),
        "dsa": lambda: dsa.generate_private_key(2048),
        "ed25519": ed25519.Ed25519PrivateKey.generate,
    }
    return makers[kind]()


def key_pem(key, form=serialization.PrivateFormat.PKCS8) -> str:
    return key.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption()).decode()


def cert_pem(key, name: str = "www.example.com", not_before=NOW - DAY, not_after=NOW + DAY) -> str:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .sign(key, algorithm)
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def pair(kind: str = "p256", **cert_fields) -> dict[str, str]:
    key = key_of(kind)
    return {"certificate": cert_pem(key, **cert_fields), "private_key": key_pem(key)}


def with_certificates(*certificates: dict[str, str]) -> dict[str, Any]:
    doc = copy.deepcopy(EXAMPLE)
    doc["loadbalancers"][0]["listeners"].append(
        {
            "id": "tls",
            "listener_type": "https",
            "listener_port": 443,
            "backend_group_id": "bg-1",
            "certificates": [{"id": f"c{i}", **c} for i, c in enumerate(certificates)],
        }
    )
    return doc


def details_of(doc: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InvalidDesiredState) as caught:
        parse_desired_state(doc)
    details = {d["path"]: d["message"] for d in caught.value.details}
    for certificate in doc["loadbalancers"][0]["listeners"][1]["certificates"]:
        for line in certificate["private_key"].splitlines()[1:-1]:
            assert not any(line in message for message in details.values()), "a message shows key material"
    return details


# --- accepted -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["rsa2048", "p256", "p384"])
def test_strong_enough_keys_with_their_certificate_are_accepted(kind):
    parse_desired_state(with_certificates(pair(kind)))


@pytest.mark.parametrize(
    ("kind", "form"),
    [
        ("rsa2048", serialization.PrivateFormat.TraditionalOpenSSL),
        ("p256", serialization.PrivateFormat.TraditionalOpenSSL),
    ],
)
def test_traditional_rsa_and_ec_key_blocks_are_accepted(kind, form):
    key = key_of(kind)
    parse_desired_state(with_certificates({"certificate": cert_pem(key), "private_key": key_pem(key, form)}))


def test_a_chain_is_accepted_and_the_key_matches_its_first_certificate():
    key, issuer = key_of("p256"), key_of("p384")
    chain = cert_pem(key) + cert_pem(issuer, "ca.example.com")
    state = parse_desired_state(with_certificates({"certificate": chain, "private_key": key_pem(key)}))
    assert state.loadbalancers[0].listeners[1].certificates[0].chain.count == 2


def test_ec_parameters_before_the_key_are_accepted():
    key = key_of("p256")
    params = "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"
    form = serialization.PrivateFormat.TraditionalOpenSSL
    parse_desired_state(with_certificates({"certificate": cert_pem(key), "private_key": params + key_pem(key, form)}))


# --- refused ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("rsa1024", "must be an RSA key of 2048 to 8192 bits, not 1024"),
        ("p192", "must be an EC key of at least 256 bits, not secp192r1"),
        ("dsa", "must be an RSA key (at least 2048 bits) or an EC key (at least 256 bits), not DSA"),
        ("ed25519", "must be an RSA key (at least 2048 bits) or an EC key (at least 256 bits), not Ed25519"),
    ],
)
def test_weak_or_other_keys_are_refused(kind, message):
    assert details_of(with_certificates(pair(kind))) == {f"{CERTS}/0/private_key": message}


def test_rsa_keys_larger_than_the_limit_are_refused(monkeypatch):
    # A key over 8192 bits takes minutes to make: the limit comes down instead.
    monkeypatch.setattr(pem, "MAX_RSA_BITS", 2048)
    assert details_of(with_certificates(pair("rsa3072"))) == {
        f"{CERTS}/0/private_key": "must be an RSA key of 2048 to 2048 bits, not 3072"
    }


def test_a_key_of_another_certificate_is_refused():
    mismatched = {"certificate": pair("p256")["certificate"], "private_key": pair("p384")["private_key"]}
    assert details_of(with_certificates(pair("rsa2048"), mismatched)) == {
        f"{CERTS}/1/private_key": "does not belong to the first certificate of `certificate`"
    }


def test_a_key_matching_only_a_later_certificate_of_the_chain_is_refused():
    key, other = key_of("p256"), key_of("p384")
    chain = cert_pem(other) + cert_pem(key)
    details = details_of(with_certificates({"certificate": chain, "private_key": key_pem(key)}))
    assert details == {f"{CERTS}/0/private_key": "does not belong to the first certificate of `certificate`"}


def test_a_certificate_block_that_does_not_decode_is_refused_by_its_number():
    good = pair("p256")
    broken = "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUbroken0=\n-----END CERTIFICATE-----\n"
    details = details_of(with_certificates({**good, "certificate": good["certificate"] + broken}))
    assert details == {f"{CERTS}/0/certificate": "must hold X.509 certificates: block 2 of 2 does not decode"}


def test_a_key_block_that_does_not_decode_is_refused():
    good = pair("p256")
    lines = good["private_key"].splitlines()
    garbled = "\n".join([lines[0], lines[1][:-8] + "AAAAAAAA", *lines[2:]]) + "\n"
    details = details_of(with_certificates({**good, "private_key": garbled}))
    assert details == {f"{CERTS}/0/private_key": "must be an unencrypted private key that decodes"}


def test_an_rsa_key_whose_numbers_do_not_fit_together_is_refused():
    key = key_of("rsa2048")
    numbers = key.private_numbers()
    damaged = rsa.RSAPrivateNumbers(
        numbers.p, numbers.q, numbers.d, numbers.dmp1 ^ 2, numbers.dmq1, numbers.iqmp, numbers.public_numbers
    ).private_key(unsafe_skip_rsa_key_validation=True)
    details = details_of(with_certificates({"certificate": cert_pem(key), "private_key": key_pem(damaged)}))
    assert details == {
        f"{CERTS}/0/private_key": (
            "must be an unencrypted private key that decodes (its RSA numbers do not fit together)"
        )
    }


def test_two_key_blocks_are_refused():
    good = pair("p256")
    doc = with_certificates({**good, "private_key": good["private_key"] + pair("p384")["private_key"]})
    assert details_of(doc) == {f"{CERTS}/0/private_key": "must hold exactly one private key block, not 2"}


# --- validity -----------------------------------------------------------------


def test_expired_and_not_yet_valid_certificates_are_accepted_and_warned_about():
    expired = pair("p256", not_before=NOW - 10 * DAY, not_after=NOW - DAY)
    future = pair("p384", not_before=NOW + DAY, not_after=NOW + 10 * DAY)
    lb = parse_desired_state(with_certificates(pair("rsa2048"), expired, future)).loadbalancers[0]
    warnings = lb.certificate_warnings(NOW)
    assert [w["path"] for w in warnings] == [
        "/listeners/1/certificates/1/certificate",
        "/listeners/1/certificates/2/certificate",
    ]
    assert warnings[0]["message"].startswith("certificate expired at ")
    assert warnings[1]["message"].startswith("certificate not valid before ")
    not_after = lb.listeners[1].certificates[1].chain.not_after
    assert warnings[0]["message"] == f"certificate expired at {not_after:%Y-%m-%dT%H:%M:%SZ}"
    # Five days on, the first two have expired and the third is valid.
    later = [w["path"] for w in lb.certificate_warnings(NOW + 5 * DAY)]
    assert later == ["/listeners/1/certificates/0/certificate", "/listeners/1/certificates/1/certificate"]


# --- cost ---------------------------------------------------------------------


def test_each_text_is_decoded_once(monkeypatch):
    calls = []
    load = serialization.load_pem_private_key
    monkeypatch.setattr(serialization, "load_pem_private_key", lambda *a, **k: calls.append(1) or load(*a, **k))
    key = rsa.generate_private_key(65537, 2048)  # a key no other test has decoded
    certificate = {"certificate": cert_pem(key), "private_key": key_pem(key)}
    for _ in range(3):
        parse_desired_state(with_certificates(certificate))
    assert len(calls) == 1


def test_the_cache_keeps_digests_not_key_text():
    key = key_of("p256")
    text = key_pem(key)
    pem.private_key_public_part(text)
    assert all(isinstance(k, bytes) and len(k) == 32 for k in pem._keys._values)
