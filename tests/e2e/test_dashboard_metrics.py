"""Every metric the Grafana dashboard queries is one a running kproxy exports (scraped from a
real `kproxy run` with every built-in filter, after some traffic), so a renamed metric breaks
this test instead of silently emptying a panel."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from kproxy.testing.proxyproc import RunningProxy

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kproxy-dashboard.json"
SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def family(series: str) -> str:
    for suffix in SUFFIXES:
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


def test_dashboard_queries_only_exported_metrics(proxy_factory: Callable[..., RunningProxy], namespace: str) -> None:
    filters = [
        {"name": "compression"},
        {"name": "watchcache", "resources": ["configmaps"]},
        {"name": "dryrun", "rules": [{"name": "dry", "match": {"namespaces": ["dry-never-*"]}, "action": "enforce"}]},
        {"name": "validation", "rules": [{"name": "warn", "level": "Warn"}]},
        {"name": "transcode", "upstream": "protobuf"},
    ]
    rp = proxy_factory(extra={"filters": filters})
    for _ in range(3):
        assert rp.get(f"/api/v1/namespaces/{namespace}/configmaps")[0] == 200
    exported = {family(name) for name in re.findall(r"^# TYPE (\w+) ", rp.metrics(), re.MULTILINE)}
    assert "kproxy_requests" in exported
    dash = json.loads(DASHBOARD.read_text())
    queried = {
        family(name)
        for panel in dash["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"\b(kproxy_\w+)", target["expr"])
    }
    assert queried, "the dashboard queries no kproxy metric"
    assert sorted(queried - exported) == []
