"""Caller identity (kproxy/identity/authn.py) as policy rules see it, against the real apiserver.

``credentials: forward``: the caller's bearer token is reviewed (TokenReview, cached); rules
select by user and group; no token is ``system:anonymous``; a bad token gets the apiserver's
own 401. ``credentials: proxy``: every caller is kproxy's own identity (SelfSubjectReview).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from test_dryrun import cm_body, send

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.proxyproc import RunningProxy


def _kubeconfig(rp: RunningProxy, token: str, out: Path) -> Path:
    assert rp.config_path is not None and rp.ca_file is not None
    cmd = [sys.executable, "-m", "kproxy.cli", "kubeconfig", "--config", str(rp.config_path), "--output", str(out)]
    subprocess.run([*cmd, f"--token={token}", "--certificate-authority", str(rp.ca_file)], check=True)
    return out


def _metric(rp: RunningProxy, prefix: str) -> float:
    for line in rp.metrics().splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


def _rules(ns: str) -> list[dict[str, Any]]:
    return [
        {"name": "masters", "match": {"groups": ["system:masters"]}, "action": "allow"},
        {"name": "anonymous", "match": {"users": ["system:anonymous"]}, "action": "reject"},
        {"name": "user-preview", "match": {"users": ["kproxy-*"], "namespaces": [ns]}, "action": "enforce"},
    ]


def _grant_configmaps(control_plane: ControlPlaneInfo, ns: str, user: str) -> None:
    """A Role of our own (the aggregated ``edit`` role is empty without a controller-manager)."""
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces"
    role = {
        "metadata": {"name": "configmaps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
    }
    binding = {
        "metadata": {"name": "configmaps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmaps"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    for kind, obj in (("roles", role), ("rolebindings", binding)):
        code, data = control_plane.request("POST", f"{rbac}/{ns}/{kind}", body=json.dumps(obj).encode())
        assert code == 201, data


def _exists(control_plane: ControlPlaneInfo, path: str) -> bool:
    code, data = control_plane.request("GET", path)
    assert code in (200, 404), data
    return code == 200


def test_forward_mode_rules_select_by_user_and_group(
    control_plane: ControlPlaneInfo,
    proxy_factory: Callable[..., RunningProxy],
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
) -> None:
    ns = namespace
    _grant_configmaps(control_plane, ns, control_plane.user_name)
    rp = proxy_factory(credentials="forward", tls=True, extra={"filters": [{"name": "dryrun", "rules": _rules(ns)}]})
    user = _kubeconfig(rp, control_plane.user_token, tmp_path / "user.kubeconfig")
    admin = _kubeconfig(rp, control_plane.admin_token, tmp_path / "admin.kubeconfig")

    # The user (matched by a user glob, in this namespace) only ever dry-runs.
    res = kubectl(["create", "configmap", "by-user", "-n", ns], kubeconfig=user, check=False)
    assert res.returncode == 0, res.stderr
    assert 'Warning: kproxy dryrun rule "user-preview" ran this request as a dry run' in res.stderr
    assert not _exists(control_plane, f"/api/v1/namespaces/{ns}/configmaps/by-user")
    # The admin token's user is in system:masters: the first rule allows a real write.
    res = kubectl(["create", "configmap", "by-admin", "-n", ns], kubeconfig=admin, check=False)
    assert res.returncode == 0 and "Warning" not in res.stderr, res.stderr
    assert _exists(control_plane, f"/api/v1/namespaces/{ns}/configmaps/by-admin")
    # Outside the rule's namespace nothing matches: the apiserver itself decides (no RBAC there).
    res = kubectl(["create", "configmap", "elsewhere", "-n", "default"], kubeconfig=user, check=False)
    assert res.returncode == 1
    assert f'User "{control_plane.user_name}" cannot create resource "configmaps"' in res.stderr
    assert "Warning" not in res.stderr

    # Identities are cached: two tokens, two reviews, however many requests.
    for _ in range(3):
        kubectl(["create", "configmap", "again", "-n", ns], kubeconfig=user)
    assert _metric(rp, 'kproxy_token_reviews_total{result="authenticated"}') == 2
    assert _metric(rp, "kproxy_token_reviews_cache_hits_total") >= 3


def test_forward_mode_anonymous_and_invalid_tokens(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str
) -> None:
    ns = namespace
    rp = proxy_factory(credentials="forward", tls=True, extra={"filters": [{"name": "dryrun", "rules": _rules(ns)}]})
    assert rp.ca_file is not None
    proxy_ssl = ssl.create_default_context(cafile=str(rp.ca_file))
    direct_ssl = control_plane.ssl_context(client_cert=False)
    direct_base = f"https://127.0.0.1:{control_plane.apiserver_port}"
    path = f"/api/v1/namespaces/{ns}/configmaps"

    # No token: the apiserver's anonymous user. It may not create configmaps at all, so it gets
    # the apiserver's own refusal (authorization comes first there), byte for byte, before the
    # rule naming it would refuse it too.
    status, _, data = send(rp.url, "POST", path, cm_body("anon"), ssl_ctx=proxy_ssl)
    direct = send(direct_base, "POST", path, cm_body("anon"), ssl_ctx=direct_ssl)
    assert status == direct[0] == 403, data
    assert data == direct[2] and b'User \\"system:anonymous\\" cannot create resource' in data
    # A token the apiserver rejects: its own 401, byte for byte.
    for auth in ("Bearer not-a-valid-token", "bearer not-a-valid-token"):
        through = send(rp.url, "POST", path, cm_body("bad"), {"Authorization": auth}, proxy_ssl)
        direct = send(direct_base, "POST", path, cm_body("bad"), {"Authorization": auth}, direct_ssl)
        assert through[0] == direct[0] == 401
        assert through[2] == direct[2]
        assert json.loads(through[2])["message"] == "Unauthorized"
    # Rejected tokens are cached too.
    assert _metric(rp, 'kproxy_token_reviews_total{result="rejected"}') == 1
    assert not _exists(control_plane, f"{path}/anon") and not _exists(control_plane, f"{path}/bad")


def test_proxy_mode_identity_is_kproxys_own(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], kubectl: Kubectl, namespace: str
) -> None:
    rules = [
        {"name": "not-me", "match": {"users": [control_plane.user_name]}, "action": "reject"},
        {"name": "me", "match": {"users": ["kproxy-admin"], "groups": ["system:masters"]}, "action": "enforce"},
    ]
    rp = proxy_factory(extra={"filters": [{"name": "dryrun", "rules": rules}]})
    res = kubectl(["create", "configmap", "c", "-n", namespace], kubeconfig=rp.kubeconfig, check=False)
    assert res.returncode == 0, res.stderr
    assert 'kproxy dryrun rule "me" ran this request as a dry run' in res.stderr
    assert not _exists(control_plane, f"/api/v1/namespaces/{namespace}/configmaps/c")
    assert _metric(rp, "kproxy_token_reviews_total") == 0
