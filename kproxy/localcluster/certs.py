"""X.509 material for the local control plane (envtest).

kube-apiserver only talks TLS, authenticates the admin by client certificate
and signs service-account tokens, so a throwaway control plane needs a small
PKI of its own: one CA, a serving certificate, an admin client certificate and
a service-account signing key.  Everything is generated in-process with
``cryptography`` (no ``openssl`` binary, no network) so tests are hermetic.

ECDSA P-256 is used throughout: key generation is ~100x faster than RSA-2048,
and both Go's crypto/tls and kube-apiserver's token signer (ES256) accept it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "ADMIN_COMMON_NAME",
    "ADMIN_ORGANIZATIONS",
    "APISERVER_SANS",
    "CertKey",
    "PKIFiles",
    "ServiceAccountKey",
    "generate_ca",
    "generate_client_cert",
    "generate_service_account_key",
    "generate_serving_cert",
    "write_pem",
    "write_pki",
]

#: Names and addresses the apiserver may be reached by: loopback for tests,
#: plus the in-cluster service names and the first service IP of
#: ``--service-cluster-ip-range=10.0.0.0/24`` so that clients configured the
#: in-cluster way also verify.
APISERVER_SANS: tuple[str, ...] = (
    "127.0.0.1",
    "::1",
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
    "10.0.0.1",
)

ADMIN_COMMON_NAME = "kproxy-admin"
#: ``system:masters`` is hard-wired in kube-apiserver to bypass authorization,
#: so the admin works before (and independently of) RBAC bootstrapping.
ADMIN_ORGANIZATIONS: tuple[str, ...] = ("system:masters",)

# Backdate so that small clock differences between processes (or a VM that
# just resumed) never make a fresh certificate "not yet valid".
_BACKDATE = dt.timedelta(hours=1)
_CA_LIFETIME = dt.timedelta(days=3650)
_LEAF_LIFETIME = dt.timedelta(days=365)


@dataclass(frozen=True)
class CertKey:
    """A certificate with its private key, both kept as objects and as PEM."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        """PKCS#8 PEM, which Go (tls.X509KeyPair, keyutil) and Python's ssl all read."""
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


@dataclass(frozen=True)
class ServiceAccountKey:
    """The key pair kube-apiserver signs (private) and verifies (public) SA tokens with."""

    private_pem: bytes
    public_pem: bytes


@dataclass(frozen=True)
class PKIFiles:
    """Absolute paths of everything :func:`write_pki` wrote."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path
    #: A serving certificate for a kproxy in front of this control plane (same CA, same loopback names).
    proxy_cert: Path
    proxy_key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common_name: str, organizations: Iterable[str] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _validity(lifetime: dt.timedelta) -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC)
    return now - _BACKDATE, now + lifetime


def _san_entries(hosts: Iterable[str]) -> list[x509.GeneralName]:
    """Classify each host as an IP or DNS SAN: Go and OpenSSL only match IPs against iPAddress SANs."""
    entries: list[x509.GeneralName] = []
    for host in hosts:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            entries.append(x509.DNSName(host))
    return entries


def generate_ca(common_name: str = "kproxy-envtest-ca") -> CertKey:
    """A self-signed CA that may sign leaf certificates only (path length 0)."""
    key = _new_key()
    name = _name(common_name)
    not_before, not_after = _validity(_CA_LIFETIME)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertKey(cert=cert, key=key)


def _leaf(
    ca: CertKey,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    sans: Sequence[str] = (),
) -> CertKey:
    key = _new_key()
    not_before, not_after = _validity(_LEAF_LIFETIME)
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        # A leaf must not outlive its issuer, or strict verifiers reject it.
        .not_valid_after(min(not_after, ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            # ECDSA keys sign the handshake; keyEncipherment only applies to RSA key exchange.
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(_san_entries(sans)), critical=False)
    return CertKey(cert=builder.sign(ca.key, hashes.SHA256()), key=key)


def generate_serving_cert(
    ca: CertKey, hosts: Sequence[str] = APISERVER_SANS, common_name: str = "kube-apiserver"
) -> CertKey:
    """A TLS server certificate for kube-apiserver valid for ``hosts`` (IPs and DNS names)."""
    return _leaf(ca, _name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, sans=hosts)


def generate_client_cert(ca: CertKey, common_name: str, organizations: Sequence[str] = ()) -> CertKey:
    """A TLS client certificate; kube-apiserver maps CN to the user name and O to its groups."""
    return _leaf(ca, _name(common_name, organizations), ExtendedKeyUsageOID.CLIENT_AUTH)


def generate_service_account_key() -> ServiceAccountKey:
    """The SA token key pair (ES256); the public half goes to ``--service-account-key-file``."""
    key = _new_key()
    return ServiceAccountKey(
        private_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        public_pem=key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )


def write_pem(path: Path, data: bytes, *, private: bool) -> Path:
    """Write ``data`` to ``path`` atomically; private material is created 0600 from the start.

    The file is created with the final mode (not chmod-ed afterwards) so a key
    is never readable by others, not even for an instant, and it is replaced
    via rename so readers never see a half-written PEM.
    """
    path = path.absolute()
    mode = 0o600 if private else 0o644
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)  # O_CREAT mode is filtered by umask; make it exact
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_pki(directory: Path) -> PKIFiles:
    """Generate a complete, fresh PKI for one control plane into ``directory``."""
    directory = directory.absolute()
    directory.mkdir(parents=True, exist_ok=True)
    ca = generate_ca()
    serving = generate_serving_cert(ca)
    admin = generate_client_cert(ca, ADMIN_COMMON_NAME, ADMIN_ORGANIZATIONS)
    sa = generate_service_account_key()
    proxy = generate_serving_cert(ca, common_name="kproxy")
    return PKIFiles(
        ca_cert=write_pem(directory / "ca.crt", ca.cert_pem, private=False),
        ca_key=write_pem(directory / "ca.key", ca.key_pem, private=True),
        serving_cert=write_pem(directory / "apiserver.crt", serving.cert_pem, private=False),
        serving_key=write_pem(directory / "apiserver.key", serving.key_pem, private=True),
        admin_cert=write_pem(directory / "admin.crt", admin.cert_pem, private=False),
        admin_key=write_pem(directory / "admin.key", admin.key_pem, private=True),
        sa_key=write_pem(directory / "sa.key", sa.private_pem, private=True),
        sa_pub=write_pem(directory / "sa.pub", sa.public_pem, private=False),
        proxy_cert=write_pem(directory / "kproxy.crt", proxy.cert_pem, private=False),
        proxy_key=write_pem(directory / "kproxy.key", proxy.key_pem, private=True),
    )
