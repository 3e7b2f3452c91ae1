"""The garbage-collector policy of a real `kproxy run` (kproxy.gctuning), read from its /metrics:
the start-up heap is frozen out of every later collection, every collection's pause is exported
by generation, a reload returns the frozen objects to the collector, and a YAML LIST that the
watch cache builds whole (thousands of Python objects alive at once) runs without a full
collection, where without the policy it triggers several."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp
import yaml
from test_watchcache_outage import metric

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

CONFIGMAPS = 1500
CACHE_CONFIGMAPS = {"filters": [{"name": "watchcache", "resources": ["configmaps"]}]}


def _configmap(ns: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": f"gc-{i:04d}", "namespace": ns, "labels": {"app": "gc", "shard": str(i % 7)}},
        "data": {f"key-{k}": f"value {i} {k}" for k in range(8)},
    }


async def _create(cp: ControlPlaneInfo, ns: str, count: int) -> None:
    conn = aiohttp.TCPConnector(ssl=cp.ssl_context(), limit=16)
    async with aiohttp.ClientSession(connector=conn) as s:
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem, s.post(f"{cp.server}/api/v1/namespaces/{ns}/configmaps", json=_configmap(ns, i)) as r:
                assert r.status == 201, await r.text()

        await asyncio.gather(*(one(i) for i in range(count)))


def _yaml_list(rp: RunningProxy, ns: str) -> Any:
    req = urllib.request.Request(
        f"{rp.url}/api/v1/namespaces/{ns}/configmaps?resourceVersion=0", headers={"Accept": "application/yaml"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "application/yaml"
        return yaml.safe_load(r.read())


def _full_collections(rp: RunningProxy) -> float:
    return metric(rp, "kproxy_gc_pause_seconds_count", generation="2")


async def test_start_up_heap_frozen_and_pauses_exported(proxy_factory: Callable[..., RunningProxy]) -> None:
    rp = proxy_factory()
    assert rp.get("/version")[0] == 200
    # Modules, protobuf descriptors, config, filters: tens of thousands of objects.
    assert metric(rp, "kproxy_gc_frozen_objects") > 10_000
    text = rp.metrics()
    for generation in "012":
        assert f'kproxy_gc_pause_seconds_count{{generation="{generation}"}}' in text
    # `kproxy run` holds collection off while it builds the server: it runs again once started.
    # Young collections follow objects that stay (requests free what they make): connections
    # held open make some.
    host, port = urllib.parse.urlsplit(rp.url).hostname, urllib.parse.urlsplit(rp.url).port
    held = []
    try:
        for _ in range(300):
            held.append(socket.create_connection((host, port), timeout=10))
        eventually(
            lambda: metric(rp, "kproxy_gc_pause_seconds_count", generation="0") > 0,
            30,
            "a young-generation collection after the start",
        )
    finally:
        for sock in held:
            sock.close()
    # A reload replaces the filters frozen with the rest: everything frozen is collectable again.
    rp.proc.send_signal(signal.SIGHUP)
    eventually(lambda: metric(rp, "kproxy_config_reloads_total", result="success") == 1, 30, "the reload")
    assert metric(rp, "kproxy_gc_frozen_objects") == 0
    assert rp.get("/version")[0] == 200


async def test_yaml_list_from_the_cache_runs_no_full_collection(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    await _create(control_plane, namespace, CONFIGMAPS)
    rp = proxy_factory(extra=CACHE_CONFIGMAPS)

    def cached() -> bool:
        status, body = rp.get(f"/api/v1/namespaces/{namespace}/configmaps?resourceVersion=0")
        served = metric(rp, "kproxy_watchcache_reads_total", resource="configmaps", verb="list", served="cache")
        return status == 200 and served > 0 and len(json.loads(body)["items"]) == CONFIGMAPS

    eventually(cached, 60, "the cache to serve the namespace's configmaps")
    before = _full_collections(rp)
    served = metric(rp, "kproxy_watchcache_reads_total", resource="configmaps", verb="list", served="cache")
    doc = _yaml_list(rp, namespace)
    assert metric(rp, "kproxy_watchcache_reads_total", resource="configmaps", verb="list", served="cache") > served
    assert doc["kind"] == "ConfigMapList" and len(doc["items"]) == CONFIGMAPS
    assert doc["items"][5]["data"]["key-3"] == "value 5 3"
    assert _full_collections(rp) == before
