"""kproxy's /metrics follows the Prometheus and apiserver conventions, scraped from a real
`kproxy run` with every filter: the ``process_*`` and ``python_*`` collectors a client's default
registry has, ``kproxy_build_info``, no ``_created`` series, ``apiserver_request_total``'s label
names (``group``, ``resource``, ``subresource``), no resource-version arithmetic, and every
exported kproxy metric documented. And who answered each request (the watch cache, a filter, or
the upstream) is in the access log and the request metrics, checked with kubectl."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

import kproxy
from kproxy.core.metricnames import RENAMED
from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "kproxy-dashboard.json"
REQUEST_LABELS = {"verb", "group", "resource", "subresource", "code", "answered_by"}
BAD_CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bad\nbogus: 1\ndata:\n  a: '1'\n"


def all_filters(strict_namespace: str) -> list[dict[str, Any]]:
    return [
        {"name": "compression"},
        {"name": "watchcache", "resources": ["configmaps"]},
        {"name": "dryrun", "rules": [{"name": "dry", "match": {"namespaces": ["dry-never-*"]}, "action": "enforce"}]},
        {
            "name": "validation",
            "rules": [{"name": "strict", "match": {"namespaces": [strict_namespace]}, "level": "Strict"}],
        },
        {"name": "transcode", "upstream": "protobuf"},
    ]


def family(series: str) -> str:
    """A series' family name (a counter's family has no ``_total``; no family has ``_created``)."""
    for suffix in ("_bucket", "_sum", "_count", "_total"):
        if series.endswith(suffix):
            return series[: -len(suffix)]
    return series


def samples(rp: RunningProxy, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (s.labels, s.value) for f in text_string_to_metric_families(rp.metrics()) for s in f.samples if s.name == name
    ]


def counted(rp: RunningProxy, **labels: str) -> float:
    return sum(v for got, v in samples(rp, "kproxy_requests_total") if all(got.get(k) == x for k, x in labels.items()))


def access_lines(rp: RunningProxy) -> list[dict[str, Any]]:
    out = []
    for line in rp.log_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("logger") == "kproxy.access":
            out.append(rec)
    return out


@pytest.fixture
def full(proxy_factory: Callable[..., RunningProxy], namespace: str) -> RunningProxy:
    rp = proxy_factory(extra={"filters": all_filters(namespace)})
    # The cache is filled and discovery (the resource labels) read.
    eventually(lambda: any(v >= 0 for _, v in samples(rp, "kproxy_watchcache_objects")), 30, "the configmaps cache")
    eventually(
        lambda: (
            rp.get(f"/api/v1/namespaces/{namespace}/configmaps")[0] == 200 and counted(rp, resource="configmaps") > 0
        ),
        30,
        "configmaps to be labelled as itself",
    )
    return rp


def test_metrics_follow_prometheus_and_apiserver_conventions(full: RunningProxy, namespace: str) -> None:
    rp = full
    assert rp.get(f"/apis/apps/v1/namespaces/{namespace}/deployments")[0] == 200
    assert rp.get(f"/api/v1/namespaces/{namespace}/pods/nope/status")[0] == 404
    assert rp.get(f"/api/v1/namespaces/{namespace}/pods/nope/bogussub")[0] == 404
    assert rp.get(f"/api/v1/namespaces/{namespace}/r4nd0ms")[0] == 404
    assert rp.get("/version")[0] == 200
    text = rp.metrics()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    names = {s.name for f in families.values() for s in f.samples}

    # The default collectors of a Prometheus client, and the build info.
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} <= names
    assert {"python_info", "python_gc_collections_total"} <= names
    (build,) = families["kproxy_build_info"].samples
    assert build.value == 1 and build.labels["version"] == kproxy.__version__
    # No _created series (Prometheus reads start times from the counter resets, not from these).
    assert not [n for n in names if n.endswith("_created")]
    # Counters end in _total; every name is kproxy's, the process's or Python's.
    for name, fam in families.items():
        assert name.startswith(("kproxy_", "process_", "python_")), name
        if fam.type == "counter":
            assert all(s.name.endswith("_total") for s in fam.samples), name
    assert "kproxy_watchcache_resource_version_lag" not in families
    # One naming scheme (docs/monitoring.md): a filter's metrics are kproxy_<filter>_..., its bytes
    # _input_bytes/_output_bytes. The names it replaced are exported for one release too, counting
    # the same as the new ones.
    current = {n for n in names if n.startswith("kproxy_") and n not in RENAMED}
    assert not [n for n in current if re.search(r"_(in|out)_bytes", n) or n.startswith("kproxy_transcoded_")]
    assert {"kproxy_transcode_input_bytes_total", "kproxy_transcode_output_bytes_total"} <= names
    assert any(s.labels.get("shape") == "list" for s in families["kproxy_transcode_responses"].samples)
    for old, new in RENAMED.items():
        if new in names:
            assert sorted(map(repr, samples(rp, old))) == sorted(map(repr, samples(rp, new))), old
            assert families[family(old)].documentation.startswith("Deprecated: renamed"), old
    progress = [v for _, v in samples(rp, "kproxy_watchcache_last_progress_timestamp_seconds")]
    assert progress and all(abs(time.time() - v) < 600 for v in progress), progress

    # apiserver_request_total's label names, bounded by discovery.
    series = samples(rp, "kproxy_requests_total")
    assert all(set(labels) == REQUEST_LABELS for labels, _ in series)
    seen = {(lb["group"], lb["resource"], lb["subresource"]) for lb, _ in series}
    assert ("apps", "deployments", "") in seen
    assert ("", "pods", "status") in seen
    assert ("", "pods", "other") in seen  # a subresource pods do not have
    assert ("", "other", "") in seen  # a resource the apiserver does not serve
    assert ("", "", "") in seen  # /version
    assert not [s for s in seen if "r4nd0ms" in s or "bogussub" in s]
    latency = samples(rp, "kproxy_request_duration_seconds_count")
    assert latency and all(set(labels) == REQUEST_LABELS - {"code"} for labels, _ in latency)

    # Every kproxy metric is documented, and every one the dashboard queries is exported.
    docs = "\n".join(p.read_text() for p in [ROOT / "docs" / "monitoring.md", *(ROOT / "docs" / "using").glob("*.md")])
    undocumented = sorted(n for n in families if n.startswith("kproxy_") and n not in docs)
    assert undocumented == [], undocumented
    dash = json.loads(DASHBOARD.read_text())
    queried = {
        family(n)
        for p in dash["panels"]
        for t in p.get("targets", [])
        for n in re.findall(r"\b((?:kproxy|process)_\w+)", t["expr"])
    }
    assert queried and sorted(queried - {family(n) for n in set(families) | names}) == []


def test_who_answered_is_in_the_access_log_and_metrics(
    full: RunningProxy, namespace: str, kubectl: Kubectl, control_plane: ControlPlaneInfo
) -> None:
    rp = full
    kubectl(["create", "configmap", "seen", "-n", namespace, "--from-literal=a=1"], kubeconfig=rp.kubeconfig)
    before = {who: counted(rp, resource="configmaps", answered_by=who) for who in ("cache", "upstream", "filter")}
    logged = len(access_lines(rp))

    # A JSON list: the watch cache answers it. The plain (Table) form goes upstream.
    out = kubectl(["get", "configmaps", "-n", namespace, "-o", "json"], kubeconfig=rp.kubeconfig).stdout
    assert "seen" in [i["metadata"]["name"] for i in json.loads(out)["items"]]
    table = kubectl(["get", "configmaps", "-n", namespace], kubeconfig=rp.kubeconfig).stdout
    assert table.split()[:3] == ["NAME", "DATA", "AGE"] and "seen" in table
    # The JSON forms docs/using/watchcache.md shows instead of the Table: the cache answers them.
    columns = ["get", "configmaps", "-n", namespace, "-o", "custom-columns=NAME:.metadata.name,A:.data.a"]
    rows = [line.split() for line in kubectl(columns, kubeconfig=rp.kubeconfig).stdout.splitlines()]
    assert rows[0] == ["NAME", "A"] and ["seen", "1"] in rows, rows
    client_side = kubectl(
        ["get", "configmaps", "-n", namespace, "--server-print=false"], kubeconfig=rp.kubeconfig
    ).stdout
    assert client_side.split()[:2] == ["NAME", "AGE"] and "seen" in client_side
    # A Strict validation failure: the validation filter answered, nothing reached the apiserver.
    bad = kubectl(
        ["create", "--validate=false", "-f", "-", "-n", namespace],
        kubeconfig=rp.kubeconfig,
        input=BAD_CONFIGMAP,
        check=False,
    )
    assert bad.returncode == 1 and "unknown field" in bad.stderr, bad.stderr
    assert kubectl(["get", "configmap", "bad", "-n", namespace], check=False).returncode == 1  # at the apiserver

    path = f"/api/v1/namespaces/{namespace}/configmaps"
    eventually(lambda: len(access_lines(rp)) >= logged + 5, 10, "the access log lines")
    lines = [r for r in access_lines(rp)[logged:] if r.get("resource") == "configmaps" and path in r.get("msg", "")]
    whos = [(r["verb"], r["answered_by"], r["msg"].rsplit(" ", 1)[-1]) for r in lines]
    # In order: -o json, the Table, custom-columns, --server-print=false, the Strict failure.
    assert [w for w in whos if w[0] == "list"] == [
        ("list", "cache", "200"),
        ("list", "upstream", "200"),
        ("list", "cache", "200"),
        ("list", "cache", "200"),
    ], whos
    assert ("create", "filter", "400") in whos, whos
    after = {who: counted(rp, resource="configmaps", answered_by=who) for who in before}
    assert after["cache"] - before["cache"] == 3
    assert after["upstream"] - before["upstream"] == 1
    assert after["filter"] - before["filter"] == 1
    assert counted(rp, verb="create", resource="configmaps", code="400", answered_by="filter") == 1


def test_answers_kproxy_gives_itself_are_answered_by_kproxy(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, tmp_path: Path
) -> None:
    """The outage answer for an apiserver kproxy cannot reach, and a body over the limit, were
    written by kproxy, not by the apiserver."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens here now
    kc = yaml.safe_load(control_plane.admin_kubeconfig.read_text())
    kc["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path = tmp_path / "dead.kubeconfig"
    path.write_text(yaml.safe_dump(kc))
    rp = proxy_factory(upstream_kubeconfig=path, ready=False, extra={"max_request_body_bytes": 16})
    assert rp.get("/api/v1/namespaces/default/configmaps")[0] == 429
    req = urllib.request.Request(rp.url + "/api/v1/namespaces/default/configmaps", data=b"{" * 64, method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 413
    eventually(lambda: len(access_lines(rp)) >= 2, 10, "the access log lines")
    assert [(r["verb"], r["answered_by"], r["msg"].rsplit(" ", 1)[-1]) for r in access_lines(rp)] == [
        ("list", "kproxy", "429"),
        ("create", "kproxy", "413"),
    ]
    assert counted(rp, answered_by="kproxy") == 2
    assert counted(rp, answered_by="upstream") == 0
