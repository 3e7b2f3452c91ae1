"""CustomResourceDefinitions for tests: a definition built from a few names, installed on the real
apiserver and waited for until its API is served (the apiserver serves a new group a moment
after the definition is established)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from kproxy.localcluster.controlplane import ControlPlaneInfo

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def crd(
    group: str,
    plural: str,
    kind: str,
    *,
    scope: str = "Namespaced",
    spec_fields: dict[str, str] | None = None,
    selectable: Sequence[str] = (),
) -> dict[str, Any]:
    """A v1-only definition. ``spec_fields`` (name -> type) gives ``spec`` a schema (needed for
    ``selectable`` jsonPaths); without it every field is kept as sent."""
    if spec_fields is None:
        schema: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    else:
        props = {name: {"type": typ} for name, typ in spec_fields.items()}
        schema = {"type": "object", "properties": {"spec": {"type": "object", "properties": props}}}
    version: dict[str, Any] = {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
    if selectable:
        version["selectableFields"] = [{"jsonPath": p} for p in selectable]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "scope": scope,
            "versions": [version],
        },
    }


def install(cp: ControlPlaneInfo, definition: dict[str, Any], timeout: float = 30.0) -> None:
    """Create ``definition`` (an existing one is kept) and wait until its resource lists."""
    status, body = cp.request("POST", CRDS, body=json.dumps(definition).encode())
    if status not in (201, 409):
        raise AssertionError(f"creating {definition['metadata']['name']}: {status} {body[:300]!r}")
    spec = definition["spec"]
    path = f"/apis/{spec['group']}/v1/{spec['names']['plural']}"
    deadline = time.monotonic() + timeout
    while cp.request("GET", path)[0] != 200:
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} not served after {timeout}s")
        time.sleep(0.1)


def uninstall(cp: ControlPlaneInfo, name: str) -> None:
    cp.request("DELETE", f"{CRDS}/{name}")
