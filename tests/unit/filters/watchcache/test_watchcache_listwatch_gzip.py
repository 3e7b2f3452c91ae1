"""The cache's reader of a gzip-encoded streaming list: every member decoded as it arrives, lines
and length-prefixed frames cut across chunk and member boundaries, a line without end refused."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator

import pytest

from kproxy.core import listwatch
from kproxy.core.listwatch import UpstreamError, _Gunzipped


async def _chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def _members(*parts: bytes) -> bytes:
    return b"".join(gzip.compress(p) for p in parts)  # one member per flush, as the apiserver writes


@pytest.mark.parametrize("size", [1, 7, 4096])
async def test_lines_across_members_and_chunks(size: int) -> None:
    body = _members(b'{"type":"ADDED"}\n{"type":', b'"MODIFIED"}\n', b'{"type":"BOOKMARK"}\n')
    lines = [line async for line in _Gunzipped(_chunks(body, size))]
    assert lines == [b'{"type":"ADDED"}\n', b'{"type":"MODIFIED"}\n', b'{"type":"BOOKMARK"}\n']


async def test_frames_across_members_and_a_clean_end() -> None:
    frames = [b"\x00\x00\x00\x03abc", b"\x00\x00\x00\x05de", b"fgh"]
    content = _Gunzipped(_chunks(_members(*frames), 5))
    assert await content.readexactly(4) == b"\x00\x00\x00\x03"
    assert await content.readexactly(3) == b"abc"
    assert await content.readexactly(4) == b"\x00\x00\x00\x05"
    assert await content.readexactly(5) == b"defgh"
    with pytest.raises(asyncio.IncompleteReadError) as err:
        await content.readexactly(4)
    assert err.value.partial == b""


async def test_a_line_longer_than_a_frame_may_be_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listwatch, "_MAX_FRAME", 1000)

    async def endless() -> AsyncIterator[bytes]:
        yield _members(b"x" * 600, b"x" * 600)
        await asyncio.Event().wait()  # the stream goes on without a newline: never reached
        yield b""

    lines = _Gunzipped(endless()).__aiter__()
    with pytest.raises(UpstreamError):
        await asyncio.wait_for(anext(lines), 5)
