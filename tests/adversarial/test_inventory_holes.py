"""KNOWN HOLES: caller bytes on which kproxy and the apiserver disagree about who the caller is.

Each test here states the agreement kproxy owes the apiserver and fails today; each is marked
``xfail(strict=True)`` with the disagreement as its reason, so the suite stays green while the
hole is open and turns red (an unexpected pass) the day it is closed: then drop the mark.
The verdict is always the apiserver's: a SelfSubjectReview sent straight to it and through
kproxy, and what it persisted.

(None open at the moment.)

Closed holes keep their test here, unmarked:

- ``test_certificate_groups_are_the_apiservers``: the x509 caller's ``system:authenticated``
  group was added to every certificate caller; it is now added as the apiserver's
  AuthenticatedGroupAdder adds it (staging/src/k8s.io/apiserver/pkg/authentication/group/
  authenticated_group_adder.go). ``test_a_certificate_naming_system_anonymous_gets_no_more_than_directly``:
  such a certificate is refused, since an impersonated ``system:anonymous`` always gets
  ``system:unauthenticated``.
- ``test_certificate_callers_carry_the_apiservers_credential_id``: the apiserver's
  ``authentication.kubernetes.io/credential-id: X509SHA256=<hex>`` extra was missing.
- ``test_impersonation_headers_decide_whom_rules_match``: in ``proxy`` and ``forward`` modes a
  caller's own ``Impersonate-*`` headers go upstream (the apiserver then acts as the
  impersonated user, after checking the caller may impersonate: staging/src/k8s.io/apiserver/
  pkg/endpoints/filters/impersonation/), but kproxy's policy rules matched the identity before
  impersonation: a dryrun rule naming the impersonated user did not apply, and the write was
  persisted as that user. The rules now match the identity the apiserver acts as
  (kproxy/identity/impersonation_headers.py; more in test_inventory_impersonation.py).
- ``test_a_callers_certificate_cannot_become_a_control_plane_service_account``: a certificate
  from the callers' CA naming a kube-system controller's service account was impersonated; the
  bootstrap policy gives those service accounts cluster-wide powers (the garbage collector reads
  every secret), and the apiserver never authenticates a service account by certificate; such a
  certificate is now refused as a privileged identity unless listed.
- ``test_websocket_token_is_reviewed_as_the_apiserver_authenticates_it``: the WebSocket bearer
  protocol's token goes to the token authenticators whole
  (staging/src/k8s.io/apiserver/pkg/authentication/request/websocket/protocol.go); a TokenReview
  puts it behind ``Bearer `` in a fake Authorization header and the bearer-token authenticator
  keeps only what precedes a space (pkg/registry/authentication/tokenreview/storage.go,
  .../request/bearertoken/bearertoken.go). A protocol token ``<valid token> x`` is the
  apiserver's 401; kproxy in ``impersonate`` mode authenticated it as ``<valid token>``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import NameOID

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .bodies import cm_json
from .conftest import start_capped
from .inventory_support import CLIENT_AUTH, Seen, apiserver_client_ca, client_cert, self_subject_review, tls_with
from .wire import Endpoint, exchange, request_bytes

TARGET = "inv-impersonated"


def _post(cp: ControlPlaneInfo, path: str, body: dict[str, object]) -> None:
    code, resp = cp.request("POST", path, body=json.dumps(body).encode())
    assert code == 201, resp


@pytest.fixture
def impersonator(control_plane: ControlPlaneInfo, namespace: str) -> str:
    """A service account token in ``namespace`` that may impersonate the user TARGET (and nothing
    else); TARGET may create ConfigMaps in ``namespace``, the service account may not."""
    cp, ns, tag = control_plane, namespace, secrets.token_hex(3)
    _post(cp, f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "impersonator"}})
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    _post(cp, f"{rbac}/clusterroles", {
        "metadata": {"name": f"inv-impersonate-{tag}"},
        "rules": [{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"], "resourceNames": [TARGET]}],
    })  # fmt: skip
    _post(cp, f"{rbac}/clusterrolebindings", {
        "metadata": {"name": f"inv-impersonate-{tag}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"inv-impersonate-{tag}"},
        "subjects": [{"kind": "ServiceAccount", "name": "impersonator", "namespace": ns}],
    })  # fmt: skip
    _post(cp, f"{rbac}/namespaces/{ns}/roles", {
        "metadata": {"name": "cm"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
    })  # fmt: skip
    _post(cp, f"{rbac}/namespaces/{ns}/rolebindings", {
        "metadata": {"name": "cm"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TARGET}],
    })  # fmt: skip
    out = cp.json("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/impersonator/token",
                  {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})  # fmt: skip
    token: str = out["status"]["token"]
    return token


@pytest.mark.parametrize("mode", ["forward", "proxy"])
def test_impersonation_headers_decide_whom_rules_match(
    mode: str,
    impersonator: str,
    control_plane: ControlPlaneInfo,
    capped_factory: Callable[..., RunningProxy],
    namespace: str,
) -> None:
    """A dryrun ``enforce`` rule names the user TARGET. A write the apiserver performs as TARGET
    (the caller impersonates it: in ``forward`` a service account allowed to, in ``proxy`` any
    caller, with kproxy's rights) must be a dry run: nothing persisted."""
    rules = [{"name": "target", "match": {"users": [TARGET], "namespaces": [namespace]}, "action": "enforce"}]
    rp = capped_factory(
        credentials=mode, tls=mode == "forward", extra={"filters": [{"name": "dryrun", "rules": rules}]}
    )
    ep = Endpoint.from_url(rp.url, tls_with(None, rp.ca_file, Path()) if rp.ca_file is not None else None)
    headers = [("Impersonate-User", TARGET)]
    if mode == "forward":
        headers.append(("Authorization", f"Bearer {impersonator}"))
    # Who the apiserver says the caller is, through kproxy with these headers.
    seen = self_subject_review(ep, headers)
    assert seen.user == TARGET, seen
    raw = request_bytes(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps",
        [("Content-Type", "application/json"), ("Accept", "application/json"), *headers], cm_json("by-impersonation"),
    )  # fmt: skip
    write = exchange(ep, raw)
    code, _ = control_plane.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/by-impersonation")
    assert code == 404, f"persisted as {TARGET}, whom the enforce rule names: {write.short()}"


@pytest.fixture(scope="module")
def imp_apiserver_ca(
    control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """impersonate mode whose callers' CA is the apiserver's own client CA: one certificate
    goes both ways."""
    tmp = tmp_path_factory.mktemp("inv-holes")
    rp = start_capped(tmp / "p", control_plane, credentials="impersonate", tls=True,
                      extra={"tls": {"client_ca_file": str(control_plane.ca_file)}})  # fmt: skip
    yield rp
    rp.stop(signal.SIGKILL)


def _both_ways(
    cp: ControlPlaneInfo, rp: RunningProxy, leaf: certs.CertKey | None, tmp: Path, headers: list[tuple[str, str]]
) -> tuple[Seen, Seen]:
    assert rp.ca_file is not None
    direct = self_subject_review(
        Endpoint("127.0.0.1", cp.apiserver_port, tls_with(leaf, cp.ca_file, tmp / "d")), headers
    )
    via = self_subject_review(Endpoint.from_url(rp.url, tls_with(leaf, rp.ca_file, tmp / "v")), headers)
    return direct, via


def _leaf(cp: ControlPlaneInfo, cn: str, orgs: tuple[str, ...]) -> certs.CertKey:
    name = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])  # fmt: skip
    return client_cert(apiserver_client_ca(cp), name, CLIENT_AUTH)


@pytest.mark.parametrize(
    "cn,orgs",
    [
        ("inv-unauth", ("system:unauthenticated",)),
        ("inv-authd", ("system:authenticated", "inv-g")),
        ("inv-g", ("inv-g",)),
    ],
    ids=["o-system-unauthenticated", "o-system-authenticated", "plain"],
)
def test_certificate_groups_are_the_apiservers(
    cn: str,
    orgs: tuple[str, ...],
    imp_apiserver_ca: RunningProxy,
    control_plane: ControlPlaneInfo,
    tmp_path: Path,
) -> None:
    leaf = _leaf(control_plane, cn, orgs)
    direct, via = _both_ways(control_plane, imp_apiserver_ca, leaf, tmp_path, [])
    # SelfSubjectReview is refused to a caller without system:authenticated (system:basic-user);
    # the apiserver's verdict on the groups is then its 403 itself.
    assert via.who() == direct.who(), f"through kproxy {via}, directly {direct}"


@pytest.mark.parametrize("orgs", [("inv-g",), ()], ids=["cn-system-anonymous", "cn-system-anonymous-no-o"])
def test_a_certificate_naming_system_anonymous_gets_no_more_than_directly(
    orgs: tuple[str, ...], imp_apiserver_ca: RunningProxy, control_plane: ControlPlaneInfo, tmp_path: Path
) -> None:
    """Directly, the certificate's caller is ``system:anonymous`` in its groups alone (the
    AuthenticatedGroupAdder adds nothing to that user), so it may not even read ``/version``
    (granted to system:authenticated and system:unauthenticated). An impersonated
    ``system:anonymous`` always gets ``system:unauthenticated`` from the impersonation filter, so
    kproxy cannot name this caller exactly and refuses it (401: stricter, never more)."""
    leaf = _leaf(control_plane, "system:anonymous", orgs)
    assert imp_apiserver_ca.ca_file is not None
    version = request_bytes("GET", "/version", [("Accept", "application/json")])
    direct = exchange(
        Endpoint("127.0.0.1", control_plane.apiserver_port, tls_with(leaf, control_plane.ca_file, tmp_path / "d")),
        version,
    )
    via = exchange(Endpoint.from_url(imp_apiserver_ca.url, tls_with(leaf, imp_apiserver_ca.ca_file, tmp_path / "v")),
                   version)  # fmt: skip
    assert direct.status == 403, direct.short()
    assert via.status == 401, f"through kproxy {via.short()}"


def test_certificate_callers_carry_the_apiservers_credential_id(
    imp_apiserver_ca: RunningProxy, control_plane: ControlPlaneInfo, tmp_path: Path
) -> None:
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "inv-g"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "inv-credential")])  # fmt: skip
    leaf = client_cert(apiserver_client_ca(control_plane), name, CLIENT_AUTH)
    direct, via = _both_ways(control_plane, imp_apiserver_ca, leaf, tmp_path, [])
    fingerprint = hashlib.sha256(leaf.cert.public_bytes(serialization.Encoding.DER)).hexdigest()
    assert dict(direct.extra).get("authentication.kubernetes.io/credential-id") == (f"X509SHA256={fingerprint}",)
    assert (via.who(), via.extra) == (direct.who(), direct.extra)


def test_websocket_token_is_reviewed_as_the_apiserver_authenticates_it(
    imp_apiserver_ca: RunningProxy, control_plane: ControlPlaneInfo, tmp_path: Path
) -> None:
    padded = control_plane.user_token + " x"
    encoded = base64.urlsafe_b64encode(padded.encode()).decode().rstrip("=")
    headers = [
        ("Connection", "Upgrade"),
        ("Upgrade", "websocket"),
        ("Sec-WebSocket-Protocol", f"base64url.bearer.authorization.k8s.io.{encoded}, v4.channel.k8s.io"),
    ]
    direct, via = _both_ways(control_plane, imp_apiserver_ca, None, tmp_path, headers)
    assert direct.status == 401, direct
    assert via.status == 401, f"through kproxy the apiserver named {via.user}"


@pytest.fixture(scope="module")
def imp_own_ca(
    control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningProxy, certs.CertKey]]:
    """impersonate mode whose callers' CA is a CA of its own (not the apiserver's), with its key."""
    tmp = tmp_path_factory.mktemp("inv-own-ca")
    ca = certs.generate_ca("inv-callers-ca")
    ca_file = certs.write_pem(tmp / "callers-ca.crt", ca.cert_pem, private=False)
    rp = start_capped(tmp / "p", control_plane, credentials="impersonate", tls=True,
                      extra={"tls": {"client_ca_file": str(ca_file)}})  # fmt: skip
    yield rp, ca
    rp.stop(signal.SIGKILL)


def test_a_callers_certificate_cannot_become_a_control_plane_service_account(
    imp_own_ca: tuple[RunningProxy, certs.CertKey], control_plane: ControlPlaneInfo, namespace: str, tmp_path: Path
) -> None:
    """The bootstrap policy binds each controller's role to its service account in kube-system
    (plugin/pkg/auth/authorizer/rbac/bootstrappolicy/controller_policy.go); the garbage
    collector's reads every secret. A certificate the callers' CA issued naming that service
    account must get kproxy's refusal of privileged identities, not the secret."""
    rp, ca = imp_own_ca
    _post(control_plane, f"/api/v1/namespaces/{namespace}/secrets",
          {"metadata": {"name": "inv-secret"}, "stringData": {"k": "v"}})  # fmt: skip
    user = "system:serviceaccount:kube-system:generic-garbage-collector"
    leaf = client_cert(ca, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user)]), CLIENT_AUTH)
    assert rp.ca_file is not None
    ep = Endpoint.from_url(rp.url, tls_with(leaf, rp.ca_file, tmp_path))
    read = exchange(ep, request_bytes("GET", f"/api/v1/namespaces/{namespace}/secrets/inv-secret",
                                      [("Accept", "application/json")]))  # fmt: skip
    assert read.status == 403, f"the secret was read as {user}: {read.short()}"
