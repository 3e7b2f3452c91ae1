"""kproxy.core.upstreamgzip: a gzip reply decoded once, in bounded pieces."""

from __future__ import annotations

import asyncio
import gzip
import os
import random
from collections.abc import AsyncIterator

import pytest
from multidict import CIMultiDict

from kproxy.core.chain import BytesBody, Reply, StreamBody
from kproxy.core.upstreamgzip import PIECE, decode_reply, decode_stream

PLAIN = b"a" * 3_000_000 + os.urandom(200_000) + b"b" * 2_000_000
#: Two members, as the apiserver's watch-list gzip sends them.
GZIPPED = gzip.compress(PLAIN[:2_500_000]) + gzip.compress(PLAIN[2_500_000:])


async def _chunks(data: bytes, sizes: list[int]) -> AsyncIterator[bytes]:
    pos = 0
    for n in sizes:
        yield data[pos : pos + n]
        pos += n
    if pos < len(data):
        yield data[pos:]


async def _collect(it: AsyncIterator[bytes]) -> list[bytes]:
    return [p async for p in it]


def test_pieces_are_bounded_however_the_input_is_cut() -> None:
    rng = random.Random(7)
    for cut in ([1] * 50, [rng.randint(1, 5000) for _ in range(200)], [len(GZIPPED)]):
        pieces = asyncio.run(_collect(decode_stream(_chunks(GZIPPED, cut))))
        assert b"".join(pieces) == PLAIN
        assert max(len(p) for p in pieces) <= PIECE


def test_a_body_cut_short_decodes_its_prefix() -> None:
    pieces = asyncio.run(_collect(decode_stream(_chunks(GZIPPED[: len(GZIPPED) // 3], []))))
    got = b"".join(pieces)
    assert got and PLAIN.startswith(got)


def test_a_body_read_whole_becomes_a_bounded_stream() -> None:
    headers = CIMultiDict({"Content-Encoding": "gzip", "Content-Length": str(len(GZIPPED))})
    reply = Reply(200, headers, BytesBody(GZIPPED, "application/json"))
    assert decode_reply(reply)
    assert "Content-Encoding" not in reply.headers and "Content-Length" not in reply.headers
    assert isinstance(reply.body, StreamBody)
    assert asyncio.run(reply.body.read()) == PLAIN
    assert not decode_reply(reply)  # plain now: nothing more to do


def test_a_malformed_body_fails_instead_of_passing_garbage() -> None:
    """Bytes that are not gzip under ``Content-Encoding: gzip`` raise (the proxy's 500 Status
    before the head, a broken-off body after it), never reach the client as if decoded."""
    bad = GZIPPED[:100] + bytes(b ^ 0x5A for b in GZIPPED[100:400]) + GZIPPED[400:]
    with pytest.raises(Exception, match="(?i)invalid|error|incorrect|corrupt"):
        asyncio.run(_collect(decode_stream(_chunks(bad, [50] * 20))))
