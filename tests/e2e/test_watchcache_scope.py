"""The watch cache and scope: cluster-scoped resources (namespaces, nodes) and paths the apiserver
has no route for (a cluster-scoped resource under a namespace, a namespaced object without one)
answer exactly as the apiserver does, in each media type, errors included."""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

PROTOBUF = "application/vnd.kubernetes.protobuf"


def _fetch(url: str, accept: str, ctx: ssl.SSLContext | None = None) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "scope-test"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


_JSON_LIST_RV = re.compile(rb'^(\{"kind":"\w+List","apiVersion":"v1","metadata":\{"resourceVersion":")(\d+)"')
_YAML_LIST_RV = re.compile(rb'\nmetadata:\n  resourceVersion: "(\d+)"\n$')


def _list_rv_span(body: bytes) -> tuple[int, int] | None:
    """Where the resourceVersion of a list answer in JSON (first) or YAML (last) is."""
    m = _JSON_LIST_RV.match(body) or _YAML_LIST_RV.search(body)
    return m.span(m.lastindex or 0) if m else None


def _list_rv(body: bytes) -> bytes:
    span = _list_rv_span(body)
    return body[span[0] : span[1]] if span else b""


def _same_but_list_rv(via: tuple[int, str, bytes], direct: tuple[int, str, bytes], rvs: tuple[bytes, bytes]) -> bool:
    """Whether two answers to a ``resourceVersion=0`` list differ only in the list's
    resourceVersion. "Any state" lets the two caches answer from different points: a consistent
    read makes the apiserver's own cache catch up with etcd's latest revision (a progress
    notification), which reaches kproxy's cache only with its next bookmark, and an earlier test
    may have made one. ``rvs`` are (kproxy's, the apiserver's) list resourceVersions from the
    JSON answers, used to mask the protobuf ListMeta (field 2, a length-prefixed string)."""
    if via[:2] != direct[:2]:
        return False
    a, b = via[2], direct[2]
    sa, sb = _list_rv_span(a), _list_rv_span(b)
    if sa and sb:
        return a[: sa[0]] + a[sa[1] :] == b[: sb[0]] + b[sb[1] :]
    mine, theirs = rvs
    if not mine or len(mine) != len(theirs):
        return False
    return a.replace(b"\x12" + bytes([len(mine)]) + mine, b"\x12" + bytes([len(theirs)]) + theirs, 1) == b


def test_scopes_and_missing_routes_match_the_apiserver(
    proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo, namespace: str
) -> None:
    cp = control_plane
    rp = proxy_factory(extra={"filters": [{"name": "watchcache", "resources": ["namespaces", "nodes", "pods"]}]})
    eventually(
        lambda: namespace.encode() in rp.get("/api/v1/namespaces?resourceVersion=0")[1], 30, "the namespaces cache"
    )
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"{namespace}-node", "labels": {"t": namespace}}}
    assert cp.request("POST", "/api/v1/nodes", body=json.dumps(node).encode())[0] == 201
    try:
        eventually(lambda: f"{namespace}-node".encode() in rp.get("/api/v1/nodes?resourceVersion=0")[1], 30, "the node")
        paths = [
            f"/api/v1/namespaces/{namespace}?resourceVersion=0",
            "/api/v1/namespaces?resourceVersion=0",
            f"/api/v1/namespaces?labelSelector=kubernetes.io%2Fmetadata.name%3D{namespace}",
            "/api/v1/namespaces?limit=2",
            f"/api/v1/nodes/{namespace}-node?resourceVersion=0",
            f"/api/v1/nodes?resourceVersion=0&labelSelector=t%3D{namespace}",
            "/api/v1/nodes/absent-node?resourceVersion=0",
            f"/api/v1/namespaces/{namespace}/nodes?resourceVersion=0",
            "/api/v1/pods/absent?resourceVersion=0",
            f"/api/v1/namespaces/{namespace}/pods/absent?resourceVersion=0",
            f"/api/v1/namespaces/{namespace}/pods?resourceVersion=0",
        ]
        any_state_lists = {paths[1], paths[5], paths[10]}
        rvs = (b"", b"")
        ctx = cp.ssl_context()
        before = rp.metrics().count('served="cache"')
        for path in paths:
            for accept in ("application/json", "application/yaml", PROTOBUF):
                direct = _fetch(f"{cp.server}{path}", accept, ctx)
                via = _fetch(rp.url + path, accept)
                if "limit=2" in path and direct[0] == 200 and accept == "application/json":
                    # Both paginate the same snapshot order; tokens differ only by kproxy's marker.
                    d, v = json.loads(direct[2]), json.loads(via[2])
                    assert [i["metadata"]["name"] for i in d["items"]] == [i["metadata"]["name"] for i in v["items"]]
                    continue
                if "limit=2" in path:
                    continue
                if path in any_state_lists:
                    if accept == "application/json":
                        rvs = (_list_rv(via[2]), _list_rv(direct[2]))
                    if via != direct and _same_but_list_rv(via, direct, rvs):
                        continue
                assert via == direct, (path, accept, via[:2], direct[:2], via[2][:300], direct[2][:300])
        metrics = rp.metrics()
        assert metrics.count('served="cache"') > before
        assert re.search(r'reason="scope",resource="nodes",served="upstream"', metrics)
        assert re.search(r'reason="status 404",resource="nodes",served="cache",verb="get"', metrics)
    finally:
        cp.request("DELETE", f"/api/v1/nodes/{namespace}-node")
