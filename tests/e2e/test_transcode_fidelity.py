"""Fidelity of the transcode filter over the corpus (tests/e2e/corpus): for every object, the
apiserver's own JSON and kproxy's protobuf -> JSON are equal, for GET, LIST and WATCH.

kproxy runs with ``transcode: {upstream: protobuf}``; every request here asks JSON, so kproxy asks
the apiserver for protobuf and rebuilds the JSON. Each GET test first checks that the apiserver
really serves that object as protobuf (so the comparison is never JSON against passed-through
JSON), and the last test checks kproxy's counters: every shape was transcoded.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import corpus
import pytest
from corpus.compare import PROTOBUF, Sides, initial_events

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

_TEMPLATE = [corpus.describe(d, "__NS__") for d in corpus.manifests("__NS__")]


def _id(obj: corpus.CorpusObject) -> str:
    return f"{obj.kind}:{obj.name.replace('-__NS__', '').replace('__NS__', 'ns')}"


_COLLECTIONS: dict[str, corpus.CorpusObject] = {}
for _o in _TEMPLATE:
    # One collection per resource; cluster-scoped collections are narrowed to one corpus object.
    _COLLECTIONS.setdefault(f"{_o.api_version}/{_o.resource}", _o)


@pytest.fixture(scope="module")
def loaded(control_plane: ControlPlaneInfo) -> Iterator[tuple[str, list[corpus.CorpusObject]]]:
    ns = f"transcode-corpus-{secrets.token_hex(3)}"
    body = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}).encode()
    code, resp = control_plane.request("POST", "/api/v1/namespaces", body=body)
    assert code == 201, resp
    objects = corpus.load(control_plane, ns)
    yield ns, objects
    corpus.cleanup(control_plane, objects)
    control_plane.request("DELETE", f"/api/v1/namespaces/{ns}")


def _real(obj: corpus.CorpusObject, ns: str) -> corpus.CorpusObject:
    name = obj.name.replace("__NS__", ns)
    return corpus.CorpusObject(obj.api_version, obj.kind, name, ns if obj.namespace else None, obj.resource)


@pytest.mark.parametrize("index", range(len(_TEMPLATE)), ids=[_id(o) for o in _TEMPLATE])
async def test_get_equal(index: int, loaded: tuple[str, list[corpus.CorpusObject]], sides: Sides) -> None:
    ns, _ = loaded
    obj = _real(_TEMPLATE[index], ns)
    pb = await sides.request("GET", obj.path, via_proxy=False, accept=PROTOBUF)
    assert pb.status == 200 and pb.content_type == PROTOBUF, "the apiserver serves this object as protobuf"
    direct, via = await sides.both("GET", obj.path)
    assert direct.status == 200, direct.body[:300]
    assert (via.status, via.content_type) == (200, "application/json"), via.body[:500]
    assert via.json() == direct.json()


@pytest.mark.parametrize("index", range(len(_TEMPLATE)), ids=[_id(o) for o in _TEMPLATE])
async def test_get_bytes_equal(index: int, loaded: tuple[str, list[corpus.CorpusObject]], sides: Sides) -> None:
    """Stricter than equal JSON: the same bytes (key order, escaping, trailing newline)."""
    ns, _ = loaded
    obj = _real(_TEMPLATE[index], ns)
    direct, via = await sides.both("GET", obj.path)
    assert via.body == direct.body


def _list_path(obj: corpus.CorpusObject) -> str:
    if obj.namespace is None:
        return f"{obj.collection}?fieldSelector=metadata.name%3D{obj.name}"
    return obj.collection


@pytest.mark.parametrize("key", list(_COLLECTIONS), ids=list(_COLLECTIONS))
async def test_list_equal(key: str, loaded: tuple[str, list[corpus.CorpusObject]], sides: Sides) -> None:
    ns, _ = loaded
    obj = _real(_COLLECTIONS[key], ns)
    first = await sides.request("GET", _list_path(obj), via_proxy=False)
    assert first.status == 200, first.body[:300]
    rv = first.json()["metadata"]["resourceVersion"]
    sep = "&" if "?" in _list_path(obj) else "?"
    # The same snapshot on both sides, whatever else changes in the cluster meanwhile.
    path = f"{_list_path(obj)}{sep}resourceVersion={rv}&resourceVersionMatch=Exact"
    direct, via = await sides.both("GET", path)
    assert direct.status == 200
    assert (via.status, via.content_type) == (200, "application/json"), via.body[:500]
    got, want = via.json(), direct.json()
    assert len(want["items"]) >= 1
    assert got == want


def _strip_bookmark_rv(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The initial-events-end bookmark carries the watch cache's RV when each watch started."""
    out = json.loads(json.dumps(events))
    out[-1]["object"]["metadata"]["resourceVersion"] = "<rv>"
    return list(out)


@pytest.mark.parametrize("key", list(_COLLECTIONS), ids=list(_COLLECTIONS))
async def test_watch_equal(key: str, loaded: tuple[str, list[corpus.CorpusObject]], sides: Sides) -> None:
    ns, _ = loaded
    obj = _real(_COLLECTIONS[key], ns)
    path = _list_path(obj)
    sep = "&" if "?" in path else "?"
    path += f"{sep}watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    results = []
    for via_proxy in (False, True):
        async with sides.stream(path, via_proxy=via_proxy) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "application/json"
            results.append(await initial_events(resp))
    direct, via = results
    assert len(direct) >= 2  # at least one ADDED and the bookmark
    assert [e["type"] for e in via] == [e["type"] for e in direct]
    assert _strip_bookmark_rv(via) == _strip_bookmark_rv(direct)


async def test_corpus_size_and_all_shapes_transcoded(
    loaded: tuple[str, list[corpus.CorpusObject]], pb_proxy: RunningProxy, sides: Sides
) -> None:
    """The corpus holds at least 30 objects, and kproxy really transcodes each shape."""
    ns, objects = loaded
    assert len(objects) >= 30
    assert len(corpus.kinds(objects)) >= 25

    def count(shape: str) -> float:
        prefix = f'kproxy_transcode_responses_total{{shape="{shape}"}} '
        return next((float(ln.split()[-1]) for ln in pb_proxy.metrics().splitlines() if ln.startswith(prefix)), 0.0)

    before = {shape: count(shape) for shape in ("object", "list", "watch")}
    pods = f"/api/v1/namespaces/{ns}/pods"
    assert (await sides.request("GET", f"{pods}/corpus-pod", via_proxy=True)).status == 200
    assert (await sides.request("GET", pods, via_proxy=True)).status == 200
    watch = f"{pods}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    async with sides.stream(watch, via_proxy=True) as resp:
        await initial_events(resp)
    for shape, n in before.items():
        assert count(shape) >= n + 1, shape
