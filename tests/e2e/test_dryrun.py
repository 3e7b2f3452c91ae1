"""The ``dryrun`` filter in front of the real apiserver, driven by kubectl, the official Python
client and raw HTTP. After every request the object is read directly from the apiserver: under
``enforce`` nothing may change, whatever the client tries."""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from webhook import REFUSAL, running_webhook

from kproxy.codec.envelope import ld
from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import ALLOW_EXEC, RunningProxy, start_proxy

WARNING = '299 - "kproxy dryrun rule \\"preview\\" ran this request as a dry run: nothing was persisted"'
KUBECTL_WARNING = 'Warning: kproxy dryrun rule "preview" ran this request as a dry run: nothing was persisted'

Response = tuple[int, http.client.HTTPMessage, bytes]


def send(
    base: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    ssl_ctx: ssl.SSLContext | None = None,
) -> Response:
    """One raw HTTP request (any method, any header, any body)."""
    u = urlsplit(base)
    conn: http.client.HTTPConnection
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname or "", u.port, context=ssl_ctx, timeout=20)
    else:
        conn = http.client.HTTPConnection(u.hostname or "", u.port, timeout=20)
    try:
        hdrs = {"Accept": "application/json", **(headers or {})}
        if body is not None and "Content-Type" not in hdrs:
            hdrs["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


class Api:
    """Raw requests to kproxy and, for comparison and checks, directly to the apiserver."""

    def __init__(self, cp: ControlPlaneInfo, rp: RunningProxy) -> None:
        self.cp = cp
        self.rp = rp
        self.direct_base = f"https://127.0.0.1:{cp.apiserver_port}"
        self.ssl = cp.ssl_context()

    def proxy(self, method: str, path: str, body: bytes | None = None, **headers: str) -> Response:
        return send(self.rp.url, method, path, body, _headers(headers))

    def direct(self, method: str, path: str, body: bytes | None = None, **headers: str) -> Response:
        return send(self.direct_base, method, path, body, _headers(headers), self.ssl)

    def get(self, path: str) -> dict[str, Any] | None:
        status, _, data = self.direct("GET", path)
        if status == 404:
            return None
        assert status == 200, data
        return dict(json.loads(data))

    def rv(self, path: str) -> str | None:
        obj = self.get(path)
        return None if obj is None else str(obj["metadata"]["resourceVersion"])


def _headers(h: dict[str, str]) -> dict[str, str]:
    return {k.replace("_", "-"): v for k, v in h.items()}


def cm_body(name: str, **data: str) -> bytes:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}).encode()


def normalized(obj: dict[str, Any]) -> dict[str, Any]:
    """An object without what differs between two dry runs of the same request."""
    obj = json.loads(json.dumps(obj))
    meta = obj.get("metadata", {})
    for key in ("uid", "creationTimestamp", "resourceVersion", "deletionTimestamp"):
        meta.pop(key, None)
    for entry in meta.get("managedFields", []) or []:
        entry.pop("time", None)
    return obj


@pytest.fixture(scope="module")
def enforcing(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """kproxy (credentials: proxy, kproxy's admin identity) enforcing dry run for everything."""
    rp = start_proxy(
        tmp_path_factory.mktemp("dryrun"),
        control_plane.admin_kubeconfig,
        extra={
            "filters": [{"name": "dryrun", "rules": [{"name": "preview", "action": "enforce"}]}],
            "proxy": ALLOW_EXEC,
        },
    )
    yield rp
    rp.stop()


@pytest.fixture
def api(control_plane: ControlPlaneInfo, enforcing: RunningProxy) -> Api:
    return Api(control_plane, enforcing)


def _setup(api: Api, ns: str) -> None:
    """Objects to try to change: a ConfigMap, a Deployment, a pending Pod (and its ServiceAccount)."""
    for path, body in (
        (f"/api/v1/namespaces/{ns}/configmaps", cm_body("base", a="1")),
        (f"/api/v1/namespaces/{ns}/serviceaccounts", b'{"metadata":{"name":"default"}}'),
        (
            f"/apis/apps/v1/namespaces/{ns}/deployments",
            json.dumps(
                {
                    "metadata": {"name": "web"},
                    "spec": {
                        "replicas": 1,
                        "selector": {"matchLabels": {"app": "web"}},
                        "template": {
                            "metadata": {"labels": {"app": "web"}},
                            "spec": {"containers": [{"name": "nginx", "image": "nginx"}]},
                        },
                    },
                }
            ).encode(),
        ),
        (
            f"/api/v1/namespaces/{ns}/pods",
            b'{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}',
        ),
    ):
        status, _, data = api.direct("POST", path, body)
        assert status == 201, data


def _snapshot(api: Api, ns: str) -> dict[str, str | None]:
    paths = {
        "cm": f"/api/v1/namespaces/{ns}/configmaps/base",
        "deploy": f"/apis/apps/v1/namespaces/{ns}/deployments/web",
        "pod": f"/api/v1/namespaces/{ns}/pods/p",
    }
    return {k: api.rv(p) for k, p in paths.items()}


# --------------------------------------------------------------------------- kubectl


def test_kubectl_every_mutation_is_a_dry_run(
    api: Api, kubectl: Kubectl, namespace: str, enforcing: RunningProxy, tmp_path: Path
) -> None:
    ns = namespace
    _setup(api, ns)
    before = _snapshot(api, ns)
    new_cm = tmp_path / "new.yaml"
    new_cm.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "new"}}))
    changed = tmp_path / "base.yaml"
    changed.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "base"}, "data": {"a": "2"}})
    )
    base = api.get(f"/api/v1/namespaces/{ns}/configmaps/base")
    assert base is not None
    base["data"] = {"a": "3"}
    replaced = tmp_path / "replace.json"
    replaced.write_text(json.dumps(base))
    commands = [
        ["create", "configmap", "new"],
        ["apply", "-f", str(new_cm)],
        ["apply", "-f", str(changed)],
        ["apply", "--server-side", "--force-conflicts", "-f", str(changed)],
        ["replace", "-f", str(replaced)],
        ["label", "configmap", "base", "x=y"],
        ["annotate", "configmap", "base", "x=y"],
        ["patch", "configmap", "base", "-p", '{"data":{"a":"4"}}'],
        ["patch", "configmap", "base", "--type=merge", "-p", '{"data":{"a":"5"}}'],
        ["patch", "configmap", "base", "--type=json", "-p", '[{"op":"add","path":"/data/b","value":"1"}]'],
        ["scale", "deployment", "web", "--replicas=3"],
        ["set", "image", "deployment/web", "nginx=nginx:2"],
        ["rollout", "restart", "deployment/web"],
        ["patch", "deployment", "web", "--subresource=status", "--type=merge", "-p", '{"status":{"replicas":7}}'],
        # kubectl waits for a deleted object to disappear, which a dry run never makes happen
        ["delete", "configmap", "base", "--wait=false"],
        ["delete", "deployment", "web", "--cascade=foreground", "--wait=false"],
        ["delete", "pod", "p", "--grace-period=0", "--force", "--wait=false"],
        ["delete", "configmaps", "--all", "--wait=false"],
    ]
    for args in commands:
        res = kubectl([*args, "-n", ns], kubeconfig=enforcing.kubeconfig, check=False)
        assert res.returncode == 0, (args, res.stderr)
        assert KUBECTL_WARNING in res.stderr, (args, res.stderr)
        assert _snapshot(api, ns) == before, args
        assert api.get(f"/api/v1/namespaces/{ns}/configmaps/new") is None, args


def test_kubectl_answers_are_the_apiservers_dry_run_answers(
    api: Api, kubectl: Kubectl, namespace: str, enforcing: RunningProxy
) -> None:
    ns = namespace
    _setup(api, ns)
    for args in (
        ["create", "configmap", "new", "--from-literal=k=v"],
        ["patch", "configmap", "base", "-p", '{"data":{"a":"9"}}'],
        ["scale", "deployment", "web", "--replicas=4"],
    ):
        through = kubectl.json([*args, "-n", ns], kubeconfig=enforcing.kubeconfig)
        direct = kubectl.json([*args, "-n", ns, "--dry-run=server"])
        assert normalized(through) == normalized(direct), args
    assert api.get(f"/api/v1/namespaces/{ns}/configmaps/new") is None


# --------------------------------------------------------------------------- Python client


@pytest.fixture
def py(enforcing: RunningProxy) -> Iterator[client.ApiClient]:
    cfg = client.Configuration()
    cfg.host = enforcing.url
    with client.ApiClient(cfg) as c:
        yield c


def test_python_client_every_verb_and_subresource(api: Api, py: client.ApiClient, namespace: str) -> None:
    ns = namespace
    _setup(api, ns)
    before = _snapshot(api, ns)
    core, apps = client.CoreV1Api(py), client.AppsV1Api(py)
    cm = core.read_namespaced_config_map("base", ns)
    cm.data = {"a": "changed"}
    deploy = apps.read_namespaced_deployment("web", ns)
    deploy.status = client.V1DeploymentStatus(replicas=9, ready_replicas=9)
    apply_body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "base"}, "data": {"a": "ssa"}}
    calls: list[tuple[str, Callable[[], Any]]] = [
        ("create", lambda: core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata={"name": "new"}))),
        ("update", lambda: core.replace_namespaced_config_map("base", ns, cm)),
        ("patch", lambda: core.patch_namespaced_config_map("base", ns, {"data": {"a": "p"}})),
        (
            "apply",
            lambda: core.patch_namespaced_config_map(
                "base", ns, apply_body, field_manager="py", force=True, _content_type="application/apply-patch+yaml"
            ),
        ),
        ("update status", lambda: apps.replace_namespaced_deployment_status("web", ns, deploy)),
        ("patch scale", lambda: apps.patch_namespaced_deployment_scale("web", ns, {"spec": {"replicas": 5}})),
        (
            "eviction",
            lambda: core.create_namespaced_pod_eviction(
                "p", ns, client.V1Eviction(metadata=client.V1ObjectMeta(name="p", namespace=ns))
            ),
        ),
        (
            "binding",
            lambda: core.create_namespaced_pod_binding(
                "p",
                ns,
                client.V1Binding(metadata={"name": "p"}, target=client.V1ObjectReference(kind="Node", name="n1")),
                _preload_content=False,
            ),
        ),
        ("delete", lambda: core.delete_namespaced_config_map("base", ns)),
        ("delete pod", lambda: core.delete_namespaced_pod("p", ns, grace_period_seconds=0)),
        ("delete deployment", lambda: apps.delete_namespaced_deployment("web", ns, propagation_policy="Foreground")),
        ("deletecollection", lambda: core.delete_collection_namespaced_config_map(ns)),
        ("deletecollection pods", lambda: core.delete_collection_namespaced_pod(ns)),
    ]
    for what, call in calls:
        call()
        assert _snapshot(api, ns) == before, what
        assert api.get(f"/api/v1/namespaces/{ns}/configmaps/new") is None
    pod = api.get(f"/api/v1/namespaces/{ns}/pods/p")
    assert pod is not None and not pod["spec"].get("nodeName")


def test_python_client_create_matches_direct_dry_run(api: Api, py: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(py)
    through = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata={"generateName": "gen-"}, data={"k": "v"}), _preload_content=False
    )
    assert through.status == 201
    assert through.headers["Warning"] == WARNING
    got = json.loads(through.data)
    status, _, data = api.direct(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps?dryRun=All",
        b'{"metadata":{"generateName":"gen-"},"data":{"k":"v"}}',
    )
    assert status == 201
    want = json.loads(data)
    assert got["metadata"]["name"].startswith("gen-")
    for obj in (got, want):
        obj["metadata"].pop("name")
        obj["metadata"].pop("managedFields")
    assert normalized(got) == normalized(want)
    assert api.get(f"/api/v1/namespaces/{namespace}/configmaps")["items"] == []  # type: ignore[index]


# --------------------------------------------------------------------------- bypass attempts


@pytest.mark.parametrize(
    "query",
    [
        "",
        "dryrun=All",
        "DRYRUN=All",
        "DryRun=",
        "dryRun=All;x=1",
        "dryRun=All&dryRun=All",
        "dry%52un=All",
        "dryRun=%41ll",
        "fieldManager=x&dryrun=&DRYRUN=foo",
    ],
)
def test_query_variants_are_enforced(api: Api, namespace: str, query: str) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps" + (f"?{query}" if query else "")
    status, headers, data = api.proxy("POST", path, cm_body("sneaky"))
    assert status == 201, data
    assert headers.get_all("Warning") == [WARNING]
    assert api.get(f"/api/v1/namespaces/{namespace}/configmaps/sneaky") is None


@pytest.mark.parametrize(
    "query",
    ["dryRun=", "dryRun=foo", "dryRun=all", "dryRun=All&dryRun=foo", "dry%52un=foo", "dryRun=All%20", "dryRun=<&>"],
)
@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION"])
def test_invalid_values_get_the_apiservers_422(api: Api, namespace: str, query: str, method: str) -> None:
    ns = namespace
    status, _, data = api.direct("POST", f"/api/v1/namespaces/{ns}/configmaps", cm_body("base", a="1"))
    assert status == 201, data
    rv = api.rv(f"/api/v1/namespaces/{ns}/configmaps/base")
    obj = f"/api/v1/namespaces/{ns}/configmaps/base"
    body: bytes | None
    path, body, headers = obj, None, {}
    if method == "POST":
        path, body = f"/api/v1/namespaces/{ns}/configmaps", cm_body("other")
    elif method == "PUT":
        body = cm_body("base", a="2")
    elif method == "PATCH":
        body, headers = b'{"data":{"a":"3"}}', {"Content-Type": "application/merge-patch+json"}
    elif method == "DELETECOLLECTION":
        method, path = "DELETE", f"/api/v1/namespaces/{ns}/configmaps"
    through = api.proxy(method, f"{path}?{query}", body, **headers)
    direct = api.direct(method, f"{path}?{query}", body, **headers)
    assert through[0] == direct[0] == 422, (through[2], direct[2])
    assert through[2] == direct[2]
    assert through[1]["Content-Type"] == direct[1]["Content-Type"]
    assert api.rv(obj) == rv
    assert api.get(f"/api/v1/namespaces/{ns}/configmaps/other") is None


def _protobuf_delete_options(grace: int | None = 0, dry_run: list[str] | None = None) -> bytes:
    """A protobuf DeleteOptions in the k8s envelope, as client-go sends it with protobuf content."""

    raw = b""
    if grace is not None:
        raw += bytes([1 << 3 | 0, grace])
    for v in dry_run or []:
        raw += ld(5, v.encode())
    type_meta = ld(1, b"v1") + ld(2, b"DeleteOptions")
    return b"k8s\x00" + ld(1, type_meta) + ld(2, raw)


PROTOBUF = "application/vnd.kubernetes.protobuf"


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{}", "application/json"),
        (b'{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0}', "application/json"),
        (b'{"kind":"DeleteOptions","apiVersion":"meta.k8s.io/v1","dryRun":[]}', "application/json"),
        (b'{"DryRun":["All"],"dryrun":["All"]}', "application/json"),
        (b"null", "application/json"),
        (b"{}", ""),
        (b"kind: DeleteOptions\napiVersion: v1\npropagationPolicy: Background\n", "application/yaml"),
        (b"{}", "APPLICATION/JSON; charset=utf-8"),
        (_protobuf_delete_options(), PROTOBUF),
        (_protobuf_delete_options(dry_run=[]), PROTOBUF),
    ],
)
def test_delete_bodies_are_enforced(api: Api, namespace: str, body: bytes, content_type: str) -> None:
    """A DELETE body replaces the query's options at the apiserver: kproxy makes the body a dry run."""
    ns = namespace
    for name in ("victim", "kept"):
        status, _, data = api.direct("POST", f"/api/v1/namespaces/{ns}/configmaps", cm_body(name))
        assert status == 201, data
    headers = {"Content-Type": content_type} if content_type else {}
    # The vector is real: directly, the body wins over ?dryRun=All and the object is gone.
    status, _, data = api.direct("DELETE", f"/api/v1/namespaces/{ns}/configmaps/victim?dryRun=All", body, **headers)
    assert status == 200, data
    assert api.get(f"/api/v1/namespaces/{ns}/configmaps/victim") is None
    for path in (f"/api/v1/namespaces/{ns}/configmaps/kept", f"/api/v1/namespaces/{ns}/configmaps"):
        status, resp_headers, data = api.proxy("DELETE", path, body, **headers)
        assert status == 200, data
        assert resp_headers.get_all("Warning") == [WARNING]
        assert api.get(f"/api/v1/namespaces/{ns}/configmaps/kept") is not None


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b'{"dryRun":["foo"]}', "application/json"),
        (b'{"dryRun":["All","x"]}', "application/json"),
        (b"dryRun: ['']\n", "application/yaml"),
        (_protobuf_delete_options(dry_run=["nope"]), PROTOBUF),
    ],
)
def test_invalid_delete_body_values_get_the_apiservers_422(
    api: Api, namespace: str, body: bytes, content_type: str
) -> None:
    ns = namespace
    status, _, data = api.direct("POST", f"/api/v1/namespaces/{ns}/configmaps", cm_body("kept"))
    assert status == 201, data
    path = f"/api/v1/namespaces/{ns}/configmaps/kept"
    through = api.proxy("DELETE", path, body, Content_Type=content_type)
    direct = api.direct("DELETE", path, body, Content_Type=content_type)
    assert through[0] == direct[0] == 422
    assert through[2] == direct[2]
    assert api.get(path) is not None


def test_unreadable_delete_bodies_are_refused_not_forwarded(api: Api, namespace: str) -> None:
    ns = namespace
    status, _, data = api.direct("POST", f"/api/v1/namespaces/{ns}/configmaps", cm_body("kept"))
    assert status == 201, data
    path = f"/api/v1/namespaces/{ns}/configmaps/kept"
    # A media type the apiserver does not decode DeleteOptions from: the same 415 as directly.
    through = api.proxy("DELETE", path, b"{}", Content_Type="text/plain")
    direct = api.direct("DELETE", path, b"{}", Content_Type="text/plain")
    assert through[0] == direct[0] == 415
    assert through[2] == direct[2]
    # Bodies kproxy cannot read are refused with a 400 Status.
    for body, ct in ((b"{not json", "application/json"), (b"[1]", "application/json"), (b"k8s", PROTOBUF)):
        status, _, data = api.proxy("DELETE", path, body, Content_Type=ct)
        assert status == 400, (body, data)
        assert json.loads(data)["reason"] == "BadRequest"
    assert api.get(path) is not None


def test_method_override_headers_cannot_help(api: Api, namespace: str) -> None:
    """Neither Go's server nor the apiserver honours X-HTTP-Method-Override: the wire method runs."""
    ns = namespace
    status, _, data = api.direct("POST", f"/api/v1/namespaces/{ns}/configmaps", cm_body("kept"))
    assert status == 201, data
    path = f"/api/v1/namespaces/{ns}/configmaps/kept"
    for header in ("X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override"):
        status, _, data = api.proxy("GET", path, None, **{header: "DELETE"})
        assert status == 200 and json.loads(data)["metadata"]["name"] == "kept"
        status, headers, data = api.proxy(
            "POST", f"/api/v1/namespaces/{ns}/configmaps", cm_body("posted"), **{header: "DELETE"}
        )
        assert status == 201 and headers.get_all("Warning") == [WARNING], data
        assert api.get(path) is not None
        assert api.get(f"/api/v1/namespaces/{ns}/configmaps/posted") is None
    # A lower-case method is read as Go reads it (any token) and judged by the rule: it cannot be
    # run as a dry run, so the rule refuses it; the apiserver itself routes no lower-case method.
    status, _, data = api.proxy("delete", path)
    assert status == 403 and "method delete refused" in json.loads(data)["message"], data
    status, _, data = api.direct("delete", path)
    assert status == 405 and json.loads(data)["reason"] == "MethodNotAllowed", data
    assert api.get(path) is not None


# --------------------------------------------------------------------------- connect, webhook, metrics


def test_connect_requests_are_refused_under_enforce(
    api: Api, kubectl: Kubectl, namespace: str, enforcing: RunningProxy
) -> None:
    ns = namespace
    _setup(api, ns)
    for method, path in (
        ("POST", f"/api/v1/namespaces/{ns}/pods/p/exec?command=ls&stdout=true"),
        ("GET", f"/api/v1/namespaces/{ns}/pods/p/attach?stdout=true"),
        ("POST", f"/api/v1/namespaces/{ns}/pods/p/portforward?ports=80"),
        ("GET", f"/api/v1/namespaces/{ns}/pods/p/proxy/"),
        ("GET", f"/api/v1/namespaces/{ns}/services/s:80/proxy/x"),
        ("GET", "/api/v1/nodes/n1/proxy/configz"),
    ):
        status, _, data = api.proxy(method, path)
        assert status == 403, (path, data)
        status_obj = json.loads(data)
        assert status_obj["reason"] == "Forbidden"
        assert 'kproxy dryrun rule "preview"' in status_obj["message"]
        assert "cannot be run as a dry run" in status_obj["message"]
    res = kubectl(["exec", "p", "-n", ns, "--", "ls"], kubeconfig=enforcing.kubeconfig, check=False)
    assert res.returncode != 0
    assert 'kproxy dryrun rule \\"preview\\": pods/exec cannot be run as a dry run' in res.stderr or (
        'kproxy dryrun rule "preview": pods/exec cannot be run as a dry run' in res.stderr
    ), res.stderr


def test_webhook_refusing_dry_run_reaches_the_client_unchanged(
    api: Api, kubectl: Kubectl, namespace: str, tmp_path: Path, enforcing: RunningProxy
) -> None:
    ns = namespace
    name = f"kproxy-dryrun-{ns}"[:63]
    with running_webhook(tmp_path) as hook:
        # admissionregistration/v1 accepts only None and NoneOnDryRun: a webhook with side effects
        # cannot be registered on this apiserver, so the refusal is the webhook's own.
        status, _, data = api.direct(
            "POST",
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            json.dumps(hook.configuration(name, ns, side_effects="Unknown")).encode(),
        )
        assert status == 422 and b"sideEffects" in data, data
        status, _, data = api.direct(
            "POST",
            "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
            json.dumps(hook.configuration(name, ns)).encode(),
        )
        assert status == 201, data
        try:
            create = f"/api/v1/namespaces/{ns}/configmaps"

            def refused_directly() -> bool:
                return api.direct("POST", create + "?dryRun=All", cm_body("w"))[0] != 201

            eventually(refused_directly, 30, "the webhook configuration to take effect")
            direct = api.direct("POST", create + "?dryRun=All", cm_body("w"))
            through = api.proxy("POST", create, cm_body("w"))
            assert through[0] == direct[0] == 403, through[2]
            assert through[2] == direct[2]
            assert REFUSAL.encode() in through[2]
            assert through[1].get_all("Warning") == [WARNING]
            assert hook.reviews and all(r["dryRun"] for r in hook.reviews)
            res = kubectl(["create", "configmap", "w", "-n", ns], kubeconfig=enforcing.kubeconfig, check=False)
            assert res.returncode == 1 and REFUSAL in res.stderr
            # Real writes still pass the webhook (it only refuses dry runs).
            assert api.direct("POST", create, cm_body("real"))[0] == 201
        finally:
            api.direct("DELETE", f"/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/{name}")


def test_metrics_count_by_rule(api: Api, namespace: str, enforcing: RunningProxy) -> None:
    def enforced() -> float:
        for line in enforcing.metrics().splitlines():
            if line.startswith('kproxy_dryrun_enforced_total{rule="preview"}'):
                return float(line.split()[-1])
        return 0.0

    start = enforced()
    assert api.proxy("POST", f"/api/v1/namespaces/{namespace}/configmaps", cm_body("m"))[0] == 201
    assert api.proxy("GET", f"/api/v1/namespaces/{namespace}/configmaps")[0] == 200
    assert enforced() == start + 1


# --------------------------------------------------------------------------- reject and allow


def test_reject_and_allow_rules(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], kubectl: Kubectl, namespace: str
) -> None:
    ns = namespace
    rp = proxy_factory(
        extra={
            "filters": [
                {
                    "name": "dryrun",
                    "rules": [
                        {"name": "secrets-dry-only", "match": {"resources": ["secrets"]}, "action": "reject"},
                        {"match": {"resources": ["pods/*"]}, "action": "reject"},
                        {"name": "rest", "action": "allow"},
                    ],
                }
            ]
        }
    )
    api = Api(control_plane, rp)
    res = kubectl(
        ["create", "secret", "generic", "s", "--from-literal=a=b", "-n", ns], kubeconfig=rp.kubeconfig, check=False
    )
    assert res.returncode == 1
    assert 'secrets is forbidden: kproxy dryrun rule "secrets-dry-only" allows only dry-run requests' in res.stderr
    assert api.get(f"/api/v1/namespaces/{ns}/secrets/s") is None
    res = kubectl(
        ["create", "secret", "generic", "s", "--from-literal=a=b", "-n", ns, "--dry-run=server"],
        kubeconfig=rp.kubeconfig,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "Warning" not in res.stderr
    assert api.get(f"/api/v1/namespaces/{ns}/secrets/s") is None
    # allowed: a real write
    kubectl(["create", "configmap", "real", "-n", ns], kubeconfig=rp.kubeconfig)
    assert api.get(f"/api/v1/namespaces/{ns}/configmaps/real") is not None
    # an existing secret: dry-run delete passes (its body carries dryRun), a real one is refused
    kubectl(["create", "secret", "generic", "s2", "-n", ns])
    assert kubectl(["delete", "secret", "s2", "-n", ns, "--dry-run=server"], kubeconfig=rp.kubeconfig).returncode == 0
    res = kubectl(["delete", "secret", "s2", "-n", ns], kubeconfig=rp.kubeconfig, check=False)
    assert res.returncode == 1 and '"secrets-dry-only"' in res.stderr
    assert api.get(f"/api/v1/namespaces/{ns}/secrets/s2") is not None
    # invalid values: the apiserver's 422, not a 403
    path = f"/api/v1/namespaces/{ns}/secrets?dryRun=yes"
    secret = b'{"metadata":{"name":"s3"}}'
    through, direct = api.proxy("POST", path, secret), api.direct("POST", path, secret)
    assert through[0] == direct[0] == 422 and through[2] == direct[2]
    # an unnamed rule is named by its position; subresource patterns select subresources only
    status, _, data = api.direct("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", b'{"metadata":{"name":"default"}}')
    status, _, data = api.proxy(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        b'{"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}',
    )
    assert status == 201, data
    status, _, data = api.proxy("POST", f"/api/v1/namespaces/{ns}/pods/p/eviction", b'{"metadata":{"name":"p"}}')
    assert status == 403 and b'kproxy dryrun rule \\"rules[1]\\"' in data, data
    # an Eviction whose own deleteOptions ask for a dry run is one (eviction.go propagateDryRun)
    dry_eviction = b'{"metadata":{"name":"p"},"deleteOptions":{"dryRun":["All"]}}'
    status, _, data = api.proxy("POST", f"/api/v1/namespaces/{ns}/pods/p/eviction", dry_eviction)
    assert status == 201, data
    assert api.get(f"/api/v1/namespaces/{ns}/pods/p") is not None
    metrics = rp.metrics()
    assert 'kproxy_dryrun_rejected_total{rule="secrets-dry-only"} 2.0' in metrics
    assert 'kproxy_dryrun_rejected_total{rule="rules[1]"} 1.0' in metrics


def test_check_config_validates_rules(tmp_path: Path) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "c.yaml"

    def check(text: str) -> subprocess.CompletedProcess[str]:
        cfg.write_text(text)
        return subprocess.run(
            [sys.executable, "-m", "kproxy.cli", "check-config", str(cfg)], capture_output=True, text=True
        )

    head = "filters:\n  - name: dryrun\n    rules:\n"
    ok = check(head + "      - {action: enforce, match: {resources: [deployments.apps/scale]}}\n")
    assert ok.returncode == 0, ok.stderr
    bad = check(head + "      - {action: enforce, match: {resources: [apps/deployments]}}\n")
    assert bad.returncode == 2
    assert "filters[0].rules[0].match.resources" in bad.stderr and "deployments.apps" in bad.stderr
    bad = check(head + "      - {action: enforced}\n")
    assert bad.returncode == 2 and "filters[0].rules[0].action" in bad.stderr
    bad = check(head + "      - {action: allow, match: {verb: [get]}}\n")
    assert bad.returncode == 2 and "filters[0].rules[0].match.verb" in bad.stderr


def test_python_client_errors_pass_through(api: Api, py: client.ApiClient, namespace: str) -> None:
    """A dry run that fails at the apiserver fails the same way through kproxy (here: AlreadyExists)."""
    status, _, data = api.direct("POST", f"/api/v1/namespaces/{namespace}/configmaps", cm_body("dup"))
    assert status == 201, data
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(py).create_namespaced_config_map(namespace, client.V1ConfigMap(metadata={"name": "dup"}))
    assert err.value.status == 409
    direct = api.direct("POST", f"/api/v1/namespaces/{namespace}/configmaps?dryRun=All", cm_body("dup"))
    assert json.loads(err.value.body) == json.loads(direct[2])
    assert err.value.headers["Warning"] == WARNING


def test_token_requests_are_refused_because_a_dry_run_still_mints_a_token(
    api: Api, namespace: str, kubectl: Kubectl, enforcing: RunningProxy
) -> None:
    ns = namespace
    status, _, data = api.direct("POST", f"/api/v1/namespaces/{ns}/serviceaccounts", b'{"metadata":{"name":"bot"}}')
    assert status == 201, data
    path = f"/api/v1/namespaces/{ns}/serviceaccounts/bot/token"
    # Why: directly, a dry-run TokenRequest returns a real token that authenticates.
    status, _, data = api.direct("POST", path + "?dryRun=All", b'{"spec":{"expirationSeconds":600}}')
    assert status == 201, data
    token = json.loads(data)["status"]["token"]
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
    status, _, data = api.direct("POST", "/apis/authentication.k8s.io/v1/tokenreviews", json.dumps(review).encode())
    assert json.loads(data)["status"]["user"]["username"] == f"system:serviceaccount:{ns}:bot"
    # Through kproxy under enforce: refused, with or without dryRun.
    for query in ("", "?dryRun=All"):
        status, _, data = api.proxy("POST", path + query, b'{"spec":{"expirationSeconds":600}}')
        assert status == 403, data
        assert b"serviceaccounts/token issues a real token even as a dry run" in data
    res = kubectl(["create", "token", "bot", "-n", ns], kubeconfig=enforcing.kubeconfig, check=False)
    assert res.returncode == 1 and "issues a real token" in res.stderr


SCALE_PATCH = b'{"spec":{"replicas":4}}'
MERGE = "application/merge-patch+json"
CASES: list[tuple[str, str, str, bytes | None, str]] = [
    # (what, method, path below the namespace, body, content type)
    ("create", "POST", "configmaps", cm_body("fresh", k="v"), "application/json"),
    (
        "create yaml",
        "POST",
        "configmaps",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: y}\n",
        "application/yaml",
    ),
    ("update", "PUT", "configmaps/base", cm_body("base", a="2"), "application/json"),
    ("merge patch", "PATCH", "configmaps/base", b'{"data":{"a":"3"}}', MERGE),
    (
        "json patch",
        "PATCH",
        "configmaps/base",
        b'[{"op":"replace","path":"/data/a","value":"4"}]',
        "application/json-patch+json",
    ),
    ("strategic patch", "PATCH", "configmaps/base", b'{"data":{"a":"5"}}', "application/strategic-merge-patch+json"),
    (
        "apply",
        "PATCH",
        "configmaps/base?fieldManager=t&force=true",
        b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: base}\ndata: {a: '6'}\n",
        "application/apply-patch+yaml",
    ),
    ("delete", "DELETE", "configmaps/base", None, ""),
    ("delete with options", "DELETE", "configmaps/base", b'{"propagationPolicy":"Foreground"}', "application/json"),
    ("deletecollection", "DELETE", "configmaps", None, ""),
    ("scale", "PATCH", "deployments/web/scale", SCALE_PATCH, MERGE),
    ("status", "PATCH", "deployments/web/status", b'{"status":{"replicas":3}}', MERGE),
    (
        "eviction",
        "POST",
        "pods/p/eviction",
        b'{"apiVersion":"policy/v1","kind":"Eviction","metadata":{"name":"p"}}',
        "application/json",
    ),
    (
        "binding",
        "POST",
        "pods/p/binding",
        b'{"apiVersion":"v1","kind":"Binding","metadata":{"name":"p"},"target":{"kind":"Node","name":"n1"}}',
        "application/json",
    ),
    ("pod delete", "DELETE", "pods/p?gracePeriodSeconds=0", None, ""),
]


@pytest.mark.parametrize(("what", "method", "sub", "body", "ctype"), CASES, ids=[c[0] for c in CASES])
def test_answers_equal_the_apiservers_dry_run(
    api: Api, namespace: str, what: str, method: str, sub: str, body: bytes | None, ctype: str
) -> None:
    """Every verb and subresource: kproxy's answer is the apiserver's own answer to the same request
    with ?dryRun=All, and the stored objects do not change."""
    ns = namespace
    _setup(api, ns)
    before = _snapshot(api, ns)
    group = "apis/apps/v1" if sub.startswith("deployments") else "api/v1"
    path = f"/{group}/namespaces/{ns}/{sub}"
    headers = {"Content-Type": ctype} if ctype else {}
    through = api.proxy(method, path, body, **headers)
    assert _snapshot(api, ns) == before
    direct_body = body
    if method == "DELETE" and body:  # the body's options replace the query's: say it there
        direct_body = json.dumps({**json.loads(body), "dryRun": ["All"]}).encode()
    direct = api.direct(method, path + ("&" if "?" in path else "?") + "dryRun=All", direct_body, **headers)
    assert _snapshot(api, ns) == before
    assert through[0] == direct[0], (through[2], direct[2])
    assert through[1].get_all("Warning") == [WARNING]
    got, want = json.loads(through[2]), json.loads(direct[2])
    if what == "deletecollection":
        for items in (got["items"], want["items"]):
            items.sort(key=lambda o: o["metadata"]["name"])
        got["items"] = [normalized(o) for o in got["items"]]
        want["items"] = [normalized(o) for o in want["items"]]
    got.get("metadata", {}).pop("resourceVersion", None)
    want.get("metadata", {}).pop("resourceVersion", None)
    assert normalized(got) == normalized(want)


def test_rules_select_by_namespace_and_resource(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], kubectl: Kubectl, namespace: str
) -> None:
    other = f"{namespace}-b"[:63]
    kubectl(["create", "namespace", other])
    try:
        rules = [
            {
                "name": "ns-preview",
                "match": {"namespaces": [f"{namespace[:20]}*"], "resources": ["configmaps"]},
                "action": "enforce",
            },
            {"name": "no-scaling", "match": {"resources": ["*/scale"]}, "action": "reject"},
            {
                "name": "apps-preview",
                "match": {"resources": ["*.apps"], "verbs": ["patch", "delete"]},
                "action": "enforce",
            },
            {"name": "rest", "action": "allow"},
        ]
        rp = proxy_factory(extra={"filters": [{"name": "dryrun", "rules": rules}]})
        api = Api(control_plane, rp)
        kubectl(["create", "deployment", "web", "--image=nginx", "-n", other])
        rv = api.rv(f"/apis/apps/v1/namespaces/{other}/deployments/web")

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return kubectl(list(args), kubeconfig=rp.kubeconfig, check=False)

        # both namespaces match the glob (the second one's name starts the same way) for configmaps
        for ns in (namespace, other):
            res = run("create", "configmap", "c", "-n", ns)
            assert res.returncode == 0 and 'rule "ns-preview"' in res.stderr, res.stderr
            assert api.get(f"/api/v1/namespaces/{ns}/configmaps/c") is None
        # secrets match no namespace rule: real
        res = run("create", "secret", "generic", "s", "-n", namespace)
        assert res.returncode == 0 and "Warning" not in res.stderr, res.stderr
        assert api.get(f"/api/v1/namespaces/{namespace}/secrets/s") is not None
        # the scale subresource is refused by its own rule, before the apps rule
        res = run("scale", "deployment", "web", "--replicas=2", "-n", other)
        assert res.returncode == 1 and 'rule "no-scaling"' in res.stderr, res.stderr
        # a patch of the deployment itself is a dry run; creating one is real (verbs)
        res = run("label", "deployment", "web", "x=y", "-n", other)
        assert res.returncode == 0 and 'rule "apps-preview"' in res.stderr, res.stderr
        assert api.rv(f"/apis/apps/v1/namespaces/{other}/deployments/web") == rv
        res = run("create", "deployment", "web2", "--image=nginx", "-n", other)
        assert res.returncode == 0 and "Warning" not in res.stderr, res.stderr
        assert api.get(f"/apis/apps/v1/namespaces/{other}/deployments/web2") is not None
    finally:
        kubectl(["delete", "namespace", other, "--wait=false"], check=False)


def test_reload_keeps_metrics(
    control_plane: ControlPlaneInfo, proxy_factory: Callable[..., RunningProxy], namespace: str
) -> None:
    """A reload builds a new filter on the same metrics registry: its counters are shared, not re-registered."""
    rules = [{"name": "a", "match": {"resources": ["secrets"]}, "action": "reject"}, {"name": "b", "action": "enforce"}]
    rp = proxy_factory(extra={"filters": [{"name": "dryrun", "rules": rules}]})
    api = Api(control_plane, rp)
    status, headers, _ = api.proxy("POST", f"/api/v1/namespaces/{namespace}/configmaps", cm_body("one"))
    assert status == 201 and 'rule \\"b\\"' in headers["Warning"]
    rp.write_config({"filters": [{"name": "dryrun", "rules": [{"name": "c", "action": "reject"}]}]})

    def reloaded() -> bool:
        return api.proxy("POST", f"/api/v1/namespaces/{namespace}/configmaps", cm_body("two"))[0] == 403

    eventually(reloaded, 30, "the reloaded rules")
    metrics = rp.metrics()
    # counts from before the reload stay (requests sent while waiting were enforced by "b")
    assert 'kproxy_dryrun_enforced_total{rule="b"}' in metrics
    assert 'kproxy_dryrun_rejected_total{rule="c"}' in metrics
    assert api.get(f"/api/v1/namespaces/{namespace}/configmaps/one") is None
    assert api.get(f"/api/v1/namespaces/{namespace}/configmaps/two") is None
