"""The compression filter's decisions with a fake upstream (the real thing: tests/e2e/test_compression.py)."""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import AsyncIterator

import pytest
from backports import zstd
from multidict import CIMultiDict

from kproxy.config import ConfigError, parse_config
from kproxy.core.chain import BytesBody, Chain, Exchange, Reply, StreamBody
from kproxy.filters import build_filters
from kproxy.testing.exchange import make_exchange

BIG = b"".join(b'{"name":"cm-%05d","data":"value"}\n' % i for i in range(2000))


def exchange(target: str, accept_encoding: str | None = "gzip", method: str = "GET") -> Exchange:
    return make_exchange(method, target, {} if accept_encoding is None else {"Accept-Encoding": accept_encoding})


async def parts(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


class Upstream:
    """Answers with a prepared reply and remembers the request it got."""

    def __init__(self, make: object) -> None:
        self.make = make
        self.seen: Exchange | None = None

    async def __call__(self, ex: Exchange) -> Reply:
        self.seen = ex
        return self.make()  # type: ignore[operator,no-any-return]


def chain(upstream: Upstream, **settings: object) -> Chain:
    return Chain(build_filters(parse_config({"filters": [{"name": "compression", **settings}]})), upstream)


def json_reply(body: bytes, status: int = 200, stream: bool = False, length: bool = True, **headers: str) -> Reply:
    h = CIMultiDict({"Content-Type": "application/json", **{k.replace("_", "-"): v for k, v in headers.items()}})
    if stream:
        return Reply(status, h, StreamBody(parts(body), len(body) if length else None, "application/json"))
    h["Content-Length"] = str(len(body))
    return Reply(status, h, BytesBody(body, "application/json"))


async def body_of(reply: Reply) -> bytes:
    assert isinstance(reply.body, (BytesBody, StreamBody))
    return b"".join([c async for c in reply.body.chunks()])


async def test_whole_body_compressed_and_upstream_asked_for_nothing() -> None:
    up = Upstream(lambda: json_reply(BIG, ETag='"v1"'))
    reply = await chain(up).handle(exchange("/api/v1/namespaces/a/configmaps", "gzip, zstd"))
    assert up.seen is not None
    assert "Accept-Encoding" not in up.seen.headers  # the apiserver does no gzip work
    assert reply.headers["Content-Encoding"] == "zstd"
    assert reply.headers["ETag"] == '"v1"'  # the apiserver's own, as its gzip leaves it
    assert "Content-Length" not in reply.headers
    assert zstd.decompress(await body_of(reply)) == BIG


@pytest.mark.parametrize("length", [True, False])
async def test_streamed_body_known_or_unknown_length(length: bool) -> None:
    up = Upstream(lambda: json_reply(BIG, stream=True, length=length))
    reply = await chain(up).handle(exchange("/api/v1/configmaps"))
    assert reply.headers["Content-Encoding"] == "gzip"
    assert isinstance(reply.body, StreamBody)
    assert reply.body.length is None
    assert zlib.decompress(await body_of(reply), 31) == BIG


async def test_threshold() -> None:
    small = b'{"kind":"ConfigMap"}'
    for make in (lambda: json_reply(small), lambda: json_reply(small, stream=True, length=False)):
        reply = await chain(Upstream(make)).handle(exchange("/api/v1/namespaces/a/configmaps/x"))
        assert "Content-Encoding" not in reply.headers
        assert await body_of(reply) == small
    # Identity refused: compressed whatever the size.
    reply = await chain(Upstream(lambda: json_reply(small))).handle(exchange("/api", "gzip, identity;q=0"))
    assert zlib.decompress(await body_of(reply), 31) == small
    # A threshold of 0 compresses everything.
    reply = await chain(Upstream(lambda: json_reply(small)), min_size=0).handle(exchange("/api"))
    assert reply.headers["Content-Encoding"] == "gzip"


@pytest.mark.parametrize(
    ("target", "method", "status", "headers", "known_before"),
    [
        ("/api/v1/configmaps", "HEAD", 200, {}, True),
        ("/api/v1/configmaps?watch=true", "GET", 200, {}, True),  # watch compression is off by default
        ("/api/v1/namespaces/a/pods/p/proxy/x", "GET", 200, {}, True),
        ("/api/v1/configmaps", "GET", 204, {}, False),
        ("/api/v1/configmaps", "GET", 304, {}, False),
        ("/api/v1/configmaps", "GET", 200, {"Cache_Control": "no-transform"}, False),
        ("/api/v1/configmaps", "GET", 200, {"Content_Encoding": "br"}, False),
    ],
)
async def test_not_compressed(
    target: str, method: str, status: int, headers: dict[str, str], known_before: bool
) -> None:
    up = Upstream(lambda: json_reply(BIG, status=status, **headers))
    reply = await chain(up).handle(exchange(target, "gzip", method))
    assert reply.headers.get("Content-Encoding") == headers.get("Content_Encoding")
    assert up.seen is not None
    # Known from the request alone: the client's own Accept-Encoding goes upstream untouched.
    assert up.seen.headers.get("Accept-Encoding") == ("gzip" if known_before else None)


async def test_watch_compressed_when_enabled() -> None:
    events = [b'{"type":"ADDED","object":{"i":%d}}\n' % i for i in range(20)]

    def make() -> Reply:
        return Reply(200, CIMultiDict({"Content-Type": "application/json"}), StreamBody(parts(b"".join(events), 33)))

    reply = await chain(Upstream(make), watch=True).handle(exchange("/api/v1/configmaps?watch=1"))
    assert reply.headers["Content-Encoding"] == "gzip"
    dec = zlib.decompressobj(31)
    decoded = [dec.decompress(p) async for p in reply.body.chunks()]  # type: ignore[union-attr]
    # A piece is written when a chunk ends an event (flushed), never for a mere piece of one.
    assert all(b"\n" in d for d in decoded if d)
    assert b"".join(decoded) == b"".join(events)


@pytest.mark.parametrize("level", [None, 3])
async def test_watch_zstd_level(level: int | None) -> None:
    """zstd watches use their own level (default -1, the faster one); lists keep zstd_level."""
    events = b"".join(b'{"type":"ADDED","object":{"i":%d,"pad":"%s"}}\n' % (i, b"p" * 200) for i in range(50))

    def make() -> Reply:
        return Reply(200, CIMultiDict({"Content-Type": "application/json"}), StreamBody(parts(events, 700)))

    settings = {"watch": True} if level is None else {"watch": True, "watch_zstd_level": level}
    flt = build_filters(parse_config({"filters": [{"name": "compression", **settings}]}))[0]
    assert flt.watch_codecs["zstd"].level == (-1 if level is None else level)  # type: ignore[attr-defined]
    assert flt.codecs["zstd"].level == 1  # type: ignore[attr-defined]
    reply = await Chain([flt], Upstream(make)).handle(exchange("/api/v1/configmaps?watch=1", "zstd"))
    assert reply.headers["Content-Encoding"] == "zstd"
    dec = zstd.ZstdDecompressor()
    assert b"".join([dec.decompress(p) async for p in reply.body.chunks()]) == events  # type: ignore[union-attr]


def _zstd_window_log(frame: bytes) -> int:
    """The window a zstd frame header announces (RFC 8878 3.1.1.1.2; streams have no single segment)."""
    assert frame[:4] == b"\x28\xb5\x2f\xfd" and not frame[4] & 0x20
    return 10 + (frame[5] >> 3)


@pytest.mark.parametrize(("settings", "window_log"), [({}, 16), ({"watch_zstd_window_log": 14}, 14)])
def test_watch_zstd_state(settings: dict[str, int], window_log: int) -> None:
    """Watch streams' zstd window (default 2^16: a small per-watcher state); lists keep level 1's."""
    flt = build_filters(parse_config({"filters": [{"name": "compression", "watch": True, **settings}]}))[0]
    event = b'{"type":"ADDED","object":{"pad":"%s"}}\n' % (b"p" * 300)
    watch = flt.watch_codecs["zstd"].new_encoder().compress_flush(event)  # type: ignore[attr-defined]
    assert _zstd_window_log(watch) == window_log
    listing = flt.codecs["zstd"].new_encoder()  # type: ignore[attr-defined]
    assert _zstd_window_log(listing.compress(BIG) + listing.finish()) == 19


async def test_upstream_gzip_passed_through_or_decoded() -> None:
    gz = gzip.compress(BIG)

    def make() -> Reply:
        return json_reply(gz, stream=True, length=False, Content_Encoding="gzip", Vary="Accept-Encoding")

    up = Upstream(make)
    reply = await chain(up, upstream_gzip=True).handle(exchange("/api/v1/configmaps", "gzip"))
    assert up.seen is not None
    assert up.seen.headers["Accept-Encoding"] == "gzip"
    assert await body_of(reply) == gz  # untouched
    reply = await chain(up, upstream_gzip=True).handle(exchange("/api/v1/configmaps", "zstd"))
    assert reply.headers["Content-Encoding"] == "zstd"
    assert reply.headers.getall("Vary") == ["Accept-Encoding"]
    assert zstd.decompress(await body_of(reply)) == BIG


def test_config_errors() -> None:
    for bad, where in (
        ({"encodings": ["br"]}, "filters[0].encodings[0]"),
        ({"encodings": ["gzip", "gzip"]}, "filters[0].encodings"),
        ({"gzip_level": 9}, "filters[0]: gzip level 9"),
        ({"watch_zstd_level": 23}, "filters[0]: zstd level 23"),
        ({"watch_zstd_window_log": 9}, "filters[0].watch_zstd_window_log"),
        ({"watch_zstd_hash_log": 27}, "filters[0].watch_zstd_hash_log"),
        ({"min_size": -1}, "filters[0].min_size"),
        ({"level": 1}, "filters[0].level"),
    ):
        with pytest.raises(ConfigError, match=re.escape(where)):
            build_filters(parse_config({"filters": [{"name": "compression", **bad}]}))


async def test_restarted_filters_share_one_set_of_metrics() -> None:
    """A reload starts a new instance with the same context: no duplicate registration."""
    from prometheus_client import CollectorRegistry, generate_latest

    from kproxy.core.context import FilterContext

    ctx = FilterContext(api=None, credentials="proxy", registry=CollectorRegistry())  # type: ignore[arg-type]
    first, second = (build_filters(parse_config({"filters": [{"name": "compression", "watch": w}]}))[0] for w in (0, 1))
    await first.start(ctx)  # type: ignore[attr-defined]
    await second.start(ctx)  # type: ignore[attr-defined]
    await Chain([second], Upstream(lambda: json_reply(BIG))).handle(exchange("/api/v1/configmaps"))
    assert b'kproxy_compression_responses_total{encoding="gzip"} 1.0' in generate_latest(ctx.registry)
