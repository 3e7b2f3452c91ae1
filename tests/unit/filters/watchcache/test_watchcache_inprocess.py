"""watchcache in the real ProxyServer, in front of recorded apiserver answers (kproxy.testing.replay):
the cache fills from the recorded streaming list (protobuf, held open as a live watch would be)
and then answers LIST and GET itself, as the apiserver answered them."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from kproxy.testing.eventually import eventually_async
from kproxy.testing.inprocess import InProcessProxy, inprocess_proxy
from kproxy.testing.replay import ReplayUpstream, recording

NS = "/api/v1/namespaces/rec"
JSON = {"Accept": "application/json"}
PROTOBUF = "application/vnd.kubernetes.protobuf"
PROBE = "/api/v1/configmaps?limit=1&fieldSelector=metadata.name%3D.kproxy-matches-nothing"


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[tuple[InProcessProxy, ReplayUpstream]]:
    config = {"filters": [{"name": "watchcache", "resources": ["configmaps"]}]}
    async with inprocess_proxy(config, ReplayUpstream(hold_watches=True)) as (p, up):

        async def served_locally() -> bool:
            before = len(up.requests(path=f"{NS}/configmaps"))
            await p.request("GET", f"{NS}/configmaps", JSON)
            return len(up.requests(path=f"{NS}/configmaps")) == before

        # Until a LIST no longer goes upstream: the cache is filled.
        await eventually_async(served_locally, 5, "a LIST answered from the cache")
        yield p, up


def items(body: bytes) -> list[dict[str, object]]:
    out: list[dict[str, object]] = orjson.loads(body)["items"]
    return out


async def test_the_cache_is_filled_by_one_streaming_list(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    _, up = proxy
    watches = up.requests(path="/api/v1/configmaps")
    # (A consistent read's freshness probe is a streaming list too, of nothing: a field selector.)
    streaming = [w for w in watches if w.query.get("sendInitialEvents") == ["true"] and "fieldSelector" not in w.query]
    assert len(streaming) == 1 and streaming[0].headers["Accept"].startswith(PROTOBUF)


async def test_a_list_is_served_from_the_cache(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    before = len(up.received)
    status, _, body = await p.request("GET", f"{NS}/configmaps", JSON)
    assert status == 200
    assert not [r for r in up.received[before:] if r.path == f"{NS}/configmaps"]
    # The same objects the apiserver listed (the recorded LIST), at the version of its latest state.
    assert items(body) == items(recording(f"{NS}/configmaps").body)
    latest = recording(PROBE, PROTOBUF)  # the consistent-read probe's version
    assert orjson.loads(body)["metadata"]["resourceVersion"].encode() in latest.body


async def test_a_get_is_served_from_the_cache_byte_for_byte(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    target = f"{NS}/configmaps/cm-a"
    for accept in ("application/json", PROTOBUF):
        # resourceVersion=0: any version will do, the apiserver's own watch cache answers
        status, _, body = await p.request("GET", f"{target}?resourceVersion=0", {"Accept": accept})
        assert (status, body) == (200, recording(target, accept).body)
    assert not up.requests(path=target)
    # No resourceVersion: a consistent read, which the apiserver serves from etcd; so does kproxy.
    status, _, body = await p.request("GET", target, JSON)
    assert (status, body) == (200, recording(target).body)
    assert [r.target for r in up.requests(path=target)] == [target]


async def test_a_protobuf_list_from_the_cache(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, _ = proxy
    status, headers, body = await p.request("GET", f"{NS}/configmaps", {"Accept": PROTOBUF})
    assert status == 200 and headers["Content-Type"] == PROTOBUF
    assert b"cm-a" in body and b"cm-b" in body and b"cm-w" not in body  # cm-w was deleted


async def test_a_watch_is_served_from_the_cache(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, up = proxy
    target = f"{NS}/configmaps?watch=1&resourceVersion=0&timeoutSeconds=1"
    status, _, body = await p.request("GET", target, JSON)
    events = [orjson.loads(line) for line in body.splitlines()]
    assert status == 200
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "cm-a"), ("ADDED", "cm-b")]
    assert not [r for r in up.requests(path=f"{NS}/configmaps") if r.query.get("watch")]
