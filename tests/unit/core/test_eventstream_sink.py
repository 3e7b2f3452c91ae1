"""TransportSink on a real loopback connection whose client does not read.

End to end (SIGTERM while a cached watch is behind on its initial events):
tests/e2e/test_watchcache_watch_lifecycle.py.
"""

from __future__ import annotations

import asyncio
import socket

from aiohttp.base_protocol import BaseProtocol

from kproxy.core.eventstream import TransportSink


async def _stalled() -> tuple[TransportSink, BaseProtocol, socket.socket, asyncio.Server]:
    """A sink whose connection's buffers are full: a client that reads nothing."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[BaseProtocol] = loop.create_future()

    class Protocol(BaseProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            made.set_result(self)

    server = await loop.create_server(lambda: Protocol(loop), "127.0.0.1", 0)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    client.setblocking(False)
    await loop.sock_connect(client, server.sockets[0].getsockname())
    protocol = await made
    assert protocol.transport is not None
    sink = TransportSink(protocol.transport, protocol, chunked=True)
    while sink.writable():
        sink.write(b"x" * (256 << 10))
    return sink, protocol, client, server


async def _read_all(client: socket.socket) -> None:
    """The client reads from now on (cancelled when the test has what it waits for)."""
    loop = asyncio.get_running_loop()
    while await loop.sock_recv(client, 1 << 20):
        pass


async def test_a_cancelled_drain_leaves_the_connection_s_own_writes_alone() -> None:
    """Ending a watch cancels its initial events' wait for the connection; the response's end of
    stream waits on the same connection and must still get through (it was cancelled too)."""
    sink, protocol, client, server = await _stalled()
    try:
        waiting = asyncio.create_task(sink.drain())
        await asyncio.sleep(0)  # it waits on the full connection
        assert not waiting.done()
        waiting.cancel()
        end = asyncio.create_task(protocol._drain_helper())  # what aiohttp's write_eof awaits
        reader = asyncio.create_task(_read_all(client))
        await asyncio.wait_for(end, 10)  # not CancelledError: it waited for the client to read
        reader.cancel()
    finally:
        if protocol.transport is not None:
            protocol.transport.abort()
        client.close()
        server.close()


async def test_flushed_waits_until_nothing_is_left_in_the_process() -> None:
    sink, protocol, client, server = await _stalled()
    try:
        transport = protocol.transport
        assert transport is not None
        limits = transport.get_write_buffer_limits()
        flushed = asyncio.create_task(sink.flushed())
        reader = asyncio.create_task(_read_all(client))
        await asyncio.wait_for(flushed, 10)
        reader.cancel()
        assert transport.get_write_buffer_size() == 0
        assert transport.get_write_buffer_limits() == limits  # the connection's own limits back
    finally:
        if protocol.transport is not None:
            protocol.transport.abort()
        client.close()
        server.close()
