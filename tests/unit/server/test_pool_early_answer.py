"""The upstream answers before it has taken the whole request body, then closes (as Go's server
does for an early 403/404/405/429): the pool returns that answer rather than failing the write."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from kproxy.server.pool import Pool


async def test_answer_before_the_body_is_taken_stands() -> None:
    closed = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the head only: the body is never read
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 6\r\nConnection: close\r\n\r\nno way")
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        closed.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def body() -> AsyncIterator[bytes]:
        yield b"x" * 65536
        await closed.wait()
        for _ in range(256):  # keeps writing into the closed connection until the pool sees it
            yield b"x" * 65536
            await asyncio.sleep(0)

    pool = Pool("127.0.0.1", port, None, None, 5.0)
    try:
        for length in (None, 256 * 65536 + 65536):  # chunked, then with a Content-Length
            closed.clear()
            resp = await pool.request("POST", "/", [], body(), length)
            assert (resp.status, await resp.read()) == (403, b"no way")
    finally:
        pool.close()
        server.close()
