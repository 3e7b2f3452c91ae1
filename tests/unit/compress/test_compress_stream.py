"""Codec backends and the streaming encoder: round trips, per-event flushes, multi-member gzip."""

from __future__ import annotations

import time
import zlib
from collections.abc import AsyncIterator

import pytest
from backports import zstd

from kproxy.compress import stream
from kproxy.compress.backends import codec, gzip_codec, gzip_decoder, gzip_library, zstd_codec

DATA = b"".join(b'{"kind":"Pod","metadata":{"name":"pod-%05d","namespace":"default"}}\n' % i for i in range(3000))


def test_default_gzip_backend_is_isal() -> None:
    assert gzip_library() == "isal"
    assert gzip_codec().level == 1
    with pytest.raises(ValueError, match="outside isal's range"):
        gzip_codec(9)
    with pytest.raises(ValueError):
        zstd_codec(23)
    with pytest.raises(ValueError):
        codec("br")


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
def test_one_shot_round_trip(coding: str) -> None:
    out = codec(coding).compress(DATA)
    assert len(out) * 10 < len(DATA)
    plain = zlib.decompress(out, 31) if coding == "gzip" else zstd.decompress(out)
    assert plain == DATA


async def _aiter(parts: list[bytes]) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


def _decoder(coding: str) -> object:
    return zlib.decompressobj(31) if coding == "gzip" else zstd.ZstdDecompressor()


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
async def test_watch_stream_every_event_decodes_after_its_flush(coding: str) -> None:
    events = [b'{"type":"MODIFIED","object":{"n":%d,"pad":"%s"}}\n' % (i, b"x" * 300) for i in range(50)]
    # The last event arrives in two reads: it is flushed once, when whole.
    parts = [*events[:-1], events[-1][:20], events[-1][20:]]
    seen: list[int] = []
    enc = codec(coding, None, 17 if coding == "zstd" else None).new_encoder()
    gen = stream.encode(_aiter(parts), enc, lambda *a: seen.append(a[0]), flush_each=True, newline_framed=True)
    out = [piece async for piece in gen]
    assert len(out) == len(events) + 1  # one piece per event, then the stream's end
    dec = _decoder(coding)
    for piece, event in zip(out, events, strict=False):
        # Each piece decodes to its whole event: nothing is held back in the compressor.
        assert dec.decompress(piece) == event  # type: ignore[attr-defined]
    assert dec.decompress(out[-1]) == b""  # type: ignore[attr-defined]
    total = sum(len(p) for p in out)
    assert total * 3 < sum(map(len, events))
    assert sum(seen) == sum(map(len, events))


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
@pytest.mark.parametrize("cut", [700, 4096])
async def test_watch_event_is_flushed_in_the_chunk_that_completes_it(coding: str, cut: int) -> None:
    """Reads cut across events (the apiserver's pod events arrive in ~4 KiB reads, each ending
    one event and starting the next): whenever a piece is written, every event completed by the
    reads so far decodes from it, although the read ended in the middle of the next one."""
    events = [b'{"type":"MODIFIED","object":{"n":%d,"pad":"%s"}}\n' % (i, b"y" * (300 + i * 37)) for i in range(60)]
    plain = b"".join(events)
    parts = [plain[i : i + cut] for i in range(0, len(plain), cut)]
    taken = 0

    async def source() -> AsyncIterator[bytes]:
        nonlocal taken
        for p in parts:
            taken += 1
            yield p

    accounted: list[tuple[int, int, float]] = []
    enc = codec(coding, None, 16 if coding == "zstd" else None).new_encoder()
    dec = _decoder(coding)
    decoded = b""
    pieces = 0
    gen = stream.encode(source(), enc, lambda *a: accounted.append(a), flush_each=True, newline_framed=True)
    async for piece in gen:
        decoded += dec.decompress(piece)  # type: ignore[attr-defined]
        read = b"".join(parts[:taken])
        complete = read[: read.rfind(b"\n") + 1]
        assert read.startswith(decoded)
        assert len(decoded) >= len(complete), f"an event completed by read {taken} was held back"
        pieces += 1
    assert decoded == plain
    assert pieces >= sum(1 for p in parts if b"\n" in p)
    assert sum(a[0] for a in accounted) == len(plain)
    assert sum(a[2] for a in accounted) > 0  # CPU time estimated from the timed calls


class _Recording:
    """An encoder that records the size of each call and whether it flushed."""

    def __init__(self) -> None:
        self.inner = codec("zstd").new_encoder()
        self.calls: list[tuple[int, bool]] = []

    def compress(self, data: bytes | memoryview) -> bytes:
        self.calls.append((len(data), False))
        return self.inner.compress(data)

    def compress_flush(self, data: bytes | memoryview) -> bytes:
        self.calls.append((len(data), True))
        return self.inner.compress_flush(data)

    def flush(self) -> bytes:
        return self.inner.flush()

    def finish(self) -> bytes:
        return self.inner.finish()


async def test_watch_reads_are_one_codec_call_per_completed_event_and_large_events_are_bounded() -> None:
    small = [b'{"type":"MODIFIED","object":{"n":%d,"pad":"%s"}}\n' % (i, b"z" * 4500) for i in range(8)]
    big = b'{"type":"ADDED","object":{"data":"' + b"q" * (3 * stream.COALESCE) + b'"}}\n'
    plain = b"".join(small) + big + small[0]
    parts = [plain[i : i + 4096] for i in range(0, len(plain), 4096)]
    enc = _Recording()
    gen = stream.encode(_aiter(parts), enc, lambda *a: None, flush_each=True, newline_framed=True)
    out = b"".join([p async for p in gen])
    assert zstd.decompress(out) == plain
    # No codec call for a read that ends no event, one flush per read that does: ten events,
    # each completed in a read of its own, ten flushes.
    assert sum(flushed for _, flushed in enc.calls) == 10
    assert all(flushed for _, flushed in enc.calls[:8])
    # The large event: compressed (not flushed) whenever a quarter MiB is held.
    held = [size for size, flushed in enc.calls if not flushed]
    assert len(held) >= 2
    assert all(stream.COALESCE <= size < stream.COALESCE + 4096 for size in held)
    assert sum(size for size, _ in enc.calls) == len(plain)


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
async def test_watch_stream_ending_inside_an_event_keeps_its_bytes(coding: str) -> None:
    parts = [b'{"type":"ADDED"}\n{"type":"MOD', b"IFIED", b'","object":{}']
    counted: list[int] = []
    enc = codec(coding).new_encoder()
    gen = stream.encode(_aiter(parts), enc, lambda *a: counted.append(a[0]), flush_each=True, newline_framed=True)
    out = b"".join([p async for p in gen])
    plain = zlib.decompress(out, 31) if coding == "gzip" else zstd.decompress(out)
    assert plain == b"".join(parts)
    assert sum(counted) == len(plain)


@pytest.mark.parametrize("coding", ["gzip", "zstd"])
async def test_list_stream_is_coalesced_and_round_trips(coding: str) -> None:
    parts = [DATA[i : i + 16384] for i in range(0, len(DATA), 16384)]
    account: list[tuple[int, int, float]] = []
    enc = codec(coding).new_encoder()
    out = b"".join(
        [p async for p in stream.encode(_aiter(parts[1:]), enc, lambda *a: account.append(a), prefix=parts[0])]
    )
    plain = zlib.decompress(out, 31) if coding == "gzip" else zstd.decompress(out)
    assert plain == DATA
    assert sum(a[0] for a in account) == len(DATA)
    assert sum(a[1] for a in account) == len(out)


@pytest.mark.parametrize("size", [0, 1000, 3 * 1024 * 1024 + 17])
async def test_a_zstd_body_is_one_frame_per_body_chunk(size: int) -> None:
    """Lists go out as independent zstd frames of ``body_chunk`` bytes (a streaming context is
    slower, see ``_ZstdFramesEncoder``); an empty body is one empty frame."""
    data = (DATA * (size // len(DATA) + 1))[:size]
    parts = [data[i : i + 16384] for i in range(0, len(data), 16384)] or [b""]
    c = codec("zstd")
    out = b"".join(
        [p async for p in stream.encode(_aiter(parts), c.body_encoder(), lambda *a: None, coalesce=c.body_chunk)]
    )
    assert zstd.decompress(out) == data
    frames, rest = 0, out
    while rest:
        d = zstd.ZstdDecompressor()
        d.decompress(rest)
        assert d.eof
        rest, frames = d.unused_data, frames + 1
    assert frames == max(1, -(-size // c.body_chunk))


async def test_gzip_decoder_reads_multi_member_streams() -> None:
    members = [gzip_codec().compress(b"a" * 1000 + b"\n"), gzip_codec().compress(b"second member\n")]
    blob = b"".join(members)
    parts = [blob[i : i + 7] for i in range(0, len(blob), 7)]
    out = b"".join([p async for p in stream.decode(_aiter(parts), gzip_decoder(), lambda *a: None)])
    assert out == b"a" * 1000 + b"\nsecond member\n"


async def test_peek() -> None:
    it = _aiter([b"abc", b"def", b"ghi"])
    head, ended = await stream.peek(it, 4)
    assert (head, ended) == (b"abcdef", False)
    assert [p async for p in it] == [b"ghi"]
    assert await stream.peek(_aiter([b"ab", b"c"]), 10) == (b"abc", True)


def test_cpu_timed_returns_the_output_and_the_calls_cpu_time() -> None:
    """The clock's own cost is taken off, never more: a call that burns 20 ms of CPU measures
    about that, a call that does nothing measures zero or a hair above, never below."""

    def burn(ms: float) -> bytes:
        end = time.thread_time() + ms / 1000
        while time.thread_time() < end:
            pass
        return b"done"

    out, seconds = stream.cpu_timed(burn, 20)
    assert out == b"done"
    assert 0.019 <= seconds < 0.1
    for _ in range(1000):
        out, seconds = stream.cpu_timed(bytes, b"x")
        assert out == b"x"
        assert 0.0 <= seconds < 0.01
