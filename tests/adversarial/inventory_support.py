"""Helpers of the inventory tests (tests/adversarial/test_inventory_*.py): client certificates
of any subject and extended key usages from the apiserver's own client CA, so that one
certificate can be sent straight to the apiserver and through kproxy, and the verdicts compared;
and SelfSubjectReview, the apiserver's word on who a request's caller is."""

from __future__ import annotations

import datetime as dt
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import ControlPlaneInfo

from .wire import Answer, Endpoint, exchange, request_bytes

SSR_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
SSR = b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'
CLIENT_AUTH = (ExtendedKeyUsageOID.CLIENT_AUTH,)


def apiserver_client_ca(cp: ControlPlaneInfo) -> certs.CertKey:
    """The CA the apiserver's x509 authenticator trusts (``--client-ca-file``), with its key."""
    cert = x509.load_pem_x509_certificate((cp.dir / "ca.crt").read_bytes())
    key = serialization.load_pem_private_key((cp.dir / "ca.key").read_bytes(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    return certs.CertKey(cert=cert, key=key)


def client_cert(ca: certs.CertKey, subject: x509.Name, ekus: Sequence[x509.ObjectIdentifier] | None) -> certs.CertKey:
    """A leaf signed by ``ca`` with exactly this subject; ``ekus`` None: no extendedKeyUsage at all."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if ekus is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(list(ekus)), critical=False)
    return certs.CertKey(cert=builder.sign(ca.key, hashes.SHA256()), key=key)


def tls_with(leaf: certs.CertKey | None, trust: Path, tmp: Path) -> ssl.SSLContext:
    """A client context trusting ``trust`` and presenting ``leaf`` (if any)."""
    ctx = ssl.create_default_context(cafile=str(trust))
    if leaf is not None:
        tmp.mkdir(parents=True, exist_ok=True)
        crt = certs.write_pem(tmp / "leaf.crt", leaf.cert_pem, private=False)
        key = certs.write_pem(tmp / "leaf.key", leaf.key_pem, private=True)
        ctx.load_cert_chain(str(crt), str(key))
    return ctx


@dataclass(frozen=True)
class Seen:
    """Who the apiserver said the caller was, or that it did not say (no Status 201)."""

    status: int
    user: str | None = None
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: What came instead of a 201 (for the failure message).
    answer: str = ""

    @classmethod
    def of(cls, answer: Answer) -> Seen:
        if answer.status != 201:
            return cls(answer.status, answer=answer.short())
        info: dict[str, Any] = answer.json()["status"]["userInfo"]
        extra = tuple(sorted((k, tuple(v)) for k, v in (info.get("extra") or {}).items()))
        return cls(201, info.get("username"), tuple(info.get("groups") or ()), info.get("uid", ""), extra)

    def who(self) -> tuple[int, str | None, tuple[str, ...]]:
        """Status, user and groups (as a set, in a stable order)."""
        return self.status, self.user, tuple(sorted(self.groups))


def self_subject_review(ep: Endpoint, headers: Sequence[tuple[str, str]] = ()) -> Seen:
    raw = request_bytes(
        "POST", SSR_PATH, [("Accept", "application/json"), ("Content-Type", "application/json"), *headers], SSR
    )
    return Seen.of(exchange(ep, raw))
