"""Consistent reads from the watch cache across a slow link: any number arriving together cost at
most two upstream requests (one freshness probe in flight and the one they share after it), and
the pages after a consistent list's first cost none; each read still sees a write made just before
it, and the pages are the apiserver's.

kproxy caches limitranges and reaches the apiserver through toxiproxy adding 60 ms each way
(``kproxy.testing.toxiproxy``), so readers sent together arrive well within one round trip. The
requests are counted at the apiserver: ``apiserver_request_total`` for limitranges, read once
every probe has ended (``apiserver_longrunning_requests`` back to what it was before them).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy
from kproxy.testing.toxiproxy import Link, Toxiproxy

LINK = Link("probes", 120, None)  # 60 ms each way
READERS = 20


@pytest.fixture(scope="module")
def toxi(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Toxiproxy]:
    t = Toxiproxy(tmp_path_factory.mktemp("toxiproxy") / "toxiproxy.log")
    yield t
    t.stop()


@pytest.fixture(scope="module")
def far(
    control_plane: ControlPlaneInfo, toxi: Toxiproxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("kp-probes")
    kubeconfig = toxi.kubeconfig_through(
        "probes", control_plane.admin_kubeconfig, control_plane.apiserver_port, LINK, tmp / "far.kubeconfig"
    )
    chain = {"filters": [{"name": "watchcache", "resources": ["limitranges"]}]}
    rp = start_proxy(tmp, kubeconfig, extra=chain, token="ignored-in-proxy-mode")
    try:
        rp.wait_cached("/api/v1/limitranges", "limitranges")
        yield rp
    finally:
        rp.stop()


@pytest.fixture
def namespace(control_plane: ControlPlaneInfo) -> Iterator[str]:
    name = f"probes-{int(time.time() * 1000) % 10**8}"
    control_plane.json(
        "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    yield name
    base = f"/api/v1/namespaces/{name}/limitranges"
    control_plane.request("DELETE", base)  # the collection: the session cluster has no namespace controller
    control_plane.request("DELETE", f"/api/v1/namespaces/{name}")


def _create(cp: ControlPlaneInfo, namespace: str, name: str) -> str:
    body = {
        "apiVersion": "v1",
        "kind": "LimitRange",
        "metadata": {"name": name},
        "spec": {"limits": [{"type": "Container", "max": {"cpu": "2"}}]},
    }
    out = cp.json("POST", f"/api/v1/namespaces/{namespace}/limitranges", body)
    return str(out["metadata"]["resourceVersion"])


def _apiserver_counts(cp: ControlPlaneInfo) -> tuple[dict[str, float], float]:
    """limitranges requests of every namespace (the cache's, kproxy's probes: not the apiserver's
    own LimitRanger lookups, in one namespace) the apiserver finished, by verb; and the
    long-running ones open now."""
    code, body = cp.request("GET", "/metrics", accept="text/plain")
    assert code == 200
    done: dict[str, float] = {}
    running = 0.0
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.labels.get("resource") != "limitranges" or s.labels.get("subresource", ""):
                continue
            if s.name == "apiserver_request_total" and s.labels.get("scope") == "cluster":
                done[s.labels["verb"]] = done.get(s.labels["verb"], 0.0) + s.value
            elif s.name == "apiserver_longrunning_requests":
                running += s.value
    return done, running


def _settled(cp: ControlPlaneInfo, running_before: float) -> dict[str, float]:
    """The counts once every probe the reads started has ended at the apiserver."""
    out: dict[str, float] = {}

    def ended() -> bool:
        nonlocal out
        out, running = _apiserver_counts(cp)
        return running <= running_before

    eventually(ended, 30, "the freshness probes to end at the apiserver")
    return out


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as r:
        assert r.status == 200
        return json.loads(r.read())


def _served_from_cache(rp: RunningProxy) -> float:
    total = 0.0
    for family in text_string_to_metric_families(rp.metrics()):
        for s in family.samples:
            labels = s.labels
            if (
                s.name == "kproxy_watchcache_reads_total"
                and labels.get("resource") == "limitranges"
                and labels.get("served") == "cache"
                and labels.get("reason") in ("consistent", "continue")
            ):
                total += s.value
    return total


def test_concurrent_consistent_lists_share_probes(
    control_plane: ControlPlaneInfo, far: RunningProxy, namespace: str
) -> None:
    _create(control_plane, namespace, "first")
    _, running = _apiserver_counts(control_plane)  # the long-running watches without ours
    far.get(f"/api/v1/namespaces/{namespace}/limitranges")  # warm: the connection across the link
    before = _settled(control_plane, running)
    from_cache = _served_from_cache(far)

    rv = _create(control_plane, namespace, "just-before")  # written before any reader starts
    barrier = threading.Barrier(READERS)
    results: list[Any] = [None] * READERS
    took: list[float] = [0.0] * READERS

    def read(i: int) -> None:
        barrier.wait()
        t0 = time.monotonic()
        results[i] = _get(f"{far.url}/api/v1/namespaces/{namespace}/limitranges")
        took[i] = time.monotonic() - t0

    threads = [threading.Thread(target=read, args=(i,)) for i in range(READERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    spent = _delta(_settled(control_plane, running), before)
    direct = control_plane.json("GET", f"/api/v1/namespaces/{namespace}/limitranges")
    want = sorted(i["metadata"]["name"] for i in direct["items"])
    for out in results:
        assert sorted(i["metadata"]["name"] for i in out["items"]) == want == ["first", "just-before"]
        assert int(out["metadata"]["resourceVersion"]) >= int(rv)
    assert _served_from_cache(far) - from_cache == READERS
    # Only the shared freshness probes (a streaming list that matches nothing: the apiserver's
    # WATCH), at most one in flight and one after it; no LIST of the limitranges across the link.
    assert set(spent) <= {"WATCH"}, spent
    assert 1 <= spent.get("WATCH", 0) <= 2, spent
    assert max(took) < 4 * LINK.rtt_ms / 1000 + 0.2, took


def test_paging_a_consistent_list_costs_one_probe(
    control_plane: ControlPlaneInfo, far: RunningProxy, namespace: str
) -> None:
    for i in range(5):
        _create(control_plane, namespace, f"lr-{i}")
    _, running = _apiserver_counts(control_plane)  # the long-running watches without ours
    far.get(f"/api/v1/namespaces/{namespace}/limitranges")
    before = _settled(control_plane, running)
    from_cache = _served_from_cache(far)

    rv = _create(control_plane, namespace, "lr-5")  # written just before the first page
    base = f"/api/v1/namespaces/{namespace}/limitranges?limit=2"
    pages: list[list[str]] = []
    token = ""
    while True:
        out = _get(far.url + base + (f"&continue={token}" if token else ""))
        pages.append([i["metadata"]["name"] for i in out["items"]])
        token = out["metadata"].get("continue", "")
        if not token:
            break
    spent = _delta(_settled(control_plane, running), before)
    assert _served_from_cache(far) - from_cache == 3
    assert int(out["metadata"]["resourceVersion"]) >= int(rv)

    direct: list[list[str]] = []
    token = ""
    while True:
        got = control_plane.json("GET", base + (f"&continue={token}" if token else ""))
        direct.append([i["metadata"]["name"] for i in got["items"]])
        token = got["metadata"].get("continue", "")
        if not token:
            break
    assert pages == direct == [["lr-0", "lr-1"], ["lr-2", "lr-3"], ["lr-4", "lr-5"]]
    # One freshness probe for the first page; the continue pages cross the link not at all.
    assert spent == {"WATCH": 1}, spent


# --------------------------------------------------------------------------- the cache's own fill

FILL_CONFIGMAPS = 60


@pytest.fixture
def big_configmaps(control_plane: ControlPlaneInfo, namespace: str) -> Iterator[str]:
    """FILL_CONFIGMAPS ConfigMaps of 3 KB of annotation each (deleted after the test)."""
    base = f"/api/v1/namespaces/{namespace}/configmaps"
    for i in range(FILL_CONFIGMAPS):
        note = "".join(f"line {j} of configmap {i}; " for j in range(120))
        control_plane.json(
            "POST",
            base,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"cm-{i:03d}", "annotations": {"note": note}},
            },
        )
    yield namespace
    control_plane.request("DELETE", base)


def _fill_bytes(
    control_plane: ControlPlaneInfo, toxi: Toxiproxy, tmp: Path, name: str, link: Link | None
) -> tuple[int, RunningProxy]:
    """Bytes that crossed toxiproxy while a new kproxy filled its cache of configmaps."""
    dst = tmp / f"{name}.kubeconfig"
    kubeconfig = toxi.kubeconfig_through(name, control_plane.admin_kubeconfig, control_plane.apiserver_port, link, dst)
    before = toxi.relayed_bytes()
    chain = {"filters": [{"name": "watchcache", "resources": ["configmaps"]}]}
    rp = start_proxy(tmp / name, kubeconfig, extra=chain, token="ignored-in-proxy-mode")
    # Asked of a namespace with nothing in it: what passes upstream until the cache is ready is small.
    rp.wait_cached("/api/v1/namespaces/kproxy-probes-empty/configmaps", "configmaps")
    return toxi.relayed_bytes() - before, rp


def test_the_cache_fill_asks_for_gzip_across_a_slow_link(
    control_plane: ControlPlaneInfo, toxi: Toxiproxy, big_configmaps: str, tmp_path: Path
) -> None:
    # What the fill carries uncompressed: every configmap, in protobuf as the cache asks; of it,
    # this test's own (compressible: one sentence repeated). Other tests' configmaps, whatever
    # they hold, are in the fill too: gzip may save nothing on them.
    code, listed = control_plane.request("GET", "/api/v1/configmaps", accept="application/vnd.kubernetes.protobuf")
    assert code == 200
    plain = len(listed)
    code, own = control_plane.request(
        "GET", f"/api/v1/namespaces/{big_configmaps}/configmaps", accept="application/vnd.kubernetes.protobuf"
    )
    assert code == 200
    compressible = len(own)
    far_bytes, far = _fill_bytes(control_plane, toxi, tmp_path, "fill-far", LINK)
    try:
        path = f"/api/v1/namespaces/{big_configmaps}/configmaps"
        code, body = far.get(path)
        assert code == 200
        direct = control_plane.json("GET", path)
        assert json.loads(body)["items"] == direct["items"]
    finally:
        far.stop()
    near_bytes, near = _fill_bytes(control_plane, toxi, tmp_path, "fill-near", None)
    near.stop()
    # Next to the apiserver the fill is not gzipped (its bytes are at least the plain list's);
    # across the slow link the same fill (and the same few other requests) saves at least half
    # of this test's configmaps' bytes (gzip keeps about a tenth of them).
    assert near_bytes >= plain, (near_bytes, plain)
    assert far_bytes < near_bytes - compressible / 2, (far_bytes, near_bytes, plain, compressible)
