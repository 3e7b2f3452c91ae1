"""Metadata-only LIST and GET (``as=PartialObjectMetadataList`` / ``as=PartialObjectMetadata``)
from the watch cache, against the apiserver's own answers.

Each request goes straight to the apiserver first, then through kproxy (the watchcache filter on
pods, configmaps and secrets), and the answers are compared by :mod:`watchcache_diff` (bytes, in
JSON, YAML and protobuf). The reads kproxy can answer must also be counted as served from the
cache; transforms it does not make (``v1beta1``, a list asked as an object) reach the apiserver,
whose refusal the client gets. The watches are in ``test_watchcache_watch.py``
(``test_metadata_only_watches``); the garbage collector's metadata informers run through kproxy in
``tests/e2e/living``.
"""

from __future__ import annotations

import json
from typing import Any

from corpus.compare import Sides
from watchcache_diff import diff as compare
from watchcache_diff import gather_limited, query_path, reads_total
from watchcache_population import Population, cache_proxy, population, wc_sides

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.informer import Informer
from kproxy.testing.proxyproc import RunningProxy

__all__ = ["cache_proxy", "population", "wc_sides"]  # module-scoped fixtures used here

LIST = "application/{};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
OBJECT = "application/{};as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
ENCODINGS = ("json", "yaml", "vnd.kubernetes.protobuf")
#: What client-go's metadata client sends for a list.
CLIENT_GO_LIST = f"{LIST.format('vnd.kubernetes.protobuf')}, {LIST.format('json')}, application/json"


def _served(rp: RunningProxy, verb: str, where: str) -> float:
    return sum(
        reads_total(rp.metrics(), resource=r, verb=verb, served=where) for r in ("pods", "configmaps", "secrets")
    )


async def test_metadata_lists_and_gets_from_the_cache(
    wc_sides: Sides, population: Population, cache_proxy: RunningProxy
) -> None:
    """Lists of every scope with each resource-version form, a page limit, label and field
    selectors, pretty-printing; GETs at resourceVersion=0; in every encoding and as client-go asks.
    All byte-equal, and all served from the cache."""
    a, b, _ = population.namespaces
    lists = ["/api/v1/pods", f"/api/v1/namespaces/{a}/pods", "/api/v1/configmaps", f"/api/v1/namespaces/{b}/secrets"]
    params = [
        [],
        [("resourceVersion", "0")],
        [("resourceVersion", str(population.recent_rv))],
        [("limit", "7")],
        [("labelSelector", "app in (web,db)")],
        [("fieldSelector", "status.phase!=Failed"), ("resourceVersion", "0")],
        [("pretty", "true")],
    ]
    accepts = [*(LIST.format(e) for e in ENCODINGS), CLIENT_GO_LIST]
    work = [
        compare(wc_sides, path, p, accept=accept)
        for path in lists
        for p in params
        if not (p and p[0][0] == "fieldSelector" and "pods" not in path)
        for accept in accepts
    ]
    objects = [
        *(f"/api/v1/namespaces/{a}/pods/{n}" for n in population.pods[a][:3]),
        *(f"/api/v1/namespaces/{b}/configmaps/{n}" for n in ("tricky", "big", "yaml-styles")),
        f"/api/v1/namespaces/{b}/secrets/{population.secrets[b][0]}",
        f"/api/v1/namespaces/{a}/pods/no-such-pod",
    ]
    work += [
        compare(wc_sides, path, [("resourceVersion", "0")], accept=OBJECT.format(e), is_list=False)
        for path in objects
        for e in ENCODINGS
    ]
    lists_before, gets_before = _served(cache_proxy, "list", "cache"), _served(cache_proxy, "get", "cache")
    found = await gather_limited(work, 24)
    assert not found, found.report()
    # Every list above is one the cache serves; the missing pod's GET is the cache's 404.
    assert _served(cache_proxy, "list", "cache") - lists_before >= len(work) - 3 * len(objects)
    assert _served(cache_proxy, "get", "cache") - gets_before == 3 * len(objects)


async def test_metadata_pages_to_the_end(wc_sides: Sides, population: Population) -> None:
    """A metadata-only list read page by page with kproxy's continue tokens names the same objects,
    in the same order, as the apiserver's whole list."""
    accept = LIST.format("json")
    whole = await wc_sides.request("GET", "/api/v1/pods", via_proxy=False, accept=accept)
    assert whole.status == 200
    want = [i["metadata"]["name"] for i in whole.json()["items"]]
    got: list[str] = []
    token = ""
    for _ in range(100):
        p = [("limit", "4")] + ([("continue", token)] if token else [])
        page = await wc_sides.request("GET", query_path("/api/v1/pods", p), via_proxy=True, accept=accept)
        assert page.status == 200, page.body[:300]
        doc = page.json()
        assert doc["kind"] == "PartialObjectMetadataList" and len(doc["items"]) <= 4
        assert all(
            i["kind"] == "PartialObjectMetadata" and set(i) == {"kind", "apiVersion", "metadata"} for i in doc["items"]
        )
        got += [i["metadata"]["name"] for i in doc["items"]]
        token = doc["metadata"].get("continue", "")
        if not token:
            break
    assert got == want


async def test_other_transforms_reach_the_apiserver(
    wc_sides: Sides, population: Population, cache_proxy: RunningProxy
) -> None:
    """A list asked as one object, an object as a list, the ``v1beta1`` forms and a Table: the
    apiserver answers (its 406s and v1beta1 bodies), byte for byte, and kproxy counts them as
    passed on."""
    a = population.namespaces[0]
    pods, one = f"/api/v1/namespaces/{a}/pods", f"/api/v1/namespaces/{a}/pods/{population.pods[a][0]}"
    rv0 = [("resourceVersion", "0")]
    v1beta1 = "application/json;as={};g=meta.k8s.io;v=v1beta1"
    before = _served(cache_proxy, "list", "upstream") + _served(cache_proxy, "get", "upstream")
    found = await gather_limited(
        [
            compare(wc_sides, pods, rv0, accept=OBJECT.format("json")),
            compare(wc_sides, one, rv0, accept=LIST.format("json"), is_list=False),
            compare(wc_sides, pods, rv0, accept=v1beta1.format("PartialObjectMetadataList")),
            compare(wc_sides, one, rv0, accept=v1beta1.format("PartialObjectMetadata"), is_list=False),
        ],
        4,
    )
    assert not found, found.report()
    assert _served(cache_proxy, "list", "upstream") + _served(cache_proxy, "get", "upstream") - before == 4


def test_client_go_metadata_informer(
    control_plane: ControlPlaneInfo, population: Population, cache_proxy: RunningProxy, namespace: str
) -> None:
    """client-go's metadata informer (what the garbage collector and the quota controller run for
    every resource) through kproxy: it lists and watches from the cache, gets PartialObjectMetadata
    objects, follows a relabel, a deletion and a creation, never sees a watch error, and ends with
    the apiserver's state."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for i in range(3):
        _create_pod(control_plane, pods, f"meta-{i}")
    served = _served(cache_proxy, "list", "cache") + _served(cache_proxy, "watch", "cache")
    inf = Informer(cache_proxy.kubeconfig, namespace=namespace, resource="/v1/pods", metadata=True)
    try:
        inf.wait(lambda: bool(inf.of("synced")), 60, "first sync")
        patch = b'{"metadata":{"labels":{"moved":"yes"}}}'
        status, body = control_plane.request(
            "PATCH", f"{pods}/meta-0", body=patch, content_type="application/merge-patch+json"
        )
        assert status == 200, body
        assert control_plane.request("DELETE", f"{pods}/meta-1")[0] == 200
        _create_pod(control_plane, pods, "meta-9")

        def seen(kind: str, name: str) -> list[dict[str, Any]]:
            return [e for e in inf.of("event") if e["type"] == kind and e["name"] == name]

        inf.wait(
            lambda: (
                bool(seen("DELETED", "meta-1") and seen("ADDED", "meta-9"))
                and any((e.get("labels") or {}).get("moved") == "yes" for e in seen("MODIFIED", "meta-0"))
            ),
            30,
            "the relabel, the deletion and the creation",
        )
        events = inf.of("event")
        assert {e["goType"] for e in events} == {"*v1.PartialObjectMetadata"}, events
        status, body = control_plane.request("GET", pods)
        assert status == 200
        want = {
            f"{namespace}/{i['metadata']['name']}": i["metadata"]["resourceVersion"] for i in json.loads(body)["items"]
        }
        inf.wait(lambda: inf.store() == want, 30, "the apiserver's state")
    finally:
        inf.stop()
    bad = [line for line in inf.lines if line["kind"] in ("watch-error", "watch-error-event", "watch-open-error")]
    assert not bad, bad
    assert len(inf.of("list")) == 1, inf.of("list")
    # Its list (or streaming list) and its watch were answered by the cache.
    assert _served(cache_proxy, "list", "cache") + _served(cache_proxy, "watch", "cache") - served >= 1


def _create_pod(cp: ControlPlaneInfo, path: str, name: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    status, body = cp.request("POST", path, body=json.dumps(pod).encode())
    assert status == 201, body
