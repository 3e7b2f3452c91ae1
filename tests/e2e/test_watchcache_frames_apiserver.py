"""FrameEncoder against the real apiserver: every watch frame the apiserver writes is rebuilt, byte for
byte, from the cache's form of the same object.

For each resource a JSON watch and a protobuf watch are opened side by side straight on the apiserver
(``sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true``) while a
writer creates, updates and deletes objects. Both watches see the same events (same watch cache), so
the i-th protobuf frame and the i-th JSON frame carry the same object: a CachedObject is made from
the protobuf object (as kproxy's cache holds built-in kinds) and :class:`FrameEncoder` must give
both frames exactly. Bookmarks (the initial-events-end one and its resource version) are rebuilt
from their resource version alone: the initial-events-end one of every built-in kind the apiserver
serves, and the periodic ones. Custom resources (JSON only) are rebuilt from the object's JSON as
the cache keeps it. A selector watch's DELETED for an object that stops matching is rebuilt from
the previous object at the update's resource version. ERROR events (410 Expired, 504 Too large
resource version) are rebuilt from their Status.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec
import orjson
import pytest
from test_watchcache_recovery import _compact

from kproxy.cacher import CachedObject, Kind
from kproxy.cacher.fields import builtin_fields, crd_fields
from kproxy.cacher.ingest import ObjectFactory
from kproxy.codec import ProtobufCodec, decode_envelope
from kproxy.codec.envelope import parse_watch_event
from kproxy.core.negotiation import JSON, PROTOBUF
from kproxy.core.status import StatusCause, resource_expired, timeout
from kproxy.core.upstreamversion import UpstreamVersion
from kproxy.filters.watchcache.frames import CONTENT_TYPES, FrameEncoder
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing import crds

WATCH = {
    "watch": "1",
    "sendInitialEvents": "true",
    "resourceVersionMatch": "NotOlderThan",
    "allowWatchBookmarks": "true",
    "timeoutSeconds": "60",
}
END = "k8s.io/initial-events-end"
WAIT = 20.0  # seconds for any one expected frame (the machine is shared)
MERGE = "application/merge-patch+json"


_CODEC = ProtobufCodec()


@pytest.fixture(scope="module")
def codec() -> ProtobufCodec:
    return _CODEC


@pytest.fixture
async def session(control_plane: ControlPlaneInfo) -> AsyncIterator[aiohttp.ClientSession]:
    conn = aiohttp.TCPConnector(ssl=control_plane.ssl_context())
    async with aiohttp.ClientSession(connector=conn, auto_decompress=False) as s:
        yield s


# --------------------------------------------------------------------------- reading the apiserver's frames


@dataclass
class Frame:
    """One frame as the apiserver wrote it, with what identifies it."""

    raw: bytes
    type: str
    name: str  # "" for bookmarks and errors
    rv: int
    end: bool = False  # the initial-events-end bookmark


class _JsonEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw


@dataclass
class Watch:
    """A watch straight on the apiserver, read frame by frame (a frame = the complete event bytes)."""

    resp: aiohttp.ClientResponse
    media: str
    frames: list[Frame] = field(default_factory=list)

    async def _next_raw(self) -> bytes:
        if self.media == JSON:
            line = await self.resp.content.readline()
            if not line:
                raise EOFError
            return line
        try:
            head = await self.resp.content.readexactly(4)
            return head + await self.resp.content.readexactly(int.from_bytes(head, "big"))
        except asyncio.IncompleteReadError as e:
            if e.partial == b"":
                raise EOFError from None
            raise

    async def next(self) -> Frame:
        raw = await asyncio.wait_for(self._next_raw(), WAIT)
        frame = _identify(raw, self.media)
        self.frames.append(frame)
        return frame

    async def until(self, pred: Callable[[Frame], bool]) -> None:
        while not pred(await self.next()):
            pass

    async def rest(self) -> None:
        """Every remaining frame, until the apiserver ends the stream."""
        try:
            while True:
                await self.next()
        except EOFError:
            pass


def _identify(raw: bytes, media: str) -> Frame:
    """What a frame carries, read with general decoders (not with anything FrameEncoder uses)."""
    if media == JSON:
        assert raw.endswith(b"}\n") and raw.count(b"\n") == 1, raw[-50:]
        ev = msgspec.json.decode(raw, type=_JsonEvent)
        type_, obj = ev.type, orjson.loads(bytes(ev.object))
    else:
        assert int.from_bytes(raw[:4], "big") == len(raw) - 4
        type_, envelope = parse_watch_event(raw[4:])
        obj = _CODEC.to_obj(envelope)
    meta = obj.get("metadata") or {}
    end = (meta.get("annotations") or {}).get(END) == "true"
    name = meta.get("name", "") if type_ not in ("BOOKMARK", "ERROR") else ""
    return Frame(raw, type_, name, int(meta.get("resourceVersion") or 0), end)


async def _open(
    session: aiohttp.ClientSession, cp: ControlPlaneInfo, path: str, query: dict[str, str], media: str
) -> Watch:
    url = f"{cp.server}{path}?{urllib.parse.urlencode(query)}"
    # identity: 1.37 gzips watch-list responses; the frames are compared before any compression.
    resp = await session.get(
        url, headers={"Accept": media, "Accept-Encoding": "identity"}, timeout=aiohttp.ClientTimeout(total=None)
    )
    assert resp.status == 200, await resp.read()
    assert resp.headers["Content-Type"] == CONTENT_TYPES[media]
    return Watch(resp, media)


async def _call(
    session: aiohttp.ClientSession,
    cp: ControlPlaneInfo,
    method: str,
    path: str,
    body: Any = None,
    ctype: str = "application/json",
) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else None
    async with session.request(
        method, cp.server + path, data=data, headers={"Content-Type": ctype, "Accept": "application/json"}
    ) as r:
        text = await r.read()
        assert r.status in (200, 201), f"{method} {path}: {r.status} {text[:300]!r}"
        out: dict[str, Any] = json.loads(text)
        return out


# --------------------------------------------------------------------------- the resources


@dataclass(frozen=True)
class Case:
    resource: str
    group: str
    kind: Kind
    collection: Callable[[str], str]  # namespace -> collection path
    make: Callable[[str, str], dict[str, Any]]  # (namespace, name) -> object
    patch: dict[str, Any]  # a merge patch that changes what the object holds
    cluster: bool = False


# Strings a naive encoder gets wrong: HTML-significant characters (Go escapes them), non-ASCII,
# control characters, the JavaScript line separator.
TRICKY = '<b>&amp;</b> é ☃ \u2028 \t"quoted" \\ 🚀'


def _labels(ns: str) -> dict[str, str]:
    return {"kproxy-frames": ns, "app": "web"}


def _pod(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": _labels(ns), "annotations": {"note": TRICKY}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "registry.example/app:1",
                    "args": ["--x=<y>", TRICKY],
                    "resources": {"limits": {"cpu": "1500m", "memory": "1Gi"}, "requests": {"cpu": "0.5"}},
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                }
            ],
            "terminationGracePeriodSeconds": 5,
        },
    }


def _configmap(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "labels": _labels(ns)},
        "data": {"tricky": TRICKY, "empty": "", "json": '{"a": [1, 2.5e10]}'},
        "binaryData": {"blob": "AAEC/w=="},
    }


def _deployment(ns: str, name: str) -> dict[str, Any]:
    sel = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": _labels(ns)},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": sel},
                "spec": {
                    "containers": [
                        {"name": "c", "image": "registry.example/app:1", "env": [{"name": "X", "value": TRICKY}]}
                    ]
                },
            },
        },
    }


def _service(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "labels": _labels(ns)},
        "spec": {"selector": {"app": name}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }


def _node(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": _labels(ns), "annotations": {"note": TRICKY}},
        "spec": {"podCIDR": "10.2.0.0/24", "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]},
    }


CASES = [
    Case(
        "pods",
        "",
        Kind("v1", "Pod", "PodList", True),
        lambda ns: f"/api/v1/namespaces/{ns}/pods",
        _pod,
        {"metadata": {"labels": {"app": "db"}}, "spec": {"activeDeadlineSeconds": 30}},
    ),
    Case(
        "configmaps",
        "",
        Kind("v1", "ConfigMap", "ConfigMapList", True),
        lambda ns: f"/api/v1/namespaces/{ns}/configmaps",
        _configmap,
        {"data": {"tricky": None, "new": "<&>"}},
    ),
    Case(
        "deployments",
        "apps",
        Kind("apps/v1", "Deployment", "DeploymentList", True),
        lambda ns: f"/apis/apps/v1/namespaces/{ns}/deployments",
        _deployment,
        {"spec": {"replicas": 0, "paused": True}},
    ),
    Case(
        "services",
        "",
        Kind("v1", "Service", "ServiceList", True),
        lambda ns: f"/api/v1/namespaces/{ns}/services",
        _service,
        {"spec": {"ports": [{"name": "https", "port": 443}]}},
    ),
    Case(
        "nodes",
        "",
        Kind("v1", "Node", "NodeList", True),
        lambda ns: "/api/v1/nodes",
        _node,
        {"spec": {"unschedulable": True}},
        cluster=True,
    ),
]


def _check_frames(enc: FrameEncoder, factory: ObjectFactory, json_w: Watch, proto_w: Watch) -> None:
    """Every frame of both watches rebuilt. Bookmarks from their own resource version (the two
    watches start a moment apart, so their initial-events-end bookmarks may be at different
    revisions); the i-th event of one watch is the i-th of the other, and both frames are made
    from the CachedObject of the protobuf one (as the cache holds built-in kinds)."""
    for w in (json_w, proto_w):
        for f in w.frames:
            if f.type == "BOOKMARK":
                assert enc.bookmark(f.rv, w.media, initial_events_end=f.end) == f.raw, f.raw
    json_events = [f for f in json_w.frames if f.type != "BOOKMARK"]
    proto_events = [f for f in proto_w.frames if f.type != "BOOKMARK"]
    assert [(f.type, f.name, f.rv) for f in json_events] == [(f.type, f.name, f.rv) for f in proto_events]
    for jf, pf in zip(json_events, proto_events, strict=True):
        _, envelope = parse_watch_event(pf.raw[4:])
        obj = factory.from_proto(decode_envelope(envelope).raw)
        assert obj.rv == pf.rv
        assert enc.event(pf.type, obj, PROTOBUF) == pf.raw, f"{pf.type} {pf.name}: protobuf frame differs"
        mine = enc.event(jf.type, obj, JSON)
        assert mine == jf.raw, f"{jf.type} {jf.name}:\n{mine!r}\n{jf.raw!r}"


@pytest.mark.parametrize("case", CASES, ids=[c.resource for c in CASES])
async def test_builtin_frames_match_apiserver(
    case: Case, control_plane: ControlPlaneInfo, namespace: str, session: aiohttp.ClientSession, codec: ProtobufCodec
) -> None:
    """Initial ADDED events, the initial-events-end bookmark, then live ADDED, MODIFIED and DELETED
    events of a built-in kind, each rebuilt byte for byte in JSON and protobuf."""
    cp = control_plane
    base = case.collection(namespace)
    prefix = f"fr-{namespace[-6:]}" if case.cluster else "fr"
    names = [f"{prefix}-{i}" for i in range(3)]
    query = dict(WATCH)
    if case.cluster:
        query["labelSelector"] = f"kproxy-frames={namespace}"
    try:
        for name in names[:2]:
            await _call(session, cp, "POST", base, case.make(namespace, name))
        json_w, proto_w = await asyncio.gather(*(_open(session, cp, base, query, m) for m in (JSON, PROTOBUF)))
        try:
            await asyncio.gather(*(w.until(lambda f: f.end) for w in (json_w, proto_w)))
            await _call(session, cp, "POST", base, case.make(namespace, names[2]))
            await _call(session, cp, "PATCH", f"{base}/{names[0]}", case.patch, MERGE)
            await _call(session, cp, "DELETE", f"{base}/{names[1]}")
            await _call(session, cp, "DELETE", f"{base}/{names[2]}")
            await asyncio.gather(
                *(w.until(lambda f: f.type == "DELETED" and f.name == names[2]) for w in (json_w, proto_w))
            )
        finally:
            json_w.resp.close()
            proto_w.resp.close()
    finally:
        if case.cluster:
            for name in names:  # nodes outlive the test's namespace
                async with session.delete(f"{cp.server}{base}/{name}"):
                    pass

    factory = ObjectFactory(case.kind, builtin_fields(case.group, case.resource), codec)
    _check_frames(FrameEncoder(case.kind, codec), factory, json_w, proto_w)
    for w in (json_w, proto_w):
        assert [f.type for f in w.frames[:3]] == ["ADDED", "ADDED", "BOOKMARK"] and w.frames[2].end
        assert w.frames[2].rv >= max(f.rv for f in w.frames[:2])
    live = [(f.type, f.name) for f in json_w.frames[3:] if f.type != "BOOKMARK"]
    # (A pod's DELETE may first be a MODIFIED that sets deletionTimestamp.)
    assert live[0] == ("ADDED", names[2]) and ("MODIFIED", names[0]) in live, live
    assert {n for t, n in live if t == "DELETED"} == {names[1], names[2]}, live


# --------------------------------------------------------------------------- every built-in kind's bookmark


async def _discover(session: aiohttp.ClientSession, cp: ControlPlaneInfo) -> list[tuple[str, str, str]]:
    """(collection path, apiVersion, kind) of every built-in resource the apiserver watches."""

    async def get(path: str) -> dict[str, Any]:
        async with session.get(cp.server + path) as r:
            # A custom resource's group version may go between the two reads (another test's CRD
            # deleted): only built-in kinds are wanted here.
            if r.status == 404 and path != "/apis":
                return {"resources": []}
            assert r.status == 200, path
            out: dict[str, Any] = await r.json()
            return out

    versions = ["v1"] + [v["groupVersion"] for g in (await get("/apis"))["groups"] for v in g["versions"]]
    out = []
    for gv in versions:
        base = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        for r in (await get(base))["resources"]:
            if "/" not in r["name"] and "watch" in r.get("verbs", ()):
                out.append((f"{base}/{r['name']}", gv, r["kind"]))
    return out


async def _first_frame(
    session: aiohttp.ClientSession, cp: ControlPlaneInfo, path: str, query: dict[str, str], media: str
) -> Frame:
    w = await _open(session, cp, path, query, media)
    try:
        return await w.next()
    finally:
        w.resp.close()


async def test_every_builtin_kind_bookmark_matches_apiserver(
    control_plane: ControlPlaneInfo, session: aiohttp.ClientSession, codec: ProtobufCodec
) -> None:
    """The initial-events-end bookmark of every built-in kind the apiserver serves (a watch whose
    selector matches nothing sends just that), in JSON and protobuf: Go's zero struct of each kind,
    including what the apps/v1 conversions add to it; then the plain bookmark at the same
    resource version, in the layout the annotation-less object takes."""
    query = dict(WATCH, labelSelector="kproxy-frames-nothing=x")
    kinds = [k for k in await _discover(session, control_plane) if codec.knows(k[1], k[2])]
    assert len(kinds) > 40 and ("/apis/apps/v1/deployments", "apps/v1", "Deployment") in kinds
    mismatches = []
    version = UpstreamVersion(None if control_plane.minor is None else (1, control_plane.minor))
    for path, api_version, kind_name in kinds:
        enc = FrameEncoder(Kind(api_version, kind_name, kind_name + "List", True), codec, version)
        for media in (JSON, PROTOBUF):
            frame = await _first_frame(session, control_plane, path, query, media)
            assert frame.type == "BOOKMARK" and frame.end and frame.rv > 0, frame
            mine = enc.bookmark(frame.rv, media, initial_events_end=True)
            if mine != frame.raw:
                mismatches.append(f"{kind_name} {api_version} {media}:\n  {frame.raw!r}\n  {mine!r}")
            # Without the annotation: the same object minus it (a periodic bookmark).
            plain = enc.bookmark(frame.rv, media)
            if media == JSON:
                obj = orjson.loads(plain)["object"]
                assert obj["metadata"]["resourceVersion"] == str(frame.rv)
                assert END not in (obj["metadata"].get("annotations") or {})
                want = orjson.loads(frame.raw)["object"]
                del want["metadata"]["annotations"][END]
                if not want["metadata"]["annotations"]:
                    del want["metadata"]["annotations"]
                assert obj == want
    assert not mismatches, "\n".join(mismatches)


# --------------------------------------------------------------------------- a custom resource

CRD = crds.crd("frames.kproxy.test", "framers", "Framer")
CR_KIND = Kind("frames.kproxy.test/v1", "Framer", "FramerList", False)


def _framer(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": CR_KIND.api_version,
        "kind": CR_KIND.kind,
        "metadata": {"name": name, "namespace": ns, "labels": _labels(ns)},
        "spec": {"text": TRICKY, "n": 12345678901234, "f": 1.5e-7, "list": [True, None, {"z": 1, "a": 2}]},
    }


async def test_custom_resource_frames_match_apiserver(
    control_plane: ControlPlaneInfo, namespace: str, session: aiohttp.ClientSession, codec: ProtobufCodec
) -> None:
    """A custom resource (JSON only): each event rebuilt from the object's JSON as the cache keeps it
    (the bytes the apiserver sent), and the bookmarks, an unstructured map with sorted keys."""
    cp = control_plane
    crds.install(cp, CRD)
    base = f"/apis/frames.kproxy.test/v1/namespaces/{namespace}/framers"
    names = ["fr-0", "fr-1", "fr-2"]
    for name in names[:2]:
        await _call(session, cp, "POST", base, _framer(namespace, name))
    w = await _open(session, cp, base, WATCH, JSON)
    try:
        await w.until(lambda f: f.end)
        await _call(session, cp, "POST", base, _framer(namespace, names[2]))
        await _call(session, cp, "PATCH", f"{base}/{names[0]}", {"spec": {"text": "<changed>", "list": None}}, MERGE)
        await _call(session, cp, "DELETE", f"{base}/{names[1]}")
        await _call(session, cp, "DELETE", f"{base}/{names[2]}")
        await w.until(lambda f: f.type == "DELETED" and f.name == names[2])
    finally:
        w.resp.close()
    enc = FrameEncoder(CR_KIND, codec)
    factory = ObjectFactory(CR_KIND, crd_fields((), namespaced=True), codec)
    for f in w.frames:
        if f.type == "BOOKMARK":
            assert enc.bookmark(f.rv, JSON, initial_events_end=f.end) == f.raw
            continue
        obj = factory.from_json(bytes(msgspec.json.decode(f.raw, type=_JsonEvent).object))
        assert enc.event(f.type, obj, JSON) == f.raw
    assert [(f.type, f.name) for f in w.frames[:3]] == [("ADDED", names[0]), ("ADDED", names[1]), ("BOOKMARK", "")]
    assert w.frames[2].end
    # The apiserver may put a plain bookmark anywhere in the live part (cache_watcher.go,
    # nextBookmarkTime); a CI run once saw one right after the first live event. Each was rebuilt above.
    live = w.frames[3:]
    assert [(f.type, f.name) for f in live if f.type != "BOOKMARK"] == [
        ("ADDED", names[2]),
        ("MODIFIED", names[0]),
        ("DELETED", names[1]),
        ("DELETED", names[2]),
    ]
    assert not any(f.end for f in live)
    assert [f.rv for f in live] == sorted(f.rv for f in live)
    with pytest.raises(ValueError):
        enc.bookmark(w.frames[2].rv, PROTOBUF)


# --------------------------------------------------------------------------- ERROR events


async def _error_frames(
    session: aiohttp.ClientSession, cp: ControlPlaneInfo, path: str, query: dict[str, str]
) -> dict[str, Frame]:
    """The single ERROR frame of a JSON and a protobuf watch opened together (then the stream ends)."""

    async def one(media: str) -> Frame:
        deadline = time.monotonic() + WAIT
        while True:  # a watch cache still initialising after a restart answers 429 for a moment
            url = f"{cp.server}{path}?{urllib.parse.urlencode(query)}"
            resp = await session.get(url, headers={"Accept": media, "Accept-Encoding": "identity"})
            if resp.status != 429 or time.monotonic() > deadline:
                break
            resp.close()
            await asyncio.sleep(0.2)
        assert resp.status == 200, await resp.read()
        assert resp.headers["Content-Type"] == CONTENT_TYPES[media]
        w = Watch(resp, media)
        try:
            await w.rest()
        finally:
            resp.close()
        assert [f.type for f in w.frames] == ["ERROR"], w.frames
        return w.frames[0]

    json_f, proto_f = await asyncio.gather(one(JSON), one(PROTOBUF))
    return {JSON: json_f, PROTOBUF: proto_f}


def _status_of(frame: Frame, codec: ProtobufCodec) -> dict[str, Any]:
    if frame.raw.startswith(b"{"):
        out: dict[str, Any] = orjson.loads(frame.raw)["object"]
        return out
    _, envelope = parse_watch_event(frame.raw[4:])
    return codec.to_obj(envelope)


async def test_expired_error_frames_match_apiserver(
    control_plane: ControlPlaneInfo, namespace: str, session: aiohttp.ClientSession, codec: ProtobufCodec
) -> None:
    """A watch from a resource version older than the apiserver can deliver: 200 and one ERROR
    event carrying the 410 Expired Status, which kproxy's own Status renders to the same frame."""
    cp = control_plane
    # The apiserver's watch cache starts at etcd's head when the apiserver starts, and etcd keeps
    # nothing older once compacted: resourceVersion 1 is then too old for either.
    cp.stop_apiserver(kill=True)
    try:
        _compact(cp)
    finally:
        cp.start_apiserver()
    await session.close()
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(ssl=cp.ssl_context()), auto_decompress=False
    ) as fresh:
        frames = await _error_frames(
            fresh, cp, f"/api/v1/namespaces/{namespace}/configmaps", {"watch": "1", "resourceVersion": "1"}
        )
    enc = FrameEncoder(Kind("v1", "ConfigMap", "ConfigMapList", True), codec)
    for media, frame in frames.items():
        status = _status_of(frame, codec)
        assert status["code"] == 410 and status["reason"] == "Expired", status
        assert re.fullmatch(
            r"too old resource version: 1 \(\d+\)|The resourceVersion for the provided watch is too old\.",
            status["message"],
        )
        assert enc.error(resource_expired(status["message"]).to_dict(), media) == frame.raw, media


async def test_too_large_resource_version_error_frames_match_apiserver(
    control_plane: ControlPlaneInfo, namespace: str, session: aiohttp.ClientSession, codec: ProtobufCodec
) -> None:
    """sendInitialEvents from a resource version the cache never reaches: after ~3 s one ERROR event
    with a 504 Timeout Status carrying details (a cause and retryAfterSeconds)."""
    query = dict(WATCH, resourceVersion=str(10**12))
    frames = await _error_frames(session, control_plane, f"/api/v1/namespaces/{namespace}/pods", query)
    enc = FrameEncoder(Kind("v1", "Pod", "PodList", True), codec)
    for media, frame in frames.items():
        status = _status_of(frame, codec)
        m = re.fullmatch(r"Timeout: (Too large resource version: \d+, current: \d+)", status.get("message", ""))
        assert m and status["code"] == 504, status
        mine = timeout(m.group(1), 1, [StatusCause("ResourceVersionTooLarge", "Too large resource version")])
        assert enc.error(mine.to_dict(), media) == frame.raw, media


# --------------------------------------------------------------------------- selector transitions


@pytest.mark.parametrize("case", [CASES[0], CASES[1], None], ids=["pods", "configmaps", "custom-resource"])
async def test_selector_transition_frames_match_apiserver(
    case: Case | None,
    control_plane: ControlPlaneInfo,
    namespace: str,
    session: aiohttp.ClientSession,
    codec: ProtobufCodec,
) -> None:
    """A watch with a label selector: an object that stops matching arrives as DELETED carrying its
    previous content at the update's resource version (the cache makes it with
    ``CachedObject.at_rv``), one that matches again as ADDED; each frame rebuilt byte for byte."""
    cp = control_plane
    make: Callable[[str, str], dict[str, Any]]
    if case is None:
        crds.install(cp, CRD)
        kind, base, make = CR_KIND, f"/apis/frames.kproxy.test/v1/namespaces/{namespace}/framers", _framer
        factory = ObjectFactory(CR_KIND, crd_fields((), namespaced=True), codec)
        medias = [JSON]
    else:
        kind, base, make = case.kind, case.collection(namespace), case.make
        factory = ObjectFactory(case.kind, builtin_fields(case.group, case.resource), codec)
        medias = [JSON, PROTOBUF]
    a, b = "sel-a", "sel-b"
    for name in (a, b):
        await _call(session, cp, "POST", base, make(namespace, name))
    query = dict(WATCH, labelSelector=f"kproxy-frames={namespace},app=web")
    watches = await asyncio.gather(*(_open(session, cp, base, query, m) for m in medias))
    try:
        await asyncio.gather(*(w.until(lambda f: f.end) for w in watches))
        leave = {"metadata": {"labels": {"app": "db"}, "annotations": {"step": "leave"}}}
        back = {"metadata": {"labels": {"app": "web"}, "annotations": {"step": "back"}}}
        await _call(session, cp, "PATCH", f"{base}/{a}", leave, MERGE)
        await _call(session, cp, "PATCH", f"{base}/{a}", back, MERGE)
        await _call(session, cp, "PATCH", f"{base}/{b}", leave, MERGE)
        await asyncio.gather(*(w.until(lambda f: f.type == "DELETED" and f.name == b) for w in watches))
    finally:
        for w in watches:
            w.resp.close()

    expected = [("ADDED", a), ("ADDED", b), ("DELETED", a), ("ADDED", a), ("DELETED", b)]
    events = {w.media: [f for f in w.frames if f.type != "BOOKMARK"] for w in watches}
    for media, frames in events.items():
        assert [(f.type, f.name) for f in frames] == expected, media
    # The cache's objects, from the stream it would read (protobuf for built-in kinds).
    source = events[medias[-1]]
    seen: dict[str, CachedObject] = {}  # each name's last object
    objects = []
    for f in source:
        if medias[-1] == JSON:
            obj = factory.from_json(bytes(msgspec.json.decode(f.raw, type=_JsonEvent).object))
        else:
            _, envelope = parse_watch_event(f.raw[4:])
            obj = factory.from_proto(decode_envelope(envelope).raw)
        if f.type == "DELETED":
            # What the apiserver sent: the previous content, at the update's resource version.
            assert obj.labels.get("app") == "web" and obj.rv == f.rv > seen[f.name].rv
            obj = seen[f.name].at_rv(f.rv)  # what the cache sends
        seen[f.name] = obj
        objects.append(obj)
    enc = FrameEncoder(kind, codec)
    for media, frames in events.items():
        for f, obj in zip(frames, objects, strict=True):
            mine = enc.event(f.type, obj, media)
            assert mine == f.raw, f"{f.type} {f.name} {media}:\n{mine!r}\n{f.raw!r}"


# --------------------------------------------------------------------------- periodic bookmarks


def _daemonset(ns: str, name: str) -> dict[str, Any]:
    sel = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "selector": {"matchLabels": sel},
            "template": {"metadata": {"labels": sel}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


PERIODIC = [
    ("configmaps", Kind("v1", "ConfigMap", "ConfigMapList", True), "/api/v1", _configmap),
    ("deployments", Kind("apps/v1", "Deployment", "DeploymentList", True), "/apis/apps/v1", _deployment),
    ("daemonsets", Kind("apps/v1", "DaemonSet", "DaemonSetList", True), "/apis/apps/v1", _daemonset),
    ("framers", CR_KIND, "/apis/frames.kproxy.test/v1", _framer),
]


async def test_periodic_bookmarks_match_apiserver(
    control_plane: ControlPlaneInfo, namespace: str, session: aiohttp.ClientSession, codec: ProtobufCodec
) -> None:
    """The bookmarks a watch gets without the initial-events-end marker (the apiserver sends one
    2 s before a watch's timeout once it has seen an event after the watch's start): only
    ``metadata.resourceVersion``, plus what apps/v1's conversion adds (a DaemonSet's
    template-generation annotation)."""
    cp = control_plane
    crds.install(cp, CRD)

    async def one(resource: str, kind: Kind, prefix: str, make: Callable[[str, str], dict[str, Any]]) -> None:
        base = f"{prefix}/namespaces/{namespace}/{resource}"
        rv = (await _call(session, cp, "GET", base))["metadata"]["resourceVersion"]
        # No object matches: the stream carries bookmarks only.
        query = {
            "watch": "1",
            "resourceVersion": rv,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "5",
            "fieldSelector": "metadata.name=nothing",
        }
        medias = [JSON, PROTOBUF] if kind.protobuf else [JSON]
        watches = await asyncio.gather(*(_open(session, cp, base, query, m) for m in medias))
        await _call(session, cp, "POST", base, make(namespace, "bm"))  # an event after the watch's start
        try:
            await asyncio.gather(*(w.rest() for w in watches))
        finally:
            for w in watches:
                w.resp.close()
        enc = FrameEncoder(kind, codec)
        for w in watches:
            assert w.frames, f"{resource} {w.media}: no bookmark before the timeout"
            for f in w.frames:
                assert f.type == "BOOKMARK" and not f.end and f.rv >= int(rv), f
                assert enc.bookmark(f.rv, w.media) == f.raw, f"{resource} {w.media}:\n{f.raw!r}"

    await asyncio.gather(*(one(*p) for p in PERIODIC))
