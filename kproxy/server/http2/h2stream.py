"""One HTTP/2 stream as the proxy's request handler sees it: the request (``H2Request``, which
offers what ``ProxyServer.handle`` reads of an aiohttp request), its body under flow control, and
the response side (``ResponseStream``, ``H2Sink``).

Flow control follows Go's server (golang.org/x/net/http2 server.go): the request body's window is
given back as the chain reads it, so a stream holds at most its window (256 KiB) of unread body
and a connection at most the connection window; a response is sent as the client's windows allow,
and what waits for a window is bounded: a writer awaits it, an event sink stops being writable.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any, Protocol

from aiohttp import HttpVersion
from multidict import CIMultiDict, CIMultiDictProxy


class H2ServerConnection(Protocol):
    """What a stream needs of its connection (``kproxy.server.http2.server`` has it)."""

    number: int
    transport: Any
    writing_paused: bool

    def consumed(self, sid: int, n: int) -> None: ...
    def stream_closed(self, sid: int) -> bool: ...
    def reset(self, sid: int, code: int = ...) -> None: ...
    def send_headers(self, sid: int, headers: list[tuple[bytes, bytes]], end: bool) -> None: ...
    def send_response_headers(
        self, sid: int, status: int, headers: CIMultiDict[str] | list[tuple[str, str]], end: bool
    ) -> None: ...
    def send_response(
        self, sid: int, status: int, headers: CIMultiDict[str] | list[tuple[str, str]], data: bytes
    ) -> bool: ...
    async def send_data(self, sid: int, data: bytes | memoryview, end: bool) -> None: ...
    def queue_data(self, sid: int, data: bytes) -> None: ...
    def queued(self, sid: int) -> int: ...
    async def wait_queued_below(self, sid: int, size: int) -> None: ...
    def goaway(self, code: int = ...) -> None: ...


HTTP_2 = HttpVersion(2, 0)

#: Bytes an event sink may hold for a stream beyond what its window lets out before it stops being
#: writable (the watch then waits, or is ended as a slow watcher, as over HTTP/1.1 when the
#: transport's buffer is full).
SINK_HIGH_WATER = 64 * 1024


class StreamReset(ConnectionResetError):
    """The client reset the stream (or the connection went away) before it ended."""


class RequestBody:
    """The request's DATA as the handler reads it (the few ``aiohttp.StreamReader`` methods the
    proxy uses). Each read gives its bytes' window back to the client."""

    __slots__ = ("_chunks", "_conn", "_eof", "_error", "_ready", "_sid", "size")

    def __init__(self, conn: H2ServerConnection, sid: int) -> None:
        self._conn = conn
        self._sid = sid
        self._chunks: collections.deque[bytes] = collections.deque()
        self._eof = False
        self._error: BaseException | None = None
        self._ready: asyncio.Event | None = None  # made when the handler first waits (most never do)
        self.size = 0  # bytes received and not yet read

    # -- the connection's side
    def feed(self, data: bytes) -> None:
        if self._eof:
            return
        self._chunks.append(data)
        self.size += len(data)
        if self._ready is not None:
            self._ready.set()

    def feed_eof(self) -> None:
        """No more body: the stream ended, or the proxy stopped reading (the rest is discarded)."""
        self._eof = True
        if self._ready is not None:
            self._ready.set()

    def set_exception(self, err: BaseException) -> None:
        if not self._eof:
            self._error = err
        self._eof = True
        if self._ready is not None:
            self._ready.set()

    # -- the handler's side
    def exception(self) -> BaseException | None:
        return self._error

    def is_eof(self) -> bool:
        return self._eof and not self._chunks

    async def readany(self) -> bytes:
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            if self._ready is None:
                self._ready = asyncio.Event()
            self._ready.clear()
            await self._ready.wait()
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self.size -= len(data)
        self._conn.consumed(self._sid, len(data))
        return data

    async def read(self) -> bytes:
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)


class StreamTransport:
    """What the handler may do to "its connection" on HTTP/2: the stream stands for it. Closing
    or aborting resets the stream (never the connection other streams share); extra info (the TLS
    object, the peer) is the connection's."""

    __slots__ = ("_conn", "_sid")

    def __init__(self, conn: H2ServerConnection, sid: int) -> None:
        self._conn = conn
        self._sid = sid

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        transport = self._conn.transport
        return transport.get_extra_info(name, default) if transport is not None else default

    def is_closing(self) -> bool:
        return self._conn.stream_closed(self._sid)

    def abort(self) -> None:
        self._conn.reset(self._sid)

    close = abort


class H2Request:
    """An HTTP/2 request, offering what ``ProxyServer.handle`` reads of an ``aiohttp`` request."""

    __slots__ = (
        "body_exists",
        "connection",
        "content",
        "content_length",
        "headers",
        "last",
        "method",
        "raw_path",
        "remote",
        "response",
        "transport",
    )

    version = HTTP_2

    def __init__(
        self,
        conn: H2ServerConnection,
        sid: int,
        method: str,
        target: str,
        headers: CIMultiDict[str],
        ended: bool,
        remote: str | None,
    ) -> None:
        self.method = method
        #: The number of the client connection the request came on.
        self.connection: int = conn.number
        self.raw_path = target
        self.headers = CIMultiDictProxy(headers)
        self.remote = remote
        self.body_exists = not ended
        self.content = RequestBody(conn, sid)
        if ended:
            self.content.feed_eof()
        length = headers.get("Content-Length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self.transport = StreamTransport(conn, sid)
        self.response = ResponseStream(conn, sid)
        #: The connection ends after this stream (GOAWAY before its answer).
        self.last = False

    def peercert(self) -> bytes | None:
        """The DER of the connection's client certificate, if it sent one."""
        tls = self.transport.get_extra_info("ssl_object")
        return tls.getpeercert(binary_form=True) if tls is not None else None

    def sink(self) -> H2Sink:
        return H2Sink(self.response._conn, self.response._sid)

    async def send_continue(self) -> None:
        """``100 Continue`` (Go's server sends it as a HEADERS frame on the first body read)."""
        self.response.informational(100)


class ResponseStream:
    """The response side of a stream: headers, then DATA as the client's windows allow."""

    __slots__ = ("_conn", "_sid", "sent", "started")

    def __init__(self, conn: H2ServerConnection, sid: int) -> None:
        self._conn = conn
        self._sid = sid
        self.started = False
        self.sent = 0

    def informational(self, status: int) -> None:
        if not self.started:
            self._conn.send_headers(self._sid, [(b":status", b"%d" % status)], end=False)

    def start(self, status: int, headers: CIMultiDict[str] | list[tuple[str, str]], end: bool = False) -> None:
        self.started = True
        self._conn.send_response_headers(self._sid, status, headers, end)

    def start_whole(self, status: int, headers: CIMultiDict[str] | list[tuple[str, str]], data: bytes) -> bool:
        """The headers and the whole body ``data`` at once, ending the stream, when the client's
        windows take it now (most small answers): True. False when only the headers went out and
        the body is still to be written (``write``)."""
        self.started = True
        whole = self._conn.send_response(self._sid, status, headers, data)
        if whole:
            self.sent += len(data)
        return whole

    async def write(self, data: bytes | memoryview, end: bool = False) -> None:
        """Send ``data`` (waiting for windows as needed); ``end`` ends the stream with it."""
        self.sent += len(data)
        await self._conn.send_data(self._sid, data, end)

    async def end(self) -> None:
        await self._conn.send_data(self._sid, b"", True)

    def reset(self, code: int) -> None:
        self._conn.reset(self._sid, code)

    def goaway(self) -> None:
        """End the connection after the streams it has (GOAWAY NO_ERROR now)."""
        self._conn.goaway()

    def closing(self) -> bool:
        return self._conn.stream_closed(self._sid)


class H2Sink:
    """A watch served from the cache, on an HTTP/2 stream: the ``TransportSink`` of
    ``kproxy.core.eventstream`` for a stream. Frames are queued for the stream and sent as its
    window allows; the sink is writable while less than ``SINK_HIGH_WATER`` waits."""

    __slots__ = ("_conn", "_sid", "done", "wrote")

    def __init__(self, conn: H2ServerConnection, sid: int) -> None:
        self._conn = conn
        self._sid = sid
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.wrote = False

    def write(self, data: bytes) -> None:
        if not data or self.closing():
            return
        self.wrote = True
        self._conn.queue_data(self._sid, data)

    def writable(self) -> bool:
        return self._conn.queued(self._sid) < SINK_HIGH_WATER and not self._conn.writing_paused

    async def drain(self) -> None:
        if self.closing():
            raise ConnectionError("client went away")
        await self._conn.wait_queued_below(self._sid, SINK_HIGH_WATER)

    def closing(self) -> bool:
        return self._conn.stream_closed(self._sid)

    def close(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
