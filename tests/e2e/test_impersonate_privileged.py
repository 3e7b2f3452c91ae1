"""`credentials: impersonate` and the control plane's own identities: a client certificate from the
callers' CA naming ``system:masters`` (or a node) is refused by kproxy with a 403 Status, and
nothing is written upstream, unless the operator lists it (``impersonate.allowed_privileged_*``);
listed, the caller is exactly what the certificate says. Verdicts at the apiserver: what was
persisted (a direct GET with the admin client), who the apiserver saw (SelfSubjectReview)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kproxy.localcluster import certs
from kproxy.localcluster.envtest import Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy


@pytest.fixture
def caller_ca() -> certs.CertKey:
    return certs.generate_ca("kproxy-callers-ca")


def _impersonating(
    proxy_factory: Callable[..., RunningProxy], caller_ca: certs.CertKey, tmp_path: Path, **impersonate: Any
) -> RunningProxy:
    ca_file = certs.write_pem(tmp_path / "callers-ca.crt", caller_ca.cert_pem, private=False)
    extra: dict[str, Any] = {"tls": {"client_ca_file": str(ca_file)}}
    if impersonate:
        extra["impersonate"] = impersonate
    return proxy_factory(credentials="impersonate", tls=True, extra=extra)


def _caller(rp: RunningProxy, ca: certs.CertKey, tmp_path: Path, user: str, groups: tuple[str, ...]) -> ssl.SSLContext:
    leaf = certs.generate_client_cert(ca, user, groups)
    name = user.replace(":", "_")
    crt = certs.write_pem(tmp_path / f"{name}.crt", leaf.cert_pem, private=False)
    key = certs.write_pem(tmp_path / f"{name}.key", leaf.key_pem, private=True)
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    ctx.load_cert_chain(str(crt), str(key))
    return ctx


def _send(rp: RunningProxy, ctx: ssl.SSLContext, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        rp.url + path,
        data=data,
        method=method,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}}


SSR = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
SSR_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"


def test_system_masters_certificate_is_refused_unless_listed(
    proxy_factory: Callable[..., RunningProxy],
    caller_ca: certs.CertKey,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
) -> None:
    rp = _impersonating(proxy_factory, caller_ca, tmp_path)
    eve = _caller(rp, caller_ca, tmp_path, "eve", ("system:masters",))
    path = f"/api/v1/namespaces/{namespace}/configmaps"

    code, status = _send(rp, eve, "POST", path, _configmap("by-masters"))
    assert code == 403, status
    assert status["kind"] == "Status" and status["reason"] == "Forbidden"
    assert status["details"] == {"name": "system:masters", "kind": "groups"}
    assert status["message"] == (
        'groups "system:masters" is forbidden: kproxy does not act as the privileged group "system:masters" '
        "unless impersonate.allowed_privileged_groups lists it"
    )
    # Nothing was written: the apiserver holds no such object.
    got = kubectl(["get", "configmap", "by-masters", "-n", namespace], check=False)
    assert got.returncode == 1 and "NotFound" in got.stderr
    # Reads and the SelfSubjectReview are refused too: nothing is sent as system:masters.
    assert _send(rp, eve, "GET", "/api/v1/secrets")[0] == 403
    assert _send(rp, eve, "POST", SSR_PATH, SSR)[0] == 403
    # Another member of the same CA, in ordinary groups, is served.
    alice = _caller(rp, caller_ca, tmp_path, "alice", ("devs",))
    code, review = _send(rp, alice, "POST", SSR_PATH, SSR)
    assert code == 201 and review["status"]["userInfo"]["username"] == "alice"

    # Listed by the operator (a config reload): the certificate means what it says, cluster-admin.
    config = rp.write_config({"impersonate": {"allowed_privileged_groups": ["system:masters"]}})
    eventually(lambda: _send(rp, eve, "POST", SSR_PATH, SSR)[0] == 201, 30, "the reload to allow system:masters")
    who = _send(rp, eve, "POST", SSR_PATH, SSR)[1]["status"]["userInfo"]
    assert (who["username"], who["groups"]) == ("eve", ["system:masters", "system:authenticated"])
    code, _ = _send(rp, eve, "POST", path, _configmap("by-masters"))
    assert code == 201
    made = kubectl.json(["get", "configmap", "by-masters", "-n", namespace, "--show-managed-fields"])
    assert made["data"] == {"a": "b"}

    # Removed again: refused at once, before the token or certificate cache could matter.
    rp.write_config({"impersonate": {**config["impersonate"], "allowed_privileged_groups": []}})
    eventually(lambda: _send(rp, eve, "POST", SSR_PATH, SSR)[0] == 403, 30, "the reload to refuse system:masters")


@pytest.mark.parametrize(
    ("user", "groups", "refused"),
    [
        ("system:node:worker-1", ("system:nodes",), 'users "system:node:worker-1" is forbidden'),
        ("kubelet", ("system:nodes",), 'groups "system:nodes" is forbidden'),
        ("system:kube-controller-manager", (), 'users "system:kube-controller-manager" is forbidden'),
        # kubeadm's administrators (bound to cluster-admin by kubeadm, refused here without a binding).
        ("mallory", ("kubeadm:cluster-admins",), 'groups "kubeadm:cluster-admins" is forbidden'),
        # kubeadm's bootstrap tokens: their node CSRs are approved, a node certificate follows.
        ("bootstrapper", ("system:bootstrappers",), 'groups "system:bootstrappers" is forbidden'),
        (
            "system:bootstrap:abcdef",
            ("system:bootstrappers:kubeadm:default-node-token",),
            'groups "system:bootstrappers:kubeadm:default-node-token" is forbidden',
        ),
        (
            # The garbage collector's role reads every Secret; RBAC takes this name for its service account.
            "system:serviceaccount:kube-system:generic-garbage-collector",
            (),
            'users "system:serviceaccount:kube-system:generic-garbage-collector" is forbidden',
        ),
    ],
)
def test_node_and_controller_identities_are_refused(
    proxy_factory: Callable[..., RunningProxy],
    caller_ca: certs.CertKey,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
    user: str,
    groups: tuple[str, ...],
    refused: str,
) -> None:
    """The Node authorizer would give a node's identity the Secrets of its pods; the controller
    manager's role reads every Secret. kproxy does not act as them unless listed."""
    kubectl(["create", "secret", "generic", "s", "--from-literal=k=v", "-n", namespace])
    rp = _impersonating(proxy_factory, caller_ca, tmp_path)
    ctx = _caller(rp, caller_ca, tmp_path, user, groups)
    code, status = _send(rp, ctx, "GET", f"/api/v1/namespaces/{namespace}/secrets/s")
    assert code == 403 and status["message"].startswith(refused), status
    assert "data" not in status


def test_a_group_bound_to_cluster_admin_under_any_name_is_refused_unless_listed(
    proxy_factory: Callable[..., RunningProxy],
    caller_ca: certs.CertKey,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
) -> None:
    """No list knows ``ops-admins-<n>``; the cluster binds it to cluster-admin. kproxy asks the
    apiserver (a SubjectAccessReview for the identity: may it do everything?) and refuses it as
    it refuses system:masters, while a caller in an ordinary group of the same CA is served;
    listed by the operator, the group is acted as."""
    group = f"ops-admins-{namespace[-6:]}"
    binding = f"kproxy-test-{group}"
    kubectl(["create", "clusterrolebinding", binding, "--clusterrole=cluster-admin", f"--group={group}"])
    try:
        eventually(
            lambda: (
                kubectl(["auth", "can-i", "*", "*", "--as=olga", f"--as-group={group}"], check=False).returncode == 0
            ),
            30,
            "the binding to reach the authorizer",
        )
        rp = _impersonating(proxy_factory, caller_ca, tmp_path)
        olga = _caller(rp, caller_ca, tmp_path, "olga", (group,))
        path = f"/api/v1/namespaces/{namespace}/configmaps"

        code, status = _send(rp, olga, "POST", path, _configmap("by-ops-admins"))
        assert code == 403, status
        assert status["reason"] == "Forbidden" and status["details"] == {"name": "olga", "kind": "users"}, status
        assert "whom the apiserver allows everything (cluster-admin)" in status["message"], status
        got = kubectl(["get", "configmap", "by-ops-admins", "-n", namespace], check=False)
        assert got.returncode == 1 and "NotFound" in got.stderr
        assert _send(rp, olga, "POST", SSR_PATH, SSR)[0] == 403

        # An ordinary group of the same CA is served, and the apiserver sees exactly that caller.
        alice = _caller(rp, caller_ca, tmp_path, "alice", ("devs",))
        code, review = _send(rp, alice, "POST", SSR_PATH, SSR)
        assert code == 201, review
        assert (review["status"]["userInfo"]["username"], review["status"]["userInfo"]["groups"]) == (
            "alice",
            ["devs", "system:authenticated"],
        )

        # Listed by the operator: acted as, cluster-admin at the apiserver.
        rp.write_config({"impersonate": {"allowed_privileged_groups": [group]}})
        eventually(lambda: _send(rp, olga, "POST", SSR_PATH, SSR)[0] == 201, 30, "the reload to allow the group")
        who = _send(rp, olga, "POST", SSR_PATH, SSR)[1]["status"]["userInfo"]
        assert (who["username"], who["groups"]) == ("olga", [group, "system:authenticated"])
        code, made = _send(rp, olga, "POST", path, _configmap("by-ops-admins"))
        assert code == 201, made
        assert kubectl.json(["get", "configmap", "by-ops-admins", "-n", namespace])["data"] == {"a": "b"}
    finally:
        kubectl(["delete", "clusterrolebinding", binding], check=False)
