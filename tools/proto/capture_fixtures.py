"""Capture the apiserver's own protobuf and JSON answers as unit-test fixtures for kproxy.codec.

Usage: .venv/bin/python tools/proto/capture_fixtures.py /tmp/cp-<name>   (a running
`kproxy envtest up --dir` control plane). Creates fixture-objects.yaml's objects, then saves,
for each path below, the protobuf body (<name>.pb) and the JSON body (<name>.json) the same
apiserver gave, plus protobuf and JSON watch streams. tests/unit/codec/test_codec_fixtures.py checks
that the codec turns each .pb into its .json.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent.parent / "tests" / "unit" / "codec" / "codec_fixtures"

PATHS = {
    "podlist": "/api/v1/namespaces/demo/pods",
    "pod": "/api/v1/namespaces/demo/pods/p1",
    "configmaps": "/api/v1/namespaces/demo/configmaps",
    "secrets": "/api/v1/namespaces/demo/secrets",
    "deployments": "/apis/apps/v1/namespaces/demo/deployments",
    "scale": "/apis/apps/v1/namespaces/demo/deployments/d1/scale",
    "services": "/api/v1/namespaces/demo/services",
    "cronjobs": "/apis/batch/v1/namespaces/demo/cronjobs",
    "roles": "/apis/rbac.authorization.k8s.io/v1/namespaces/demo/roles",
    "clusterroles": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "crds": "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "leases": "/apis/coordination.k8s.io/v1/namespaces/demo/leases",
    "hpas": "/apis/autoscaling/v2/namespaces/demo/horizontalpodautoscalers",
    "networkpolicies": "/apis/networking.k8s.io/v1/namespaces/demo/networkpolicies",
    "statefulsets": "/apis/apps/v1/namespaces/demo/statefulsets",
    "events": "/api/v1/namespaces/demo/events",
    "events-v1": "/apis/events.k8s.io/v1/namespaces/demo/events",
    "namespace": "/api/v1/namespaces/demo",
    "status-notfound": "/api/v1/namespaces/demo/pods/nope",
    "emptylist": "/api/v1/namespaces/demo/persistentvolumeclaims",
    "flowschemas": "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas",
    "prioritylevels": "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations",
    "apiservices": "/apis/apiregistration.k8s.io/v1/apiservices",
    "apiversions": "/api",
    "apigrouplist": "/apis",
    "apiresourcelist": "/api/v1",
    "priorityclasses": "/apis/scheduling.k8s.io/v1/priorityclasses",
    "serviceaccounts": "/api/v1/namespaces/demo/serviceaccounts",
    "endpointslices": "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
    "validatingadmissionpolicies": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
}
WATCHES = {
    "watch-pods": "/api/v1/namespaces/demo/pods?watch=1&resourceVersion=0&allowWatchBookmarks=true&timeoutSeconds=1",
    "watch-configmaps": "/api/v1/namespaces/demo/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1",
}


def main() -> None:
    cp = Path(sys.argv[1])
    state = json.loads((cp / "state.json").read_text())
    server = f"https://127.0.0.1:{state['ports']['apiserver']}"
    ctx = ssl.create_default_context(cafile=str(cp / "ca.crt"))
    subprocess.run(
        [
            state["kubectl"],
            "--kubeconfig",
            str(cp / "admin.kubeconfig"),
            "apply",
            "-f",
            str(HERE / "fixture-objects.yaml"),
        ],
        check=True,
    )

    def get(path: str, accept: str) -> bytes:
        req = urllib.request.Request(
            server + path, headers={"Authorization": "Bearer " + state["admin_token"], "Accept": accept}
        )
        try:
            with urllib.request.urlopen(req, context=ctx) as r:
                return bytes(r.read())
        except urllib.error.HTTPError as e:
            return bytes(e.read())

    OUT.mkdir(parents=True, exist_ok=True)
    for name, path in {**PATHS, **WATCHES}.items():
        for _ in range(5):  # a consistent pair: the protobuf answer unchanged around the JSON one
            pb = get(path, "application/vnd.kubernetes.protobuf")
            js = get(path, "application/json")
            if name in WATCHES or get(path, "application/vnd.kubernetes.protobuf") == pb:
                break
        (OUT / f"{name}.pb").write_bytes(pb)
        (OUT / f"{name}.json").write_bytes(js)
        print(f"{name}: {len(pb)} bytes protobuf, {len(js)} bytes JSON")
        if name == "pod":
            (OUT / "pod.yaml").write_bytes(get(path, "application/yaml"))


if __name__ == "__main__":
    main()
