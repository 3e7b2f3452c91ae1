"""The objects benchmarks measure: small ConfigMaps, realistic pods, and seeding them."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import aiohttp

from benchmarks.lib.common import BenchError, log
from kproxy.localcluster import envtest

# --------------------------------------------------------------------------- ConfigMaps

#: namespace of the small ConfigMaps the request benchmarks GET and LIST
CONFIGMAP_NAMESPACE = "bench"
CONFIGMAPS = 500
GET_NAME = "cm-0001"
DATA_BYTES = 200


def configmap_list(count: int) -> dict[str, Any]:
    rnd = random.Random(42)  # same bytes every run, so every run compresses alike
    items = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{i:04d}", "namespace": CONFIGMAP_NAMESPACE, "labels": {"app": "kproxy-bench"}},
            "data": {"payload": rnd.randbytes(DATA_BYTES // 2).hex()},
        }
        for i in range(count)
    ]
    return {"apiVersion": "v1", "kind": "List", "items": items}


def seed_configmaps(info: envtest.ControlPlaneInfo) -> None:
    """Namespace ``bench`` holding exactly the benchmark's ConfigMaps (recreated when reused)."""
    kubectl = info.kubectl_runner()
    if kubectl.run(["get", "namespace", CONFIGMAP_NAMESPACE], check=False).returncode == 0:
        kubectl.run(["delete", "configmaps", "--all", f"--namespace={CONFIGMAP_NAMESPACE}"], timeout=300)
    else:
        kubectl.run(["create", "namespace", CONFIGMAP_NAMESPACE])
    kubectl.run(["create", "-f", "-"], input=json.dumps(configmap_list(CONFIGMAPS)), timeout=600)


# --------------------------------------------------------------------------- pods

#: namespace of the realistic pods :func:`seed_pods` creates
NAMESPACE = "bench-compress"
IMAGES = ["registry.k8s.io/pause:3.10", "nginx:1.27.3", "quay.io/prometheus/node-exporter:v1.8.2", "redis:7.4.1"]


def pod_manifest(i: int, rnd: random.Random) -> dict[str, Any]:
    """A pod shaped like a real workload's: labels, annotations, two containers with env,
    resources, probes, mounts; the apiserver adds defaults, managedFields and status."""
    app = f"svc-{i % 97:02d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-{rnd.getrandbits(40):010x}-{i:05d}",
            "namespace": NAMESPACE,
            "labels": {
                "app.kubernetes.io/name": app,
                "app.kubernetes.io/part-of": "bench",
                "pod-template-hash": f"{rnd.getrandbits(32):08x}",
                "tier": rnd.choice(["frontend", "backend", "cache"]),
            },
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(9000 + i % 100),
                "kubectl.kubernetes.io/restartedAt": f"2026-11-{1 + i % 20:02d}T10:{i % 60:02d}:00Z",
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": rnd.choice(IMAGES),
                    "args": ["--port=8080", f"--shard={i % 16}", "--log-level=info"],
                    "env": [
                        {"name": "POD_INDEX", "value": str(i)},
                        {"name": "REQUEST_ID_SEED", "value": f"{rnd.getrandbits(64):016x}"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                    "ports": [{"name": "http", "containerPort": 8080}, {"name": "metrics", "containerPort": 9090}],
                    "resources": {
                        "requests": {"cpu": f"{50 + i % 200}m", "memory": f"{64 + i % 256}Mi"},
                        "limits": {"cpu": "1", "memory": "512Mi"},
                    },
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080}, "periodSeconds": 10},
                    "livenessProbe": {"httpGet": {"path": "/livez", "port": 8080}, "failureThreshold": 5},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}],
                },
                {
                    "name": "sidecar",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                },
            ],
            "volumes": [{"name": "config", "configMap": {"name": f"{app}-config"}}],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "bench", "effect": "NoSchedule"}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
        },
    }


def pod_list_like(count: int, seed: int = 1) -> bytes:
    """A PodList body built offline from the same generator (for unit-level codec checks)."""
    rnd = random.Random(seed)
    items = [pod_manifest(i, rnd) for i in range(count)]
    return json.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}).encode()


async def seed_pods(info: envtest.ControlPlaneInfo, count: int, concurrency: int = 32) -> None:
    """``count`` pods in ``bench-compress`` (created concurrently, straight at the apiserver)."""
    ssl_ctx = info.ssl_context()
    async with aiohttp.ClientSession(base_url=info.server, connector=aiohttp.TCPConnector(ssl=ssl_ctx)) as s:
        async with s.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}}) as r:
            if r.status not in (201, 409):
                raise BenchError(f"creating namespace {NAMESPACE}: {r.status} {await r.text()}")
        async with s.get(f"/api/v1/namespaces/{NAMESPACE}/pods", params={"limit": "1"}) as r:
            have = (await r.json())["metadata"].get("remainingItemCount", 0) + 1 if r.status == 200 else 0
        if have >= count:
            log(f"{NAMESPACE} already holds {have} pods")
            return
        rnd = random.Random(7)
        manifests = [pod_manifest(i, rnd) for i in range(count)]
        sem = asyncio.Semaphore(concurrency)

        async def create(m: dict[str, Any]) -> None:
            async with sem, s.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=m) as r:
                if r.status not in (201, 409):
                    raise BenchError(f"creating pod: {r.status} {await r.text()}")

        t = time.monotonic()
        await asyncio.gather(*(create(m) for m in manifests))
        log(f"created {count} pods in {time.monotonic() - t:.1f}s")


def pod_manifests(namespace: str, count: int, seed: int = 7) -> list[dict[str, Any]]:
    """``count`` of :func:`pod_manifest`'s realistic pods (~3 KB of JSON as created) in ``namespace``."""
    rnd = random.Random(seed)
    manifests = []
    for i in range(count):
        m = pod_manifest(i, rnd)
        m["metadata"]["namespace"] = namespace
        manifests.append(m)
    return manifests
