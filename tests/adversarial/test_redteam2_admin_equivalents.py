"""Red team (round two): impersonate mode acts as identities that are cluster-admin in all but name.

Before acting as a caller, kproxy asks the apiserver whether the identity may do everything (a
SubjectAccessReview for verb, group and resource ``*``: kproxy/identity/impersonate.py
``AdminCheck``) and refuses it unless listed, so that the callers' CA cannot mint the cluster's
administrators. RBAC matches a requested verb ``*`` only against a rule whose verbs hold ``*``
(plugin/pkg/auth/authorizer/rbac/rbac.go, ``VerbMatches``), so the review says "no" to:

* ``all-verbs``: a ClusterRole granting every verb the apiserver knows, by name, on every resource
  (what ``cluster-admin`` grants, spelled out);
* ``bind``: a ClusterRole granting only ``create`` on ClusterRoleBindings and ``bind`` on
  ClusterRoles (the RBAC escalation check lets a caller with ``bind`` grant a role it does not
  hold: plugin/pkg/registry/rbac/clusterrolebinding/policybased/storage.go, ``BindingAuthorized``);
* ``escalate``: ``create``/``update`` and ``escalate`` on ClusterRoles plus ``create`` on
  ClusterRoleBindings of a role it holds (plugin/pkg/registry/rbac/clusterrole/policybased/storage.go,
  ``EscalationAllowed``): it widens its own role to ``*``.

Each is one request from cluster-admin. Here a certificate from the callers' CA naming a group
bound to one of them makes, through kproxy, a ClusterRoleBinding of ``cluster-admin`` to a user of
its choice (the apiserver persists it: a GET as admin finds it), or widens its own ClusterRole to
``*``. kproxy must refuse these identities as it refuses one bound to ``cluster-admin``."""

from __future__ import annotations

import json
import secrets
import ssl
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .inventory_support import self_subject_review
from .wire import Endpoint, exchange, request_bytes

RBAC = "/apis/rbac.authorization.k8s.io/v1"
ALL_VERBS = [
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
    "bind",
    "impersonate",
    "approve",
    "sign",
    "attest",
    "use",
    "proxy",
]
ROLES: dict[str, list[dict[str, object]]] = {
    "all-verbs": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ALL_VERBS}],
    "bind": [
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterrolebindings"], "verbs": ["create"]},
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"]},
    ],
    "escalate": [
        {
            "apiGroups": ["rbac.authorization.k8s.io"],
            "resources": ["clusterroles"],
            "verbs": ["get", "update", "escalate"],
        },
    ],
}


def _request(cp: ControlPlaneInfo, method: str, path: str, obj: Mapping[str, object] | None = None) -> int:
    code, data = cp.request(method, path, body=json.dumps(obj).encode() if obj is not None else None)
    assert code in (200, 201, 404), data.decode(errors="replace")
    return code


@pytest.fixture(params=sorted(ROLES))
def equivalent(request: pytest.FixtureRequest, control_plane: ControlPlaneInfo) -> Iterator[tuple[str, str]]:
    """(kind, group): a ClusterRole of that kind bound to a fresh group."""
    kind: str = request.param
    name = f"redteam2-{kind}-{secrets.token_hex(3)}"
    _request(control_plane, "POST", f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": ROLES[kind]})
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name}],
    }
    _request(control_plane, "POST", f"{RBAC}/clusterrolebindings", binding)
    yield kind, name
    _request(control_plane, "DELETE", f"{RBAC}/clusterrolebindings/{name}")
    _request(control_plane, "DELETE", f"{RBAC}/clusterroles/{name}")


def _caller(rp: RunningProxy, ca: certs.CertKey, tmp: Path, group: str) -> Endpoint:
    leaf = certs.generate_client_cert(ca, "mallory", (group,))
    crt = certs.write_pem(tmp / "caller.crt", leaf.cert_pem, private=False)
    key = certs.write_pem(tmp / "caller.key", leaf.key_pem, private=True)
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    ctx.load_cert_chain(str(crt), str(key))
    return Endpoint.from_url(rp.url, ctx)


def _send(ep: Endpoint, method: str, path: str, obj: Mapping[str, object] | None = None) -> tuple[int, bytes]:
    headers = [("Accept", "application/json")]
    body = b""
    if obj is not None:
        headers.append(("Content-Type", "application/json"))
        body = json.dumps(obj).encode()
    answer = exchange(ep, request_bytes(method, path, headers, body))
    return answer.status, answer.body


def test_the_callers_ca_cannot_mint_an_identity_one_request_from_cluster_admin(
    control_plane: ControlPlaneInfo,
    capped_factory: Callable[..., RunningProxy],
    equivalent: tuple[str, str],
    tmp_path: Path,
) -> None:
    cp = control_plane
    kind, group = equivalent
    ca = certs.generate_ca("redteam2-callers-ca")
    ca_file = certs.write_pem(tmp_path / "callers-ca.crt", ca.cert_pem, private=False)
    rp = capped_factory(credentials="impersonate", tls=True, extra={"tls": {"client_ca_file": str(ca_file)}})
    mallory = _caller(rp, ca, tmp_path, group)
    seen = self_subject_review(mallory)
    if kind == "escalate":
        # Widen its own ClusterRole to cluster-admin's rule.
        status, body = _send(mallory, "GET", f"{RBAC}/clusterroles/{group}")
        got = json.loads(body) if status == 200 else {}
        if status == 200:
            got["rules"] = [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]
            status, body = _send(mallory, "PUT", f"{RBAC}/clusterroles/{group}", got)
        code, data = cp.request("GET", f"{RBAC}/clusterroles/{group}")
        persisted = code == 200 and json.loads(data)["rules"][0]["verbs"] == ["*"]
        what = "widened its own ClusterRole to verbs/resources *"
    else:
        # Bind cluster-admin to a user of its choosing.
        target = f"redteam2-escalated-{secrets.token_hex(3)}"
        crb = {
            "metadata": {"name": target},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": target}],
        }
        status, body = _send(mallory, "POST", f"{RBAC}/clusterrolebindings", crb)
        code, _ = cp.request("GET", f"{RBAC}/clusterrolebindings/{target}")
        persisted = code == 200
        if persisted:
            cp.request("DELETE", f"{RBAC}/clusterrolebindings/{target}")
        what = f"bound cluster-admin to user {target}"
    assert not persisted and status == 403, (
        f"a callers'-CA certificate in group {group} ({kind}) {what} through kproxy "
        f"({status}: {body[:200]!r}); the apiserver saw {seen.who()}"
    )


@pytest.fixture
def kube_system_admins(control_plane: ControlPlaneInfo) -> Iterator[str]:
    """A fresh group bound to ``cluster-admin`` by a RoleBinding in ``kube-system`` only."""
    name = f"redteam2-ks-admins-{secrets.token_hex(3)}"
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name}],
    }
    _request(control_plane, "POST", f"{RBAC}/namespaces/kube-system/rolebindings", binding)
    yield name
    _request(control_plane, "DELETE", f"{RBAC}/namespaces/kube-system/rolebindings/{name}")


def test_the_callers_ca_cannot_mint_an_administrator_of_kube_system(
    control_plane: ControlPlaneInfo,
    capped_factory: Callable[..., RunningProxy],
    kube_system_admins: str,
    tmp_path: Path,
) -> None:
    """``cluster-admin`` bound in ``kube-system`` only: the SubjectAccessReview (no namespace) says
    no, yet the identity mints tokens for kube-system's service accounts, which the bootstrap
    policy binds to cluster-wide controller roles (``clusterrole-aggregation-controller``:
    ``escalate`` on every ClusterRole) and which kproxy itself refuses to act as. Here its token
    request for that service account (created first if the control plane runs no controller
    manager) is answered 201 through kproxy; it must be refused as a cluster-admin's would be."""
    cp = control_plane
    ca = certs.generate_ca("redteam2-callers-ca")
    ca_file = certs.write_pem(tmp_path / "callers-ca.crt", ca.cert_pem, private=False)
    rp = capped_factory(credentials="impersonate", tls=True, extra={"tls": {"client_ca_file": str(ca_file)}})
    mallory = _caller(rp, ca, tmp_path, kube_system_admins)
    sa = "clusterrole-aggregation-controller"
    sa_path = "/api/v1/namespaces/kube-system/serviceaccounts"
    created = _send(mallory, "POST", sa_path, {"metadata": {"name": sa}})[0]
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    status, body = _send(mallory, "POST", f"{sa_path}/{sa}/token", request)
    minted = status == 201 and bool(json.loads(body)["status"]["token"])
    escalates = False
    if minted:
        # What the token may do, asked of the apiserver directly: escalate any ClusterRole.
        ssar = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "verb": "escalate",
                    "group": "rbac.authorization.k8s.io",
                    "resource": "clusterroles",
                }
            },
        }
        code, data = cp.request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body=json.dumps(ssar).encode(),
            token=json.loads(body)["status"]["token"],
        )
        escalates = code == 201 and json.loads(data)["status"].get("allowed", False)
    if created == 201:
        cp.request("DELETE", f"{sa_path}/{sa}")
    assert not minted and status == 403, (
        f"group {kube_system_admins} (cluster-admin by a RoleBinding in kube-system) minted a token for "
        f"kube-system's {sa} through kproxy ({status}; creating the service account: {created}); the "
        f"token may escalate every ClusterRole at the apiserver: {escalates}"
    )


@pytest.fixture
def signer_approvers(control_plane: ControlPlaneInfo) -> Iterator[str]:
    """A fresh group that may approve client certificates for the apiserver's client signer, as
    the CSR approval docs grant it: ``approve`` on that one signer, ``update`` on the approval."""
    name = f"redteam2-approvers-{secrets.token_hex(3)}"
    rules = [
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"],
         "verbs": ["get", "create"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests/approval"],
         "verbs": ["update"]},
        {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
         "resourceNames": ["kubernetes.io/kube-apiserver-client"], "verbs": ["approve"]},
    ]  # fmt: skip
    _request(control_plane, "POST", f"{RBAC}/clusterroles", {"metadata": {"name": name}, "rules": rules})
    binding = {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": name}],
    }
    _request(control_plane, "POST", f"{RBAC}/clusterrolebindings", binding)
    yield name
    _request(control_plane, "DELETE", f"{RBAC}/clusterrolebindings/{name}")
    _request(control_plane, "DELETE", f"{RBAC}/clusterroles/{name}")


def test_the_callers_ca_cannot_mint_an_approver_of_admin_certificates(
    control_plane: ControlPlaneInfo,
    capped_factory: Callable[..., RunningProxy],
    signer_approvers: str,
    tmp_path: Path,
) -> None:
    """Approving for ``kubernetes.io/kube-apiserver-client`` bounds the subject only by the
    apiserver's CertificateSubjectRestriction admission, which refuses ``O=system:masters`` alone:
    an identity that may approve there approves its own request for ``O=kubeadm:cluster-admins``
    (cluster-admin on kubeadm clusters) and is cluster-admin once the signer signs it. Through
    kproxy its approval must be refused: the apiserver, asked whether the identity may approve for
    that signer, says yes."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cp = control_plane
    ca = certs.generate_ca("redteam2-callers-ca")
    ca_file = certs.write_pem(tmp_path / "callers-ca.crt", ca.cert_pem, private=False)
    rp = capped_factory(credentials="impersonate", tls=True, extra={"tls": {"client_ca_file": str(ca_file)}})
    mallory = _caller(rp, ca, tmp_path, signer_approvers)
    subject = x509.Name([
        x509.NameAttribute(NameOID.COMMON_NAME, "mallory-admin"),
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kubeadm:cluster-admins"),
    ])  # fmt: skip
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(subject)
        .sign(ec.generate_private_key(ec.SECP256R1()), hashes.SHA256())
    )
    pem = csr.public_bytes(serialization.Encoding.PEM)
    name = f"redteam2-masters-{secrets.token_hex(3)}"
    import base64

    request = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": base64.b64encode(pem).decode(), "signerName": "kubernetes.io/kube-apiserver-client",
                 "usages": ["client auth"]},
    }  # fmt: skip
    _request(cp, "POST", "/apis/certificates.k8s.io/v1/certificatesigningrequests", request)
    path = f"/apis/certificates.k8s.io/v1/certificatesigningrequests/{name}"
    try:
        code, data = cp.request("GET", path)
        assert code == 200, data
        obj = json.loads(data)
        obj["status"] = {"conditions": [{"type": "Approved", "status": "True", "reason": "Mine", "message": "mine"}]}
        status, body = _send(mallory, "PUT", f"{path}/approval", obj)
        code, data = cp.request("GET", path)
        conditions = json.loads(data).get("status", {}).get("conditions") or []
        approved = any(c.get("type") == "Approved" for c in conditions)
        assert not approved and status == 403, (
            f"a callers'-CA certificate in group {signer_approvers} approved a kubeadm:cluster-admins client "
            f"certificate through kproxy ({status}: {body[:200]!r})"
        )
    finally:
        cp.request("DELETE", path)
