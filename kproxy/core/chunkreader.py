"""A reader over a body that arrives as chunks: ``readexactly``, ``readline``, ``read`` and line
iteration, the part of aiohttp's ``StreamReader`` kproxy's own upstream reads use (watch frames
and lines), for bodies aiohttp does not hand out as a stream (an HTTP/2 stream's, a gzip body
decoded as it arrives)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

__all__ = ["ChunkReader"]


class ChunkReader:
    """Reads ``chunks`` as they come. With ``max_line``, a line longer than that (no newline yet
    after so many bytes) raises ``too_long(max_line)`` rather than growing the buffer without end."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        max_line: int | None = None,
        too_long: Callable[[int], Exception] = lambda n: ValueError(f"a line of more than {n} bytes"),
    ) -> None:
        self._chunks = chunks
        self._buf = bytearray()
        self._eof = False
        self._max_line = max_line
        self._too_long = too_long

    async def _fill(self) -> bool:
        if self._eof:
            return False
        try:
            chunk = await anext(self._chunks)
        except StopAsyncIteration:
            self._eof = True
            return False
        self._buf += chunk
        return True

    async def readexactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            if not await self._fill():
                partial = bytes(self._buf)
                self._buf.clear()
                raise asyncio.IncompleteReadError(partial, n)
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def readline(self) -> bytes:
        """The next line with its newline; the rest without one at the end; b"" after the end."""
        start = 0
        while True:
            i = self._buf.find(b"\n", start)
            if i >= 0:
                out = bytes(self._buf[: i + 1])
                del self._buf[: i + 1]
                return out
            start = len(self._buf)
            if self._max_line is not None and start > self._max_line:
                raise self._too_long(self._max_line)
            if not await self._fill():
                out = bytes(self._buf)
                self._buf.clear()
                return out

    async def read(self) -> bytes:
        while await self._fill():
            pass
        out = bytes(self._buf)
        self._buf.clear()
        return out

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[bytes]:
        while True:
            line = await self.readline()
            if not line:
                return
            yield line
