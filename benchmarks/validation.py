"""The validation engine's cost per request and its schema load time, in one run.

    python -m benchmarks.validation [--envtest-dir DIR] [--calls 20000] [--output FILE]

Schemas are the local control plane's own (``/openapi/v3``, apps/v1 and a benchmark CRD's
group-version), fetched and compiled here as kproxy does. Per-request rows time
``validate_body`` (decode + strict checks; what the filter adds to a Strict POST/PUT) per call,
garbage collector on, one core; p50 and p99 in µs over ``--calls`` calls, the rows taking turns
in five rounds. Peers measured in the same run, on the same bodies:

* ``orjson.loads`` alone: the floor of the orjson path (it has to parse the body);
* the same clean Deployment through the orjson path (the msgspec Structs switched off), through
  the full msgspec Structs (narrowing switched off), and through Structs narrowed by a wider
  Deployment first (one read back from a cluster, with more features: 4.8 KB);
* the apiserver answering the same Strict POST with ``dryRun=All`` (client-side latency): what a
  local Strict answer saves, and the whole cost of letting the apiserver validate.

The machine's load average is printed with the table: the host is shared, so compare rows of one
run (ratios to the floor), not runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from benchmarks.lib.cluster import control_plane
from benchmarks.lib.common import log
from benchmarks.lib.stats import percentile
from kproxy.filters.validation.messages import create_update_error
from kproxy.filters.validation.schemanodes import load_group_version
from kproxy.filters.validation.structs import compile_fast
from kproxy.filters.validation.validator import validate_body
from kproxy.localcluster import envtest

GROUP = "bench.kproxy.test"
NAMESPACE = "default"
ROUNDS = 5


def deployment() -> dict[str, Any]:
    """A realistic ~3 KB Deployment: two containers with env, probes, resources, security."""
    container = {
        "name": "app",
        "image": "registry.example.com/team/app:1.2.3",
        "imagePullPolicy": "IfNotPresent",
        "ports": [
            {"name": "http", "containerPort": 8080, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 9090},
        ],
        "env": [{"name": f"ENV_{i}", "value": f"value-{i}"} for i in range(8)]
        + [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}, "requests": {"cpu": "100m", "memory": "128Mi"}},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "initialDelaySeconds": 5},
        "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 5},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}, {"name": "data", "mountPath": "/data"}],
        "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
    }
    pod = {
        "serviceAccountName": "web",
        "containers": [container, dict(container, name="sidecar")],
        "volumes": [{"name": "config", "configMap": {"name": "web-config"}}, {"name": "data", "emptyDir": {}}],
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "web", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "web"}},
                                                "topologyKey": "kubernetes.io/hostname"}}]}},
    }  # fmt: skip
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web", "tier": "frontend"}, "annotations": {"owner": "payments"}},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "template": {"metadata": {"labels": {"app": "web", "tier": "frontend"}}, "spec": pod},
        },
    }


def wide_deployment() -> dict[str, Any]:
    """The benchmark Deployment as read back from a cluster (server defaults, status), with more
    features: what narrowed Structs learn from a varied workload."""
    # fmt: off
    d = deployment()
    d["metadata"].update({
        "namespace": "default", "generation": 2, "uid": "5b7c", "resourceVersion": "1", "finalizers": ["a"],
        "creationTimestamp": "2024-01-01T00:00:00Z",
        "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u", "controller": True,
                             "blockOwnerDeletion": True}],
    })
    d["spec"].update({"progressDeadlineSeconds": 600, "revisionHistoryLimit": 10, "minReadySeconds": 5,
                      "paused": False})
    pod = d["spec"]["template"]["spec"]
    pod.update({
        "dnsPolicy": "ClusterFirst", "restartPolicy": "Always", "schedulerName": "default-scheduler",
        "securityContext": {"runAsUser": 1000, "fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": 30, "nodeSelector": {"disk": "ssd"}, "imagePullSecrets": [{"name": "r"}],
        "priorityClassName": "high", "hostNetwork": False,
        "initContainers": [{"name": "init", "image": "busybox", "command": ["sh", "-c", "true"], "args": ["x"],
                            "workingDir": "/"}],
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                                       "labelSelector": {"matchLabels": {"app": "web"}}}],
    })
    pod["containers"][0].update({
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File", "stdin": False,
        "tty": False, "envFrom": [{"configMapRef": {"name": "c"}}, {"secretRef": {"name": "s"}}],
        "startupProbe": {"exec": {"command": ["true"]}, "failureThreshold": 30, "timeoutSeconds": 1,
                         "successThreshold": 1},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
    })
    pod["volumes"] += [
        {"name": "s", "secret": {"secretName": "s", "defaultMode": 420, "items": [{"key": "k", "path": "p"}]}},
        {"name": "pvc", "persistentVolumeClaim": {"claimName": "c", "readOnly": True}},
        {"name": "h", "hostPath": {"path": "/x", "type": "Directory"}},
        {"name": "pr", "projected": {"sources": [
            {"serviceAccountToken": {"path": "t", "expirationSeconds": 3600, "audience": "a"}},
            {"downwardAPI": {"items": [{"path": "l", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}},
    ]
    d["status"] = {
        "replicas": 3, "readyReplicas": 3, "availableReplicas": 3, "updatedReplicas": 3, "observedGeneration": 2,
        "conditions": [{"type": "Available", "status": "True", "reason": "r", "message": "m",
                        "lastTransitionTime": "2024-01-01T00:00:00Z", "lastUpdateTime": "2024-01-01T00:00:00Z"}],
    }
    # fmt: on
    return d


ITEM_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "weight": {"type": "integer"},
        "port": {"x-kubernetes-int-or-string": True},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "target": {"type": "object", "properties": {"host": {"type": "string"}, "path": {"type": "string"}}},
        "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"routes.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": "routes", "singular": "route", "kind": "Route", "listKind": "RouteList"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {
                "items": {"type": "array", "items": ITEM_SCHEMA}, "owner": {"type": "string"}}}}}}}],
    },
}  # fmt: skip


def route(n: int = 170) -> dict[str, Any]:
    """A ~30 KB custom resource."""
    items = [
        {"name": f"route-{i}", "weight": i, "port": "http" if i % 2 else 8080, "labels": {"team": "a", "env": "prod"},
         "target": {"host": f"svc-{i}.example.svc", "path": f"/api/v{i % 3}"}, "extra": {"note": "x"}}
        for i in range(n)
    ]  # fmt: skip
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "Route",
        "metadata": {"name": "r"},
        "spec": {"owner": "t", "items": items},
    }


def sample(fn: Callable[[], object], calls: int) -> list[int]:
    """Nanoseconds of each of ``calls`` calls of ``fn`` (after a short warm-up)."""
    for _ in range(min(200, calls)):
        fn()
    samples = []
    clock = time.perf_counter_ns
    for _ in range(calls):
        t = clock()
        fn()
        samples.append(clock() - t)
    return samples


def percentiles(samples: list[int]) -> tuple[float, float]:
    """p50 and p99 in µs of ``samples`` in ns."""
    return percentile(samples, 50) / 1000, percentile(samples, 99) / 1000


async def fetch_schemas(info: envtest.ControlPlaneInfo) -> dict[str, Any]:
    ssl = info.ssl_context()
    out: dict[str, Any] = {}
    async with aiohttp.ClientSession(base_url=info.server, connector=aiohttp.TCPConnector(ssl=ssl)) as s:
        async with s.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=CRD) as r:
            if r.status not in (201, 409):
                raise SystemExit(f"creating the benchmark CRD: {r.status} {await r.text()}")
        for _ in range(100):  # the CRD's document appears shortly after it is established
            t = time.perf_counter()
            async with s.get("/openapi/v3") as r:
                index = orjson.loads(await r.read())
            out["index_ms"] = (time.perf_counter() - t) * 1000
            if f"apis/{GROUP}/v1" in index["paths"]:
                break
            await asyncio.sleep(0.2)
        for gv in ("apis/apps/v1", f"apis/{GROUP}/v1"):
            t = time.perf_counter()
            async with s.get(index["paths"][gv]["serverRelativeURL"]) as r:
                raw = await r.read()
            out[gv] = (raw, (time.perf_counter() - t) * 1000)
        # The peer: the apiserver answering a Strict POST itself (dry run), client-side latency.
        body = orjson.dumps({**deployment(), "bogus": 1})
        url = f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments?dryRun=All&fieldValidation=Strict"
        lat = []
        for _ in range(300):
            t = time.perf_counter()
            async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                await r.read()
                assert r.status == 400
            lat.append((time.perf_counter() - t) * 1e6)
        out["apiserver_us"] = statistics.median(lat)
    return out


def measure(args: argparse.Namespace) -> list[str]:
    with control_plane(args.envtest_dir) as info:
        fetched = asyncio.run(fetch_schemas(info))
    lines = [
        f"validation benchmark: python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average before {os.getloadavg()[0]:.2f}; {args.calls} calls per row",
        "",
        "Schema load (kproxy does this once per group-version document hash):",
        "",
        "| document | bytes | fetch ms | parse + index ms | compile kind ms |",
        "| --- | --- | --- | --- | --- |",
        f"| /openapi/v3 index | | {fetched['index_ms']:.1f} | | |",
    ]
    roots = {}
    for gv, resource in (("apis/apps/v1", "deployments"), (f"apis/{GROUP}/v1", "routes")):
        raw, fetch_ms = fetched[gv]
        t = time.perf_counter()
        doc = load_group_version(orjson.loads(raw))
        parse_ms = (time.perf_counter() - t) * 1000
        endpoint = doc.endpoint(resource)
        assert endpoint is not None
        t = time.perf_counter()
        root = doc.node(endpoint.ref)
        compile_ms = (time.perf_counter() - t) * 1000
        roots[resource] = (root, doc)
        lines.append(f"| {gv} ({endpoint.kind}) | {len(raw)} | {fetch_ms:.1f} | {parse_ms:.1f} | {compile_ms:.1f} |")

    d_root, _ = roots["deployments"]
    # The same schema with the msgspec path switched off: the orjson path it replaced, measured
    # in the same run (``validate_body`` falls back to it for every body not proven clean).
    o_doc = load_group_version(orjson.loads(fetched["apis/apps/v1"][0]))
    o_endpoint = o_doc.endpoint("deployments")
    assert o_endpoint is not None
    o_root = o_doc.node(o_endpoint.ref)
    o_root.fast = lambda _data: None

    def fresh_root() -> Any:
        doc = load_group_version(orjson.loads(fetched["apis/apps/v1"][0]))
        endpoint = doc.endpoint("deployments")
        assert endpoint is not None
        return doc.node(endpoint.ref)

    # The full Structs (narrowing switched off), and Structs narrowed by a wider Deployment first.
    f_root, w_root = fresh_root(), fresh_root()
    f_root.fast = compile_fast(f_root, max_lessons=0)
    r_root, r_doc = roots["routes"]
    meta = r_doc.object_meta()
    dep = orjson.dumps(deployment())
    dep_unknown = orjson.dumps({**deployment(), "bogus": 1})
    dep_dup = dep.replace(b'"replicas":3', b'"replicas":3,"replicas":3')
    dep_spaced = json.dumps(deployment()).encode()  # the Python client's json.dumps: ", " and ": "
    dep_yaml = json.dumps(deployment(), indent=2).encode()  # JSON is YAML: same content, YAML decoder
    cr = orjson.dumps(route())
    cr_unknown = cr.replace(b'"owner":"t"', b'"owner":"t","ownr":"t"')
    assert validate_body(dep, "application/json", d_root).clean and d_root.fast and d_root.fast(dep)
    assert validate_body(orjson.dumps(wide_deployment()), "application/json", w_root).clean
    assert validate_body(dep, "application/json", w_root).clean and w_root.fast and w_root.fast(dep)
    assert validate_body(dep, "application/json", f_root).clean and f_root.fast and f_root.fast(dep)
    assert validate_body(dep_spaced, "application/json", d_root).clean and d_root.fast(dep_spaced)
    assert validate_body(cr, "application/json", r_root, custom=True, meta=meta).clean
    assert validate_body(dep_unknown, "application/json", d_root).errors == ['unknown field "bogus"']
    assert validate_body(cr_unknown, "application/json", r_root, custom=True, meta=meta).errors

    def strict_answer(body: bytes) -> Callable[[], object]:
        def run() -> object:
            out = validate_body(body, "application/json", d_root)
            return create_update_error("Deployment", "v1", out).body()

        return run

    rows: list[tuple[str, int, Callable[[], object]]] = [
        ("orjson.loads, Deployment (floor)", len(dep), lambda: orjson.loads(dep)),
        ("Deployment, clean", len(dep), lambda: validate_body(dep, "application/json", d_root)),
        ("Deployment, clean, Structs narrowed by a wider Deployment first", len(dep),
         lambda: validate_body(dep, "application/json", w_root)),
        ("Deployment, clean, full Structs (narrowing off)", len(dep),
         lambda: validate_body(dep, "application/json", f_root)),
        ("Deployment, clean, orjson path (msgspec off)", len(dep),
         lambda: validate_body(dep, "application/json", o_root)),
        ("Deployment, clean, with spaces (colon count)", len(dep_spaced),
         lambda: validate_body(dep_spaced, "application/json", d_root)),
        ("Deployment, unknown field + Strict 400 body", len(dep_unknown), strict_answer(dep_unknown)),
        ("Deployment, duplicate field (exact decoder)", len(dep_dup),
         lambda: validate_body(dep_dup, "application/json", d_root)),
        ("Deployment as YAML, clean", len(dep_yaml), lambda: validate_body(dep_yaml, "application/yaml", d_root)),
        ("orjson.loads, CR (floor)", len(cr), lambda: orjson.loads(cr)),
        ("CR, clean", len(cr), lambda: validate_body(cr, "application/json", r_root, custom=True, meta=meta)),
        ("CR, unknown field", len(cr_unknown),
         lambda: validate_body(cr_unknown, "application/json", r_root, custom=True, meta=meta)),
    ]  # fmt: skip
    lines += [
        "",
        "Per request (one core, gc on):",
        "",
        "| body | bytes | p50 µs | p99 µs |",
        "| --- | --- | --- | --- |",
    ]
    gc.collect()
    # The rows take turns, ROUNDS times: a burst of load from the other tenants of the host then
    # lands on every row alike instead of on one of them.
    samples: dict[str, list[int]] = {name: [] for name, _, _ in rows}
    for _ in range(ROUNDS):
        for name, size, fn in rows:
            calls = args.calls if size < 10_000 and "YAML" not in name else max(500, args.calls // 20)
            samples[name] += sample(fn, max(1, calls // ROUNDS))
    for name, size, _ in rows:
        p50, p99 = percentiles(samples[name])
        lines.append(f"| {name} | {size} | {p50:.1f} | {p99:.1f} |")
        log(lines[-1])
    lines.append(
        f"| peer: the apiserver answering the Strict POST (dry run, client latency) | {len(dep_unknown)} "
        f"| {fetched['apiserver_us']:.0f} | |"
    )
    lines.append("")
    lines.append(f"load average after: {os.getloadavg()[0]:.2f}")
    return lines


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envtest-dir", type=Path, default=None, help="a running control plane to use")
    p.add_argument("--calls", type=int, default=20000, help="calls per row (a twentieth for 30 KB and YAML bodies)")
    p.add_argument("--output", type=Path, default=None, help="also write the table here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    lines = measure(args)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
