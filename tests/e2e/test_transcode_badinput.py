"""Bad protobuf from the upstream: truncated frames, wrong magic, unknown kinds, garbage.

The real apiserver never sends such bodies, so kproxy (a real `kproxy run` process with
``transcode: {upstream: protobuf}``) is pointed at a small stand-in upstream in this test process
that serves them, built from real protobuf taken from the real apiserver. What is checked:
a clean 500 ``InternalError`` Status in the client's media type while nothing was written yet,
an aborted connection (never a clean end) for a list that breaks after its first bytes, one
``ERROR`` event for a watch, and kproxy keeps serving afterwards.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web
from corpus.compare import PROTOBUF, Sides

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.localcluster.processes import free_ports
from kproxy.testing.proxyproc import RunningProxy, start_proxy

MAGIC = b"k8s\x00"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    """``k8s\\0`` + runtime.Unknown{typeMeta{apiVersion, kind}, raw}."""
    return MAGIC + _field(1, _field(1, api_version.encode()) + _field(2, kind.encode())) + _field(2, raw)


def raw_of(env: bytes) -> bytes:
    """The ``raw`` field of a real envelope (field 2 after the typeMeta field 1)."""
    pos = len(MAGIC)
    assert env[pos] == 0x0A
    n, pos = _read_varint(env, pos + 1)
    pos += n
    assert env[pos] == 0x12
    n, pos = _read_varint(env, pos + 1)
    return env[pos : pos + n]


def _read_varint(b: bytes, pos: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        byte = b[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def watch_frame(type_: str, env: bytes) -> bytes:
    event = _field(1, type_.encode()) + _field(2, _field(1, env))
    return struct.pack(">I", len(event)) + event


class StandIn:
    """The stand-in upstream: each path serves one prepared body."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.lists: dict[str, list[bytes]] = {}
        self.watches: dict[str, list[bytes]] = {}
        self.seen: list[tuple[str, str, str]] = []  # method, path, Accept

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/readyz":
            return web.Response(text="ok")
        accept = request.headers.get("Accept", "")
        self.seen.append((request.method, request.path, accept))
        name = request.path.rsplit("/", 1)[-1]
        if PROTOBUF not in accept:  # what an upstream answers a client that did not ask protobuf
            body = json.dumps({"kind": "Gizmo", "apiVersion": "v1", "metadata": {"name": name}})
            return web.Response(body=body.encode() + b"\n", headers={"Content-Type": "application/json"})
        if request.query.get("watch") and name in self.watches:
            resp = web.StreamResponse(headers={"Content-Type": PROTOBUF + ";stream=watch"})
            await resp.prepare(request)
            for frame in self.watches[name]:
                await resp.write(frame)
            await resp.write_eof()
            return resp
        if name in self.lists:
            resp = web.StreamResponse(headers={"Content-Type": PROTOBUF})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for piece in self.lists[name]:
                await resp.write(piece)
                await asyncio.sleep(0)
            await resp.write_eof()
            return resp
        if name in self.objects:
            return web.Response(body=self.objects[name], headers={"Content-Type": PROTOBUF})
        return web.Response(status=404, text="no such case")


@pytest.fixture(scope="module")
def real_protobuf(control_plane: ControlPlaneInfo) -> dict[str, bytes]:
    """A real ConfigMap envelope and a real (large) ConfigMapList from the apiserver."""
    ns = "transcode-badinput-src"
    control_plane.request(
        "POST", "/api/v1/namespaces", body=json.dumps({"metadata": {"name": ns}}).encode()
    )  # may already exist
    for i in range(40):
        body = {"metadata": {"name": f"cm-{i}"}, "data": {"k": "v" * 4000}}
        control_plane.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=json.dumps(body).encode())

    async def fetch() -> dict[str, bytes]:
        s = Sides(control_plane, "http://unused")
        try:
            obj = await s.request("GET", f"/api/v1/namespaces/{ns}/configmaps/cm-0", via_proxy=False, accept=PROTOBUF)
            lst = await s.request("GET", f"/api/v1/namespaces/{ns}/configmaps", via_proxy=False, accept=PROTOBUF)
        finally:
            await s.close()
        assert obj.content_type == PROTOBUF and lst.content_type == PROTOBUF
        return {"object": obj.body, "list": lst.body}

    return asyncio.run(fetch())


@pytest.fixture
async def stand_in(tmp_path: Path) -> AsyncIterator[tuple[StandIn, Path]]:
    si = StandIn()
    server = web.Server(si.handle)
    runner = web.ServerRunner(server)
    await runner.setup()
    (port,) = free_ports(1)
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    kubeconfig = tmp_path / "standin.kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "s", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    yield si, kubeconfig
    await runner.cleanup()


@pytest.fixture
async def proxy(stand_in: tuple[StandIn, Path], tmp_path: Path) -> AsyncIterator[RunningProxy]:
    _, kubeconfig = stand_in
    rp = await asyncio.to_thread(
        start_proxy, tmp_path / "kp", kubeconfig, extra={"filters": [{"name": "transcode", "upstream": "protobuf"}]}
    )
    yield rp
    await asyncio.to_thread(rp.stop)


Get = Callable[..., Awaitable[tuple[int, dict[str, str], bytes]]]


@pytest.fixture
async def get(proxy: RunningProxy) -> AsyncIterator[Get]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:

        async def do(path: str, accept: str = "application/json") -> tuple[int, dict[str, str], bytes]:
            async with session.get(proxy.url + path, headers={"Accept": accept}) as resp:
                return resp.status, dict(resp.headers), await resp.read()

        yield do


def _assert_internal_error(status: int, headers: dict[str, str], body: bytes, fragment: str) -> None:
    assert status == 500, body[:300]
    assert headers["Content-Type"] == "application/json"
    assert int(headers["Content-Length"]) == len(body)  # a whole answer, not a cut stream
    st = json.loads(body)
    assert (st["kind"], st["status"], st["reason"], st["code"]) == ("Status", "Failure", "InternalError", 500)
    assert st["message"].startswith("Internal error occurred: kproxy transcode: ")
    assert fragment in st["message"], st["message"]


OBJ = "/api/v1/namespaces/bad/configmaps/"


async def test_wrong_magic(stand_in: tuple[StandIn, Path], real_protobuf: dict[str, bytes], get: Get) -> None:
    si, _ = stand_in
    si.objects["magic"] = b"k9s\x00" + real_protobuf["object"][4:]
    _assert_internal_error(*await get(OBJ + "magic"), "")


async def test_truncated_object(stand_in: tuple[StandIn, Path], real_protobuf: dict[str, bytes], get: Get) -> None:
    si, _ = stand_in
    si.objects["truncated"] = real_protobuf["object"][: len(real_protobuf["object"]) // 2]
    _assert_internal_error(*await get(OBJ + "truncated"), "")


async def test_unknown_kind_on_a_write_is_a_clean_status(
    stand_in: tuple[StandIn, Path], real_protobuf: dict[str, bytes], proxy: RunningProxy
) -> None:
    si, _ = stand_in
    si.objects["secrets"] = envelope("v1", "Gizmo", raw_of(real_protobuf["object"]))
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.url + "/api/v1/namespaces/bad/secrets", json={"metadata": {"name": "s"}}) as resp,
    ):
        _assert_internal_error(resp.status, dict(resp.headers), await resp.read(), "Gizmo")
    assert len([s for s in si.seen if s[0] == "POST"]) == 1  # a write is never sent twice


@pytest.mark.parametrize("path", [OBJ + "unknown", "/api/v1/namespaces/bad/gizmos"])
async def test_unknown_kind_on_a_read_is_asked_again_as_the_client_asked(
    stand_in: tuple[StandIn, Path], real_protobuf: dict[str, bytes], proxy: RunningProxy, get: Get, path: str
) -> None:
    """A read whose protobuf answer is of a kind kproxy has no schema for (an aggregated API that
    speaks protobuf) is repeated with the client's own Accept, and that answer passed through."""
    si, _ = stand_in
    gizmo = envelope("v1", "Gizmo", raw_of(real_protobuf["object"]))
    name = path.rsplit("/", 1)[-1]
    if name == "gizmos":
        si.lists[name] = [gizmo[i : i + 100] for i in range(0, len(gizmo), 100)]
    else:
        si.objects[name] = gizmo
    status, headers, body = await get(path)
    assert (status, headers["Content-Type"]) == (200, "application/json")
    assert json.loads(body) == {"kind": "Gizmo", "apiVersion": "v1", "metadata": {"name": name}}
    assert [s[2] for s in si.seen if s[1] == path] == [f"{PROTOBUF}, application/json", "application/json"]
    assert "kproxy_transcode_fallbacks_total 1.0" in proxy.metrics()


@pytest.mark.parametrize("body", [b"", MAGIC, MAGIC + bytes(range(256)) * 3, b"\xff" * 64])
async def test_garbage(stand_in: tuple[StandIn, Path], get: Get, body: bytes) -> None:
    si, _ = stand_in
    si.objects["garbage"] = body
    _assert_internal_error(*await get(OBJ + "garbage"), "")


async def test_status_error_in_yaml_for_a_yaml_client(
    stand_in: tuple[StandIn, Path], real_protobuf: dict[str, bytes], get: Get
) -> None:
    si, _ = stand_in
    si.objects["yaml"] = b"k9s\x00junk"
    status, headers, body = await get(OBJ + "yaml", accept="application/yaml")
    assert (status, headers["Content-Type"]) == (500, "application/yaml")
    st = yaml.safe_load(body)
    assert (st["kind"], st["reason"], st["code"]) == ("Status", "InternalError", 500)


async def test_list_garbage_from_the_start_is_a_clean_status(stand_in: tuple[StandIn, Path], get: Get) -> None:
    si, _ = stand_in
    si.lists["configmaps"] = [b"not protobuf at all, " * 100]
    _assert_internal_error(*await get("/api/v1/namespaces/bad/configmaps"), "")


async def test_list_cut_short_aborts_the_connection(
    stand_in: tuple[StandIn, Path], real_protobuf: dict[str, bytes], proxy: RunningProxy, get: Get
) -> None:
    si, _ = stand_in
    data = real_protobuf["list"]
    cut = data[: len(data) * 6 // 10]
    si.lists["configmaps"] = [cut[i : i + 8192] for i in range(0, len(cut), 8192)]
    async with (
        aiohttp.ClientSession() as session,
        session.get(proxy.url + "/api/v1/namespaces/bad/configmaps") as resp,
    ):
        assert resp.status == 200  # the first items were out before the cut was seen
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    # kproxy is still serving.
    si.objects["fine"] = real_protobuf["object"]
    status, _, body = await get(OBJ + "fine")
    assert status == 200 and json.loads(body)["kind"] == "ConfigMap"


async def test_whole_list_is_streamed_intact(
    stand_in: tuple[StandIn, Path], real_protobuf: dict[str, bytes], get: Get
) -> None:
    """Control for the test above: the same list uncut, in the same pieces, arrives whole."""
    si, _ = stand_in
    data = real_protobuf["list"]
    si.lists["configmaps"] = [data[i : i + 8192] for i in range(0, len(data), 8192)]
    status, headers, body = await get("/api/v1/namespaces/bad/configmaps")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert len(json.loads(body)["items"]) == 40


async def _watch_events(proxy: RunningProxy, path: str) -> list[dict[str, object]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(proxy.url + path, headers={"Accept": "application/json"}) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/json"
        return [json.loads(line) for line in (await resp.read()).splitlines()]


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(struct.pack(">I", 10) + b"\x0a\x05ADD", id="truncated-frame"),
        pytest.param(watch_frame("ADDED", b"k9s\x00" + b"\x00" * 20), id="wrong-magic"),
        pytest.param(struct.pack(">I", 12) + b"\xff" * 12, id="garbage-frame"),
        pytest.param("unknown", id="unknown-kind"),
    ],
)
async def test_watch_bad_frame_ends_with_an_error_event(
    stand_in: tuple[StandIn, Path], real_protobuf: dict[str, bytes], proxy: RunningProxy, bad: bytes | str
) -> None:
    si, _ = stand_in
    good = watch_frame("ADDED", real_protobuf["object"])
    if bad == "unknown":
        bad = watch_frame("ADDED", envelope("v1", "Gizmo", raw_of(real_protobuf["object"])))
    assert isinstance(bad, bytes)
    # A truncated frame can only be the last one; after any other bad frame, a good one follows
    # that must not be delivered (the stream ends at the first frame kproxy cannot read).
    si.watches["configmaps"] = [good, bad] if bad.startswith(struct.pack(">I", 10)) else [good, bad, good]
    events = await _watch_events(proxy, "/api/v1/namespaces/bad/configmaps?watch=1")
    assert len(events) == 2, events
    assert events[0]["type"] == "ADDED"
    assert events[0]["object"]["kind"] == "ConfigMap"  # type: ignore[index]
    err = events[1]
    assert err["type"] == "ERROR"
    st = err["object"]
    assert st["kind"] == "Status" and st["reason"] == "InternalError" and st["code"] == 500  # type: ignore[index]
