"""Field validation where the answer is not about the body's fields alone, compared with the
apiserver answering the same request directly: writes to routes that do not exist (its 404 or
405 comes before decoding), custom resources naming another version of their group (pruned
with that version's schema, or with none when the CRD lacks it), and, when kproxy provides
validation, the warnings on answers the apiserver gives after decoding (404, admission's 403).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing import crds
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

GROUP = "routes.kproxy.test"
Answer = tuple[int, list[str], Any]


def _send(conn: http.client.HTTPConnection, method: str, path: str, body: bytes) -> Answer:
    conn.request(method, path, body=body, headers={"Content-Type": "application/json", "Accept": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    try:
        parsed: Any = json.loads(data)
    except ValueError:
        parsed = data
    if isinstance(parsed, dict):
        for key in ("uid", "creationTimestamp", "resourceVersion", "managedFields"):
            (parsed.get("metadata") or {}).pop(key, None)
    return resp.status, resp.headers.get_all("Warning") or [], parsed


def _compare(cp: ControlPlaneInfo, rp: RunningProxy, requests: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    port = int(rp.url.rsplit(":", 1)[1])
    diffs = []
    for method, path, obj in requests:
        body = json.dumps(obj).encode()
        direct = _send(http.client.HTTPSConnection("127.0.0.1", cp.apiserver_port, context=cp.ssl_context()),
                       method, path, body)  # fmt: skip
        via = _send(http.client.HTTPConnection("127.0.0.1", port), method, path, body)
        if via != direct:
            diffs.append(f"{method} {path}\n  direct: {direct}\n  kproxy: {via}")
    return diffs


def _validating(factory: Callable[..., RunningProxy], upstream_validates: str) -> RunningProxy:
    return factory(
        extra={"filters": [{"name": "validation", "upstream_validates": upstream_validates, "settle_seconds": 0}]}
    )


@pytest.mark.parametrize("upstream_validates", ["auto", "no"])
def test_a_write_to_a_route_that_does_not_exist_is_the_apiservers_404_or_405(
    control_plane: ControlPlaneInfo, namespace: str, proxy_factory: Callable[..., RunningProxy], upstream_validates: str
) -> None:
    rp = _validating(proxy_factory, upstream_validates)
    ns = namespace
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "bogus": 1}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}, "bogus": 1}
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "a"}}
    crd["x"] = 1
    requests = [
        ("POST", "/api/v1/configmaps", cm),  # a namespaced resource without its namespace: 405
        ("PUT", "/api/v1/configmaps/a", cm),  # 404
        ("POST", f"/api/v1/namespaces/{ns}/configmaps/a", cm),  # create naming the object: 405
        ("PUT", f"/api/v1/namespaces/{ns}/configmaps", cm),  # update of a collection: 405
        ("POST", f"/api/v1/namespaces/{ns}/nodes", node),  # a cluster-scoped resource in a namespace: 404
        ("PUT", f"/api/v1/namespaces/{ns}/nodes/a", node),
        ("POST", f"/apis/apiextensions.k8s.io/v1/namespaces/{ns}/customresourcedefinitions", crd),
        ("POST", f"/api/v1/namespaces/{ns}/pods/p/status", {**cm, "kind": "Pod"}),  # status takes PUT: 405
        ("POST", f"/api/v1/namespaces/{ns}/configmaps", cm),  # the route exists: the strict 400
    ]
    for level in ("Strict", "Warn"):
        q = f"?dryRun=All&fieldValidation={level}"
        assert not _compare(control_plane, rp, [(m, p + q, o) for m, p, o in requests])


@pytest.fixture(scope="module")
def gizmos(kubectl: Kubectl, control_plane: ControlPlaneInfo) -> Iterator[str]:
    """A CRD with two served versions whose schemas differ (v1 knows ``v1only``, v2 ``v2only``)."""

    def version(name: str, storage: bool, field: str) -> dict[str, Any]:
        spec = {"type": "object", "properties": {"replicas": {"type": "integer"}, field: {"type": "string"}}}
        schema = {"type": "object", "properties": {"spec": spec}}
        return {"name": name, "served": True, "storage": storage, "schema": {"openAPIV3Schema": schema}}

    crd = crds.crd(GROUP, "gizmos", "Gizmo")
    crd["spec"]["versions"] = [version("v1", True, "v1only"), version("v2", False, "v2only")]
    kubectl(["apply", "-f", "-"], input=json.dumps(crd))
    kubectl(["wait", "--for=condition=Established", f"crd/gizmos.{GROUP}", "--timeout=60s"])

    def published() -> bool:
        cp = control_plane
        conn = http.client.HTTPSConnection("127.0.0.1", cp.apiserver_port, context=cp.ssl_context())
        conn.request("GET", "/openapi/v3")
        paths = json.loads(conn.getresponse().read()).get("paths", {})
        return f"apis/{GROUP}/v1" in paths and f"apis/{GROUP}/v2" in paths

    eventually(published, 60, "both versions in /openapi/v3")
    yield GROUP
    kubectl(["delete", "crd", f"gizmos.{GROUP}", "--wait=false"], check=False)


@pytest.mark.parametrize("upstream_validates", ["auto", "no"])
def test_a_custom_resource_naming_another_version_is_pruned_with_that_versions_schema(
    control_plane: ControlPlaneInfo,
    namespace: str,
    proxy_factory: Callable[..., RunningProxy],
    gizmos: str,
    upstream_validates: str,
) -> None:
    rp = _validating(proxy_factory, upstream_validates)

    def gizmo(version: str, **spec: Any) -> dict[str, Any]:
        return {"apiVersion": f"{gizmos}/{version}", "kind": "Gizmo", "metadata": {"name": "g", "foo": 1}, "spec": spec}

    bodies = [
        gizmo("v2", replicas=1, v2only="x"),  # clean for v2: only the version mismatch
        gizmo("v2", replicas=1, v1only="x"),  # unknown to v2, known to v1 (the endpoint)
        gizmo("v3", replicas=1),  # no such version: pruned with no schema at all
        gizmo("v1", v2only="x"),
    ]
    for level in ("Strict", "Warn", "Ignore"):
        path = f"/apis/{gizmos}/v1/namespaces/{namespace}/gizmos?dryRun=All&fieldValidation={level}"
        assert not _compare(control_plane, rp, [("POST", path, b) for b in bodies])


def test_provided_warnings_come_with_answers_given_after_decoding(
    control_plane: ControlPlaneInfo, kubectl: Kubectl, namespace: str, proxy_factory: Callable[..., RunningProxy]
) -> None:
    """kproxy providing validation warns on every answer the apiserver gives after decoding: the
    namespace or the object not found (404), admission refusing (403, a terminating namespace)."""
    rp = _validating(proxy_factory, "no")
    terminating = f"{namespace}-t"[:63]
    kubectl(["create", "namespace", terminating])
    try:
        # No namespace controller runs here: the namespace stays Terminating until finalized below.
        kubectl(["delete", "namespace", terminating, "--wait=false"])
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "bogus": 1}
        requests = [
            ("POST", f"/api/v1/namespaces/{namespace}-none/configmaps", cm),
            ("PUT", f"/api/v1/namespaces/{namespace}/configmaps/a", cm),
            ("POST", f"/api/v1/namespaces/{terminating}/configmaps", cm),
        ]
        assert not _compare(control_plane, rp, [(m, p + "?dryRun=All", o) for m, p, o in requests])
    finally:
        finalize = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": terminating}}
        finalize["spec"] = {"finalizers": []}
        raw = f"/api/v1/namespaces/{terminating}/finalize"
        kubectl(["replace", "--raw", raw, "-f", "-"], input=json.dumps(finalize), check=False)
