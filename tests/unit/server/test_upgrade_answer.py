"""The body of an upstream answer that did not upgrade, read piece by piece as it arrives
(kproxy.server.upgrade): chunked (extensions and trailers included), Content-Length, or to the
end of the connection; a body cut short is an error, never a short body passed off as whole."""

from __future__ import annotations

import asyncio

import pytest

from kproxy.server.upgrade import _answer_chunks


class _Writer:
    closed = False

    def close(self) -> None:
        self.closed = True


async def _read(data: bytes, chunked: bool, length: int | None, eof: bool = True) -> tuple[bytes, bool]:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    if eof:
        reader.feed_eof()
    writer = _Writer()
    out = b"".join([piece async for piece in _answer_chunks(reader, writer, chunked, length)])  # type: ignore[arg-type]
    return out, writer.closed


@pytest.mark.parametrize(
    ("data", "chunked", "length", "body"),
    [
        (b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nNEXT", True, None, b"hello world"),
        (b"5;ext=1\r\nhello\r\n0\r\nTrailer: x\r\n\r\n", True, None, b"hello"),
        (b"hello worldNEXT", False, 11, b"hello world"),
        (b"until the end", False, None, b"until the end"),
        (b"", False, 0, b""),
    ],
)
async def test_bodies(data: bytes, chunked: bool, length: int | None, body: bytes) -> None:
    assert await _read(data, chunked, length) == (body, True)


@pytest.mark.parametrize(
    ("data", "chunked", "length"),
    [
        (b"5\r\nhel", True, None),
        (b"zz\r\nhello\r\n0\r\n\r\n", True, None),
        (b"5\r\nhelloXX0\r\n\r\n", True, None),
        (b"hello", False, 11),
    ],
)
async def test_cut_short_or_malformed(data: bytes, chunked: bool, length: int | None) -> None:
    with pytest.raises(ConnectionResetError):
        await _read(data, chunked, length)
