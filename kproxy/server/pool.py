"""A lean keep-alive HTTP/1.1 connection pool to the upstream, for the request hot path.

Why not aiohttp's ClientSession here: measured on the 2-core machine, its per-request
bookkeeping (timers, tracing hooks, cookie and redirect handling, header re-validation) was
about half of kproxy's CPU per proxied small GET. A proxy needs none of it: the request head is
already known, the response is passed on as it comes. This pool writes the head (and a known
body) in one write, parses the response with ``httptools`` (llhttp, the parser Node.js uses),
and hands the body on chunk by chunk as it arrives, so watches stream exactly as before.

The head is written by ``kproxy.server.httputil.request_head``, the one writer of upstream request
heads, which refuses what Go's ``Transport`` would not send. A response to ``HEAD`` ends with its
head (whatever its Content-Length says), as Go's ``Transport`` reads it. Upgrades go on the raw
upgrade path (``kproxy.server.upgrade``), through the same writer. ``Expect`` never reaches the pool:
kproxy answers ``100-continue`` itself.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator, Iterable
from typing import cast

import httptools
from multidict import CIMultiDict

from kproxy.server.httputil import HEADER_CHARSET, end_to_end, request_head

# Pause reading from the upstream when this much body is buffered and not yet taken.
_HIGH_WATER = 1024 * 1024
# Idle connections older than this are not reused (the apiserver closes idle ones itself).
_IDLE_TTL = 30.0


class UpstreamClosed(ConnectionResetError):
    """The upstream connection ended before the response did."""


class NotSent(ConnectionError):
    """No connection to the upstream could be made: nothing of the request reached it."""


class _Conn(asyncio.Protocol):
    """One upstream connection; one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.idle_since = 0.0
        self.generation = 0
        self._reset()
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None

    def _reset(self) -> None:
        self.generation += 1
        self.headers: list[tuple[str, str]] = []
        self.reason = ""
        self.head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.complete = False
        self.lost: BaseException | None = None
        self.got_bytes = False
        self.keep_alive = False
        self.no_body = False  # the request was HEAD: the response ends with its head
        self.reader_waiter: asyncio.Future[None] | None = None
        self._reading_paused = False

    # -------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass
        except httptools.HttpParserError as err:
            self._fail(UpstreamClosed(f"malformed upstream response: {err}"))
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pool.forget(self)
        if not self.complete and exc is None and self.head.done() and self._delimited_by_close():
            self.complete = True  # a body without Content-Length or chunking ends with the connection
            self._wake()
        elif not self.complete:
            self._fail(exc or UpstreamClosed("the upstream closed the connection"))
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_exception(UpstreamClosed("upstream connection lost"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # -------------------------------------------------------------- httptools callbacks

    def on_status(self, status: bytes) -> None:
        self.reason += status.decode(HEADER_CHARSET, "surrogateescape")

    def on_header(self, name: bytes, value: bytes) -> None:
        # UTF-8 both ways, as aiohttp's server parses and writes headers, so that a header the
        # apiserver writes in UTF-8 (a Warning quoting a field name) reaches the client unchanged.
        self.headers.append(
            (name.decode(HEADER_CHARSET, "surrogateescape"), value.decode(HEADER_CHARSET, "surrogateescape"))
        )

    def on_headers_complete(self) -> None:
        self.keep_alive = bool(self.parser.should_keep_alive())
        if self.no_body:
            # llhttp does not know the request was HEAD and would wait for the body Content-Length
            # announces; the connection gets a fresh parser when it is given back.
            self.complete = True
            self._wake()
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.no_body:
            return
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    # -------------------------------------------------------------- helpers

    def _delimited_by_close(self) -> bool:
        names = {k.lower() for k, _ in self.headers}
        return "content-length" not in names and "transfer-encoding" not in names

    def _wake(self) -> None:
        w = self.reader_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self.lost = exc
        if not self.head.done():
            self.head.set_exception(exc)
            self.head.exception()  # retrieved here; the caller re-raises it
        self._wake()

    async def drain(self) -> None:
        if self._write_paused:
            self._drain_waiter = asyncio.get_running_loop().create_future()
            await self._drain_waiter

    async def body(self) -> AsyncIterator[bytes]:
        """The response body as it arrives; the connection goes back to the pool at the end.

        What arrived while the reader was away comes as one chunk: a watch's events that one
        loop pass brought are one write downstream (and one compress-and-flush call for a
        compressed watch, the "batch of events" the compression filter flushes at once), and a
        fast list body is fewer, larger writes. Nothing waits for more to arrive."""
        chunks = self.chunks
        while True:
            if chunks:
                if len(chunks) == 1:
                    chunk = chunks.popleft()
                else:
                    chunk = b"".join(chunks)
                    chunks.clear()
                self.buffered -= len(chunk)
                if self._reading_paused and self.buffered < _HIGH_WATER // 2 and self.transport is not None:
                    self._reading_paused = False
                    self.transport.resume_reading()
                yield chunk
                continue
            if self.complete:
                self.pool.release(self)
                return
            if self.lost is not None:
                raise self.lost if isinstance(self.lost, OSError) else UpstreamClosed(str(self.lost))
            self.reader_waiter = asyncio.get_running_loop().create_future()
            await self.reader_waiter
            self.reader_waiter = None

    def whole_body(self) -> bytes | None:
        """The body if it has arrived whole (a small answer comes in one read), taken at once
        with the connection given back as ``body()`` does at its end; None while it is coming."""
        if not self.complete:
            return None
        data = b"".join(self.chunks)
        self.chunks.clear()
        self.buffered = 0
        self.pool.release(self)
        return data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self.pool.forget(self)


class PoolResponse:
    """Status, headers and the streamed body of one upstream response."""

    __slots__ = ("_conn", "_generation", "headers", "reason", "status")

    def __init__(self, conn: _Conn) -> None:
        self._conn = conn
        self._generation = conn.generation
        self.status: int = conn.parser.get_status_code()
        self.reason = conn.reason
        self.headers: CIMultiDict[str] = end_to_end(conn.headers)  # hop-by-hop ones removed

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def chunks(self) -> AsyncIterator[bytes]:
        return self._conn.body()

    async def read(self) -> bytes:
        conn = self._conn
        if conn.generation == self._generation and conn.lost is None:
            data = conn.whole_body()  # without the streaming generator when it is all here
            if data is not None:
                return data
        return b"".join([c async for c in conn.body()])

    def close(self) -> None:
        """Abandon the response: the connection is closed (a watch upstream ends with it).

        A no-op once the body was read to the end (the connection may already serve another
        request by then: the generation tells)."""
        conn = self._conn
        if conn.generation == self._generation and not conn.complete:
            conn.close()


class Pool:
    """Keep-alive connections to one upstream host."""

    def __init__(
        self,
        host: str,
        port: int,
        ssl_ctx: ssl.SSLContext | None,
        server_hostname: str | None,
        connect_timeout: float,
        max_idle: int = 128,
        max_connections: int = 0,
    ) -> None:
        self.host, self.port = host, port
        # max_connections > 0 bounds the connections in use (upstream.max_connections); a request
        # waits for a free one. A busy connection holds its slot until it is released or closed.
        self._slots = asyncio.Semaphore(max_connections) if max_connections > 0 else None
        self.ssl = ssl_ctx
        self.server_hostname = server_hostname if ssl_ctx else None
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.idle: list[_Conn] = []
        self.busy: set[_Conn] = set()
        authority = host if ":" not in host else f"[{host}]"
        default = 443 if ssl_ctx else 80
        self.host_header = authority if port == default else f"{authority}:{port}"

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: _Conn(self), self.host, self.port, ssl=self.ssl, server_hostname=self.server_hostname
            ),
            self.connect_timeout,
        )
        return conn

    def _take_idle(self) -> _Conn | None:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            if conn.transport is not None and not conn.transport.is_closing() and now - conn.idle_since < _IDLE_TTL:
                return conn
            conn.close()
        return None

    def _leave_busy(self, conn: _Conn) -> None:
        if conn in self.busy:
            self.busy.remove(conn)
            if self._slots is not None:
                self._slots.release()

    def release(self, conn: _Conn) -> None:
        self._leave_busy(conn)
        if conn.transport is None or not conn.keep_alive or len(self.idle) >= self.max_idle:
            conn.close()
            return
        conn.parser = httptools.HttpResponseParser(conn)
        conn._reset()
        conn.idle_since = time.monotonic()
        self.idle.append(conn)

    def forget(self, conn: _Conn) -> None:
        self._leave_busy(conn)
        if conn in self.idle:
            self.idle.remove(conn)

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | AsyncIterator[bytes] | None,
        length: int | None,
    ) -> PoolResponse:
        """Send one request; return once the response head has arrived.

        A reused connection that turns out to be dead before any response byte arrived is retried
        once on a fresh connection, for the requests Go's transport would replay: safe methods
        without a streamed body (a create must never run twice).
        """
        if isinstance(body, bytes):
            framing = [("Content-Length", str(len(body)))]
        elif body is not None:
            framing = [("Content-Length", str(length)) if length is not None else ("Transfer-Encoding", "chunked")]
        else:
            framing = []
        head = request_head(method, target, self.host_header, [*headers, *framing])
        for attempt in (0, 1):
            if self._slots is not None:
                await self._slots.acquire()
            try:
                conn = self._take_idle()
                reused = conn is not None
                if conn is None:
                    try:
                        conn = await self._connect()
                    except (OSError, TimeoutError) as err:
                        raise NotSent(str(err) or type(err).__name__) from err
            except BaseException:
                if self._slots is not None:
                    self._slots.release()
                raise
            self.busy.add(conn)
            conn.no_body = method == "HEAD"
            try:
                await self._send(conn, head, body, length)
                await conn.head
            except BaseException as err:
                if isinstance(err, OSError) and _answered(conn):
                    # The upstream answered before taking the whole body, then closed (Go's server
                    # does so for an early 404/405/403/429 or 413): its answer stands, as Go's
                    # Transport returns it, rather than a 503 for the write that could not finish.
                    # Part of the body never went out, so the connection is never reused.
                    conn.keep_alive = False
                    return PoolResponse(conn)
                conn.close()
                retry = reused and attempt == 0 and not conn.got_bytes and _replayable(method, body)
                if isinstance(err, OSError) and retry:
                    continue
                raise
            return PoolResponse(conn)
        raise UpstreamClosed("unreachable")  # pragma: no cover - the loop returns or raises

    async def _send(
        self, conn: _Conn, head: bytes, body: bytes | AsyncIterator[bytes] | None, length: int | None
    ) -> None:
        transport = conn.transport
        if transport is None:
            raise UpstreamClosed("upstream connection closed")
        if body is None or isinstance(body, bytes):
            transport.write(head + body if body else head)
            return
        transport.write(head)
        chunked = length is None
        async for chunk in body:
            if conn.transport is None:
                raise UpstreamClosed("upstream connection closed while sending the body")
            if chunked:
                if chunk:
                    transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            else:
                transport.write(chunk)
            await conn.drain()
        if chunked:
            transport.write(b"0\r\n\r\n")

    def close(self) -> None:
        for conn in [*self.idle, *self.busy]:
            conn.close()
        self.idle.clear()
        self.busy.clear()


_SAFE = frozenset(("GET", "HEAD", "OPTIONS", "TRACE"))


def _answered(conn: _Conn) -> bool:
    """Whether the response head arrived (the body may still be coming or be complete)."""
    head = conn.head
    return head.done() and not head.cancelled() and head.exception() is None


def _replayable(method: str, body: object) -> bool:
    """net/http's ``isReplayable``: safe methods whose body can be sent again."""
    return method in _SAFE and (body is None or isinstance(body, bytes))
