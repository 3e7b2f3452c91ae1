"""A watch-cache resource the apiserver does not serve (``pod`` for ``pods``) is said once, with
the near miss, while kproxy keeps looking for it (a custom resource may be installed later)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy


def records(rp: RunningProxy) -> list[dict[str, Any]]:
    out = []
    for line in rp.log_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def test_a_resource_not_served_is_warned_once_naming_the_near_miss(
    proxy_factory: Callable[..., RunningProxy], namespace: str
) -> None:
    rp = proxy_factory(
        extra={"log": {"level": "debug"}, "filters": [{"name": "watchcache", "resources": ["pod", "configmaps"]}]}
    )

    def retries() -> int:
        return sum(1 for r in records(rp) if str(r.get("msg", "")).startswith("watchcache: still not served"))

    # Two more reads of discovery after the first that lacked it: still one warning.
    eventually(lambda: retries() >= 2, 30, "two more reads of discovery")
    warnings = [r for r in records(rp) if r.get("level") == "warning" and "watchcache" in str(r.get("msg", ""))]
    assert [w["msg"] for w in warnings] == [
        'watchcache: resources: "pod" (did you mean "pods"?) not served by the apiserver: not cached; '
        "kproxy keeps looking (a custom resource is cached once its definition is installed)"
    ]
    # The other resource is cached meanwhile.
    status, _ = rp.get(f"/api/v1/namespaces/{namespace}/configmaps")
    assert status == 200
    reads = [
        line
        for line in rp.metrics().splitlines()
        if line.startswith("kproxy_watchcache_reads_total{") and 'resource="configmaps"' in line
    ]
    assert any('served="cache"' in line for line in reads), reads
