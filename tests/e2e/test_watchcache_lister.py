"""The watch cache's upstream side against the real apiserver, in process: the paginated list
(used where streaming lists are refused) and the streaming list, for a built-in kind in protobuf
and a custom resource in JSON, give the objects the apiserver lists, with their exact bytes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from kproxy.cacher import ADDED, BOOKMARK, Kind
from kproxy.cacher.fields import builtin_fields, crd_fields
from kproxy.cacher.ingest import ObjectFactory
from kproxy.codec import ProtobufCodec
from kproxy.core.context import ApiClient
from kproxy.core.listwatch import HttpListerWatcher
from kproxy.filters.watchcache.resources import ResourceSpec
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.server.kubeconfig import from_kubeconfig
from kproxy.server.upstream import Upstream
from kproxy.testing import crds

CRD = crds.crd("lw.kproxy.test", "doohickeys", "Doohickey")


@pytest.fixture
async def api(control_plane: ControlPlaneInfo) -> AsyncIterator[ApiClient]:
    up = Upstream(from_kubeconfig(str(control_plane.admin_kubeconfig), None), "proxy")
    await up.start()
    try:
        yield ApiClient(up)
    finally:
        await up.close()


def _lister(api: ApiClient, spec: ResourceSpec, codec: ProtobufCodec, crd: bool) -> HttpListerWatcher:
    fields = crd_fields((), namespaced=True) if crd else builtin_fields(spec.group, spec.resource)
    return HttpListerWatcher(api, spec, ObjectFactory(spec.kind, fields, codec))


async def _check(lw: HttpListerWatcher, cp: ControlPlaneInfo, namespace: str, path: str) -> None:
    status, body = cp.request("GET", path)
    assert status == 200
    direct = {i["metadata"]["name"]: i for i in json.loads(body)["items"] if i["metadata"]["namespace"] == namespace}
    token, pages, seen = "", 0, {}
    while True:
        page = await lw.list(limit=2, continue_token=token)
        pages += 1
        for o in page.objects:
            if o.namespace == namespace:
                seen[o.name] = o
        token = page.continue_token
        if not token:
            break
    assert pages >= 2 and set(seen) == set(direct)
    for name, obj in seen.items():
        assert json.loads(obj.item_json) == direct[name]
        assert obj.labels == direct[name]["metadata"].get("labels", {})
    # The streaming list: the same objects as ADDED events, then the end-of-initial-events bookmark.
    streamed = set()
    async for ev in lw.watch(resource_version="", send_initial_events=True):
        if ev.type == ADDED and ev.obj is not None and ev.obj.namespace == namespace:
            streamed.add(ev.obj.name)
        if ev.type == BOOKMARK and ev.initial_events_end:
            assert ev.rv >= await lw.current_rv() - 1000  # a real resource version
            break
    assert streamed == set(direct)
    assert await lw.progress_rv() > 0


async def test_builtin_kind_in_protobuf(api: ApiClient, control_plane: ControlPlaneInfo, namespace: str) -> None:
    cp = control_plane
    for i in range(5):
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}", "labels": {"i": str(i)}}}
        assert (
            cp.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=json.dumps(body).encode())[0] == 201
        )
    spec = ResourceSpec("", "v1", "configmaps", True, Kind("v1", "ConfigMap", "ConfigMapList", True))
    lw = _lister(api, spec, ProtobufCodec(), crd=False)
    await _check(lw, cp, namespace, f"/api/v1/namespaces/{namespace}/configmaps")


async def test_custom_resource_in_json(api: ApiClient, control_plane: ControlPlaneInfo, namespace: str) -> None:
    cp = control_plane
    crds.install(cp, CRD)
    try:
        base = f"/apis/lw.kproxy.test/v1/namespaces/{namespace}/doohickeys"
        for i in range(5):
            body = {"apiVersion": "lw.kproxy.test/v1", "kind": "Doohickey", "metadata": {"name": f"d{i}"}, "x": i}
            assert cp.request("POST", base, body=json.dumps(body).encode())[0] == 201
        kind = Kind("lw.kproxy.test/v1", "Doohickey", "DoohickeyList", False)
        spec = ResourceSpec("lw.kproxy.test", "v1", "doohickeys", True, kind)
        lw = _lister(api, spec, ProtobufCodec(), crd=True)
        await _check(lw, cp, namespace, base)
        # Custom resources are kept as the apiserver's exact bytes.
        page = await lw.list(limit=500, continue_token="")
        status, one = cp.request("GET", f"{base}/d0")
        assert status == 200
        mine = next(o for o in page.objects if o.name == "d0" and o.namespace == namespace)
        assert mine.item_json + b"\n" == one
    finally:
        crds.uninstall(cp, "doohickeys.lw.kproxy.test")
