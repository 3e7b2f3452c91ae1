"""Objects whose strings are not UTF-8, read through kproxy as the apiserver writes them.

A protobuf client can store a ConfigMap whose data and annotation values are any bytes (gogo's
Unmarshal does not check UTF-8, validation does not look). The apiserver answers in JSON with
``\\ufffd`` for each byte that is not UTF-8 (encoding/json) and in YAML with U+FFFD. kproxy must
answer the same bytes through the transcode filter (the apiserver answers it protobuf), the watch
cache (it encodes the cached protobuf itself) and both, and one such object must not fail the
lists and watches that hold it, nor anyone else's.

Every comparison is made against the apiserver asked directly, in the same namespace, with the
objects created directly (a protobuf POST as admin).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import aiohttp
import pytest
from corpus.compare import JSON, PROTOBUF, YAML, Sides
from watchcache_diff import reads_total

from kproxy.codec.envelope import encode_envelope
from kproxy.codec.envelope import ld as _ld
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy, start_proxy

CHAINS = {
    "transcode": [{"name": "transcode", "upstream": "protobuf"}],
    "watchcache": [{"name": "watchcache", "resources": ["configmaps"]}],
    "watchcache+transcode": [
        {"name": "watchcache", "resources": ["configmaps"]},
        {"name": "transcode", "upstream": "protobuf"},
    ],
}
CACHED = ("watchcache", "watchcache+transcode")

# Each a different way of not being UTF-8 (Go writes one \ufffd per byte of each), with a real
# U+FFFD (written as it is) and an HTML character (escaped) beside them.
BAD_VALUE = b"\xff\xfe|\xe2\x82|\xed\xa0\x80|\xc0\x80|\xf0\x9f\x98|" + "\ufffd<".encode()
BAD_NOTE = b"note \x80"


def configmap_protobuf(
    name: str, data: dict[bytes, bytes], annotations: dict[bytes, bytes], labels: dict[bytes, bytes] | None = None
) -> bytes:
    """A ConfigMap as a protobuf client writes it, strings as raw bytes (generated.proto:
    ConfigMap{metadata=1, data=2}, ObjectMeta{name=1, labels=11, annotations=12}, map entries
    {key=1, value=2})."""

    def entries(field: int, m: dict[bytes, bytes]) -> bytes:
        return b"".join(_ld(field, _ld(1, k) + _ld(2, v)) for k, v in m.items())

    meta = _ld(1, name.encode()) + entries(11, labels or {}) + entries(12, annotations)
    return encode_envelope("v1", "ConfigMap", _ld(1, meta) + entries(2, data))


@dataclass
class Setup:
    chain: str
    proxy: RunningProxy
    namespace: str


@pytest.fixture(scope="module", params=list(CHAINS))
def setup(
    request: pytest.FixtureRequest, control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    """A namespace with a good ConfigMap, one that is not UTF-8 (both created directly), and
    kproxy with one of CHAINS in front of the apiserver."""
    chain = request.param
    ns = f"utf8-{chain.replace('+', '-')}-{secrets.token_hex(3)}"
    code, body = control_plane.request(
        "POST", "/api/v1/namespaces", body=json.dumps({"metadata": {"name": ns}}).encode()
    )
    assert code == 201, body
    code, body = control_plane.request(
        "POST",
        f"/api/v1/namespaces/{ns}/configmaps",
        body=json.dumps({"metadata": {"name": "a-good"}, "data": {"k": "fine"}}).encode(),
    )
    assert code == 201, body
    proxy = start_proxy(
        tmp_path_factory.mktemp(f"utf8-{chain}"), control_plane.admin_kubeconfig, extra={"filters": CHAINS[chain]}
    )
    yield Setup(chain, proxy, ns)
    proxy.stop()
    control_plane.request("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture
async def sides(control_plane: ControlPlaneInfo, setup: Setup) -> AsyncIterator[Sides]:
    s = Sides(control_plane, setup.proxy.url)
    yield s
    await s.close()


async def create_bad(sides: Sides, setup: Setup, name: str = "b-bad") -> None:
    """The object that is not UTF-8, created directly in protobuf (once per module)."""
    path = f"/api/v1/namespaces/{setup.namespace}/configmaps"
    if (await sides.request("GET", f"{path}/{name}", via_proxy=False)).status == 200:
        return
    body = configmap_protobuf(name, {b"k": BAD_VALUE, b"plain": b"text"}, {b"example.com/note": BAD_NOTE})
    answer = await sides.request("POST", path, via_proxy=False, data=body, headers={"Content-Type": PROTOBUF})
    assert answer.status == 201, answer.body
    assert rb"\ufffd\ufffd|\ufffd\ufffd|" in answer.body  # the premise: stored, and Go writes it so


async def create_good(sides: Sides, setup: Setup, name: str) -> str:
    """A well-formed ConfigMap created directly; its resource version."""
    code, body = sides.cp.request(
        "POST",
        f"/api/v1/namespaces/{setup.namespace}/configmaps",
        body=json.dumps({"metadata": {"name": name}, "data": {"k": "v"}}).encode(),
    )
    assert code == 201, body
    return str(json.loads(body)["metadata"]["resourceVersion"])


async def cache_serves(sides: Sides, setup: Setup, path: str) -> None:
    """Wait until the watch cache answers lists of the namespace itself (it syncs at start)."""
    if setup.chain not in CACHED:
        return
    for _ in range(200):
        before = reads_total(setup.proxy.metrics(), resource="configmaps", verb="list", served="cache")
        await sides.request("GET", path, via_proxy=True)
        if reads_total(setup.proxy.metrics(), resource="configmaps", verb="list", served="cache") > before:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the watch cache never served the list")


_LIST_RV = (
    re.compile(rb'^(\{"kind":"ConfigMapList","apiVersion":"v1","metadata":\{"resourceVersion":")\d+'),
    re.compile(rb'\nmetadata:\n  resourceVersion: "\d+"\n$'),
    re.compile(
        rb'^(\{\n  "kind": "ConfigMapList",\n  "apiVersion": "v1",\n  "metadata": \{\n    "resourceVersion": ")\d+'
    ),
)


def without_list_rv(body: bytes) -> bytes:
    """A list body without its own resourceVersion (the apiserver's is its newest write anywhere,
    which other tests move; a cache may answer at another valid one)."""
    body = _LIST_RV[2].sub(rb"\1", _LIST_RV[0].sub(rb"\1", body))
    return _LIST_RV[1].sub(b"\nmetadata:\n", body)


FORMATS = [
    pytest.param((JSON, ""), id="json"),
    pytest.param((YAML, ""), id="yaml"),
    pytest.param((JSON, "pretty=true"), id="pretty"),
]


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("rv", ["", "0"], ids=["consistent", "rv0"])
async def test_get_of_the_object_is_byte_equal_to_the_apiservers(
    sides: Sides, setup: Setup, form: tuple[str, str], rv: str
) -> None:
    accept, query = form
    await create_bad(sides, setup)
    params = "&".join(p for p in (f"resourceVersion={rv}" if rv else "", query) if p)
    path = f"/api/v1/namespaces/{setup.namespace}/configmaps/b-bad" + (f"?{params}" if params else "")
    direct, via = await sides.both("GET", path, accept=accept)
    assert direct.status == 200
    assert (via.status, via.content_type, via.body) == (direct.status, direct.content_type, direct.body)


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("rv", ["", "0"], ids=["consistent", "rv0"])
async def test_list_holding_the_object_is_byte_equal_to_the_apiservers(
    sides: Sides, setup: Setup, form: tuple[str, str], rv: str
) -> None:
    accept, query = form
    await create_bad(sides, setup)
    params = "&".join(p for p in (f"resourceVersion={rv}" if rv else "", query) if p)
    path = f"/api/v1/namespaces/{setup.namespace}/configmaps" + (f"?{params}" if params else "")
    await cache_serves(sides, setup, path)
    direct, via = await sides.both("GET", path, accept=accept)
    assert direct.status == 200 and b"a-good" in direct.body and b"b-bad" in direct.body
    assert (via.status, via.content_type) == (direct.status, direct.content_type), via.body[:500]
    assert without_list_rv(via.body) == without_list_rv(direct.body)


async def test_cluster_wide_list_for_the_admin_holds_the_object_as_the_apiserver_writes_it(
    sides: Sides, setup: Setup
) -> None:
    """Every configmap of the cluster (other tests' too, so not compared whole): both answer
    200, and the object's item is the same bytes in both."""
    await create_bad(sides, setup)
    got = await sides.request("GET", f"/api/v1/namespaces/{setup.namespace}/configmaps/b-bad", via_proxy=False)
    item = b"{" + got.body.rstrip(b"\n")[len(b'{"kind":"ConfigMap","apiVersion":"v1",') :]
    for accept in (JSON, YAML):
        direct, via = await sides.both("GET", "/api/v1/configmaps", accept=accept)
        assert (via.status, direct.status) == (200, 200), via.body[:500]
        if accept == JSON:
            assert item in direct.body and item in via.body


async def _lines(resp: aiohttp.ClientResponse, want: int) -> list[bytes]:
    """The next ``want`` events (bookmarks left out), as the bytes of their lines."""
    out: list[bytes] = []
    while len(out) < want:
        line = await asyncio.wait_for(resp.content.readline(), 30)
        assert line, f"the watch ended after {out!r}"
        if b'"type":"BOOKMARK"' not in line:
            out.append(line)
    return out


async def test_open_watches_get_the_object_as_the_apiserver_writes_it_and_keep_running(
    sides: Sides, setup: Setup
) -> None:
    """Watches opened before the object is written (a JSON and a protobuf one through kproxy, a
    JSON one directly): each gets it and the good object written after it; the JSON events are
    the apiserver's bytes; none is cut."""
    ns = setup.namespace
    name = f"w-bad-{secrets.token_hex(2)}"
    after = f"w-good-{secrets.token_hex(2)}"
    await cache_serves(sides, setup, f"/api/v1/namespaces/{ns}/configmaps")
    # From a version written after the cache started, which its history covers.
    rv = await create_good(sides, setup, f"w-mark-{secrets.token_hex(2)}")
    path = f"/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion={rv}"
    async with (
        sides.stream(path, via_proxy=False) as direct,
        sides.stream(path, via_proxy=True) as via,
        sides.stream(path, via_proxy=True, accept=PROTOBUF) as via_pb,
    ):
        assert (direct.status, via.status, via_pb.status) == (200, 200, 200)
        await create_bad(sides, setup, name)
        await create_good(sides, setup, after)

        async def through(resp: aiohttp.ClientResponse) -> list[bytes]:
            lines: list[bytes] = []
            while not lines or f'"name":"{after}"'.encode() not in lines[-1]:
                lines += await _lines(resp, 1)
            return lines

        want, got = await through(direct), await through(via)
        assert got == want
        assert any(rb"\ufffd\ufffd|\ufffd\ufffd|" in line for line in got)
        frames = b""
        while after.encode() not in frames:
            frames += await asyncio.wait_for(via_pb.content.read(65536), 30)
        assert BAD_VALUE in frames  # protobuf watchers get the bytes as they were stored


async def test_watch_from_an_earlier_version_replays_the_object_as_the_apiserver_writes_it(
    sides: Sides, setup: Setup
) -> None:
    """A watch from before the object (history / initial events of a resourceVersion=0 watch)."""
    ns = setup.namespace
    await cache_serves(sides, setup, f"/api/v1/namespaces/{ns}/configmaps")
    rv = await create_good(sides, setup, f"r-mark-{secrets.token_hex(2)}")  # the cache's history covers it
    name = f"r-bad-{secrets.token_hex(2)}"
    await create_bad(sides, setup, name)
    for query in (f"resourceVersion={rv}", "resourceVersion=0"):
        path = f"/api/v1/namespaces/{ns}/configmaps?watch=1&{query}"
        async with sides.stream(path, via_proxy=False) as direct, sides.stream(path, via_proxy=True) as via:
            want: list[bytes] = []
            while not any(f'"name":"{name}"'.encode() in line for line in want):
                want += await _lines(direct, 1)
            got = await _lines(via, len(want))
            assert got == want, query
    if setup.chain in CACHED:
        assert reads_total(setup.proxy.metrics(), resource="configmaps", verb="watch", served="cache") > 0


@pytest.mark.parametrize("accept", [JSON, YAML])
@pytest.mark.parametrize("rv", ["", "0"], ids=["consistent", "rv0"])
async def test_not_found_status_naming_bytes_that_are_not_utf8_is_the_apiservers(
    sides: Sides, setup: Setup, accept: str, rv: str
) -> None:
    """A Status whose details.name is a name that is not UTF-8 (a GET of ``%FF%FE``): the
    apiserver's 404 (in protobuf upstream of the transcode filter, kproxy's own from the cache)."""
    path = f"/api/v1/namespaces/{setup.namespace}/configmaps/x%FF%FE" + (f"?resourceVersion={rv}" if rv else "")
    direct, via = await sides.both("GET", path, accept=accept)
    assert direct.status == 404
    assert (via.status, via.content_type, via.body) == (direct.status, direct.content_type, direct.body)


async def test_label_and_annotation_keys_and_label_values_that_are_not_utf8_are_refused_as_directly(
    sides: Sides, setup: Setup
) -> None:
    """The apiserver validates label keys and values and annotation keys (it refuses bytes that
    are not UTF-8 with a 422 naming them): the same answer through kproxy, nothing stored."""
    ns = setup.namespace
    for i, (labels, notes) in enumerate(
        [({b"k": b"v\xff"}, {}), ({b"k\xff": b"v"}, {}), ({}, {b"example.com/k\xff": b"v"})]
    ):
        body = configmap_protobuf(f"refused-{i}", {b"k": b"v"}, notes, labels)
        for accept in (JSON, YAML):
            direct, via = await sides.both(
                "POST",
                f"/api/v1/namespaces/{ns}/configmaps",
                data=body,
                headers={"Content-Type": PROTOBUF},
                accept=accept,
            )
            assert direct.status == 422, direct.body
            assert (via.status, via.content_type, via.body) == (direct.status, direct.content_type, direct.body)
        gone = await sides.request("GET", f"/api/v1/namespaces/{ns}/configmaps/refused-{i}", via_proxy=False)
        assert gone.status == 404
    assert setup.proxy.proc.poll() is None
