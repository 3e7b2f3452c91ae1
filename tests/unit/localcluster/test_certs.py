"""The envtest PKI: chains verify, names and usages are what kube-apiserver and TLS clients need."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from kproxy.localcluster import certs


@pytest.fixture(scope="module")
def ca() -> certs.CertKey:
    return certs.generate_ca()


@pytest.fixture(scope="module")
def serving(ca: certs.CertKey) -> certs.CertKey:
    return certs.generate_serving_cert(ca)


@pytest.fixture(scope="module")
def admin(ca: certs.CertKey) -> certs.CertKey:
    return certs.generate_client_cert(ca, certs.ADMIN_COMMON_NAME, certs.ADMIN_ORGANIZATIONS)


def _policy(ca: certs.CertKey) -> PolicyBuilder:
    return PolicyBuilder().store(Store([ca.cert])).time(dt.datetime.now(dt.UTC))


def test_ca_is_a_leaf_only_ca(ca: certs.CertKey) -> None:
    bc = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert ku.key_cert_sign and ku.crl_sign
    assert ca.cert.issuer == ca.cert.subject
    assert isinstance(ca.key, ec.EllipticCurvePrivateKey) and ca.key.curve.name == "secp256r1"


def test_serving_cert_sans_cover_loopback_and_in_cluster_names(serving: certs.CertKey) -> None:
    san = serving.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    dns = set(san.get_values_for_type(x509.DNSName))
    assert ips == {"127.0.0.1", "::1", "10.0.0.1"}
    assert dns == {
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }


@pytest.mark.parametrize(
    "name",
    [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes.default.svc.cluster.local"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ],
)
def test_serving_cert_verifies_as_server(
    ca: certs.CertKey, serving: certs.CertKey, name: x509.DNSName | x509.IPAddress
) -> None:
    chain = _policy(ca).build_server_verifier(name).verify(serving.cert, [])
    assert chain[-1] == ca.cert


def test_serving_cert_rejected_for_other_names(ca: certs.CertKey, serving: certs.CertKey) -> None:
    with pytest.raises(VerificationError):
        _policy(ca).build_server_verifier(x509.DNSName("example.com")).verify(serving.cert, [])


def test_serving_cert_usages(serving: certs.CertKey) -> None:
    ext = serving.cert.extensions
    assert ext.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    ku = ext.get_extension_for_class(x509.KeyUsage).value
    assert ku.digital_signature and not ku.key_cert_sign
    assert not ext.get_extension_for_class(x509.BasicConstraints).value.ca


def test_admin_client_cert_identity_and_usage(ca: certs.CertKey, admin: certs.CertKey) -> None:
    subject = admin.cert.subject
    assert subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "kproxy-admin"
    assert [a.value for a in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:masters"]
    eku = admin.cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    # cryptography's client verifier insists on a SAN (web-PKI profile), which Kubernetes client
    # certificates do not carry; check the signature here, full chain validation by OpenSSL
    # happens in test_mutual_tls_handshake_with_python_ssl.
    admin.cert.verify_directly_issued_by(ca.cert)
    assert admin.cert.issuer == ca.cert.subject


def test_client_cert_is_not_a_server_cert(ca: certs.CertKey, admin: certs.CertKey) -> None:
    with pytest.raises(VerificationError):
        _policy(ca).build_server_verifier(x509.DNSName("localhost")).verify(admin.cert, [])


def test_foreign_ca_does_not_verify(serving: certs.CertKey) -> None:
    other = certs.generate_ca("other")
    with pytest.raises(VerificationError):
        _policy(other).build_server_verifier(x509.DNSName("localhost")).verify(serving.cert, [])


def test_leaf_validity_is_backdated_and_within_ca(ca: certs.CertKey, serving: certs.CertKey) -> None:
    now = dt.datetime.now(dt.UTC)
    assert serving.cert.not_valid_before_utc < now - dt.timedelta(minutes=30)
    assert serving.cert.not_valid_after_utc <= ca.cert.not_valid_after_utc


def test_service_account_key_pair_matches() -> None:
    sa = certs.generate_service_account_key()
    private = serialization.load_pem_private_key(sa.private_pem, password=None)
    public = serialization.load_pem_public_key(sa.public_pem)
    assert isinstance(private, ec.EllipticCurvePrivateKey)
    assert isinstance(public, ec.EllipticCurvePublicKey)
    signature = private.sign(b"token", ec.ECDSA(hashes.SHA256()))
    public.verify(signature, b"token", ec.ECDSA(hashes.SHA256()))  # raises on mismatch
    assert sa.public_pem.startswith(b"-----BEGIN PUBLIC KEY-----")


def test_write_pki_modes_and_contents(tmp_path: Path) -> None:
    files = certs.write_pki(tmp_path / "pki")
    private = {files.ca_key, files.serving_key, files.admin_key, files.sa_key, files.proxy_key}
    for path in vars(files).values():
        assert path.is_absolute() and path.is_file()
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o600 if path in private else 0o644), path
    ca = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    serving = x509.load_pem_x509_certificate(files.serving_cert.read_bytes())
    key = serialization.load_pem_private_key(files.serving_key.read_bytes(), password=None)
    assert serving.public_key() == key.public_key()
    assert serving.issuer == ca.subject
    proxy = x509.load_pem_x509_certificate(files.proxy_cert.read_bytes())
    assert proxy.issuer == ca.subject  # kproxy in front of this control plane is verified with the same CA
    assert not list((tmp_path / "pki").glob(".*tmp*")), "temporary files left behind"


def test_write_pem_replaces_and_tightens(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    path.write_bytes(b"old")
    path.chmod(0o644)
    certs.write_pem(path, b"new", private=True)
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def _pump(client: ssl.SSLObject, server: ssl.SSLObject, bios: list[ssl.MemoryBIO]) -> None:
    """Drive an in-memory TLS handshake to completion (no sockets, no ports)."""
    c_in, c_out, s_in, s_out = bios
    done = {"client": False, "server": False}
    for _ in range(20):
        for side, obj in (("client", client), ("server", server)):
            if not done[side]:
                try:
                    obj.do_handshake()
                    done[side] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return
    raise AssertionError("handshake did not complete")


def test_mutual_tls_handshake_with_python_ssl(tmp_path: Path) -> None:
    """The files work for OpenSSL (what the readiness probe uses): mTLS to 127.0.0.1 by IP SAN."""
    files = certs.write_pki(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(files.serving_cert, files.serving_key)
    server_ctx.load_verify_locations(files.ca_cert)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(files.ca_cert))
    client_ctx.load_cert_chain(files.admin_cert, files.admin_key)

    bios = [ssl.MemoryBIO() for _ in range(4)]
    client = client_ctx.wrap_bio(bios[0], bios[1], server_hostname="127.0.0.1")
    server = server_ctx.wrap_bio(bios[2], bios[3], server_side=True)
    _pump(client, server, bios)
    peer = server.getpeercert()
    assert peer is not None
    assert (("commonName", "kproxy-admin"),) in peer["subject"]
