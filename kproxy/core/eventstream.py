"""Watch streams kproxy serves itself, and the two ways their frames reach a client.

An ``EventStreamBody`` is the reply body of a watch served from the watch cache (the "event
stream" body of docs/developing/architecture.md#the-path-of-a-request). It holds no data:
``attach(sink)`` registers the watch with whatever feeds it (the watch cache's broadcaster) and
frames are pushed into the sink from then on.

* The server attaches a ``TransportSink``: frames go straight to the client's transport with HTTP/1.1
  chunked framing, one write per batch, the same bytes object for every watcher that wants that
  encoding; no per-watcher task, no per-watcher queue.
* A filter that must see the bytes reads ``chunks()`` like any ``StreamBody``: that attaches a
  ``QueueSink`` and yields what it gets.

The ``compression`` filter (``watch: true``) does not read the bytes: it sets ``coding`` before the
body is attached, and the feeder compresses (once for every watcher in step, see
``kproxy.cacher.shared_stream``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from aiohttp import web

from kproxy.core.chain import StreamBody

#: ``start(sink, coding)`` registers the watch; it returns the function that ends it.
Starter = Callable[[Any, Any], Callable[[], None]]


class EventStreamBody(StreamBody):
    __slots__ = ("_aborted", "_start", "_stop", "coding")

    def __init__(self, media_type: str, start: Starter) -> None:
        super().__init__(self._queued(), media_type=media_type)
        self._start = start
        self._stop: Callable[[], None] | None = None
        self._aborted = False
        #: The content coding the frames are written in (``kproxy.compress.shared.WatchCoding``),
        #: set by the filter that put it in ``Content-Encoding``; None: as they are.
        self.coding: Any = None

    def attach(self, sink: Any) -> None:
        """Start the watch; from now on its frames are written to ``sink``. A body aborted
        before (shutdown while the request was on its way) ends at once, without a watch."""
        if self._stop is not None:
            raise RuntimeError("event stream already attached")
        if self._aborted:
            self._stop = _ended
            sink.close()
            return
        self._stop = self._start(sink, self.coding)

    def abort(self) -> None:
        """End the watch cleanly (shutdown, or the client went away): what its watcher has
        queued is written (initial events: the batches already written), then the end of
        stream. The watcher is ended, not closed as a slow one."""
        self._aborted = True
        if self._stop is not None:
            self._stop()

    def empty_end(self) -> bytes:
        """What ends a stream that got no frame at all: nothing as it is, one empty complete frame
        (member) under a content coding (an empty body is not a zstd or gzip stream, and strict
        decoders such as urllib3's fail on it)."""
        return self.coding.solo(b"") if self.coding is not None else b""

    async def _queued(self) -> AsyncIterator[bytes]:
        sink = QueueSink()
        self.attach(sink)
        wrote = False
        try:
            while True:
                data = await sink.get()
                if data is None:
                    break
                wrote = True
                yield data
            if not wrote and (end := self.empty_end()):
                yield end
        finally:
            self.abort()


class QueueSink:
    """Frames kept for a reader that pulls (``chunks()``); everything written since the last
    pull comes out as one chunk. Writable while less than ``high_water`` bytes wait."""

    def __init__(self, high_water: int = 1 << 20) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        self._closed = False
        self._high = high_water
        self._ready = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()

    def write(self, data: bytes) -> None:
        self._parts.append(data)
        self._size += len(data)
        self._ready.set()
        if self._size > self._high:
            self._drained.clear()

    def writable(self) -> bool:
        return self._size <= self._high

    async def drain(self) -> None:
        await self._drained.wait()

    def closing(self) -> bool:
        return False

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    async def get(self) -> bytes | None:
        while not self._parts:
            if self._closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        parts, self._parts = self._parts, []
        self._size = 0
        self._drained.set()
        return parts[0] if len(parts) == 1 else b"".join(parts)


class TransportSink:
    """Frames written straight to the client's transport, each batch as one HTTP/1.1 chunk
    (``chunked``) or raw (an HTTP/1.0 client: the stream ends with the connection)."""

    __slots__ = ("_protocol", "_transport", "chunked", "done", "wrote")

    def __init__(self, transport: asyncio.Transport, protocol: Any, *, chunked: bool) -> None:
        self._transport = transport
        self._protocol = protocol
        self.chunked = chunked
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.wrote = False

    def write(self, data: bytes) -> None:
        transport = self._transport
        if transport.is_closing() or not data:  # an empty chunk would end the stream
            return
        self.wrote = True
        if self.chunked:
            transport.writelines((b"%x\r\n" % len(data), data, b"\r\n"))
        else:
            transport.write(data)

    def writable(self) -> bool:
        return not self._protocol.writing_paused

    async def drain(self) -> None:
        """Wait until the connection is writable again. Cancelling the wait (a watch ended while
        its initial events wait for the client) leaves the connection as it was: the protocol's
        waiter is shared with the response's own writes (its end of stream), and a waiter
        cancelled under them would cancel those too."""
        if self._transport.is_closing():
            raise ConnectionError("client went away")
        if self._protocol.writing_paused:
            await asyncio.shield(self._protocol._drain_helper())

    def closing(self) -> bool:
        return self._transport.is_closing() or self._protocol.transport is None

    def close(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    async def flushed(self) -> None:
        """Wait until everything written has left the process (the kernel has it), or the client
        went away. What a transport still holds when the process exits is lost, and the client
        sees the stream cut short: Go's server writes the end of a handler's response before the
        connection is closed (net/http/server.go ``finishRequest``: ``w.w.Flush``, then
        ``w.conn.bufw.Flush``), and ``Shutdown`` closes only idle connections."""
        transport = self._transport
        if transport.is_closing() or not transport.get_write_buffer_size():
            return
        low, high = transport.get_write_buffer_limits()
        # Writing pauses while anything is buffered, and resumes once the buffer is empty.
        transport.set_write_buffer_limits(high=0, low=0)
        try:
            with contextlib.suppress(ConnectionError):
                await asyncio.shield(self._protocol._drain_helper())
        finally:
            if not transport.is_closing():
                transport.set_write_buffer_limits(high=high, low=low)


def _ended() -> None:
    pass


async def serve_events(request: web.BaseRequest, resp: web.StreamResponse, body: EventStreamBody) -> None:
    """Serve ``body`` on ``request``'s connection: headers out at once (the apiserver flushes
    them before the first event), then its frames straight to the transport until the watch
    ends (timeout, slow client, shutdown: a clean end of stream, written out of the process
    before this returns) or the client goes away."""
    chunked = request.version >= aiohttp.HttpVersion11
    if chunked:
        resp.enable_chunked_encoding()
    else:
        resp.force_close()  # HTTP/1.0: the stream ends with the connection
    await resp.prepare(request)
    transport = request.transport
    if transport is None:
        return
    sink = TransportSink(transport, request.protocol, chunked=chunked)
    body.attach(sink)
    await sink.done
    if not sink.closing():
        if not sink.wrote:
            sink.write(body.empty_end())
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
            await resp.write_eof()
            # The end is only an end once the client can get it: out of the process before the
            # handler returns (shutdown closes the connection once it has).
            await sink.flushed()
