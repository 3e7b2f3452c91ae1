"""Service accounts with a Role, made at the apiserver for the attacks that need a real caller."""

from __future__ import annotations

import json
from typing import Any

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually

_RBAC = "rbac.authorization.k8s.io"


def create(cp: ControlPlaneInfo, path: str, obj: dict[str, Any]) -> None:
    """POST ``obj`` as the admin; it must be created."""
    code, data = cp.request("POST", path, body=json.dumps(obj).encode())
    assert code == 201, data


def token(cp: ControlPlaneInfo, ns: str, name: str) -> str:
    """A fresh token of service account ``ns/name`` (a TokenRequest)."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
    code, data = cp.request(
        "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token", body=json.dumps(request).encode()
    )
    assert code == 201, data
    return str(json.loads(data)["status"]["token"])


def account_with_role(cp: ControlPlaneInfo, ns: str, name: str, rules: list[dict[str, Any]]) -> str:
    """Service account ``name`` in the existing namespace ``ns``, bound to a Role of ``rules``, and
    a token of it, returned once the apiserver lets it list configmaps there (the binding applied;
    ``rules`` must allow that)."""
    create(cp, f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": name}})
    rbac = f"/apis/{_RBAC}/v1/namespaces/{ns}"
    create(cp, f"{rbac}/roles", {"metadata": {"name": name}, "rules": rules})
    create(cp, f"{rbac}/rolebindings", {
        "metadata": {"name": name},
        "roleRef": {"apiGroup": _RBAC, "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
    })  # fmt: skip
    found = token(cp, ns, name)
    listing = f"/api/v1/namespaces/{ns}/configmaps"
    eventually(lambda: cp.request("GET", listing, token=found)[0] == 200, 20, f"the binding of {ns}/{name}")
    return found
