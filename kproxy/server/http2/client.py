"""HTTP/2 to the upstream kube-apiserver: a few TLS connections carrying every request as a stream.

client-go speaks HTTP/2 to the apiserver, one connection for everything; kproxy does the same
with its callers' requests and its own (reviews, the watch cache's lists and watches). The
framing, HPACK and stream state are the ``h2`` library's (sans-IO); this module is the asyncio
protocol around it and the pool, following Go's client (golang.org/x/net/http2/transport.go, the
transport client-go runs):

* **Connections.** A request takes a stream on an open connection with room under the
  apiserver's SETTINGS_MAX_CONCURRENT_STREAMS (100 by default); only when every open connection
  is full is another dialed (one dial at a time, shared by the requests that wait for it). A
  request never waits for a stream to free up (Go's ``StrictMaxConcurrentStreams`` false).
* **Headers.** Names lower-cased, ``Host`` as ``:authority``, connection-specific fields
  (Connection, Keep-Alive, Proxy-Connection, Transfer-Encoding, Upgrade, a TE other than
  ``trailers``) never sent; values go out as the bytes they were read from. What Go's
  ``EncodeHeaders`` refuses (net/http/internal/httpcommon/request.go: a method, name or value
  ``httpguts`` refuses, a ``:path`` not starting with ``/``, an invalid Host) is refused here
  before any frame is written (:class:`kproxy.server.httputil.InvalidRequestHead`). Credentials
  (Authorization, Proxy-Authorization, Cookie) are never entered in the HPACK table. The table
  belongs to the connection, each HEADERS block is decoded on its own stream: nothing of one
  request's header list is ever part of another's.
* **Flow control.** Request bodies go out as the apiserver's windows allow (a caller's upload
  waits, which back-pressures the caller). Response bodies are windowed per stream
  (:data:`STREAM_WINDOW`, the HTTP/1.1 pool's high-water mark): the window is given back as the
  consumer takes the data, so a slow consumer holds at most that much per stream.
  Abandoning a response before its end resets the stream (RST_STREAM CANCEL).
* **Health.** A connection that received no frame for :data:`READ_IDLE_TIMEOUT` is PINGed; with
  no answer in :data:`PING_TIMEOUT` it is closed and its streams fail (client-go sets Go's
  ``ReadIdleTimeout`` 30 s and ``PingTimeout`` 15 s: staging/src/k8s.io/apimachinery/pkg/util/net/
  http.go ``SetTransportDefaults``).
* **GOAWAY.** The connection takes no new stream; its streams at or below the last stream id
  finish; those above it were not processed and are sent again on another connection (as Go's
  ``shouldRetryRequest`` does) when their body can be sent again, otherwise they fail as
  :class:`kproxy.server.pool.NotSent` (nothing reached the apiserver). A stream the server
  refuses (RST_STREAM REFUSED_STREAM) is the same.

An upstream that does not negotiate ``h2`` by ALPN makes :meth:`H2Pool.request` raise
:class:`H2Unavailable` once and for all; the caller then uses the HTTP/1.1 pool.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import re
import ssl
import struct
import time
from collections.abc import AsyncIterator, Iterable
from http import HTTPStatus
from typing import Any, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream
import h2.utilities
from hpack import NeverIndexedHeaderTuple
from multidict import CIMultiDict

from kproxy.core.chunkreader import ChunkReader
from kproxy.gocompat.httpguts import TOKEN_CHARS, first_invalid_name, valid_host_header
from kproxy.gocompat.strconv import go_quote
from kproxy.server.http2.goframes import PlainEncoder, TruncatingDecoder, send_request_headers
from kproxy.server.httputil import HEADER_CHARSET, InvalidRequestHead, end_to_end
from kproxy.server.pool import NotSent, UpstreamClosed

__all__ = [
    "PING_TIMEOUT",
    "READ_IDLE_TIMEOUT",
    "STREAM_WINDOW",
    "H2Pool",
    "H2Response",
    "H2Unavailable",
    "request_fields",
]

log = logging.getLogger("kproxy.upstream.http2")

#: The receive window of each stream: what kproxy buffers at most for one response whose
#: consumer is not reading (the HTTP/1.1 pool's high-water mark).
STREAM_WINDOW = 1024 * 1024
#: The connection's receive window (Go's transportDefaultConnFlow).
CONNECTION_WINDOW = 1 << 30
#: Response header lists up to this size are read (Go's defaultMaxHeaderListSize is 10 MiB).
MAX_HEADER_LIST_SIZE = 10 << 20
READ_IDLE_TIMEOUT = 30.0
PING_TIMEOUT = 15.0
#: A connection with no stream for this long is closed (client-go's IdleConnTimeout).
IDLE_TIMEOUT = 90.0
#: Never use more than this many streams on one connection, whatever the peer allows.
_MAX_STREAMS_CAP = 1000
_LAST_STREAM_ID = 2**31 - 1

#: Connection-specific fields (RFC 9113 8.2.2), never sent on HTTP/2 (Go drops them too).
_CONNECTION_SPECIFIC = frozenset(
    ("connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "host", "content-length")
)
#: Fields whose values are never entered in the HPACK dynamic table (credentials: a
#: compression side channel must never tell one caller's token from another's).
_SENSITIVE = frozenset(("authorization", "proxy-authorization", "cookie"))
#: A response header name as HTTP/2 carries it: a lower-case token.
_RESPONSE_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9a-z]+\Z")
# httpguts' isCTL && !isLWS: the bytes no field value may hold.
_CONTROLS = bytes([*range(0x00, 0x09), *range(0x0A, 0x20), 0x7F])


#: The stream states in which h2 receives a response's HEADERS and DATA without a stream error
#: (the others go through h2's own path: ``H2Conn._receive_answers``).
_RECEIVING = frozenset((h2.stream.StreamState.OPEN, h2.stream.StreamState.HALF_CLOSED_LOCAL))
_RECV_DATA = h2.connection.ConnectionInputs.RECV_DATA
_RECV_HEADERS = h2.connection.ConnectionInputs.RECV_HEADERS
_CLIENT_OPEN = h2.connection.ConnectionState.CLIENT_OPEN
_STREAM_OPEN_STATE = h2.stream.StreamState.OPEN
_HALF_CLOSED_REMOTE = h2.stream.StreamState.HALF_CLOSED_REMOTE
_STREAM_CLOSED = h2.stream.StreamState.CLOSED
_CLOSED_BY_END_STREAM = h2.stream.StreamClosedBy.RECV_END_STREAM
#: h2's ``H2Stream.open`` (OPEN and both HALF_CLOSED states), by state.
_STREAM_OPEN = h2.stream.STREAM_OPEN
#: A frame's head: length (24 bits: high byte, low 16), type, flags, reserved bit and stream id.
_FRAME_HEAD = struct.Struct(">BHBBL")


class H2Unavailable(Exception):
    """The upstream did not negotiate HTTP/2 (ALPN picked ``http/1.1``, or nothing)."""


class StreamReset(UpstreamClosed):
    """The apiserver reset the stream (RST_STREAM) before the response ended."""


def request_fields(
    method: str,
    target: str,
    authority: str,
    headers: Iterable[tuple[str, str]],
    content_length: int | None = None,
    scheme: str = "https",
) -> list[tuple[bytes, bytes]]:
    """The HEADERS block of a request: pseudo-headers in Go's order, then the fields, names
    lower-cased and values encoded back to their bytes, then ``content-length`` when the body's
    length is known (a caller's own is never passed on: Go sets it from the body it sends);
    :class:`InvalidRequestHead` for what
    Go's transport would refuse (nothing is written then, and the HPACK state is untouched)."""
    if not method or not TOKEN_CHARS.issuperset(method):
        raise InvalidRequestHead(f"net/http: invalid method {go_quote(method)}")
    if not (target.startswith("/") or target == "*"):
        raise InvalidRequestHead(f"invalid request :path {go_quote(target)}")
    if not valid_host_header(authority):
        raise InvalidRequestHead("invalid Host header")
    names: list[str] = []
    values: list[str] = []
    kinds: list[Any] = []
    known = _FIELD_NAMES.get
    for k, v in headers:
        names.append(k)
        values.append(v)
        kinds.append(known(k))
    if None in kinds:
        bad = first_invalid_name(names)
        if bad is not None:
            raise InvalidRequestHead(f"invalid HTTP header name {go_quote(bad)}")
        kinds = [_field_name(k) for k in names]
    try:
        # One encode and one control scan for all values: "\n" separates them and must be the
        # only control byte (a value with CR, LF, NUL... adds one).
        joined = "\n".join([target, *values]).encode(HEADER_CHARSET, "surrogateescape")
    except UnicodeEncodeError:
        joined = b""
    if not joined or len(joined) - len(joined.translate(None, _CONTROLS)) != len(values):
        raise _which(target, names, values)
    encoded = joined.split(b"\n")
    fields: list[Any] = [
        (b":authority", authority.encode("ascii")),
        (b":method", method.encode("ascii")),
        (b":path", encoded[0]),
        (b":scheme", scheme.encode("ascii")),
    ]
    for (bname, kind), value in zip(kinds, encoded[1:], strict=True):
        if kind is _PLAIN:
            fields.append((bname, value))
        elif kind is _SENSITIVE_FIELD:
            fields.append(NeverIndexedHeaderTuple(bname, value))
        elif kind is _TE and value == b"trailers":
            fields.append((bname, value))
    if content_length is not None:
        fields.append((b"content-length", str(content_length).encode("ascii")))
    return fields


def _which(target: str, names: list[str], values: list[str]) -> InvalidRequestHead:
    if not _clean(target) or " " in target:
        return InvalidRequestHead(f"invalid request :path {go_quote(target)}")
    for name, value in zip(names, values, strict=True):
        if not _clean(value):
            # Go leaves the value out of the error: it may be a credential.
            return InvalidRequestHead(f"invalid HTTP header value for header {go_quote(name)}")
    return InvalidRequestHead("invalid request head")  # pragma: no cover - one of the above failed


def _clean(text: str) -> bool:
    try:
        raw = text.encode(HEADER_CHARSET, "surrogateescape")
    except UnicodeEncodeError:
        return False
    return raw.translate(None, _CONTROLS) == raw


#: What ``request_fields`` does with a field name: send it (``_PLAIN``), send it never indexed
#: (``_SENSITIVE_FIELD``), send ``te`` only as ``trailers`` (``_TE``), or drop it (``_DROPPED``).
_PLAIN, _SENSITIVE_FIELD, _TE, _DROPPED = "plain", "sensitive", "te", "dropped"
#: Names seen in requests (valid tokens), as given: the lower-case name HTTP/2 sends and what to
#: do with it. Bounded: names are the caller's.
_FIELD_NAMES: dict[str, tuple[bytes, str]] = {}


def _field_name(name: str) -> tuple[bytes, str]:
    """The lower-case name and its kind for a name that is a token (checked by the caller)."""
    found = _FIELD_NAMES.get(name)
    if found is not None:
        return found
    lname = name.lower()  # a token: ASCII only
    if lname in _CONNECTION_SPECIFIC:
        kind = _DROPPED
    elif lname == "te":
        kind = _TE
    elif lname in _SENSITIVE:
        kind = _SENSITIVE_FIELD
    else:
        kind = _PLAIN
    found = (lname.encode("ascii"), kind)
    if len(name) <= 64:
        if len(_FIELD_NAMES) >= 4096:
            _FIELD_NAMES.clear()
        _FIELD_NAMES[name] = found
    return found


def canonical_header_key(name: str) -> str:
    """Go's ``textproto.CanonicalMIMEHeaderKey`` for a lower-case HTTP/2 name: ``content-type``
    becomes ``Content-Type``, as Go's client hands the apiserver's response headers on (and its
    HTTP/1.1 server writes them). A name with a byte that is not a token is left as it is."""
    if not name or not TOKEN_CHARS.issuperset(name):
        return name
    return "-".join(p[:1].upper() + p[1:].lower() for p in name.split("-"))


_CANONICAL: dict[bytes, str] = {}


def _response_name(raw: bytes) -> str:
    name = _CANONICAL.get(raw)
    if name is None:
        name = canonical_header_key(raw.decode(HEADER_CHARSET, "surrogateescape"))
        if len(_CANONICAL) < 4096 and len(raw) <= 64:
            _CANONICAL[raw] = name
    return name


class _Stream:
    """One request's stream: the response as it arrives, and the request body's send state."""

    __slots__ = (
        "acked",
        "body_started",
        "buffered",
        "chunks",
        "conn",
        "done",
        "error",
        "head",
        "headers",
        "local_ended",
        "remote_ended",
        "sid",
        "status",
        "unprocessed",
        "waiter",
        "window_waiter",
    )

    def __init__(self, conn: H2Conn, sid: int) -> None:
        self.conn = conn
        self.sid = sid
        self.head: asyncio.Future[None] = conn.loop.create_future()
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.chunks: collections.deque[tuple[bytes, int]] = collections.deque()
        self.buffered = 0
        self.acked = 0
        self.remote_ended = False
        self.local_ended = False
        self.done = False
        self.error: BaseException | None = None
        # True when the apiserver certainly did not process the request (above a GOAWAY's last
        # stream id, REFUSED_STREAM): it may be sent again.
        self.unprocessed = False
        self.body_started = False
        self.waiter: asyncio.Future[None] | None = None
        self.window_waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)
        w = self.window_waiter
        if w is not None and not w.done():
            w.set_result(None)

    def fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        if not self.head.done():
            self.head.set_exception(exc)
            self.head.exception()  # retrieved here; the request re-raises it
        self.wake()

    def take(self) -> bytes:
        """All the data that arrived, its window given back to the apiserver."""
        chunks = self.chunks
        if len(chunks) == 1:
            data, flow = chunks.popleft()
        else:
            data = b"".join([c for c, _ in chunks])
            flow = sum(f for _, f in chunks)
            chunks.clear()
        self.buffered -= len(data)
        self.conn.give_back(self, flow)
        return data

    async def wait(self) -> None:
        self.waiter = self.conn.loop.create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None

    def failure(self) -> BaseException:
        err = self.error or UpstreamClosed("the upstream stream ended")
        return err if isinstance(err, OSError) else UpstreamClosed(str(err))

    async def body(self) -> AsyncIterator[bytes]:
        """The response body as it arrives: what arrived while the consumer was away comes as one
        chunk (as the HTTP/1.1 pool hands it on)."""
        try:
            while True:
                if self.chunks:
                    yield self.take()
                    continue
                if self.remote_ended:
                    return
                if self.error is not None:
                    raise self.failure()
                await self.wait()
        finally:
            if not self.remote_ended:
                self.conn.cancel(self)

    def cancel(self) -> None:
        self.conn.cancel(self)


#: The reason phrase of each status Python knows (others have none).
_REASONS = {status.value: status.phrase for status in HTTPStatus}


class H2Response:
    """Status, headers and the streamed body of one response (the HTTP/1.1 pool's interface)."""

    __slots__ = ("_content", "_stream", "headers", "reason", "status")

    def __init__(self, stream: _Stream) -> None:
        self._stream = stream
        self.status = stream.status
        self.reason: str | None = _REASONS.get(stream.status)
        self.headers: CIMultiDict[str] = end_to_end(stream.headers)
        self._content: Content | None = None

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("Content-Length")
        return int(value) if value is not None and value.isdigit() else None

    def chunks(self) -> AsyncIterator[bytes]:
        return self._stream.body()

    async def read(self) -> bytes:
        st = self._stream
        if st.remote_ended:
            return st.take() if st.chunks else b""
        return b"".join([c async for c in st.body()])

    def close(self) -> None:
        """Abandon the response: a stream not ended yet is reset (CANCEL)."""
        self._stream.cancel()

    @property
    def content(self) -> Content:
        """The body as a reader with aiohttp's ``StreamReader`` methods kproxy's own requests use."""
        if self._content is None:
            self._content = Content(self._stream.body())
        return self._content


class Content(ChunkReader):
    """``readexactly``, ``readline``, ``read`` and line iteration over a response body."""


class _GoawayKeepsStreams(h2.connection.H2ConnectionStateMachine):
    """h2's connection state machine, except that a GOAWAY received leaves the connection open:
    the streams at or below its last stream id are still answered (RFC 9113 6.8; Go's server
    finishes them while it drains), which h2 alone would refuse as frames on a closed
    connection. kproxy opens no stream on such a connection (``H2Conn.goaway``)."""

    _transitions = {
        **h2.connection.H2ConnectionStateMachine._transitions,
        (h2.connection.ConnectionState.IDLE, h2.connection.ConnectionInputs.RECV_GOAWAY): (
            None,
            h2.connection.ConnectionState.IDLE,
        ),
        (h2.connection.ConnectionState.CLIENT_OPEN, h2.connection.ConnectionInputs.RECV_GOAWAY): (
            None,
            h2.connection.ConnectionState.CLIENT_OPEN,
        ),
    }


class H2Conn(asyncio.Protocol):
    """One HTTP/2 connection to the upstream."""

    def __init__(self, pool: H2Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=False,  # request_fields validated them, as Go does
            normalize_outbound_headers=False,  # values go out byte for byte
            validate_inbound_headers=False,  # _head checks them as Go does, in a fraction of the time
            normalize_inbound_headers=False,
        )
        self.h2 = h2.connection.H2Connection(config=config)
        self.h2.state_machine = _GoawayKeepsStreams()
        self.h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_SIZE,
            },
        )
        self.h2.decoder.max_header_list_size = MAX_HEADER_LIST_SIZE
        # hpack's limits and errors, without its per-field calls and copies
        self.h2.decoder = TruncatingDecoder(self.h2.decoder, truncate=False)
        self.h2.encoder = PlainEncoder()  # encode_literal only (send_request_headers): no Huffman, no table search
        self.streams: dict[int, _Stream] = {}
        #: The upstream's SETTINGS_MAX_CONCURRENT_STREAMS, as h2 holds it (read again at each
        #: SETTINGS received: h2's settings object is slow to ask, and asked for every request).
        self.peer_max_streams = self.h2.remote_settings.max_concurrent_streams
        self.loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.goaway = False
        self.last_stream_id = _LAST_STREAM_ID
        self.closed = False
        self.last_read = time.monotonic()
        self.idle_since = self.last_read
        self.ping_sent: float | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._flush_scheduled = False
        # The start of a frame ``_receive_answers`` reads, cut by the end of a read, in pieces
        # until the frame is whole (``_partial_need`` bytes). Never held while h2's own buffer
        # holds anything (one or the other).
        self._partial: list[bytes] = []
        self._partial_have = 0
        self._partial_need = 0

    # -------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
            self._fail_ready(H2Unavailable("the upstream did not negotiate HTTP/2"))
            self.transport.close()
            return
        self.h2.initiate_connection()
        if self.pool.connection_window > 65535:
            self.h2.increment_flow_control_window(self.pool.connection_window - 65535)
        self.flush()
        self._schedule_check()

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        self.ping_sent = None
        events: list[Any]
        try:
            buffered = self.h2.incoming_buffer
            if buffered._data or buffered._headers_buffer:  # a frame or header block in progress
                events = self.h2.receive_data(data)
            else:
                if self._partial:
                    self._partial.append(data)
                    self._partial_have += len(data)
                    if self._partial_have < self._partial_need:
                        return
                    data = b"".join(self._partial)
                    self._partial = []
                elif self._more_of_a_body(data):
                    if self.h2._data_to_send:
                        self.flush()
                    return
                events = self._receive_answers(data)
        except h2.exceptions.ProtocolError as err:
            # h2 queued the GOAWAY for the connection error; send it and close.
            self.flush_now()
            self._lost(UpstreamClosed(f"HTTP/2 protocol error from the upstream: {err}"))
            return
        for event in events:
            if type(event) is not tuple:
                self._event(event)
            elif len(event) == 4:
                sid, body, flow, ended = event
                st = self.streams.get(sid)
                if st is None or ended or not flow:
                    self._data(sid, body, flow, ended)
                    continue
                # ``_data`` for more of a body, inline: the common case of every read of one.
                st.chunks.append((body, flow))
                st.buffered += len(body)
                w = st.waiter
                if w is not None and not w.done():
                    w.set_result(None)
            else:
                self._response(*event)
        if self.h2._data_to_send:  # acknowledgements (SETTINGS, PING), window updates, resets
            self.flush()

    def _more_of_a_body(self, data: bytes) -> bool:
        """A read that is one whole DATA frame, neither padded nor ending its stream, that
        ``_receive_answers`` would take on its fast path (the same checks) and hand on
        (``_hand_on``, then to the stream as ``_data`` puts it): done here without that
        method's setup, its pending runs and events. The apiserver writes a large answer in
        4 KiB frames as it encodes it, and while kproxy keeps up each arrives as a read of its
        own. False, and nothing done, for any other read."""
        end = len(data)
        if end < 9:
            return False
        high, low, kind, flags, sid = _FRAME_HEAD.unpack_from(data, 0)
        length = high << 16 | low
        if kind or flags & 0x09 or 9 + length != end:  # DATA, not PADDED nor END_STREAM, alone
            return False
        conn = self.h2
        sid &= 0x7FFFFFFF
        st = self.streams.get(sid)
        stream = conn.streams.get(sid)
        if st is None or stream is None or length > conn.max_inbound_frame_size:
            return False
        machine = stream.state_machine
        window = conn._inbound_flow_control_window_manager
        mine = stream._inbound_window_manager
        expected = stream._expected_content_length
        received = stream._actual_content_length + length
        if (
            machine.state not in _RECEIVING
            or not machine.headers_received
            or conn.state_machine.state is not _CLIENT_OPEN
            or window.current_window_size < length
            or mine.current_window_size < length
            or (expected is not None and received > expected)
        ):
            return False
        window.current_window_size -= length
        mine.current_window_size -= length
        stream._actual_content_length = received
        if length:
            st.chunks.append((data[9:], length))
            st.buffered += length
            w = st.waiter
            if w is not None and not w.done():
                w.set_result(None)
        return True

    def _receive_answers(self, data: bytes) -> list[Any]:
        """h2's ``receive_data`` for what an answer is made of: whole HEADERS frames (END_HEADERS,
        neither padded nor with a priority) and unpadded DATA frames, each on a stream kproxy
        opened that h2 has open for receiving, read without h2's frame buffer and frame objects.
        A header block goes to the HPACK decoder h2 would call. A response's head and its DATA
        make the state, window and content-length changes h2's ``_receive_headers_frame`` and
        ``_receive_data_frame`` would make, in the same order, without its calls where its checks
        cannot fail (``_hand_on``, ``_end_stream``; ``tests/unit/test_http2_client_receive.py``
        holds the two paths equal on random and hostile frames); other headers (1xx, trailers)
        go through h2's stream. From the first frame that is anything else (SETTINGS, PING,
        GOAWAY, RST_STREAM, WINDOW_UPDATE, PUSH_PROMISE, CONTINUATION, padding, a frame over the
        frame size, a frame on another stream) the rest goes through h2's ``receive_data``. A
        frame of an answer that the read cut is kept (``_partial``) and read whole with the next
        read, as h2's buffer would keep it; the frame is judged when whole. As there, the events
        come back together and a protocol error sends GOAWAY and discards them."""
        conn = self.h2
        events: list[Any] = []
        pos, end = 0, len(data)
        limit = conn.max_inbound_frame_size
        ours = self.streams
        theirs = conn.streams
        machine = conn.state_machine
        window = conn._inbound_flow_control_window_manager
        view = memoryview(data)
        # DATA frames that cannot fail h2's checks (the windows hold them, the content length
        # too, the response's head came, the connection and the stream take DATA without
        # changing state) are gathered per stream and handed on as one piece per stream and
        # read, with the state changes h2's calls would make (``_hand_on``). The apiserver writes
        # a list's items in 4 KiB frames, several streams' frames in turn: about 125 for 500 KiB.
        # The connection's window is taken as each frame is gathered; before any other frame,
        # before a frame that could fail (it goes alone, as h2 takes it) and at the end of the
        # read, every stream's frames are handed on, a stream's in order, and at once when one
        # ends it.
        pending: dict[int, list[Any]] = {}  # sid: [stream, payloads, their length, room left]
        stop = 0
        try:
            while end - pos >= 9:
                high, low, kind, flags, sid = _FRAME_HEAD.unpack_from(data, pos)
                length = high << 16 | low
                stop = pos + 9 + length
                if kind > 1 or length > limit:
                    break
                sid &= 0x7FFFFFFF
                mine = pending.get(sid) if pending else None
                if (
                    mine is not None
                    and kind == 0
                    and not flags & 0x08  # not PADDED
                    and length <= mine[3]
                    and length <= window.current_window_size
                    and stop <= end
                    and (not flags & 0x01 or mine[4] is None or mine[4] == mine[2] + length)
                ):
                    # More of a stream whose frames this read gathers, within what its checks allow.
                    window.current_window_size -= length
                    mine[1].append(view[pos + 9 : stop])
                    mine[2] += length
                    mine[3] -= length
                    pos = stop
                    if flags & 0x01:
                        self._hand_on(pending.pop(sid), True, events)
                    continue
                stream = theirs.get(sid)
                if sid not in ours or stream is None or stream.state_machine.state not in _RECEIVING:
                    break
                if flags & 0x08 if kind == 0 else flags & 0x2C != 0x04:  # DATA: PADDED; HEADERS:
                    break  # CONTINUATION follows, PADDED or PRIORITY
                if stop > end:
                    # The rest comes with a later read; the frame is judged again when whole (h2's
                    # buffer judges a frame's head alone only for what the checks above refuse).
                    if pending:
                        self._hand_on_all(pending, events)
                    self._keep_partial(data[pos:], stop - pos)
                    return events
                if kind == 0:  # DATA
                    # (A stream already gathering whose frame the branch above refused would fail
                    # one of these checks: it goes to h2, which answers it.)
                    ended = flags & 0x01
                    expected = stream._expected_content_length
                    received = stream._actual_content_length + length
                    room = stream._inbound_window_manager.current_window_size - length
                    if (
                        mine is None
                        and machine.state is _CLIENT_OPEN
                        and stream.state_machine.headers_received
                        and window.current_window_size >= length
                        and room >= 0
                        and (expected is None or (received == expected if ended else received <= expected))
                    ):
                        window.current_window_size -= length
                        # The room left for more of the stream's DATA (its window, its content
                        # length), and the length its data must come to if one ends it (None: any).
                        left = None if expected is None else expected - stream._actual_content_length
                        run = [stream, [view[pos + 9 : stop]], length, room, left]
                        if left is not None:
                            run[3] = min(room, left - length)
                        if ended:
                            self._hand_on(run, True, events)
                        else:
                            pending[sid] = run
                    else:
                        if pending:
                            self._hand_on_all(pending, events)
                        events += machine.process_input(_RECV_DATA)
                        window.window_consumed(length)
                        events += stream.receive_data(data[pos + 9 : stop], bool(ended), length)[1]
                else:  # HEADERS
                    if pending:
                        self._hand_on_all(pending, events)
                    headers = h2.connection._decode_headers(conn.decoder, data[pos + 9 : stop])
                    stream_machine = stream.state_machine
                    if (
                        machine.state is _CLIENT_OPEN
                        and not stream_machine.headers_received
                        and not h2.utilities.is_informational_response(headers)
                    ):
                        # A response's head: what h2's ``H2Stream.receive_headers`` does with it
                        # (the connection takes HEADERS without changing state; inbound headers
                        # are neither normalized nor validated by h2 here: ``_head`` checks them),
                        # in its order, delivered as a ``(stream id, headers, ended)`` entry in
                        # place of ResponseReceived (and StreamEnded).
                        stream_machine.headers_received = True
                        if flags & 0x01:
                            _end_stream(stream_machine)
                        stream._initialize_content_length(headers)
                        events.append((sid, headers, bool(flags & 0x01)))
                    else:
                        events += machine.process_input(_RECV_HEADERS)
                        events += stream.receive_headers(headers, bool(flags & 0x01), conn.config.header_encoding)[1]
                pos = stop
            else:
                if pending:
                    self._hand_on_all(pending, events)
                if pos < end:  # a frame head the read cut
                    self._keep_partial(data[pos:], 9)
                return events
            if pending:
                self._hand_on_all(pending, events)
        except h2.exceptions.ProtocolError as err:
            # h2's buffer keeps what followed the frame (read by a later call, as h2 would)
            conn.incoming_buffer.add_data(data[stop:])
            conn._terminate_connection(err.error_code)
            raise
        if pos < end:
            events += conn.receive_data(data[pos:] if pos else data)
        return events

    @staticmethod
    def _hand_on(run: list[Any], ended: bool, events: list[Any]) -> None:
        """A stream's DATA gathered by ``_receive_answers`` (its connection window already
        taken): what h2's ``H2Stream.receive_data`` would do with the checks passed: the stream's
        window and content length take it; an END_STREAM moves the stream on as h2's state
        machine does (OPEN to HALF_CLOSED_REMOTE, HALF_CLOSED_LOCAL to CLOSED, closed by the
        remote end). The data goes to the consumer as a ``(stream id, data, flow, ended)``
        entry in the events, in order, in place of h2's DataReceived and StreamEnded."""
        stream, payloads, total = run[0], run[1], run[2]
        body = bytes(payloads[0]) if len(payloads) == 1 else b"".join(payloads)
        stream._inbound_window_manager.current_window_size -= total
        stream._actual_content_length += total
        if ended:
            _end_stream(stream.state_machine)
        events.append((stream.stream_id, body, total, ended))

    @classmethod
    def _hand_on_all(cls, pending: dict[int, list[Any]], events: list[Any]) -> None:
        for run in pending.values():
            cls._hand_on(run, False, events)
        pending.clear()

    def _keep_partial(self, start: bytes, need: int) -> None:
        self._partial = [start]
        self._partial_have = len(start)
        self._partial_need = need

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._lost(exc or UpstreamClosed("the upstream closed the connection"))

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        waiters, self._drain_waiters = self._drain_waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    # -------------------------------------------------------------- events

    def _data(self, sid: int, data: bytes, flow: int, ended: bool = False) -> None:
        st = self.streams.get(sid)
        if st is None:
            # A stream kproxy abandoned: the connection window is still given back.
            self.h2.acknowledge_received_data(flow, sid)
            return
        if data or flow:
            st.chunks.append((data, flow))
            st.buffered += len(data)
        if ended:
            self._ended(st)
            return
        w = st.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _response(self, sid: int, headers: list[Any], ended: bool) -> None:
        st = self.streams.get(sid)
        if st is None:
            return
        self._head(st, headers)
        if ended and self.streams.get(sid) is st:  # (a head refused resets the stream)
            self._ended(st)

    def _ended(self, st: _Stream) -> None:
        st.remote_ended = True
        if not st.head.done():
            st.fail(UpstreamClosed("the upstream ended the stream without a response"))
        st.wake()
        self._maybe_done(st)

    def _event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.DataReceived):
            self._data(event.stream_id or 0, event.data or b"", event.flow_controlled_length or 0)
        elif isinstance(event, h2.events.ResponseReceived):
            st = self.streams.get(event.stream_id or 0)
            if st is not None:
                self._head(st, event.headers or [])
        elif isinstance(event, h2.events.StreamEnded):
            st = self.streams.get(event.stream_id or 0)
            if st is not None:
                self._ended(st)
        elif isinstance(event, h2.events.StreamReset):
            st = self.streams.get(event.stream_id or 0)
            if st is not None:
                code = event.error_code
                if code == h2.errors.ErrorCodes.REFUSED_STREAM and not st.head.done():
                    st.unprocessed = True
                if code == h2.errors.ErrorCodes.NO_ERROR and st.head.done():
                    # The response is whole; the apiserver needs no more of the request body.
                    st.local_ended = True
                    st.wake()
                else:
                    st.fail(StreamReset(f"the upstream reset the stream ({_code_name(code)})"))
                self._finish(st)
        elif isinstance(event, h2.events.WindowUpdated):
            if event.stream_id:
                st = self.streams.get(event.stream_id)
                if st is not None and st.window_waiter is not None and not st.window_waiter.done():
                    st.window_waiter.set_result(None)
            else:
                for st in self.streams.values():
                    if st.window_waiter is not None and not st.window_waiter.done():
                        st.window_waiter.set_result(None)
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self.peer_max_streams = self.h2.remote_settings.max_concurrent_streams
            if not self.ready.done():
                self.ready.set_result(None)
            # A larger initial window opens every stream's window.
            for st in self.streams.values():
                if st.window_waiter is not None and not st.window_waiter.done():
                    st.window_waiter.set_result(None)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._goaway(event.last_stream_id, event.error_code)
        elif isinstance(event, h2.events.TrailersReceived):
            pass  # the apiserver sends none; a stream's end comes as StreamEnded

    def _head(self, st: _Stream, raw: list[Any]) -> None:
        """The response head, checked as Go's client checks it (x/net/http2 frame.go
        ``readMetaFrame``, transport.go ``handleResponse``): names lower-case tokens, one 3-digit
        ``:status`` and no other pseudo-header, values that ``httpguts.ValidHeaderFieldValue``
        takes; anything else resets the stream (PROTOCOL_ERROR) and fails the request."""
        headers: list[tuple[str, str]] = []
        status = b""
        values: list[bytes] = []
        bad = False
        for name, value in raw:
            if name == b":status":
                bad = bad or bool(status)
                status = value
            else:
                known = _CANONICAL.get(name)  # names there passed the check below
                if known is None:
                    if _RESPONSE_NAME.match(name) is None:
                        bad = True
                        continue
                    known = _response_name(name)
                values.append(value)
                headers.append((known, value.decode(HEADER_CHARSET, "surrogateescape")))
        joined = b"\n".join(values)
        if (
            bad
            or len(status) != 3
            or not status.isdigit()
            or len(joined) - len(joined.translate(None, _CONTROLS)) != max(len(values) - 1, 0)
        ):
            st.fail(UpstreamClosed("malformed response header from the upstream"))
            self.cancel(st, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            return
        st.status = int(status)
        st.headers = headers
        if not st.head.done():
            st.head.set_result(None)

    def _goaway(self, last_stream_id: int | None, error_code: Any) -> None:
        self.goaway = True
        self.last_stream_id = last_stream_id if last_stream_id is not None else 0
        log.info(
            "upstream GOAWAY",
            extra={
                "error_code": _code_name(error_code),
                "last_stream_id": self.last_stream_id,
                "streams": len(self.streams),
            },
        )
        self.pool.retire(self)
        detail = f"the upstream sent GOAWAY ({_code_name(error_code)})"
        for st in list(self.streams.values()):
            if st.sid > self.last_stream_id:
                st.unprocessed = True
                st.fail(NotSent(detail))
                self._finish(st, reset=False)
        if not self.streams:
            self.close()

    def _lost(self, exc: BaseException) -> None:
        if self.closed:
            return
        self.closed = True
        if self.ready.done() and self.ready.exception() is None:
            log.info("upstream HTTP/2 connection ended", extra={"error": str(exc), "streams": len(self.streams)})
        if self._timer is not None:
            self._timer.cancel()
        self.pool.retire(self)
        self._fail_ready(exc if isinstance(exc, H2Unavailable) else NotSent(str(exc) or type(exc).__name__))
        for st in list(self.streams.values()):
            if st.sid > self.last_stream_id:
                st.unprocessed = True
            st.fail(exc if isinstance(exc, OSError) else UpstreamClosed(str(exc)))
            st.done = True
        self.streams.clear()
        for w in self._drain_waiters:
            if not w.done():
                w.set_exception(UpstreamClosed("the upstream connection was lost"))
                w.exception()
        self._drain_waiters.clear()
        if self.transport is not None:
            self.transport.close()

    def _fail_ready(self, exc: BaseException) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc)
            self.ready.exception()

    # -------------------------------------------------------------- streams

    @property
    def usable(self) -> bool:
        return (
            not self.goaway
            and not self.closed
            and self.ready.done()
            and self.ready.exception() is None
            and self.h2.highest_outbound_stream_id < _LAST_STREAM_ID - 2
        )

    @property
    def max_streams(self) -> int:
        return min(self.peer_max_streams, _MAX_STREAMS_CAP)

    def open_stream(self, fields: list[Any], end_stream: bool) -> _Stream:
        sid = self.h2.get_next_available_stream_id()
        st = _Stream(self, sid)
        send_request_headers(self.h2, sid, fields, end_stream, self.peer_max_streams)
        st.local_ended = end_stream
        self.streams[sid] = st
        self.flush()
        return st

    def give_back(self, st: _Stream, flow: int) -> None:
        """``flow`` bytes of the stream's data were consumed: h2's ``acknowledge_received_data``,
        which sends WINDOW_UPDATE once half a window was consumed (h2/windows.py
        ``_maybe_update_window``). Below that, for a stream h2 holds open, it only counts the
        bytes in both window managers: done here without its calls."""
        if not flow or self.closed:
            return
        h2conn = self.h2
        conn = h2conn._inbound_flow_control_window_manager
        stream = h2conn.streams.get(st.sid)
        if stream is not None and _STREAM_OPEN[stream.state_machine.state]:
            mine = stream._inbound_window_manager
            # For both windows, whether h2's ``WindowManager.process_bytes`` would only add the
            # bytes to those processed, no WINDOW_UPDATE due (h2/windows.py
            # ``_maybe_update_window``): the common case of every body chunk.
            both = conn._bytes_processed + flow
            one = mine._bytes_processed + flow
            if (
                both < conn.max_window_size // 2
                and one < mine.max_window_size // 2
                and (conn.current_window_size or both <= min(1024, conn.max_window_size // 4))
                and (mine.current_window_size or one <= min(1024, mine.max_window_size // 4))
            ):
                conn._bytes_processed = both
                mine._bytes_processed = one
                return
        elif st.sid <= h2conn.highest_outbound_stream_id:
            # A stream h2 closed (or forgot): only the connection's window counts the bytes.
            both = conn._bytes_processed + flow
            if both < conn.max_window_size // 2 and (
                conn.current_window_size or both <= min(1024, conn.max_window_size // 4)
            ):
                conn._bytes_processed = both
                return
        self._give_back_h2(st, flow)

    def _give_back_h2(self, st: _Stream, flow: int) -> None:
        if flow and not self.closed:
            try:
                self.h2.acknowledge_received_data(flow, st.sid)
            except h2.exceptions.ProtocolError:
                return
            self.flush()

    def _maybe_done(self, st: _Stream) -> None:
        if st.remote_ended and not st.local_ended:
            # The whole response arrived before the request body was sent: the apiserver does
            # not want the rest (Go's client stops writing too); free the stream.
            st.local_ended = True
            self._reset(st, h2.errors.ErrorCodes.CANCEL)
        if st.remote_ended and st.local_ended:
            self._finish(st, reset=False)

    def _finish(
        self, st: _Stream, reset: bool = False, code: h2.errors.ErrorCodes = h2.errors.ErrorCodes.CANCEL
    ) -> None:
        if st.done:
            return
        st.done = True
        if reset:
            self._reset(st, code)
        self.streams.pop(st.sid, None)
        if not self.streams:
            self.idle_since = time.monotonic()
            if self.goaway:
                self.close()

    def _reset(self, st: _Stream, code: h2.errors.ErrorCodes) -> None:
        if self.closed:
            return
        try:
            self.h2.reset_stream(st.sid, code)
        except h2.exceptions.ProtocolError:
            return  # closed already
        self.flush()

    def cancel(self, st: _Stream, code: h2.errors.ErrorCodes = h2.errors.ErrorCodes.CANCEL) -> None:
        """The consumer abandons the stream: reset it (CANCEL) unless it is over."""
        if st.chunks:
            # Data nobody will read: its share of the connection's window goes back (else every
            # abandoned response would shrink the connection's window for good).
            flow = sum(f for _, f in st.chunks)
            st.chunks.clear()
            st.buffered = 0
            self.give_back(st, flow)
        if st.done:
            return
        if st.remote_ended:
            self._maybe_done(st)
            return
        st.remote_ended = st.local_ended = True
        if st.error is None:
            st.fail(UpstreamClosed("the response was abandoned"))
        self._finish(st, reset=True, code=code)

    async def send_body_chunk(self, st: _Stream, data: bytes) -> None:
        """Send ``data`` on the stream as the windows allow; stops early (quietly) when the
        apiserver no longer wants the body (it answered and ended or reset the stream)."""
        view = memoryview(data)
        while view:
            if st.local_ended:
                return
            if st.error is not None:
                raise st.failure()
            if self.closed:
                raise UpstreamClosed("the upstream connection was lost")
            n = min(self.h2.local_flow_control_window(st.sid), self.h2.max_outbound_frame_size, len(view))
            if n <= 0:
                st.window_waiter = asyncio.get_running_loop().create_future()
                try:
                    await st.window_waiter
                finally:
                    st.window_waiter = None
                continue
            self.h2.send_data(st.sid, view[:n].tobytes())
            view = view[n:]
            self.flush()
            if self._write_paused:
                await self._drain()

    def end_body(self, st: _Stream) -> None:
        if st.local_ended or st.error is not None or self.closed:
            return
        st.local_ended = True
        self.h2.end_stream(st.sid)
        self.flush()
        if st.remote_ended:
            self._finish(st)

    async def _drain(self) -> None:
        w = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(w)
        await w

    def flush(self) -> None:
        """Write what h2 has queued, once per loop pass: the frames of every stream that went
        out in this pass (HEADERS of concurrent requests, window updates) leave in one TLS write."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush_now)

    def flush_now(self) -> None:
        self._flush_scheduled = False
        data = self.h2.data_to_send()
        if data and self.transport is not None:
            self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            try:
                self.h2.close_connection()
                self.flush_now()
            except h2.exceptions.ProtocolError:
                pass
            self.transport.close()
        self._lost(UpstreamClosed("the connection was closed"))

    # -------------------------------------------------------------- health

    def _schedule_check(self) -> None:
        interval = min(self.pool.read_idle_timeout, self.pool.ping_timeout, IDLE_TIMEOUT) / 3
        self._timer = asyncio.get_running_loop().call_later(interval, self._check)

    def _check(self) -> None:
        if self.closed:
            return
        now = time.monotonic()
        if self.ping_sent is not None:
            if now - self.ping_sent >= self.pool.ping_timeout:
                self._lost(UpstreamClosed("the upstream did not answer a PING"))
                return
        elif now - self.last_read >= self.pool.read_idle_timeout:
            self.ping_sent = now
            self.h2.ping(b"kproxy\x00\x00")
            self.flush()
        if not self.streams and now - self.idle_since >= self.pool.idle_timeout:
            self.close()
            return
        self._schedule_check()


def _end_stream(machine: h2.stream.H2StreamStateMachine) -> None:
    """h2's RECV_END_STREAM for a stream that is OPEN or HALF_CLOSED_LOCAL (h2/stream.py
    ``_transitions``: ``stream_half_closed``, ``stream_ended``)."""
    if machine.state is _STREAM_OPEN_STATE:
        machine.state = _HALF_CLOSED_REMOTE
    else:
        machine.state = _STREAM_CLOSED
        machine.stream_closed_by = _CLOSED_BY_END_STREAM


def _code_name(code: Any) -> str:
    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return str(code)


_SAFE = frozenset(("GET", "HEAD", "OPTIONS", "TRACE"))
_BODY_METHODS = frozenset(("POST", "PUT", "PATCH"))


class H2Pool:
    """HTTP/2 connections to one upstream host, shared by every request."""

    def __init__(
        self,
        host: str,
        port: int,
        ssl_ctx: ssl.SSLContext,
        server_hostname: str | None,
        connect_timeout: float,
    ) -> None:
        self.host, self.port = host, port
        self.ssl = ssl_ctx
        self.server_hostname = server_hostname
        self.connect_timeout = connect_timeout
        authority = host if ":" not in host else f"[{host}]"
        self.authority = authority if port == 443 else f"{authority}:{port}"
        self.conns: list[H2Conn] = []
        self.unavailable = False
        self._dialing: asyncio.Future[H2Conn] | None = None
        self.read_idle_timeout = READ_IDLE_TIMEOUT
        self.ping_timeout = PING_TIMEOUT
        self.idle_timeout = IDLE_TIMEOUT
        self.connection_window = CONNECTION_WINDOW
        self.dials = 0

    @staticmethod
    def alpn_context(ctx: ssl.SSLContext) -> ssl.SSLContext:
        """``ctx`` offering ``h2`` then ``http/1.1`` by ALPN (the order client-go offers)."""
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        return ctx

    async def _dial(self) -> H2Conn:
        loop = asyncio.get_running_loop()
        self.dials += 1
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: H2Conn(self), self.host, self.port, ssl=self.ssl, server_hostname=self.server_hostname
                ),
                self.connect_timeout,
            )
            await asyncio.wait_for(asyncio.shield(conn.ready), self.connect_timeout)
        except H2Unavailable:
            self.unavailable = True
            raise
        except (OSError, TimeoutError) as err:
            raise NotSent(str(err) or type(err).__name__) from err
        self.conns.append(conn)
        log.info("upstream HTTP/2 connection opened", extra={"connections": len(self.conns)})
        return conn

    async def connection(self) -> H2Conn:
        """A connection with room for one more stream (dialing one only when all are full)."""
        unusable = 0
        while True:
            for conn in self.conns:
                if len(conn.streams) < conn.max_streams and conn.usable:
                    return conn
            if self.unavailable:
                raise H2Unavailable("the upstream did not negotiate HTTP/2")
            dialing = self._dialing
            if dialing is None:
                dialing = self._dialing = asyncio.ensure_future(self._dial())
                dialing.add_done_callback(self._dialed)
            conn = await asyncio.shield(dialing)
            if conn.usable:
                if len(conn.streams) < conn.max_streams:
                    return conn
                continue  # the requests that waited with this one filled it: dial another
            unusable += 1  # went away at once (GOAWAY): a few tries, not forever
            if unusable >= 3:
                raise NotSent("the upstream closed every new HTTP/2 connection at once")

    @property
    def dialing(self) -> bool:
        """Whether a connection is being dialed."""
        return self._dialing is not None

    def _dialed(self, fut: asyncio.Future[H2Conn]) -> None:
        if self._dialing is fut:
            self._dialing = None
        if not fut.cancelled():
            fut.exception()  # retrieved: every waiter re-raises it

    def retire(self, conn: H2Conn) -> None:
        """No new stream goes to ``conn`` (GOAWAY, or it is gone)."""
        if conn in self.conns:
            self.conns.remove(conn)

    async def request(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes | AsyncIterator[bytes] | None,
        length: int | None,
    ) -> H2Response:
        """Send one request; return once the response head arrived.

        A request the apiserver did not process (GOAWAY, REFUSED_STREAM) is sent again on
        another connection when its body can be sent again; one whose connection broke before
        any answer is sent again once when Go's transport would replay it (a safe method, no
        streamed body), as the HTTP/1.1 pool does."""
        # Go's shouldSendReqContentLength: a known length, and 0 for the methods that carry a body.
        content_length: int | None = None
        if isinstance(body, bytes):
            if body or method in _BODY_METHODS:
                content_length = len(body)
        elif body is not None:
            content_length = length
        elif method in _BODY_METHODS:
            content_length = 0
        fields = request_fields(method, target, self.authority, headers, content_length)
        if isinstance(body, bytes) and not body:
            body = None
        broken_retry = True
        for _attempt in range(5):
            conn = await self.connection()
            st = conn.open_stream(fields, end_stream=body is None)
            sender = None
            if body is not None:
                # The body goes out beside the wait for the answer: a stream the apiserver
                # refuses or answers early is noticed while the caller's body is still coming.
                sender = asyncio.ensure_future(self._send_body(conn, st, body))
            try:
                if sender is not None:
                    await asyncio.wait((st.head, sender), return_when=asyncio.FIRST_COMPLETED)
                    if sender.done() and not st.head.done():
                        sender.result()  # the caller's body failed (or its limit): that error stands
                        await st.head
                await st.head
            except BaseException as err:
                if sender is not None and not sender.done():
                    sender.cancel()
                conn.cancel(st)
                if not isinstance(err, OSError):
                    raise
                resendable = body is None or isinstance(body, bytes) or not st.body_started
                if st.unprocessed:
                    if resendable:
                        continue
                    raise NotSent(str(err)) from err
                if broken_retry and method in _SAFE and (body is None or isinstance(body, bytes)) and st.status == 0:
                    broken_retry = False
                    continue
                raise
            if sender is not None and not sender.done():
                sender.add_done_callback(functools.partial(self._sent, st))
            return H2Response(st)
        raise NotSent("the upstream refused the request on every connection")

    @staticmethod
    async def _send_body(conn: H2Conn, st: _Stream, body: bytes | AsyncIterator[bytes]) -> None:
        if isinstance(body, bytes):
            await conn.send_body_chunk(st, body)
        else:
            async for chunk in body:
                st.body_started = True
                if chunk:
                    await conn.send_body_chunk(st, chunk)
                if st.local_ended:
                    return  # the apiserver wants no more of it
        conn.end_body(st)

    @staticmethod
    def _sent(st: _Stream, task: asyncio.Future[None]) -> None:
        """The body of an answered request failed: its stream is reset (the response breaks off)."""
        if not task.cancelled() and task.exception() is not None:
            st.conn.cancel(st)

    def close_when_idle(self) -> None:
        """No more requests come: each connection closes once its streams have ended (the health
        check closes the busy ones within a few seconds of their last stream)."""
        self.idle_timeout = 0.0
        for conn in [*self.conns]:
            if not conn.streams:
                conn.close()

    def close(self) -> None:
        for conn in [*self.conns]:
            conn.close()
        self.conns.clear()
        if self._dialing is not None:
            self._dialing.cancel()
