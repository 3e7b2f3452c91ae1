"""The compression filter measured against the kube-apiserver's own gzip, in one run.

    python -m benchmarks.compression [--envtest-dir DIR] [--pods 5000] [--updates 1000] [--output FILE]

On the local control plane, in namespace ``bench-compress``, with realistic pods (~3 KB of JSON
each as the apiserver returns them, managedFields included; they stay Pending, there is no
scheduler):

* LIST of every pod (a) straight from the apiserver with ``Accept-Encoding: gzip`` (its own gzip,
  level 1), (b) through kproxy with gzip, (c) through kproxy with zstd, (d) through kproxy with
  no compression: bytes on the wire, client-side latency, kproxy CPU per response; each body is
  decoded and checked against the uncompressed list (same items).
* a watch on the namespace while ``--updates`` pod updates are written, through kproxy without
  and with watch compression (``Accept-Encoding: gzip`` and ``zstd``): bytes per event and
  kproxy CPU per event per watcher (``--watchers`` watchers at once).
* the codecs themselves on the list body (MB/s of input, ratio), which is how the default
  levels and threshold were chosen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.run import BenchError, Process, control_plane, http_status, kproxy_argv, log, work_dir
from kproxy.testing import envtest
from kproxy.testing.processes import free_ports

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


# --------------------------------------------------------------------------- seeding


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
