"""kubectl through kproxy (empty chain) behaves exactly as kubectl straight to the apiserver.

Each test does the operation through kproxy and compares with the same operation (or a read of
the same object) sent directly to the kube-apiserver.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from collections.abc import Callable
from typing import Any

from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import ALLOW_EXEC, RunningProxy


def cm_manifest(name: str, ns: str, data: dict[str, str] | None = None, **meta: Any) -> str:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, **meta},
            "data": data or {"a": "1"},
        }
    )


def test_create_then_get_json_and_yaml_identical(kubectl: Kubectl, proxy: RunningProxy, namespace: str) -> None:
    kubectl(["create", "-f", "-"], kubeconfig=proxy.kubeconfig, input=cm_manifest("c1", namespace))
    for fmt in ("json", "yaml"):
        via = kubectl(["get", "configmap", "c1", "-n", namespace, "-o", fmt], kubeconfig=proxy.kubeconfig).stdout
        direct = kubectl(["get", "configmap", "c1", "-n", namespace, "-o", fmt]).stdout
        assert via == direct
    obj = json.loads(kubectl(["get", "configmap", "c1", "-n", namespace, "-o", "json", "--show-managed-fields"]).stdout)
    # kubectl's User-Agent reached the apiserver unchanged: it names the field manager.
    assert obj["metadata"]["managedFields"][0]["manager"] == "kubectl-create"


def test_create_conflict_same_error(kubectl: Kubectl, proxy: RunningProxy, namespace: str) -> None:
    kubectl(["create", "configmap", "dup", "-n", namespace])
    via = kubectl(["create", "configmap", "dup", "-n", namespace], kubeconfig=proxy.kubeconfig, check=False)
    direct = kubectl(["create", "configmap", "dup", "-n", namespace], check=False)
    assert via.returncode == direct.returncode == 1
    assert via.stderr == direct.stderr
    assert 'configmaps "dup" already exists' in via.stderr


def test_server_side_apply_and_conflict(kubectl: Kubectl, proxy: RunningProxy, namespace: str) -> None:
    pc = proxy.kubeconfig
    kubectl(
        ["apply", "--server-side", "--field-manager=alice", "-f", "-"],
        kubeconfig=pc,
        input=cm_manifest("ssa", namespace, {"k": "v1"}),
    )
    obj = kubectl.json(["get", "cm", "ssa", "-n", namespace, "--show-managed-fields"])
    assert obj["data"] == {"k": "v1"}
    assert [m["manager"] for m in obj["metadata"]["managedFields"]] == ["alice"]

    # Another manager changing the same field: 409 conflict, identical via kproxy and direct.
    args = ["apply", "--server-side", "--field-manager=bob", "-f", "-"]
    manifest = cm_manifest("ssa", namespace, {"k": "v2"})
    via = kubectl(args, kubeconfig=pc, input=manifest, check=False)
    direct = kubectl(args, input=manifest, check=False)
    assert via.returncode == direct.returncode != 0
    assert via.stderr == direct.stderr
    assert "conflict" in via.stderr.lower() and ".data.k" in via.stderr

    # --force-conflicts takes ownership through kproxy.
    kubectl([*args, "--force-conflicts"], kubeconfig=pc, input=manifest)
    assert kubectl.json(["get", "cm", "ssa", "-n", namespace])["data"] == {"k": "v2"}


def test_patch_json_merge_strategic(kubectl: Kubectl, proxy: RunningProxy, namespace: str) -> None:
    pc = proxy.kubeconfig
    kubectl(["create", "-f", "-"], input=cm_manifest("p", namespace, {"a": "1"}))
    kubectl(
        ["patch", "cm", "p", "-n", namespace, "--type=json", "-p", '[{"op":"add","path":"/data/b","value":"2"}]'],
        kubeconfig=pc,
    )
    kubectl(["patch", "cm", "p", "-n", namespace, "--type=merge", "-p", '{"data":{"c":"3"}}'], kubeconfig=pc)
    kubectl(
        ["patch", "cm", "p", "-n", namespace, "--type=strategic", "-p", '{"metadata":{"labels":{"x":"y"}}}'],
        kubeconfig=pc,
    )
    obj = kubectl.json(["get", "cm", "p", "-n", namespace])
    assert obj["data"] == {"a": "1", "b": "2", "c": "3"}
    assert obj["metadata"]["labels"] == {"x": "y"}
    # A JSON patch that fails (test op) fails the same way through kproxy.
    bad = ["patch", "cm", "p", "-n", namespace, "--type=json", "-p", '[{"op":"test","path":"/data/a","value":"nope"}]']
    via, direct = kubectl(bad, kubeconfig=pc, check=False), kubectl(bad, check=False)
    assert via.returncode == direct.returncode == 1
    assert via.stderr == direct.stderr


def test_replace_and_delete(kubectl: Kubectl, proxy: RunningProxy, namespace: str) -> None:
    pc = proxy.kubeconfig
    kubectl(["create", "-f", "-"], kubeconfig=pc, input=cm_manifest("r", namespace, {"a": "1"}))
    kubectl(["replace", "-f", "-"], kubeconfig=pc, input=cm_manifest("r", namespace, {"a": "2"}))
    assert kubectl.json(["get", "cm", "r", "-n", namespace])["data"] == {"a": "2"}
    out = kubectl(["delete", "cm", "r", "-n", namespace], kubeconfig=pc).stdout
    assert out.startswith('configmap "r" deleted')
    missing = kubectl(["get", "cm", "r", "-n", namespace], check=False)
    assert 'configmaps "r" not found' in missing.stderr
    via = kubectl(["get", "cm", "r", "-n", namespace], kubeconfig=pc, check=False)
    assert via.stderr == missing.stderr


def test_watch_events_arrive_while_open(
    control_plane: ControlPlaneInfo, proxy: RunningProxy, kubectl: Kubectl, namespace: str
) -> None:
    """Each event reaches kubectl while the watch is still open (nothing is buffered to the end)."""
    argv = [
        str(control_plane.kubectl),
        f"--kubeconfig={proxy.kubeconfig}",
        "get",
        "configmaps",
        "-n",
        namespace,
        "--watch",
        "--output-watch-events",
        "-o",
        'jsonpath={.type} {.object.metadata.name}{"\\n"}',
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        for i in range(3):
            kubectl(["create", "configmap", f"w{i}", "-n", namespace])
            eventually(lambda i=i: f"ADDED w{i}\n" in lines, 15, f"the ADDED event for w{i}")
        kubectl(["delete", "configmap", "w0", "-n", namespace])
        eventually(lambda: "DELETED w0\n" in lines, 15, "the DELETED event")
        assert proc.poll() is None, "the watch must still be open"
    finally:
        proc.terminate()
        proc.wait(10)


def test_chunked_list_over_many_objects(kubectl: Kubectl, proxy: RunningProxy, namespace: str) -> None:
    items = [json.loads(cm_manifest(f"item-{i:02d}", namespace)) for i in range(25)]
    kubectl(["create", "-f", "-"], input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    before = _count(proxy.metrics(), "list", "configmaps")
    via = kubectl(["get", "cm", "-n", namespace, "--chunk-size=2", "-o", "name"], kubeconfig=proxy.kubeconfig).stdout
    direct = kubectl(["get", "cm", "-n", namespace, "--chunk-size=2", "-o", "name"]).stdout
    assert via == direct
    assert via.count("configmap/item-") == 25
    # 25 items (+ kube-root-ca.crt if a controller made one) in pages of 2: at least 13 requests.
    assert _count(proxy.metrics(), "list", "configmaps") - before >= 13


def _count(metrics: str, verb: str, resource: str) -> float:
    total = 0.0
    pat = re.compile(r"^kproxy_requests_total\{(.*)\} (\S+)$")
    for line in metrics.splitlines():
        m = pat.match(line)
        if m and f'verb="{verb}"' in m.group(1) and f'resource="{resource}"' in m.group(1):
            total += float(m.group(2))
    return total


CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.kproxy.test
spec:
  group: kproxy.test
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
              color: {type: string}
"""


def test_crd_and_custom_resource_round_trip(kubectl: Kubectl, proxy: RunningProxy, namespace: str) -> None:
    pc = proxy.kubeconfig
    kubectl(["apply", "-f", "-"], kubeconfig=pc, input=CRD)
    kubectl(["wait", "--for=condition=Established", "crd/widgets.kproxy.test", "--timeout=60s"], kubeconfig=pc)

    def discoverable() -> bool:
        res = kubectl(["api-resources", "--api-group=kproxy.test", "-o", "name"], kubeconfig=pc, check=False)
        return "widgets.kproxy.test" in res.stdout

    eventually(discoverable, 60, "the CRD to appear in discovery", interval=0.5)
    cr = {
        "apiVersion": "kproxy.test/v1",
        "kind": "Widget",
        "metadata": {"name": "w1", "namespace": namespace},
        "spec": {"size": 3, "color": "blue"},
    }
    kubectl(["create", "-f", "-"], kubeconfig=pc, input=json.dumps(cr))
    kubectl(
        ["patch", "widgets.kproxy.test", "w1", "-n", namespace, "--type=merge", "-p", '{"spec":{"size":4}}'],
        kubeconfig=pc,
    )
    via = kubectl(["get", "widgets.kproxy.test", "w1", "-n", namespace, "-o", "json"], kubeconfig=pc).stdout
    direct = kubectl(["get", "widgets.kproxy.test", "w1", "-n", namespace, "-o", "json"]).stdout
    assert via == direct
    assert json.loads(via)["spec"] == {"size": 4, "color": "blue"}
    kubectl(["delete", "widgets.kproxy.test", "w1", "-n", namespace], kubeconfig=pc)
    gone = kubectl(["get", "widgets.kproxy.test", "w1", "-n", namespace], check=False)
    assert gone.returncode == 1 and 'widgets.kproxy.test "w1" not found' in gone.stderr


def test_discovery_api_resources_identical(kubectl: Kubectl, proxy: RunningProxy) -> None:
    via = kubectl(["api-resources", "--cached=false"], kubeconfig=proxy.kubeconfig).stdout
    direct = kubectl(["api-resources", "--cached=false"]).stdout
    assert via == direct
    assert "configmaps" in via and "deployments" in via
    assert kubectl(["api-versions"], kubeconfig=proxy.kubeconfig).stdout == kubectl(["api-versions"]).stdout


def test_warning_header_passes_through(kubectl: Kubectl, proxy: RunningProxy, namespace: str) -> None:
    """The apiserver's field-validation warning (a `Warning` header) reaches kubectl unchanged."""
    manifest = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "warn", "namespace": namespace},
            "data": {"a": "1"},
            "bogus": True,
        }
    )
    via = kubectl(["create", "--validate=warn", "-f", "-"], kubeconfig=proxy.kubeconfig, input=manifest)
    assert 'unknown field "bogus"' in via.stderr


def test_forward_mode_forbidden_identical(
    control_plane: ControlPlaneInfo, kubectl: Kubectl, forward_proxy: RunningProxy, tmp_path: Any, namespace: str
) -> None:
    """The no-permission user gets the same 403 through kproxy as directly; kproxy adds no privilege."""
    user_kc = _token_kubeconfig(tmp_path / "user.kc", forward_proxy, control_plane.user_token)
    via = kubectl(["get", "pods", "-n", namespace], kubeconfig=user_kc, check=False)
    direct = kubectl(["get", "pods", "-n", namespace], kubeconfig=control_plane.user_kubeconfig, check=False)
    assert via.returncode == direct.returncode == 1
    assert via.stderr == direct.stderr
    assert 'cannot list resource "pods"' in via.stderr
    # A privileged token is forwarded just the same.
    admin_kc = _token_kubeconfig(tmp_path / "admin.kc", forward_proxy, control_plane.admin_token)
    kubectl(["create", "configmap", "fwd", "-n", namespace], kubeconfig=admin_kc)
    # No token at all: kproxy adds none of its own credentials (kubectl would prompt, so ask directly).
    status, body = forward_proxy.get(f"/api/v1/namespaces/{namespace}/configmaps")
    assert status == 403
    assert json.loads(body)["message"].startswith('configmaps is forbidden: User "system:anonymous" cannot list')


def _token_kubeconfig(path: Any, proxy: RunningProxy, token: str | None) -> Any:
    """kubectl sends bearer tokens only over TLS: the forwarding kproxy serves HTTPS."""
    user = {"token": token} if token else {}
    server: dict[str, Any] = {"server": proxy.url}
    if proxy.ca_file:
        server["certificate-authority"] = str(proxy.ca_file)
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": server}],
                "users": [{"name": "u", "user": user}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    return path


def test_exec_error_passes_through(
    kubectl: Kubectl, proxy_factory: Callable[..., RunningProxy], namespace: str
) -> None:
    """A pod bound to no node cannot be exec'd into; the apiserver's refusal must reach kubectl unchanged
    (exec that succeeds: tests/e2e/test_exec_through_apiserver.py)."""
    pod = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "namespace": namespace},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )
    kubectl(["create", "-f", "-"], input=pod)
    proxy = proxy_factory(extra={"proxy": ALLOW_EXEC})  # credentials: proxy refuses exec by default
    via = kubectl(["exec", "p", "-n", namespace, "--", "true"], kubeconfig=proxy.kubeconfig, check=False, timeout=60)
    direct = kubectl(["exec", "p", "-n", namespace, "--", "true"], check=False, timeout=60)
    assert via.returncode == direct.returncode != 0
    assert via.stderr.replace(proxy.url, "X") == direct.stderr.replace(_server(kubectl), "X")


def _server(kubectl: Kubectl) -> str:
    return str(kubectl(["config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}"]).stdout)
