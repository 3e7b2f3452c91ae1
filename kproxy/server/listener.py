"""The listener's HTTP/1.1 edge: Go's answers to requests it cannot read.

aiohttp's server answers a request it cannot parse with its own text (the parser's internals,
``HTTP/1.0``, a ``Server: Python/… aiohttp/…`` header) and logs a traceback for it; it keeps
per-line limits of its own instead of Go's limit on the whole head; and a chunked body that
turns malformed after the head was parsed leaves the request waiting for a body that never
ends. ``GoServer`` and ``GoRequestHandler`` answer as Go's net/http server in front of the
apiserver does, and keep its deadlines on reading a head and on idle connections, with kproxy's
bounds on what unfinished heads hold (``kproxy.server.connections``).

aiohttp's documented API offers none of this (no parser hook, no per-connection deadlines, no
answer of one's own to an unreadable request), so these classes reach into its internals. Every
member they use outside the documented API is listed in :data:`AIOHTTP_SEAM`, checked when the
first server is made (a missing one stops kproxy at start rather than opening a hole), and
tests/unit/server/test_aiohttp_seam.py keeps the list complete; `make aiohttp-newest` runs the
edge's tests against the newest aiohttp release (docs/developing/architecture.md#the-aiohttp-seam).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, HttpProcessingError, LineTooLong
from aiohttp.http_writer import HttpVersion
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import MAX_MSG_QUEUE_SIZE, RequestHandler, RequestPayloadError, _ErrInfo

from kproxy.server.connections import HEADER_LINE_COST, IDLE, TLS_HANDSHAKE, Connections
from kproxy.server.h1request import (
    GO_ERROR_HEADERS,
    UNSUPPORTED_TE,
    ChunkedBody,
    Head,
    HeadRefused,
    MalformedChunked,
    go_answer,
    head_end,
    read_known_head,
)
from kproxy.server.http2.server import H2ServerConnection, Handler
from kproxy.server.http2.settings import H2Limits

log = logging.getLogger("kproxy")

#: Go's limit on a request's head (request line and headers): the apiserver's MaxHeaderBytes
#: (1 MiB, net/http's default) plus the 4096 bytes of read-buffer slack net/http allows on top.
MAX_HEAD_BYTES = (1 << 20) + 4096
#: Go counts no headers, only bytes; this bounds what a head of MAX_HEAD_BYTES costs in Python.
MAX_HEADERS = 1 << 16


class HeadTooLarge(BadHttpMessage):
    """A request head over MAX_HEAD_BYTES (or MAX_HEADERS lines)."""

    code = 431

    def __init__(self) -> None:
        super().__init__("request head too large")


class MalformedBody(Exception):
    """The client's chunked body broke off into something that is not HTTP; ``str`` is Go's text."""


def go_parse_error(err: BaseException) -> bytes:
    """What Go's net/http writes (then closes the connection) for a request it cannot read.

    Its texts (net/http ``conn.serve``): ``431 Request Header Fields Too Large``; ``Unsupported
    transfer encoding`` (501); a status error with its text (a protocol version other than 1.x,
    a missing Host); ``400 Bad Request`` for anything else."""
    if isinstance(err, HeadRefused):
        return err.answer
    msg = str(err)
    if isinstance(err, (HeadTooLarge, LineTooLong)) or "Too many headers" in msg:
        public = b"431 Request Header Fields Too Large"
    elif isinstance(err, BadStatusLine) and "Invalid HTTP version" in msg:
        public = b"505 HTTP Version Not Supported: unsupported protocol version"
    elif "Missing 'Host' header" in msg:
        public = b"400 Bad Request: missing required Host header"
    elif "Transfer-Encoding" in msg and "Content-Length" not in msg:
        return UNSUPPORTED_TE
    else:
        public = b"400 Bad Request"
    return b"HTTP/1.1 " + public + GO_ERROR_HEADERS + public


class _RawAnswer(web.StreamResponse):
    """An answer written as given bytes, then the connection closes (Go's answers to unreadable
    requests are written straight to the connection, outside its ResponseWriter)."""

    def __init__(self, raw: bytes) -> None:
        super().__init__(status=400)
        self._raw = raw
        self.force_close()

    async def prepare(self, request: web.BaseRequest) -> None:
        transport = request.transport
        if transport is not None and not transport.is_closing():
            transport.write(self._raw)

    async def write_eof(self, data: bytes = b"") -> None:
        return None


class _HeadLimit:
    """The request reader: every head is read by Go's rules first (``kproxy.server.h1request``),
    with Go's limit on its bytes, and aiohttp's parser is handed only what Go took, in a form it
    reads the same way: a head at a time, then exactly the body Go's framing gives it (a chunked
    body re-encoded). A body that turns malformed is the request's error: the request being
    served sees it, no new one starts. It tells the connection when a head is complete and what
    the heads it holds cost."""

    def __init__(self, parser: Any, protocol: GoRequestHandler, renew: Callable[[], Any]) -> None:
        self._parser = parser
        self._protocol = protocol
        self._renew = renew  # a new aiohttp parser, for one left in a state Go's reading is not in
        self._stale = False  # the parser took the last request to close or upgrade; Go did not
        self._body: Any = None  # the body of the last request whose head was parsed
        self._partial = bytearray()  # a head begun and not complete
        self._scanned = 0  # how far the search for its end went
        self._lines = 0  # the line ends in it
        self._length = 0  # the bytes of a Content-Length body still to come
        self._chunks: ChunkedBody | None = None  # a chunked body being read
        self._rest = b""  # the part of a chunk's line that came so far
        self._after_post = False
        self._closing = False  # the last head read closes the connection after its request
        self._since = 0  # bytes received since the last head (or the connection's start)
        self._read_any = False  # a head was read on this connection
        self._waiting = b""  # bytes not read yet: aiohttp's queue of requests was full
        self._ended = False  # refused or upgraded: nothing more is read as HTTP
        self._heads: deque[tuple[Head, int]] = deque()  # given to the parser, no message yet
        self._queued: deque[int] = deque()  # the cost of each parsed head not yet served

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)

    @property
    def partial(self) -> int:
        """Bytes of a head that has begun and is not complete."""
        return len(self._partial)

    def cut_off(self) -> bool:
        """Whether the client's end of stream cuts off a head Go would have begun reading: any
        byte of a connection's first head, four of a later one (Go's ``conn.serve`` peeks four
        bytes before it reads the next request, and closes quietly without them)."""
        return bool(self._partial) and self._since >= (4 if self._read_any else 1)

    def held(self) -> int:
        """Estimated memory of the heads this connection holds (begun, or parsed and queued)."""
        return len(self._partial) + len(self._waiting) + HEADER_LINE_COST * self._lines + sum(self._queued)

    def message_consumed(self) -> None:
        if self._queued:
            self._queued.popleft()
        self._parser.message_consumed()
        self._protocol.holding()

    def feed_data(self, data: bytes) -> Any:
        if self._ended:
            return (), False, b""
        messages: list[Any] = []
        resuming = not data or bool(self._waiting)
        if self._waiting:
            data, self._waiting = self._waiting + data, b""
        try:
            # aiohttp resuming a parser that paused (a full queue, a body's flow control): the
            # parser finishes what it holds first, which may be an upgrade (then the rest is its).
            tail = data if resuming and self._give(b"", messages) else self._consume(data, messages)
        except HttpProcessingError as err:  # Go's refusal of a head, or kproxy's bound on heads
            messages.append((_ErrInfo(status=400, exc=err, message=err.message), EMPTY_PAYLOAD))
            self._ended, tail = True, None
        except MalformedChunked as err:
            # Go's server hands the chunked reader's error to the handler reading the body (after
            # the data before it), and reads nothing after it; the apiserver answers it and closes.
            if err.pieces:
                self._give(b"".join(err.pieces), messages)
            body = self._body
            body.set_exception(MalformedBody(str(err)))
            body.feed_eof()  # every read still raises; aiohttp does not linger over the rest
            self._protocol.close()
            self._ended, tail = True, None
        if not self._protocol.holding():
            return (), False, b""  # a bound closed this connection
        if tail is not None:
            return messages, True, tail
        return messages, False, b""

    def _consume(self, buf: bytes, messages: list[Any]) -> bytes | None:
        """Read ``buf``: heads, and the bodies they frame. The bytes after an upgrade, or None."""
        pos, end = 0, len(buf)
        while pos < end:
            if self._length:
                n = min(self._length, end - pos)
                self._length -= n
                pos += n
                if self._give(buf[pos - n : pos], messages):
                    return buf[pos:]
            elif self._chunks is not None:
                if self._rest:
                    buf, pos, self._rest = self._rest + buf[pos:], 0, b""
                    end = len(buf)
                pieces, pos, done = self._chunks.feed(buf, pos)
                if done:
                    self._chunks = None
                elif pos < end:
                    self._rest, pos = buf[pos:], end
                if pieces and self._give(b"".join(pieces), messages):
                    return buf[pos:]
            elif self._closing:
                break  # Go reads nothing after a request that closes the connection
            elif self._stale and not (self._body is EMPTY_PAYLOAD or self._body.is_eof()):
                # aiohttp's parser is to be replaced, but it has not finished the last request
                # (it paused its body for flow control): the rest waits for it to finish.
                self._waiting = buf[pos:]
                break
            elif len(self._queued) >= MAX_MSG_QUEUE_SIZE:
                # aiohttp's queue of parsed requests is full: the rest waits, unread, until it
                # drains (aiohttp stops reading the socket meanwhile), as its own parser does.
                self._waiting = buf[pos:]
                break
            else:
                given, buf, pos = self._head(buf, pos)
                end = len(buf)
                if given is None:
                    break
                if self._give(given, messages):
                    return buf[pos:]
        return None

    def _head(self, buf: bytes, pos: int) -> tuple[bytes | None, bytes, int]:
        """The next head, read by Go's rules (what aiohttp's parser is to be given of it), and the
        bytes and offset where its body starts; None while the head is not whole (it is kept, and
        every byte of ``buf`` read)."""
        work: bytes | bytearray = buf
        self._since += len(buf) - pos
        if self._partial:
            more = buf[pos:] if pos else buf
            self._partial += more
            self._lines += more.count(b"\n")
            work, pos = self._partial, 0
        if self._after_post:  # Go's tolerance of old clients' CRLF after a POST body
            skip = 0
            while skip < 4 and pos + skip < len(work) and work[pos + skip] in b"\r\n":
                skip += 1
            if skip < 4 and pos + skip == len(work):
                self._hold(work, pos)
                return None, buf, len(buf)
            pos += skip
            self._after_post = False
        end = head_end(work, pos, self._scanned)
        if end - pos in (1, 2) and self._read_any and self._since < 4:
            end = -1  # an empty line after a request: Go waits for four bytes before it reads one
        if end < 0:
            self._hold(work, pos)
            return None, buf, len(buf)
        if end - pos > MAX_HEAD_BYTES:
            raise HeadTooLarge()
        raw = work if pos == 0 and end == len(work) and work is buf else bytes(work[pos:end])
        if work is self._partial:
            buf, pos = bytes(work[end:]), 0
            self._partial = bytearray()
        else:
            pos = end
        self._scanned = self._lines = self._since = 0
        self._read_any = True
        head = read_known_head(raw)
        if self._stale:  # llhttp would refuse what follows a request it took to close or upgrade
            self._parser, self._stale = self._renew(), False
        self._after_post = head.post
        self._closing = head.close
        self._length = head.length
        self._chunks = ChunkedBody() if head.chunked else None
        self._heads.append((head, len(raw) + HEADER_LINE_COST * raw.count(b"\n")))
        return head.canonical or raw, buf, pos

    def _hold(self, work: bytes | bytearray, pos: int) -> None:
        """Keep the begun head (``work`` from ``pos``) for the next read, within Go's limit."""
        if work is not self._partial:
            self._partial = bytearray(work[pos:])
            self._lines = self._partial.count(b"\n")
        elif pos:
            del self._partial[:pos]
            self._lines = self._partial.count(b"\n")
        self._scanned = len(self._partial)
        if self._scanned > MAX_HEAD_BYTES:
            raise HeadTooLarge()

    def _give(self, piece: bytes, messages: list[Any]) -> bool:
        """Hand ``piece`` to aiohttp's parser and collect the messages it makes, with Go's method,
        target and version put back where it was given a stand-in; True once it upgraded."""
        got, upgraded, _ = self._parser.feed_data(piece)
        for msg, payload in got:
            fix, cost = self._heads.popleft()
            if fix.method is not None or fix.target is not None or fix.version is not None:
                msg = msg._replace(
                    method=fix.method or msg.method,
                    path=msg.path if fix.target is None else fix.target,
                    version=HttpVersion(*fix.version) if fix.version is not None else msg.version,
                )
            if fix.close != msg.should_close:
                self._stale = self._stale or msg.should_close
                msg = msg._replace(should_close=fix.close)
            if msg.upgrade and not upgraded:  # llhttp paused for an upgrade aiohttp does not take
                self._stale = True
            messages.append((msg, payload))
            self._body = payload
            self._queued.append(cost)
            self._protocol.head_done()
        if upgraded:
            self._ended = True
        return bool(upgraded)


# Where a connection is (kproxy.server.connections): accepted, not yet admitted; in its TLS
# handshake (Go's tlsHandshakeTimeout runs); reading a head (the read-header deadline runs); being
# served (no deadline); idle between requests (the idle deadline runs); closed.
_NEW, _HANDSHAKE, _HEAD, _BUSY, _IDLE, _CLOSED = range(6)

#: How long closing a TLS connection waits for the client's close_notify. Go's ``tls.Conn.Close``
#: does not wait for it at all: it writes its own alert under a 5 s deadline and closes
#: (crypto/tls/conn.go ``closeNotify``); asyncio's default (30 s) would hold a file descriptor
#: that long for a client that never answers.
TLS_SHUTDOWN_TIMEOUT = 5.0


#: The members of aiohttp's classes, outside its documented API, that this module and
#: ``kproxy.server.upgrade`` use or override: the seam an aiohttp release is checked against.
AIOHTTP_SEAM: dict[type, tuple[str, ...]] = {
    RequestHandler: (
        "_parser",  # wrapped by _HeadLimit: Go's head limit, the malformed-body handling
        "_messages",  # requests parsed and not yet served (pipelining)
        "_read_bufsize",  # a new parser is made with it (_HeadLimit's renew)
        "_force_close",  # the connection closes after this answer
        "_manager",  # the Server that made the handler (its bounds, its HTTP/2 serving)
        "_loop",
        "_handle_request",  # overridden: the next head's deadline starts when an answer is written
        "_process_keepalive",  # overridden: Go's idle deadline replaces aiohttp's keep-alive timer
        "_drain_helper",  # an upgraded connection's writes wait for the socket (flow control)
        "set_parser",  # an upgraded connection's bytes go to the splice (as WebSocketResponse does)
    ),
    web.Server: ("_kwargs", "_loop"),  # the handler's arguments, to make GoRequestHandlers
    web.BaseRunner: ("_make_server", "_server", "_kwargs"),  # the admin app served by GoServer
}


def seam_missing() -> list[str]:
    """The members of :data:`AIOHTTP_SEAM` the installed aiohttp lacks (class attributes, slots,
    or attributes its ``__init__`` sets)."""
    import inspect

    missing = []
    for cls, names in AIOHTTP_SEAM.items():
        try:
            init = inspect.getsource(vars(cls).get("__init__", object.__init__))
        except (OSError, TypeError):
            init = ""
        for name in names:
            if not hasattr(cls, name) and f"self.{name}" not in init:
                missing.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    return missing


_SEAM_CHECKED = False


def _check_seam() -> None:
    global _SEAM_CHECKED
    if _SEAM_CHECKED:
        return
    missing = seam_missing()
    if missing:  # aiohttp's internals moved: fail loudly, not open
        raise RuntimeError(
            f"kproxy's HTTP/1.1 edge needs aiohttp internals this aiohttp {aiohttp_version()} lacks: "
            + ", ".join(missing)
        )
    _SEAM_CHECKED = True


def aiohttp_version() -> str:
    import aiohttp

    return str(aiohttp.__version__)


class GoRequestHandler(RequestHandler):
    """aiohttp's request handler with Go's answers at the HTTP/1.1 level and Go's deadlines on
    handshakes, heads and idle connections (see above and ``kproxy.server.connections``)."""

    def __init__(self, manager: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(manager, *args, **kwargs)
        parser = getattr(self, "_parser", None)
        if not hasattr(parser, "feed_data"):  # the parser's own interface changed (AIOHTTP_SEAM)
            raise RuntimeError(f"kproxy's HTTP/1.1 edge cannot wrap aiohttp {aiohttp_version()}'s request parser")
        # aiohttp drops its parser when the connection is lost, which breaks the reference cycle
        # through the wrapper's ``_protocol``: no other reference to the wrapper is kept.
        limits = {k: kwargs[k] for k in ("max_line_size", "max_field_size", "max_headers") if k in kwargs}
        made: Any = type(parser)

        def renew() -> Any:  # made as aiohttp's RequestHandler makes its parser
            return made(
                self, self._loop, self._read_bufsize, **limits, payload_exception=RequestPayloadError,
                auto_decompress=kwargs.get("auto_decompress", True), max_msg_queue_size=MAX_MSG_QUEUE_SIZE,
            )  # fmt: skip

        self._parser = _HeadLimit(parser, self, renew)  # type: ignore[assignment]
        conns = getattr(manager, "conns", None)
        self._conns: Connections = conns if isinstance(conns, Connections) else Connections()
        self._phase = _NEW
        self._deadline: asyncio.TimerHandle | None = None
        self._held = 0
        self._raw: asyncio.Transport | None = None  # the socket's transport (under TLS, if any)
        self._source = ""
        self._admitted = False
        self._h2: H2ServerConnection | None = None  # the connection speaks HTTP/2 (ALPN chose h2)

    # -- where the connection is ------------------------------------------------------------------

    def accepted(self, raw: asyncio.Transport, ssl_ctx: ssl.SSLContext | None) -> None:
        """The listener accepted ``raw``: admit it against the bounds on connections (or close
        it at once), then serve it, over TLS after a handshake with Go's deadline."""
        self._raw = raw
        peer = raw.get_extra_info("peername")
        self._source = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else ""
        refused = self._conns.admit(self._source)
        if refused is not None:
            self._phase = _CLOSED
            log.debug("refusing client connection", extra={"reason": refused, "peer": self._source})
            raw.abort()
            return
        self._admitted = True
        if ssl_ctx is None:
            raw.set_protocol(self)
            self.connection_made(raw)
            return
        self._phase = _HANDSHAKE
        deadline = self._conns.limits.read_header_timeout  # Go's tlsHandshakeTimeout()
        self._arm(deadline, "tls_handshake_timeout")
        self._conns.enter(self, TLS_HANDSHAKE)  # may close this connection, or an older one
        if self._phase != _HANDSHAKE:
            return
        # kproxy's own deadline (``_arm`` above) closes the connection first; asyncio's is a backstop.
        handshake = self._loop.start_tls(
            raw,
            self,
            ssl_ctx,
            server_side=True,
            ssl_handshake_timeout=(deadline or 365 * 86400) + 1,
            ssl_shutdown_timeout=TLS_SHUTDOWN_TIMEOUT,
        )
        # Started here, not in a task: the loop begins reading the connection as soon as this
        # returns, into whatever protocol it has then. start_tls puts the TLS protocol in place
        # before its first wait; a task would run it one loop pass later, after the ClientHello
        # went to the protocol the connection was accepted with.
        _drive(handshake, lambda tls, err: self._handshake_done(raw, tls, err))

    def _handshake_done(self, raw: asyncio.Transport, tls: Any, err: BaseException | None) -> None:
        if err is not None or tls is None:  # any failed handshake: the connection is gone
            log.debug("TLS handshake failed", extra={"peer": self._source, "error": str(err)})
            if self._phase == _HANDSHAKE:
                self._release()
            raw.abort()
            return
        if self._phase != _HANDSHAKE:  # closed by a bound as the handshake completed
            tls.abort()
            return
        http2: Http2Serving | None = getattr(self._manager, "http2", None)
        ssl_object = tls.get_extra_info("ssl_object")
        if http2 is not None and ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            self._serve_h2(tls, http2)
            return
        self.connection_made(tls)

    def _serve_h2(self, tls: asyncio.Transport, http2: Http2Serving) -> None:
        """ALPN chose h2: the connection is served by an ``H2ServerConnection`` from now on; this
        handler stays only as its entry in the listener's bounds (idle while it has no stream)."""
        self._disarm()
        self._phase = _BUSY
        self._conns.enter(self, None)

        def closed() -> None:
            self._release()
            http2.gone(conn.number)

        conn = H2ServerConnection(http2.handler, http2.limits, http2.registry, closed, self._h2_idle)
        self._h2 = conn
        tls.set_protocol(conn)  # type: ignore[arg-type]
        conn.connection_made(tls)

    def _h2_idle(self, idle: bool) -> None:
        if self._phase in (_BUSY, _IDLE):
            self._phase = _IDLE if idle else _BUSY
            self._conns.enter(self, IDLE if idle else None)  # may close the connection idle longest

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._raw is None:  # served without GoServer's accept (no bounds on connections)
            self._raw = transport  # type: ignore[assignment]
        self._start_head()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._release()
        super().connection_lost(exc)

    def eof_received(self) -> None:
        """The client ended its side (a TCP half-close, or a close). A head it left unfinished
        gets Go's answer to one cut off (``readRequest``'s unexpected EOF: ``400 Bad Request``),
        unless fewer than four bytes of a later one came; then the connection closes. A request
        being served is cancelled, as Go's server cancels its context when its background read
        sees the end (so a watch ends with its client); the requests queued behind it are not
        answered (Go would go on to read them)."""
        heads = self._heads()
        if heads is not None and self._phase in (_HEAD, _IDLE) and heads.cut_off() and self.transport is not None:
            self.transport.write(go_answer(b"400 Bad Request"))

    def _process_keepalive(self) -> None:
        """aiohttp's own keep-alive timer: the deadlines here replace it."""

    def _start_head(self) -> None:
        self._phase = _HEAD
        self._arm(self._conns.limits.read_header_timeout, "read_header_timeout")
        self._conns.start_head(self)  # may close this connection, or an older one

    def head_done(self) -> None:
        """A whole head arrived: the request is served with no deadline (Go sets none while a
        handler runs: watches, exec sessions, slowly streamed bodies take their time)."""
        if self._phase in (_HEAD, _IDLE):
            self._conns.enter(self, None)
            self._disarm()
            self._phase = _BUSY

    def holding(self) -> bool:
        """Account for the heads the parser holds now; False if a bound closed the connection.
        An idle connection whose next request has sent four bytes is reading a head (Go's
        ``bufr.Peek(4)`` before it sets the read-header deadline)."""
        heads = self._heads()
        if heads is None:
            return False
        held = heads.held()
        delta, self._held = held - self._held, held
        if delta:
            self._conns.hold(self, delta)
        if self._phase == _IDLE and heads.partial >= 4:
            self._start_head()
        return self._phase != _CLOSED

    async def _handle_request(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super()._handle_request(*args, **kwargs)
        finally:
            self._request_done()

    def _request_done(self) -> None:
        """The response is written: the next request, already parsed, is served at once;
        otherwise the connection reads the next head (if it has begun) or waits for it."""
        if self._phase != _BUSY or self._messages:
            return
        heads = self._heads()
        if heads is not None and heads.partial >= 4:
            self._start_head()
        else:
            self._phase = _IDLE
            self._arm(self._conns.limits.idle_timeout, "idle_timeout")
            self._conns.enter(self, IDLE)  # may close the connection idle longest

    def close_for(self, reason: str) -> None:
        """Close the connection without a word, as Go's server does when a deadline passes
        (and as kproxy does when a bound is reached). A connection waiting on its client (in a
        handshake, reading a head, idle) is dropped at once, so its file descriptor is free when
        this returns; one being served (its pipelined heads over the budget) closes after what
        it was sent."""
        phase = self._phase
        if phase == _CLOSED:
            return
        self._release()
        self._conns.on_close(reason)
        if self._h2 is not None:
            self._h2.close_for(reason)
            return
        log.debug("closing client connection", extra={"reason": reason, "peer": self._source})
        if phase in (_HANDSHAKE, _HEAD, _IDLE) and self._raw is not None:
            self._force_close = True
            self._raw.abort()
        else:
            self.force_close()

    def _release(self) -> None:
        if self._phase == _CLOSED:
            return
        self._phase = _CLOSED
        self._disarm()
        if self._admitted:
            self._admitted = False
            self._conns.leave(self, self._source)
        else:
            self._conns.enter(self, None)
        self._conns.held -= self._held
        self._held = 0

    def _heads(self) -> _HeadLimit | None:
        """The parser wrapper, while the connection is open."""
        parser: Any = self._parser
        return parser if self._phase != _CLOSED and isinstance(parser, _HeadLimit) else None

    def _arm(self, seconds: float, reason: str) -> None:
        self._disarm()
        if seconds > 0:
            self._deadline = self._loop.call_later(seconds, self.close_for, reason)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        # A malformed request is the client's problem, not kproxy's: no traceback (Go logs nothing).
        log.debug("unreadable request from %s: %s", request.remote, exc)
        return _RawAnswer(go_parse_error(exc))


class Http2Serving:
    """What a listener needs to serve HTTP/2 (its TLS context offers ``h2`` in ALPN)."""

    __slots__ = ("gone", "handler", "limits", "registry")

    def __init__(self, handler: Handler, limits: H2Limits) -> None:
        self.handler = handler
        self.limits = limits
        self.registry: set[H2ServerConnection] = set()  # the open ones (a drain sends each GOAWAY)
        #: Told the number of each connection that closed (its upstream connections can go).
        self.gone: Callable[[int], None] = lambda number: None


class GoServer(web.Server):
    """``web.Server`` whose connections use GoRequestHandler, with Go's head limits and the
    deadlines and bounds of ``connections``; with ``http2``, TLS connections that choose h2 are
    served by ``kproxy.server.http2``."""

    def __init__(
        self,
        handler: Any,
        connections: Connections | None = None,
        ssl_context: ssl.SSLContext | None = None,
        http2: Http2Serving | None = None,
        **kwargs: Any,
    ) -> None:
        self.conns = connections or Connections()
        self.http2 = http2
        #: Serve HTTPS: each accepted connection's TLS handshake is done here, under the bounds.
        self.ssl_context = ssl_context
        kwargs.update(max_line_size=MAX_HEAD_BYTES, max_field_size=MAX_HEAD_BYTES, max_headers=MAX_HEADERS)
        # A request body goes upstream as the client sent it: aiohttp would otherwise inflate a
        # ``Content-Encoding: gzip`` body (the apiserver does not) and forward it under the
        # client's Content-Length, desynchronizing the pooled upstream connection.
        kwargs["auto_decompress"] = False
        _check_seam()
        super().__init__(handler, **kwargs)

    def __call__(self) -> RequestHandler:
        """The protocol of a connection just accepted (the listening socket is plain TCP: TLS
        starts once the connection is admitted, see ``GoRequestHandler.accepted``)."""
        return _Accepted(self)  # type: ignore[return-value]  # the loop takes any protocol

    def handler(self) -> GoRequestHandler:
        return GoRequestHandler(self, loop=self._loop, **self._kwargs)


class GoAppRunner(web.AppRunner):
    """An aiohttp application (the admin listener) served by GoServer, under bounds of its own."""

    def __init__(
        self, app: web.Application, connections: Connections, ssl_context: ssl.SSLContext | None, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        self._go = (connections, ssl_context)

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()  # the application started and frozen, its Server
        connections, ssl_context = self._go
        return GoServer(
            plain.request_handler,
            connections,
            ssl_context,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            **plain._kwargs,
        )


def _drive(coro: Any, done: Callable[[Any, BaseException | None], None]) -> None:
    """Run ``coro`` now up to its first wait, then on as each future it waits for completes (what
    a task does, without a task's first loop pass); ``done(result, error)`` at its end."""

    def step(_: Any = None) -> None:
        try:
            waiting = coro.send(None)
        except StopIteration as stop:
            done(stop.value, None)
        except Exception as err:  # handed on
            done(None, err)
        else:
            waiting._asyncio_future_blocking = False  # as a task resets it
            waiting.add_done_callback(step)

    step()


class _Accepted(asyncio.Protocol):
    """A connection the listener accepted, handed at once to its request handler."""

    __slots__ = ("_server",)

    def __init__(self, server: GoServer) -> None:
        self._server = server

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._server.handler().accepted(transport, self._server.ssl_context)  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        """Never called: the handler takes the transport over before it reads."""

    def connection_lost(self, exc: BaseException | None) -> None:
        """A connection refused at once."""


def go_bad_request(why: str = "") -> web.StreamResponse:
    """Go's server's answer to a request head it cannot use (an unparsable target; with ``why``, a
    ``badRequestError`` such as ``malformed Host header``): ``400 Bad Request[: why]``, then the
    connection closes (net/http ``conn.serve``)."""
    public = b"400 Bad Request" + (b": " + why.encode() if why else b"")
    return _RawAnswer(b"HTTP/1.1 " + public + GO_ERROR_HEADERS + public)


def go_transfer_encoding_refused(version: tuple[int, int], values: list[str]) -> web.StreamResponse | None:
    """Go's 501 for a Transfer-Encoding it does not take (net/http transfer.go
    ``parseTransferEncoding``): on HTTP/1.1, anything but exactly one ``chunked``. aiohttp's parser
    refuses these too, except on an upgrade request, which it hands on with the header: Go would
    never serve it, so neither may kproxy forward it."""
    if not values or version < (1, 1):
        return None
    if len(values) == 1 and values[0].isascii() and values[0].lower() == "chunked":  # ascii.EqualFold
        return None
    return _RawAnswer(UNSUPPORTED_TE)
