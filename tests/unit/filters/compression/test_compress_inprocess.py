"""compression in the real ProxyServer, in front of recorded apiserver answers (kproxy.testing.replay)."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator

import pytest
from backports import zstd

from kproxy.testing.inprocess import InProcessProxy, inprocess_proxy
from kproxy.testing.replay import ReplayUpstream, recording

JSON = {"Accept": "application/json"}
DOC = "/api/v1"  # discovery: 6 KB of JSON


@pytest.fixture(scope="module")
async def proxy() -> AsyncIterator[tuple[InProcessProxy, ReplayUpstream]]:
    config = {"filters": [{"name": "compression", "encodings": ["zstd", "gzip"], "watch": True}]}
    async with inprocess_proxy(config) as pair:
        yield pair


def recorded(target: str) -> bytes:
    return recording(target).body


@pytest.mark.parametrize(
    ("accept_encoding", "coding"), [("gzip", "gzip"), ("zstd", "zstd"), ("gzip, zstd", "zstd"), ("br", None)]
)
async def test_a_response_is_compressed_as_the_client_allows(
    proxy: tuple[InProcessProxy, ReplayUpstream], accept_encoding: str, coding: str | None
) -> None:
    p, up = proxy
    status, headers, body = await p.request("GET", DOC, {"Accept-Encoding": accept_encoding, **JSON})
    assert status == 200
    assert headers.get("Content-Encoding") == coding
    plain = gzip.decompress(body) if coding == "gzip" else zstd.decompress(body) if coding == "zstd" else body
    assert plain == recorded(DOC)
    if coding is not None:  # kproxy compresses, not the upstream
        assert "Accept-Encoding" not in up.requests(path=DOC)[-1].headers


async def test_a_small_body_stays_plain(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, _ = proxy
    status, headers, body = await p.request("GET", "/api", {"Accept": "application/json", "Accept-Encoding": "gzip"})
    assert (status, headers.get("Content-Encoding"), body) == (200, None, recorded("/api"))


async def test_a_watch_is_compressed_per_event(proxy: tuple[InProcessProxy, ReplayUpstream]) -> None:
    p, _ = proxy
    watch = recording("", watch=True)
    status, headers, body = await p.request("GET", watch.target, {"Accept-Encoding": "gzip", **JSON})
    assert (status, headers.get("Content-Encoding")) == (200, "gzip")
    assert gzip.decompress(body) == watch.body
