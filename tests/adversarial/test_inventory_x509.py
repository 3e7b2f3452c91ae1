"""`credentials: impersonate` with client certificates: kproxy's x509 authentication against the
apiserver's own, certificate by certificate.

kproxy trusts the apiserver's client CA here, so one certificate goes straight to the apiserver
and through kproxy, and the apiserver names the caller both times (SelfSubjectReview): the user
is the subject's Common Name and the groups its Organizations, as the x509 authenticator's
``CommonNameUserConversion`` reads them (staging/src/k8s.io/apiserver/pkg/authentication/request/
x509/x509.go; Go's crypto/x509 parser, pkix.Name.FillFromRDNSequence: the last CN wins, every O
in order), and a certificate is an identity only for client authentication (``DefaultVerifyOptions``:
``x509.ExtKeyUsageClientAuth``). A certificate kproxy takes must name the caller the apiserver
names; one the apiserver would not take as anyone must not be taken by kproxy either.

The known disagreements each fail here (strict xfail, reason naming them); see
tests/adversarial/test_inventory_holes.py for the ones that give a caller more than directly."""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .conftest import start_capped
from .inventory_support import CLIENT_AUTH, Seen, apiserver_client_ca, client_cert, self_subject_review, tls_with
from .wire import Endpoint

CN, ORG = NameOID.COMMON_NAME, NameOID.ORGANIZATION_NAME


@dataclass(frozen=True)
class CertCase:
    id: str
    subject: tuple[tuple[x509.ObjectIdentifier, str, _ASN1Type | None], ...]
    ekus: Sequence[x509.ObjectIdentifier] | None = CLIENT_AUTH
    known: str | None = None

    def name(self) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(oid, value, _type=kind) if kind is not None else x509.NameAttribute(oid, value)
                for oid, value, kind in self.subject
            ]
        )


def _s(
    *attrs: tuple[x509.ObjectIdentifier, str] | tuple[x509.ObjectIdentifier, str, _ASN1Type],
) -> tuple[tuple[x509.ObjectIdentifier, str, _ASN1Type | None], ...]:
    return tuple((a[0], a[1], a[2] if len(a) == 3 else None) for a in attrs)


#: The Kubernetes user uid attribute (k8s.io/apimachinery/pkg/apis/asn1/oid.go ``X509UID``).
UID = x509.ObjectIdentifier("1.3.6.1.4.1.57683.2")

CASES = [
    CertCase("plain", _s((ORG, "inv-g1"), (CN, "inv-plain"))),
    CertCase("two-cns-last-wins", _s((CN, "inv-first"), (CN, "inv-last"))),
    CertCase("groups-in-order", _s((ORG, "inv-b"), (ORG, "inv-a"), (CN, "inv-order"))),
    CertCase("o-after-cn", _s((CN, "inv-ocn"), (ORG, "inv-late"))),
    CertCase("o-system-authenticated", _s((ORG, "system:authenticated"), (CN, "inv-authd"))),
    CertCase("service-account-name", _s((CN, "system:serviceaccount:default:inv-sa"))),
    CertCase("no-cn", _s((ORG, "inv-g1"),)),
    CertCase("empty-subject", ()),
    CertCase("bmpstring-cn", _s((CN, "inv-bmp-ü", _ASN1Type.BMPString))),
    CertCase("t61string-cn", _s((CN, "inv-t61", _ASN1Type.T61String))),
    CertCase("ia5string-o", _s((ORG, "inv-ia5", _ASN1Type.IA5String), (CN, "inv-ia5"))),
    CertCase("printablestring-cn-valid", _s((CN, "inv-printable", _ASN1Type.PrintableString))),
    CertCase("universalstring-cn", _s((CN, "inv-universal", _ASN1Type.UniversalString))),
    CertCase("universalstring-l", _s((NameOID.LOCALITY_NAME, "inv-l", _ASN1Type.UniversalString), (CN, "inv-ul"))),
    CertCase("uid", _s((ORG, "inv-g1"), (CN, "inv-uid"), (UID, "inv-uid-1234"))),
    CertCase("two-uids", _s((CN, "inv-uids"), (UID, "a"), (UID, "b"))),
    CertCase("empty-uid", _s((CN, "inv-uid-empty"), (UID, ""))),
    CertCase("no-eku", _s((CN, "inv-noeku")), ekus=None),
    CertCase("eku-client-and-server", _s((CN, "inv-both")),
             ekus=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH)),
    CertCase("eku-server-only", _s((CN, "inv-serveronly")), ekus=(ExtendedKeyUsageOID.SERVER_AUTH,)),
    CertCase("eku-any", _s((CN, "inv-anyeku")), ekus=(ExtendedKeyUsageOID.ANY_EXTENDED_KEY_USAGE,),
             known="Go's verifier takes anyExtendedKeyUsage for client auth; OpenSSL's ssl_client purpose "
                   "does not, so kproxy refuses the handshake of a certificate the apiserver takes"),
]  # fmt: skip


@pytest.fixture(scope="module")
def apiserver_ca(control_plane: ControlPlaneInfo) -> certs.CertKey:
    return apiserver_client_ca(control_plane)


@pytest.fixture(scope="module")
def imp_apiserver_ca(
    control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """impersonate mode whose callers' CA is the apiserver's own client CA."""
    tmp = tmp_path_factory.mktemp("inv-x509")
    rp = start_capped(tmp / "p", control_plane, credentials="impersonate", tls=True,
                      extra={"tls": {"client_ca_file": str(control_plane.ca_file)}})  # fmt: skip
    yield rp
    rp.stop(signal.SIGKILL)


def _accepted(seen: Seen) -> bool:
    """The caller was named by its certificate (a 201 naming no anonymous user)."""
    return seen.status == 201 and seen.user != "system:anonymous"


@pytest.mark.parametrize(
    "case", [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.known)] if c.known else [])
             for c in CASES],
)  # fmt: skip
def test_certificate_callers_are_who_the_apiserver_says(
    case: CertCase,
    imp_apiserver_ca: RunningProxy,
    apiserver_ca: certs.CertKey,
    control_plane: ControlPlaneInfo,
    tmp_path: Path,
) -> None:
    leaf = client_cert(apiserver_ca, case.name(), case.ekus)
    direct = self_subject_review(
        Endpoint("127.0.0.1", control_plane.apiserver_port, tls_with(leaf, control_plane.ca_file, tmp_path / "d"))
    )
    assert imp_apiserver_ca.ca_file is not None
    via = self_subject_review(
        Endpoint.from_url(imp_apiserver_ca.url, tls_with(leaf, imp_apiserver_ca.ca_file, tmp_path / "v"))
    )
    assert imp_apiserver_ca.proc.poll() is None, "kproxy exited"
    if _accepted(direct):
        # The same caller: user, groups, uid and extras (the credential id).
        assert (via.who(), via.uid, via.extra) == (direct.who(), direct.uid, direct.extra), (via, direct)
    else:
        # The apiserver takes no identity from this certificate: neither may kproxy.
        assert not _accepted(via), (via, direct)


UNTRUSTED = (
    "stricter: a certificate the callers' CA did not sign fails kproxy's handshake; the apiserver "
    "ignores it (its x509 authenticator fails) and authenticates the bearer token"
)


@pytest.mark.parametrize(
    "signer",
    ["apiserver-ca", pytest.param("other-ca", marks=pytest.mark.xfail(strict=True, reason=UNTRUSTED))],
)
def test_a_certificate_comes_before_a_bearer_token(
    signer: str,
    imp_apiserver_ca: RunningProxy,
    apiserver_ca: certs.CertKey,
    control_plane: ControlPlaneInfo,
    tmp_path: Path,
) -> None:
    """A caller presenting a certificate and a bearer token is the certificate's user when the
    certificate verifies (x509 runs before the token authenticators), the token's otherwise: the
    same through kproxy as directly."""
    ca = apiserver_ca if signer == "apiserver-ca" else certs.generate_ca("inv-other-ca")
    leaf = client_cert(ca, x509.Name([x509.NameAttribute(CN, "inv-cert-and-token")]), CLIENT_AUTH)
    token = [("Authorization", f"Bearer {control_plane.user_token}")]
    direct = self_subject_review(
        Endpoint("127.0.0.1", control_plane.apiserver_port, tls_with(leaf, control_plane.ca_file, tmp_path / "d")),
        token,
    )
    assert imp_apiserver_ca.ca_file is not None
    via = self_subject_review(
        Endpoint.from_url(imp_apiserver_ca.url, tls_with(leaf, imp_apiserver_ca.ca_file, tmp_path / "v")), token
    )
    assert direct.user == ("inv-cert-and-token" if signer == "apiserver-ca" else control_plane.user_name), direct
    assert via.who() == direct.who(), (via, direct)
