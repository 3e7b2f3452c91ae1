"""One watch of CustomResourceDefinitions for the whole process (``kproxy.core.discovery``).

With the watch cache caching everything (``*``, CRDs included) and the validation filter on,
both read the same list+watch of CRDs: the apiserver sees one watch of them from kproxy (its
``apiserver_longrunning_requests`` gauge, read at the apiserver before and after kproxy starts).
A CRD created, changed and deleted through the apiserver changes what both enforce and serve
while kproxy runs.
"""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing import crds
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

CRD_LABEL = "customresourcedefinitions.apiextensions.k8s.io"


def crd_watches(cp: ControlPlaneInfo) -> float:
    """The watches of CRDs the apiserver is serving now (every client's, its own loopback ones too)."""
    code, body = cp.request("GET", "/metrics", accept="text/plain")
    assert code == 200
    total = 0.0
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if (
                s.name == "apiserver_longrunning_requests"
                and s.labels.get("resource") == "customresourcedefinitions"
                and s.labels.get("verb") == "WATCH"
                and not s.labels.get("subresource")
            ):
                total += s.value
    return total


def call(rp: RunningProxy, method: str, path: str, body: Any = None) -> tuple[int, dict[str, str], Any]:
    """A request through kproxy: status, headers, decoded JSON body."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(rp.url + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, headers, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, headers, raw = e.code, dict(e.headers), e.read()
    try:
        return status, headers, json.loads(raw or b"null")
    except json.JSONDecodeError:  # the apiserver's plain "404 page not found" of a path it does not serve
        return status, headers, raw


def local(headers: dict[str, str]) -> bool:
    """Answered by kproxy itself: the apiserver puts an Audit-Id on every answer it writes."""
    return "Audit-Id" not in headers


def cached_crd(rp: RunningProxy, name: str) -> dict[str, Any] | None:
    """The definition as kproxy's cache serves it (a resourceVersion=0 list answered locally)."""
    code, headers, doc = call(rp, "GET", f"{crds.CRDS}?resourceVersion=0")
    assert code == 200 and local(headers), (code, headers)
    return next((i for i in doc["items"] if i["metadata"]["name"] == name), None)


def gizmo(group: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{group}/v1", "kind": "Gizmo", "metadata": {"name": "g"}, "spec": spec}


def strict_path(group: str, namespace: str) -> str:
    return f"/apis/{group}/v1/namespaces/{namespace}/gizmos?dryRun=All&fieldValidation=Strict"


def create_crd(cp: ControlPlaneInfo, group: str, fields: dict[str, str]) -> None:
    code, body = cp.request(
        "POST", crds.CRDS, body=json.dumps(crds.crd(group, "gizmos", "Gizmo", spec_fields=fields)).encode()
    )
    assert code == 201, body


def delete_crd(cp: ControlPlaneInfo, group: str) -> None:
    cp.request("DELETE", f"{crds.CRDS}/gizmos.{group}")


def test_crds_are_watched_once_and_followed_by_the_cache_and_validation(
    control_plane: ControlPlaneInfo, namespace: str, proxy_factory: Callable[..., RunningProxy]
) -> None:
    cp = control_plane
    first = f"one{secrets.token_hex(3)}.kproxy.test"
    later = f"two{secrets.token_hex(3)}.kproxy.test"
    create_crd(cp, first, {"a": "string"})
    try:
        before = crd_watches(cp)
        rp = proxy_factory(
            extra={
                "filters": [
                    {"name": "validation", "settle_seconds": 1},
                    {"name": "watchcache", "resources": ["*"]},
                ]
            }
        )
        # Both readers of CRDs at work: the cache serves them, validation answers a custom
        # resource's Strict error itself (it does only while a watch of CRDs feeds it).
        rp.wait_cached(crds.CRDS, CRD_LABEL)

        def local_400() -> bool:
            code, headers, _ = call(rp, "POST", strict_path(first, namespace), gizmo(first, a="1", b="2"))
            return code == 400 and local(headers)

        eventually(local_400, 30, "validation to answer a Strict error of a custom resource itself", interval=0.2)
        assert crd_watches(cp) - before == 1

        # A CRD created while kproxy runs: cached, its resource cached, its schema enforced.
        create_crd(cp, later, {"a": "string"})
        eventually(lambda: cached_crd(rp, f"gizmos.{later}") is not None, 30, "the new CRD in the cache", interval=0.2)
        rp.wait_cached(f"/apis/{later}/v1/gizmos", f"gizmos.{later}")

        def later_400() -> bool:
            code, headers, _ = call(rp, "POST", strict_path(later, namespace), gizmo(later, a="1", b="2"))
            return code == 400 and local(headers)

        eventually(later_400, 30, "the new CRD's schema enforced by kproxy", interval=0.2)

        # Changed: spec.b declared. The cache serves the new definition, and the field is accepted.
        current = json.loads(cp.request("GET", f"{crds.CRDS}/gizmos.{later}")[1])
        props = current["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
        props["b"] = {"type": "string"}
        code, body = cp.request("PUT", f"{crds.CRDS}/gizmos.{later}", body=json.dumps(current).encode())
        assert code == 200, body
        changed_rv = json.loads(body)["metadata"]["resourceVersion"]
        eventually(
            lambda: (cached_crd(rp, f"gizmos.{later}") or {}).get("metadata", {}).get("resourceVersion") == changed_rv,
            30,
            "the changed CRD in the cache",
            interval=0.2,
        )

        def accepted() -> bool:
            return call(rp, "POST", strict_path(later, namespace), gizmo(later, a="1", b="2"))[0] == 201

        eventually(accepted, 60, "the changed schema's field accepted", interval=0.2)

        # Deleted: gone from the cache, its resource no longer cached, its writes the apiserver's 404.
        delete_crd(cp, later)
        eventually(
            lambda: cached_crd(rp, f"gizmos.{later}") is None, 30, "the deleted CRD gone from the cache", interval=0.2
        )

        def not_found() -> bool:
            code, headers, _ = call(rp, "POST", strict_path(later, namespace), gizmo(later, a="1", b="2"))
            list_code, list_headers, _ = call(rp, "GET", f"/apis/{later}/v1/gizmos?resourceVersion=0")
            return code == 404 and not local(headers) and list_code == 404 and not local(list_headers)

        eventually(not_found, 60, "the deleted CRD's resource answered by the apiserver (404)", interval=0.2)
        # Through all of it, still one watch of CRDs from kproxy.
        assert crd_watches(cp) - before == 1
    finally:
        delete_crd(cp, first)
        delete_crd(cp, later)
