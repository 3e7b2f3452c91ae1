"""Red team: in ``credentials: impersonate`` a certificate from the callers' CA is cluster-admin on a
kubeadm cluster.

kproxy refuses to act as ``system:masters``, nodes, the controller manager, the scheduler and the
service accounts of ``kube-system`` unless the operator lists them
(kproxy/identity/impersonate.py ``PRIVILEGED_GROUPS``), so that the callers' CA cannot mint the
cluster's own administrators. kubeadm (v1.29 and later) gives its administrators' kubeconfig
``O=kubeadm:cluster-admins`` and binds that group to ``cluster-admin`` with the
ClusterRoleBinding ``kubeadm:cluster-admins`` (cmd/kubeadm/app/phases/kubeconfig/kubeconfig.go,
``EnsureAdminClusterRoleBinding``): a group worth exactly what ``system:masters`` is worth on the
clusters most people run, and the chart's default impersonation rights (``rbac.impersonateGroups:
[]``: every group) let kproxy impersonate it.

Here the control plane gets the binding kubeadm creates. A certificate from the callers' CA with
``CN=mallory, O=kubeadm:cluster-admins`` then writes into ``kube-system`` through kproxy (the
admin client reads it back), and the apiserver's SelfSubjectReview names the group; the same
certificate with ``O=system:masters`` is refused with kproxy's 403. It must be refused as well."""

from __future__ import annotations

import json
import secrets
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

from .inventory_support import Seen, self_subject_review
from .wire import Endpoint, exchange, request_bytes

KUBEADM_ADMINS = "kubeadm:cluster-admins"
_CRB = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"


@pytest.fixture
def kubeadm_binding(control_plane: ControlPlaneInfo) -> Iterator[None]:
    """The ClusterRoleBinding kubeadm creates for its administrators' group."""
    crb = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": KUBEADM_ADMINS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": KUBEADM_ADMINS}],
    }
    code, data = control_plane.request("POST", _CRB, body=json.dumps(crb).encode())
    assert code in (201, 409), data
    yield
    control_plane.request("DELETE", f"{_CRB}/{KUBEADM_ADMINS}")


def _caller(rp: RunningProxy, ca: certs.CertKey, tmp: Path, user: str, group: str) -> Endpoint:
    leaf = certs.generate_client_cert(ca, user, (group,))
    tag = group.replace(":", "_")
    crt = certs.write_pem(tmp / f"{tag}.crt", leaf.cert_pem, private=False)
    key = certs.write_pem(tmp / f"{tag}.key", leaf.key_pem, private=True)
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    ctx.load_cert_chain(str(crt), str(key))
    return Endpoint.from_url(rp.url, ctx)


def _write_kube_system(ep: Endpoint, name: str) -> int:
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
    raw = request_bytes(
        "POST",
        "/api/v1/namespaces/kube-system/configmaps",
        [("Content-Type", "application/json"), ("Accept", "application/json")],
        body.encode(),
    )
    return exchange(ep, raw).status


def test_the_callers_ca_cannot_mint_a_kubeadm_cluster_admin(
    control_plane: ControlPlaneInfo,
    capped_factory: Callable[..., RunningProxy],
    kubeadm_binding: None,
    tmp_path: Path,
) -> None:
    cp = control_plane
    ca = certs.generate_ca("redteam-callers-ca")
    ca_file = certs.write_pem(tmp_path / "callers-ca.crt", ca.cert_pem, private=False)
    rp = capped_factory(credentials="impersonate", tls=True, extra={"tls": {"client_ca_file": str(ca_file)}})

    # kproxy's refusal of the apiserver's own administrators' group, for comparison.
    masters = _caller(rp, ca, tmp_path, "mallory", "system:masters")
    name = f"redteam-masters-{secrets.token_hex(3)}"
    assert _write_kube_system(masters, name) == 403
    assert cp.request("GET", f"/api/v1/namespaces/kube-system/configmaps/{name}")[0] == 404

    admins = _caller(rp, ca, tmp_path, "mallory", KUBEADM_ADMINS)
    seen: Seen = self_subject_review(admins)
    name = f"redteam-kubeadm-{secrets.token_hex(3)}"
    status = _write_kube_system(admins, name)
    code, _ = cp.request("GET", f"/api/v1/namespaces/kube-system/configmaps/{name}")
    if code == 200:
        cp.request("DELETE", f"/api/v1/namespaces/kube-system/configmaps/{name}")
    print(f"SelfSubjectReview through kproxy: {seen}; write into kube-system: {status}; GET as admin: {code}")
    assert code == 404 and status == 403, (
        f"a certificate from the callers' CA with O={KUBEADM_ADMINS} (cluster-admin on kubeadm clusters) wrote "
        f"into kube-system through kproxy ({status}; GET as admin: {code}); the apiserver saw {seen.who()}"
    )
