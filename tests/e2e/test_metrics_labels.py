"""Metric labels come from bounded sets, whatever callers send (kproxy/server/metrics.py).

Requests naming random resources, and methods no verb stands for, are counted under ``other``
(as the apiserver counts only on the routes it installed, and ``cleanVerb`` reports unknown
verbs as ``other``): /metrics stays small and quick to scrape, and the resources the apiserver
serves (read from its discovery) keep their own labels.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

RANDOM_REQUESTS = 2000


def _series(proxy: RunningProxy, name: str) -> list[dict[str, str]]:
    return [
        sample.labels
        for family in text_string_to_metric_families(proxy.metrics())
        for sample in family.samples
        if sample.name == name
    ]


def _labels(proxy: RunningProxy, label: str) -> set[str]:
    return {s[label] for s in _series(proxy, "kproxy_requests_total")}


async def _send(proxy: RunningProxy, requests: list[tuple[str, str]], concurrency: int = 32) -> list[int]:
    queue = list(requests)
    codes: list[int] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue:
            method, path = queue.pop()
            async with session.request(method, proxy.url + path) as resp:
                await resp.read()
                codes.append(resp.status)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return codes


def _scrape(proxy: RunningProxy) -> tuple[int, float]:
    started = time.perf_counter()
    status, body = proxy.get("/metrics", admin=True)
    assert status == 200
    return len(body), time.perf_counter() - started


def test_random_resource_names_and_methods_leave_metrics_small(
    proxy_factory: Callable[..., RunningProxy], namespace: str
) -> None:
    proxy = proxy_factory()
    real = f"/api/v1/namespaces/{namespace}/configmaps"
    # Discovery is read in the background once kproxy starts: the real resource gets its label.
    eventually(
        lambda: proxy.get(real)[0] == 200 and "configmaps" in _labels(proxy, "resource"),
        20,
        "configmaps to be labelled as itself",
    )
    size_before, _ = _scrape(proxy)

    randoms = [
        ("GET", f"/api/v1/namespaces/{namespace}/r{secrets.token_hex(6)}") for _ in range(RANDOM_REQUESTS // 2)
    ] + [
        ("GET", f"/apis/g{secrets.token_hex(4)}.example/v1/x{secrets.token_hex(6)}")
        for _ in range(RANDOM_REQUESTS // 2)
    ]
    methods = [(m, real) for m in ("PROPFIND", "MKCOL", "LOCK", "PURGE", "SEARCH")]
    codes = asyncio.run(_send(proxy, randoms + methods))
    assert len(codes) == len(randoms) + len(methods)
    assert proxy.get(real)[0] == 200
    assert proxy.get(f"/apis/apps/v1/namespaces/{namespace}/deployments")[0] == 200

    size_after, scrape_seconds = _scrape(proxy)
    print(
        f"/metrics {size_before} -> {size_after} bytes after {RANDOM_REQUESTS} random resources; "
        f"scrape {scrape_seconds * 1000:.1f} ms"
    )
    assert size_after - size_before < 20_000, (size_before, size_after)
    assert len(_series(proxy, "kproxy_requests_total")) < 30
    resources = _labels(proxy, "resource")
    verbs = _labels(proxy, "verb")
    assert {"configmaps", "deployments", "other"} <= resources
    assert {"", "apps"} == _labels(proxy, "group")
    assert len(resources) <= 6, resources
    assert verbs <= {"get", "list", "watch", "create", "update", "patch", "delete", "other"}, verbs
    assert "other" in verbs
    others = sum(
        sample.value
        for family in text_string_to_metric_families(proxy.metrics())
        for sample in family.samples
        if sample.name == "kproxy_requests_total" and sample.labels["resource"] == "other"
    )
    assert others >= RANDOM_REQUESTS
