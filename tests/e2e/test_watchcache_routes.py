"""The watch cache answers only routes the apiserver serves: with every resource cached, paths its
installer registers no route for (a cluster-scoped resource, namespaces itself included, under
``namespaces/{ns}/``; a namespaced object by name without its namespace; the same in the
deprecated ``watch/`` form; unknown subresources) get the apiserver's own answer, status and body,
for every cached resource (staging/src/k8s.io/apiserver/pkg/endpoints/installer.go)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy


def _open(url: str, ctx: ssl.SSLContext | None, watch: bool) -> tuple[int, bytes]:
    """Status and body (a watch: status only, the stream is closed at once)."""
    req = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "routes-test"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, b"" if watch else r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _resources(cp: ControlPlaneInfo) -> Iterator[tuple[str, str, bool]]:
    """(group-version path, resource, namespaced) for every list+watch resource of every
    preferred group version (the resources kproxy caches with ``resources: ["*"]``)."""
    versions = ["/api/v1"]
    groups = cp.json("GET", "/apis")
    versions += [f"/apis/{g['preferredVersion']['groupVersion']}" for g in groups["groups"]]
    for gv in versions:
        for r in cp.json("GET", gv)["resources"]:
            if "/" not in r["name"] and {"list", "watch"} <= set(r.get("verbs", ())):
                yield gv, r["name"], bool(r["namespaced"])


def _label(gv: str, resource: str) -> str:
    group = gv.split("/")[2] if gv.startswith("/apis/") else ""
    return f"{resource}.{group}" if group else resource


def _paths(gv: str, resource: str, namespaced: bool, ns: str, name: str) -> list[tuple[str, bool]]:
    """Odd paths for one resource, each with whether it is a watch (compared by status only)."""
    rv0 = "resourceVersion=0"
    out = [
        (f"{gv}/namespaces/{ns}/{resource}/{name}/bogus?{rv0}", False),  # no such subresource
        (f"{gv}/{resource}/{name}/status/x?{rv0}", False),
    ]
    if namespaced:
        out += [
            (f"{gv}/{resource}/{name}?{rv0}", False),  # an object by name without its namespace
            (f"{gv}/watch/{resource}/{name}?{rv0}&timeoutSeconds=5", True),
            (f"{gv}/namespaces/{ns}/watch/{resource}?{rv0}&timeoutSeconds=5", True),
        ]
    else:
        sel = f"fieldSelector=metadata.name%3D{name}"
        out += [
            (f"{gv}/namespaces/{ns}/{resource}/{name}?{rv0}", False),  # cluster-scoped under a namespace
            (f"{gv}/namespaces/{ns}/{resource}?{rv0}", False),
            (f"{gv}/namespaces/{ns}/{resource}?{rv0}&{sel}", False),
            (f"{gv}/watch/namespaces/{ns}/{resource}/{name}?{rv0}&timeoutSeconds=5", True),
            (f"{gv}/namespaces/{ns}/{resource}?watch=1&{rv0}&{sel}&timeoutSeconds=5", True),
        ]
    return out


def test_the_cache_answers_no_route_the_apiserver_lacks(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    cp = control_plane
    rp = proxy_factory(extra={"filters": [{"name": "watchcache", "resources": ["*"]}]})
    resources = list(_resources(cp))
    assert ("/api/v1", "namespaces", False) in resources and ("/api/v1", "configmaps", True) in resources
    ctx = cp.ssl_context()
    checked = 0
    wrong: list[str] = []
    for gv, resource, namespaced in resources:
        # Every cache ready (a read served from it), so that a path it would wrongly answer is
        # answered by it, not passed on because it is still filling.
        first = f"{gv}/namespaces/{namespace}/{resource}" if namespaced else f"{gv}/{resource}"
        rp.wait_cached(first, _label(gv, resource), timeout=60)
        items = json.loads(cp.request("GET", f"{first}?limit=1")[1]).get("items") or []
        name = items[0]["metadata"]["name"] if items else "absent"
        if resource == "namespaces":
            name = namespace
        for path, watch in _paths(gv, resource, namespaced, namespace, name):
            direct = _open(cp.server + path, ctx, watch)
            via = _open(rp.url + path, None, watch)
            if via[0] != direct[0] or (direct[0] != 200 and via[1] != direct[1]):
                wrong.append(f"{path}: kproxy {via[0]} {via[1][:200]!r}, apiserver {direct[0]} {direct[1][:200]!r}")
            checked += 1
    # Namespace and name spellings the registry reads as they are (or refuses).
    for path in (
        "/api/v1/namespaces/a%20b/configmaps?resourceVersion=0",
        "/api/v1/namespaces/UPPER/configmaps?resourceVersion=0",
        "/api/v1/namespaces/%25/configmaps?resourceVersion=0",
        "/api/v1/namespaces/x%3Fy/configmaps/z?resourceVersion=0",
        f"/api/v1/namespaces/{namespace}/configmaps/a%20b?resourceVersion=0",
        f"/api/v1/namespaces/{namespace}/configmaps/UPPER?resourceVersion=0",
        f"/api/v1/namespaces/{namespace}/configmaps/{'x' * 300}?resourceVersion=0",
        f"/api/v1/namespaces/{namespace}%2Fconfigmaps?resourceVersion=0",
        f"/api/v1/namespaces/{namespace}/configmaps/?resourceVersion=0",
        f"/api/v1/namespaces/{namespace}/?resourceVersion=0",
        "/api/v1/namespaces/?resourceVersion=0",
        f"/api/v1/namespaces/{namespace}/finalize?resourceVersion=0",
    ):
        direct = _open(cp.server + path, ctx, False)
        via = _open(rp.url + path, None, False)
        if via[0] != direct[0] or (direct[0] != 200 and via[1] != direct[1]):
            wrong.append(f"{path}: kproxy {via[0]} {via[1][:200]!r}, apiserver {direct[0]} {direct[1][:200]!r}")
    assert not wrong, "\n".join(wrong)
    assert checked > 100
