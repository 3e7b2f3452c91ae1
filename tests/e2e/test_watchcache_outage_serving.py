"""Reads through an outage (``watchcache.outage.serve``): the apiserver of a control plane of this
module's own is stopped under a client-go informer, kubectl and plain HTTP reads through two
kprox ies in ``credentials: forward`` (bearer tokens, reviewed by the apiserver), one with the option
and one without.

With the option, while the apiserver is down: every read (consistent, ``resourceVersion=0``, a
GET, kubectl) answers 200 from the cache with a ``Warning: 299`` saying how long the cache has
been unconfirmed, ``kproxy_watchcache_unconfirmed_seconds`` grows, and a caller whose access
kproxy never had reviewed gets the outage answer (no items). The informer keeps its watch (and
gets bookmarks), sees no error and never lists again, and every change made after the apiserver
is back reaches it. Without the option the same reads fail as they always did.

The outage lasts ``KPROXY_OUTAGE_SECONDS`` (default 20; the full scenario is 300).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster import envtest
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.informer import Informer
from kproxy.testing.proxyproc import RunningProxy, start_proxy

OUTAGE_SECONDS = float(os.environ.get("KPROXY_OUTAGE_SECONDS", "20"))

# The control plane's start, the outage, and the recovery.
pytestmark = pytest.mark.timeout(OUTAGE_SECONDS + 280)


def _cache(outage: bool) -> dict[str, Any]:
    wc: dict[str, Any] = {"name": "watchcache", "resources": ["pods", "configmaps"], "bookmark_interval": 2}
    if outage:
        # Decisions made before the outage must outlast it (the default bound is 300 s).
        wc["outage"] = {"serve": True, "authorization_ttl": OUTAGE_SECONDS + 120}
    return {"filters": [wc]}


@pytest.fixture(scope="module")
def own_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneInfo]:
    """A control plane of this module's own: its apiserver is stopped for the outage."""
    directory = tmp_path_factory.mktemp("outage-serving-envtest")
    try:
        yield envtest.up(directory)
    finally:
        envtest.down(directory)


def _metric(rp: RunningProxy, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(rp.metrics()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _read(rp: RunningProxy, path: str, token: str) -> tuple[int, list[str], bytes]:
    """GET ``path`` through ``rp`` as the bearer ``token``: status, Warning headers, body."""
    assert rp.ca_file is not None
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    req = urllib.request.Request(rp.url + path, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=20, context=ctx) as r:
            return r.status, r.headers.get_all("Warning") or [], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get_all("Warning") or [], e.read()


def _write(rp: RunningProxy, path: str, token: str, obj: dict[str, Any]) -> tuple[int, list[str], bytes]:
    """POST ``obj`` to ``path`` through ``rp`` as the bearer ``token``."""
    assert rp.ca_file is not None
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    req = urllib.request.Request(rp.url + path, data=json.dumps(obj).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=20, context=ctx) as r:
            return r.status, r.headers.get_all("Warning") or [], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get_all("Warning") or [], e.read()


def _post(cp: ControlPlaneInfo, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    status, body = cp.request("POST", path, body=json.dumps(obj).encode())
    assert status == 201, body
    result: dict[str, Any] = json.loads(body)
    return result


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]},
    }


def _pods(cp: ControlPlaneInfo, ns: str) -> dict[str, str]:
    status, body = cp.request("GET", f"/api/v1/namespaces/{ns}/pods")
    assert status == 200, body
    return {f"{ns}/{p['metadata']['name']}": p["metadata"]["resourceVersion"] for p in json.loads(body)["items"]}


def _viewer_token(cp: ControlPlaneInfo, ns: str) -> str:
    """A ServiceAccount allowed to read the namespace (ClusterRole ``view``), never seen by kproxy."""
    _post(
        cp,
        f"/api/v1/namespaces/{ns}/serviceaccounts",
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "viewer"}},
    )
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns}],
    }
    _post(cp, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings", binding)
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    answer = _post(cp, f"/api/v1/namespaces/{ns}/serviceaccounts/viewer/token", request)
    token: str = answer["status"]["token"]
    return token


def _items(body: bytes) -> list[Any] | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return doc.get("items") if isinstance(doc, dict) else None


def test_reads_go_on_through_an_outage_only_with_the_option(own_cp: ControlPlaneInfo, tmp_path: Path) -> None:
    cp = own_cp
    ns = f"outage-{secrets.token_hex(3)}"
    _post(cp, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for i in range(3):
        _post(cp, f"/api/v1/namespaces/{ns}/pods", _pod(f"before{i}"))
        _post(
            cp,
            f"/api/v1/namespaces/{ns}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm{i}"}},
        )
    viewer = _viewer_token(cp, ns)
    admin = cp.admin_token
    forward: dict[str, Any] = {"credentials": "forward", "tls": True, "token": admin}
    on = start_proxy(tmp_path / "on", cp.admin_kubeconfig, extra=_cache(True), **forward)
    off = start_proxy(tmp_path / "off", cp.admin_kubeconfig, extra=_cache(False), **forward)
    inf: Informer | None = None
    kubectl = cp.kubectl_runner()
    pods = f"/api/v1/namespaces/{ns}/pods"
    configmaps = f"/api/v1/namespaces/{ns}/configmaps"
    reads = [
        f"{pods}",
        f"{pods}?resourceVersion=0",
        f"{configmaps}",
        f"{configmaps}?resourceVersion=0",
        f"{pods}/before0?resourceVersion=0",
    ]
    try:
        for rp in (on, off):
            for path, resource in ((pods, "pods"), (configmaps, "configmaps")):

                def cached(rp: RunningProxy = rp, path: str = path, resource: str = resource) -> bool:
                    served = _metric(rp, "kproxy_watchcache_reads_total", resource=resource, served="cache")
                    status = _read(rp, f"{path}?resourceVersion=0", admin)[0]
                    return (
                        status == 200
                        and _metric(rp, "kproxy_watchcache_reads_total", resource=resource, served="cache") > served
                    )

                eventually(cached, 60, f"the {resource} cache", interval=0.2)
            for path in reads:  # the admin's reads reviewed (and answered) before the outage
                status, warnings, _ = _read(rp, path, admin)
                assert status == 200 and not warnings, (path, status, warnings)
        # kubectl's discovery cached before the outage, as any kubectl that ran before has it.
        kubectl.run(["get", "configmaps", "-n", ns, "-o", "name"], kubeconfig=on.kubeconfig)
        inf = Informer(on.kubeconfig, namespace=ns)
        inf.wait(lambda: bool(inf.of("synced")), 60, "first sync")
        assert inf is not None
        # A change after the informer's watch started: the cache is past where the watch started,
        # so its bookmarks (at the cache's resource version) go out, as the apiserver's do.
        _post(cp, pods, _pod("before3"))
        eventually(lambda: inf.store() == _pods(cp, ns), 30, "the informer to see the last change before the outage")
        lists_before = len(inf.of("list"))
        assert _metric(on, "kproxy_watchcache_unconfirmed_seconds", resource="pods") < 5

        cp.stop_apiserver()
        outage_started = time.monotonic()
        bookmarks_before = len(inf.of("bookmark"))
        rounds = 0
        while time.monotonic() - outage_started < OUTAGE_SECONDS or rounds < 2:
            for path in reads:
                status, warnings, body = _read(on, path, admin)
                assert status == 200, (path, status, body[:300])
                assert len(warnings) == 1 and warnings[0].startswith('299 - "the kube-apiserver is unreachable'), (
                    warnings
                )
                if "resourceVersion" not in path:
                    assert "only the kube-apiserver can confirm" in warnings[0], warnings
                if "/before0" not in path:
                    want = 4 if "pods" in path else 3
                    assert len(_items(body) or []) == want, body[:300]
                # A caller kproxy never reviewed: the outage answer, nothing from the cache.
                status, _, body = _read(on, path, viewer)
                assert status == 429 and not _items(body), (path, status, body[:300])
                assert json.loads(body)["kind"] == "Status"
                # Without the option: as always, no data.
                status, _, body = _read(off, path, admin)
                if rounds > 0 or time.monotonic() - outage_started > 12:  # past the 10 s review cache
                    assert status != 200 and not _items(body), (path, status, body[:300])
            out = kubectl.run(["get", "pods", "-n", ns, "-o", "json"], kubeconfig=on.kubeconfig)
            assert len(json.loads(out.stdout)["items"]) == 4
            assert "the kube-apiserver is unreachable" in out.stderr, out.stderr
            rounds += 1
            time.sleep(1)
        # A watch started during the outage is served from the cache, with the Warning.
        status, warnings, body = _read(on, f"{pods}?watch=1&resourceVersion=0&timeoutSeconds=1", admin)
        assert status == 200 and len(warnings) == 1 and b'"ADDED"' in body, (status, warnings, body[:300])
        # Writes answer as they do without the option: the outage answer for a write never sent.
        for rp in (on, off):
            status, _, body = _write(
                rp, f"{configmaps}", admin, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}}
            )
            assert status == 429 and json.loads(body)["reason"] == "TooManyRequests", (status, body[:300])
        unconfirmed = _metric(on, "kproxy_watchcache_unconfirmed_seconds", resource="pods")
        assert unconfirmed >= OUTAGE_SECONDS - 2, unconfirmed
        # The informer's watch stayed open through the outage, and got its bookmarks.
        assert len(inf.of("bookmark")) > bookmarks_before

        cp.start_apiserver()
        _post(cp, f"{pods}", _pod("after0"))
        assert cp.request("DELETE", f"{pods}/before1")[0] == 200
        _post(cp, f"{pods}", _pod("after1"))
        eventually(
            lambda: inf.store() == _pods(cp, ns),
            90,
            "the informer to get every change made after the outage",
            interval=0.3,
        )
        bad = [line for line in inf.lines if line["kind"] in ("watch-error", "watch-error-event", "watch-open-error")]
        assert not bad, bad
        assert len(inf.of("list")) == lists_before, inf.of("list")
        eventually(
            lambda: _metric(on, "kproxy_watchcache_unconfirmed_seconds", resource="pods") < 5,
            60,
            "the cache confirmed again",
        )
        status, warnings, body = _read(on, pods, admin)
        assert status == 200 and not warnings and len(_items(body) or []) == 5
    finally:
        if inf is not None:
            inf.stop()
        if not cp.apiserver_alive():
            cp.start_apiserver()
        for rp in (on, off):
            rp.stop(signal.SIGKILL)
