"""An HTTP/2 connection on kproxy's TLS listener, served as Go's server serves the apiserver's.

The listener hands a connection here when ALPN chose ``h2`` (``kproxy.server.listener``). Each
request stream becomes an ``H2Request`` that the proxy's handler serves as it serves an HTTP/1.1
request; the handler writes its answer through the stream's ``ResponseStream`` or ``H2Sink``.

What Go's server (golang.org/x/net/http2 server.go) does and this does too:

- settings from ``kproxy.server.http2.settings`` (the apiserver's), sent first, with the
  connection window opened to every stream's window at once;
- no more than the stream limit of handlers at once; streams the client opens beyond it while
  handlers of streams it reset are still running wait (up to four times the limit), past that the
  connection ends with GOAWAY ENHANCE_YOUR_CALM (rapid reset, CVE-2023-44487);
- a stream over the advertised limit is refused with RST_STREAM PROTOCOL_ERROR (REFUSED_STREAM
  while the limit is not yet acknowledged), not the connection;
- a header block is bounded in bytes across its CONTINUATION frames: past the header list limit
  the connection ends (the 2024 CONTINUATION flood class);
- a client that does not read its answers cannot make control frames (PING and SETTINGS acks,
  resets) pile up: past ``MAX_QUEUED_CONTROL_FRAMES`` the connection is closed;
- GOAWAY (NO_ERROR) on a graceful drain (shutdown, or a config reload: ``ProxyServer._h2_go_away``
  ends the connection's watches cleanly too): streams already opened finish, new ones are
  refused, and the connection closes a second after its last stream; an idle connection (no
  stream for the idle timeout) is ended the same way;
- a request body that is not read to its end when the response has ended is stopped with
  RST_STREAM NO_ERROR (RFC 9113 8.1).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame, SettingsFrame
from multidict import CIMultiDict

from kproxy.server.http2.flood import FrameMeter
from kproxy.server.http2.goframes import GoConnectionState, HeaderBlockLimit, PlainEncoder, TruncatingDecoder
from kproxy.server.http2.h2stream import H2Request, StreamReset
from kproxy.server.http2.settings import (
    GOAWAY_TIMEOUT,
    HEADER_TABLE_SIZE,
    MAX_QUEUED_CONTROL_FRAMES,
    SETTINGS_NO_RFC7540_PRIORITIES,
    UNSTARTED_HANDLERS_FACTOR,
    H2Limits,
)

log = logging.getLogger("kproxy")

#: The proxy's request handler (it also serves aiohttp's requests, hence ``Any``).
Handler = Callable[[Any], Awaitable[Any]]

#: Response headers HTTP/2 has no place for (RFC 9113 8.2.2); Go's server drops them too.
_CONNECTION_SPECIFIC = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"))


#: Response field names as sent (lower case), by the name the chain gave (short ones, a bounded
#: number: names come from upstream answers).
_FIELD_NAMES: dict[str, bytes] = {}
_FIELD_NAMES_MAX = 1024
#: Request field names as the chain sees them, by their bytes (short ones, a bounded number).
_REQUEST_NAMES: dict[bytes, str] = {}
_STATUS = {code: b"%d" % code for code in range(100, 600)}

_TOO_LARGE = b"<h1>HTTP Error 431</h1><p>Request Header Field(s) Too Large</p>"
_NUMBERS = itertools.count(1)


def _usable(method: bytes, scheme: bytes, path: bytes) -> bool:
    """A request the proxy can serve: a method, an http(s) scheme and an origin-form path (or
    ``*``). h2 has checked the pseudo-header fields are present and well placed."""
    origin_form = path[:1] == b"/" or path == b"*"
    return bool(method) and method != b"CONNECT" and scheme in (b"https", b"http") and origin_form


class _Stream:
    __slots__ = ("closed", "ended_remote", "finished", "queue", "queued", "request", "task", "waiters")

    def __init__(self, request: H2Request) -> None:
        self.request = request
        self.task: asyncio.Task[None] | None = None
        self.finished = False  # its handler returned
        self.closed = False  # reset, or ended both ways
        self.ended_remote = False
        self.queue: deque[bytes] = deque()  # event-sink bytes waiting for a window
        self.queued = 0
        self.waiters: list[asyncio.Future[None]] = []


class H2ServerConnection:
    """One client's HTTP/2 connection (an asyncio protocol on its TLS transport)."""

    def __init__(
        self,
        handler: Handler,
        limits: H2Limits,
        registry: set[H2ServerConnection],
        on_close: Callable[[], None],
        on_idle: Callable[[bool], None] = lambda idle: None,
    ) -> None:
        self._on_idle = on_idle
        self._handler = handler
        #: This connection's number (never reused in the process).
        self.number = next(_NUMBERS)
        self._limits = limits
        self._registry = registry
        self._on_close = on_close
        self.transport: Any = None
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_inbound_headers=False,  # goframes.check_request_fields, in one pass
            normalize_inbound_headers=False,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self._h2 = GoConnectionState(config=config)
        self._h2.incoming_buffer = HeaderBlockLimit(limits.max_header_list_size)
        self._h2.decoder = TruncatingDecoder(self._h2.decoder)
        self._h2.encoder = PlainEncoder()
        self._streams: dict[int, _Stream] = {}
        self._meter = FrameMeter()
        self._running = 0  # handlers running (a reset stream's handler counts until it returns)
        self._unstarted: deque[int] = deque()
        self._remote = ""
        self.writing_paused = False
        self._resume: asyncio.Future[None] | None = None
        self._control_backlog = 0
        self._going_away = False
        self._last_stream = 0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # when the last stream ended, while none is open
        self._close_timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._flush_pending = False
        self._dead = False  # a connection error was sent
        self._loop = asyncio.get_event_loop()

    # ------------------------------------------------------------------ asyncio protocol

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self._remote = str(peer[0]) if isinstance(peer, (tuple, list)) and peer else ""
        self._registry.add(self)
        lim = self._limits
        conn = self._h2
        conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_FRAME_SIZE: lim.max_frame_size,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: lim.max_concurrent_streams,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: lim.max_header_list_size,
                h2.settings.SettingCodes.HEADER_TABLE_SIZE: HEADER_TABLE_SIZE,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: lim.stream_window,
                SETTINGS_NO_RFC7540_PRIORITIES: 1,  # type: ignore[dict-item]
            },
        )
        conn.initiate_connection()
        # h2 sends every setting it knows; Go's server sends these, in this order.
        conn.data_to_send()
        settings = SettingsFrame(0)
        settings.settings = {
            SettingsFrame.MAX_FRAME_SIZE: lim.max_frame_size,
            SettingsFrame.MAX_CONCURRENT_STREAMS: lim.max_concurrent_streams,
            SettingsFrame.MAX_HEADER_LIST_SIZE: lim.max_header_list_size,
            SettingsFrame.HEADER_TABLE_SIZE: HEADER_TABLE_SIZE,
            SettingsFrame.INITIAL_WINDOW_SIZE: lim.stream_window,
            SETTINGS_NO_RFC7540_PRIORITIES: 1,
        }
        transport.write(settings.serialize())
        # Go reads by its own limits from the first byte, not from the client's acknowledgement.
        conn.max_inbound_frame_size = lim.max_frame_size
        conn.decoder.max_header_list_size = lim.max_header_list_size
        grow = lim.connection_window - conn.inbound_flow_control_window
        if grow > 0:
            conn.increment_flow_control_window(grow)
        self._flush()
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        if self._closed or self._dead:
            return
        if not self._meter.feed(data):
            log.debug("HTTP/2 client %s floods frames that ask for no request", self._remote)
            self.goaway(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            self.abort()
            return
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as err:
            # h2 queued its GOAWAY (the error's code); Go closes the connection after it.
            log.debug("HTTP/2 connection error from %s: %s", self._remote, err)
            self._flush()
            self._dead = True  # nothing more is read; the connection closes a second later
            self.transport.pause_reading()
            self._close_soon()
            return
        for event in events:
            self._dispatch(event)
        self._flush()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closed = True
        self._registry.discard(self)
        for timer in (self._idle_timer, self._close_timer):
            if timer is not None:
                timer.cancel()
        for sid in list(self._streams):
            self._stream_gone(sid)
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)
        self._on_close()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._control_backlog = 0
        if self._resume is not None and not self._resume.done():
            self._resume.set_result(None)
        self._resume = None
        self._pump_all()

    def eof_received(self) -> bool | None:
        return None

    # ------------------------------------------------------------------ events

    def _dispatch(self, event: Any) -> None:
        if isinstance(event, h2.events.DataReceived):
            self._data(event)
        elif isinstance(event, h2.events.RequestReceived):
            self._request(event)
        elif isinstance(event, h2.events.StreamEnded):
            st = self._streams.get(event.stream_id)
            if st is not None:
                st.ended_remote = True
                st.request.content.feed_eof()
        elif isinstance(event, h2.events.StreamReset):
            self._stream_gone(event.stream_id)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self._pump_all()
        elif isinstance(event, (h2.events.PingReceived, h2.events.SettingsAcknowledged)):
            self._control_frame()
        elif isinstance(event, h2.events.ConnectionTerminated):
            # The client is leaving; h2 accepts nothing more on the connection either.
            self.close()

    def _control_frame(self) -> None:
        if self.writing_paused:
            self._control_backlog += 1
            if self._control_backlog > MAX_QUEUED_CONTROL_FRAMES:
                log.debug("HTTP/2 client %s does not read its control frames", self._remote)
                self.abort()

    def _request(self, event: h2.events.RequestReceived) -> None:
        sid = event.stream_id
        if self._going_away:
            self._h2.reset_stream(sid, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        if sid in self._h2.truncated:
            self._h2.truncated.discard(sid)
            self._too_large(sid)
            return
        method = path = authority = scheme = b""
        cookies: list[bytes] = []
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in event.headers or ():
            if name[:1] == b":":
                if name == b":method":
                    method = value
                elif name == b":path":
                    path = value
                elif name == b":authority":
                    authority = value
                elif name == b":scheme":
                    scheme = value
            elif name == b"cookie":
                cookies.append(value)  # RFC 9113 8.2.3: joined again, as Go does
            else:
                key = _REQUEST_NAMES.get(name)
                if key is None:
                    key = name.decode("utf-8", "surrogateescape")
                    if len(_REQUEST_NAMES) < _FIELD_NAMES_MAX and len(name) <= 64:
                        _REQUEST_NAMES[name] = key
                headers.add(key, value.decode("utf-8", "surrogateescape"))
        if cookies:
            headers.add("Cookie", b"; ".join(cookies).decode("utf-8", "surrogateescape"))
        if not authority:
            authority = headers.get("Host", "").encode("utf-8", "surrogateescape")
        if authority:
            headers["Host"] = authority.decode("utf-8", "surrogateescape")
        if not _usable(method, scheme, path):
            # Go's server resets a request it cannot make an http.Request of: a CONNECT (which it
            # would serve; kproxy has no upstream for it, so it is refused as malformed here), or a
            # :path that is not origin-form (golang.org/x/net/http2/server.go, "bad_path").
            self._h2.reset_stream(sid, h2.errors.ErrorCodes.PROTOCOL_ERROR)
            return
        method_s = method.decode("utf-8", "surrogateescape")
        target = path.decode("utf-8", "surrogateescape")
        ended = event.stream_ended is not None
        request = H2Request(self, sid, method_s, target, headers, ended, self._remote or None)
        st = self._streams[sid] = _Stream(request)
        st.ended_remote = ended
        self._disarm_idle()
        if self._running < self._limits.max_concurrent_streams:
            self._start(sid)
            return
        self._unstarted.append(sid)
        if len(self._unstarted) > UNSTARTED_HANDLERS_FACTOR * self._limits.max_concurrent_streams:
            log.debug("HTTP/2 client %s opens streams faster than their handlers end", self._remote)
            self.goaway(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            self.close()

    def _too_large(self, sid: int) -> None:
        """Go's server's answer to a header list over its limit (http2 server.go
        ``handleHeaderListTooLong``); the connection goes on."""
        conn = self._h2
        headers = [
            (b":status", b"431"),
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", b"%d" % len(_TOO_LARGE)),
            (b"date", email.utils.formatdate(usegmt=True).encode()),
        ]
        conn.send_literal_headers(sid, headers, end_stream=False)  # never h2's: see encode_literal
        conn.send_data(sid, _TOO_LARGE, end_stream=True)

    def _data(self, event: h2.events.DataReceived) -> None:
        st = self._streams.get(event.stream_id)
        if st is None or st.request.content.is_eof():
            # Nobody reads it (the stream was answered or reset): its window goes back at once.
            self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            return
        st.request.content.feed(event.data)
        padding = event.flow_controlled_length - len(event.data)
        if padding:
            self._h2.acknowledge_received_data(padding, event.stream_id)

    def consumed(self, sid: int, n: int) -> None:
        """The handler read ``n`` bytes of the stream's body: their window goes back to the client."""
        if n and not self._closed:
            self._h2.acknowledge_received_data(n, sid)  # a closed stream: the connection's window only
            self._flush()

    # ------------------------------------------------------------------ handlers

    def _start(self, sid: int) -> None:
        st = self._streams.get(sid)
        if st is None:
            return
        self._running += 1
        st.task = self._loop.create_task(self._serve(sid, st))

    async def _serve(self, sid: int, st: _Stream) -> None:
        try:
            await self._handler(st.request)
        except (asyncio.CancelledError, StreamReset, ConnectionError):
            pass
        except Exception:  # the handler answers everything; a bug must not take the connection down
            log.exception("HTTP/2 stream failed", extra={"path": st.request.raw_path})
            self.reset(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
        finally:
            self._running -= 1
            st.finished = True
            self._handler_done(sid, st)
            while self._unstarted and self._running < self._limits.max_concurrent_streams:
                self._start(self._unstarted.popleft())

    def _handler_done(self, sid: int, st: _Stream) -> None:
        if self._closed:
            return
        if not st.closed:
            if not st.request.response.started:
                self.reset(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
            elif not st.ended_remote:
                # The answer is complete and the body is not wanted (RFC 9113 8.1).
                self.reset(sid, h2.errors.ErrorCodes.NO_ERROR)
        self._forget(sid)

    def _forget(self, sid: int) -> None:
        st = self._streams.get(sid)
        if st is None or (st.task is not None and not st.finished):
            return
        del self._streams[sid]
        if not self._streams:
            if self._going_away:
                self._close_soon()
            else:
                self._arm_idle()

    def _stream_gone(self, sid: int) -> None:
        """The stream was reset (by either side) or the connection ended."""
        st = self._streams.get(sid)
        if st is None:
            return
        st.closed = True
        st.queue.clear()
        st.queued = 0
        st.request.content.set_exception(StreamReset("stream reset"))
        self._wake(st)
        if st.task is not None and not st.task.done():
            st.task.cancel()
        elif st.task is None and sid in self._unstarted:
            self._unstarted.remove(sid)
            del self._streams[sid]
        else:
            self._forget(sid)

    # ------------------------------------------------------------------ the response side

    def stream_closed(self, sid: int) -> bool:
        st = self._streams.get(sid)
        return st is None or st.closed or self._closed or self._dead

    def send_headers(self, sid: int, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        if self.stream_closed(sid):
            raise StreamReset("stream reset")
        informational = headers[0][1][:1] == b"1"  # :status comes first
        self._h2.send_literal_headers(sid, headers, end, informational)
        if end:
            self._ended_local(sid)
        self._flush()

    def send_response_headers(
        self, sid: int, status: int, headers: CIMultiDict[str] | list[tuple[str, str]], end: bool
    ) -> None:
        out = [(b":status", _STATUS.get(status) or b"%d" % status)]
        has_date = False
        items = headers.items() if isinstance(headers, CIMultiDict) else headers
        names = _FIELD_NAMES
        for name, value in items:
            key = names.get(name)
            if key is None:
                key = name.lower().encode("utf-8", "surrogateescape")
                if len(names) < _FIELD_NAMES_MAX and len(name) <= 64:
                    names[name] = key
            if key in _CONNECTION_SPECIFIC:
                continue
            if key == b"date":
                has_date = True
            out.append((key, value.encode("utf-8", "surrogateescape")))
        if not has_date:  # Go's server adds Date, as over HTTP/1.1
            out.append((b"date", email.utils.formatdate(usegmt=True).encode()))
        self.send_headers(sid, out, end)

    def send_response(
        self, sid: int, status: int, headers: CIMultiDict[str] | list[tuple[str, str]], data: bytes
    ) -> bool:
        """A whole answer: HEADERS, and the body in one DATA frame ending the stream when the
        windows and the frame size take it now (True); else only the HEADERS (False)."""
        self.send_response_headers(sid, status, headers, not data)
        if not data:
            return True
        st = self._streams.get(sid)
        if st is None or st.closed or st.queue or self.writing_paused:
            return False
        window, frame_size = self._h2.send_window(sid)
        if len(data) > window or len(data) > frame_size:
            return False
        self._h2.send_data_frame(sid, data, True)
        self._ended_local(sid)
        return True

    async def send_data(self, sid: int, data: bytes | memoryview, end: bool) -> None:
        view = memoryview(data)
        while True:
            st = self._streams.get(sid)
            if st is None or st.closed or self._closed:
                raise StreamReset("stream reset")
            if st.queue:
                await self._wait(st)
                continue
            if not view:
                if end:
                    self._h2.end_stream(sid)
                    self._ended_local(sid)
                    self._flush()
                return
            window, frame_size = self._h2.send_window(sid)
            n = min(len(view), window, frame_size)
            if n <= 0 or self.writing_paused:
                await self._wait(st)
                continue
            last = n == len(view)
            piece = data if last and n == len(data) and isinstance(data, bytes) else view[:n].tobytes()
            self._h2.send_data_frame(sid, piece, end and last)
            if end and last:
                self._ended_local(sid)
            self._flush()
            view = view[n:]
            if last:
                return

    def queue_data(self, sid: int, data: bytes) -> None:
        st = self._streams.get(sid)
        if st is None or st.closed:
            return
        st.queue.append(data)
        st.queued += len(data)
        self._pump(sid, st)
        self._flush()

    def queued(self, sid: int) -> int:
        st = self._streams.get(sid)
        return st.queued if st is not None else 0

    async def wait_queued_below(self, sid: int, size: int) -> None:
        while True:
            st = self._streams.get(sid)
            if st is None or st.closed:
                raise ConnectionError("stream closed")
            if st.queued < size and not self.writing_paused:
                return
            await self._wait(st)

    def _pump(self, sid: int, st: _Stream) -> None:
        conn = self._h2
        while st.queue and not self.writing_paused:
            window = min(*conn.send_window(sid))
            if window <= 0:
                return
            head = st.queue[0]
            if len(head) <= window:
                st.queue.popleft()
                piece = head
            else:
                piece, st.queue[0] = head[:window], head[window:]
            st.queued -= len(piece)
            conn.send_data_frame(sid, piece, False)

    def _pump_all(self) -> None:
        if self._closed:
            return
        for sid, st in list(self._streams.items()):
            if st.closed:
                continue
            if st.queue:
                try:
                    self._pump(sid, st)
                except h2.exceptions.StreamClosedError:
                    self._stream_gone(sid)
                    continue
            self._wake(st)
        self._flush()

    async def _wait(self, st: _Stream) -> None:
        fut = self._loop.create_future()
        st.waiters.append(fut)
        try:
            await fut
        finally:
            if fut in st.waiters:
                st.waiters.remove(fut)

    def _wake(self, st: _Stream) -> None:
        waiters, st.waiters = st.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _ended_local(self, sid: int) -> None:
        st = self._streams.get(sid)
        if st is not None and st.ended_remote:
            st.closed = True

    def reset(self, sid: int, code: int = h2.errors.ErrorCodes.INTERNAL_ERROR) -> None:
        """End the stream with RST_STREAM ``code`` (the handler's side of it sees it closed)."""
        st = self._streams.get(sid)
        if self._closed or st is None or st.closed:
            return
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self._h2.reset_stream(sid, code)
        self._flush()
        st.closed = True
        st.queue.clear()
        st.queued = 0
        st.request.content.set_exception(StreamReset("stream reset"))
        self._wake(st)

    # ------------------------------------------------------------------ the connection

    def goaway(self, code: int = h2.errors.ErrorCodes.NO_ERROR) -> None:
        """Tell the client to open no more streams; those it opened are served to their end.
        Written as a frame of its own: h2 would accept nothing more after it."""
        if self._closed or self._going_away:
            return
        self._going_away = True
        frame = GoAwayFrame(0)
        frame.last_stream_id = self._h2.highest_inbound_stream_id
        frame.error_code = code
        self._flush_now()
        self.transport.write(frame.serialize())
        if not self._streams:
            self._close_soon()

    def drain(self) -> None:
        """A graceful drain (shutdown, reload): GOAWAY NO_ERROR."""
        self.goaway()

    def close_for(self, reason: str) -> None:
        """Closed by one of the listener's bounds (``kproxy.server.connections``)."""
        log.debug("closing HTTP/2 client connection", extra={"reason": reason, "peer": self._remote})
        self.goaway()
        self.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._flush_now()
            self.transport.close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _close_soon(self) -> None:
        """After a GOAWAY, the connection closes ``GOAWAY_TIMEOUT`` after its last stream has
        ended (Go's ``shutDownIn(goAwayTimeout)``; frames that arrive meanwhile are still
        answered, a PING among them)."""
        if self._close_timer is None and not self._closed:
            self._close_timer = self._loop.call_later(GOAWAY_TIMEOUT, self.close)

    def _arm_idle(self) -> None:
        """The connection has no stream: the idle timeout runs from now. One timer serves many
        idle spells (a request does not cancel it: it finds the connection busy, or idle for less
        than the timeout, and is set again for what is left)."""
        self._disarm_idle()
        if self._closed:
            return
        if self._limits.idle_timeout > 0:
            self._idle_since = self._loop.time()
            if self._idle_timer is None:
                self._idle_timer = self._loop.call_later(self._limits.idle_timeout, self._idle)
        self._on_idle(True)

    def _disarm_idle(self) -> None:
        if self._idle_since is not None:
            self._idle_since = None
            self._on_idle(False)

    def _idle(self) -> None:
        self._idle_timer = None
        since = self._idle_since
        if since is None or self._closed:
            return  # busy: set again when the connection is idle again
        left = since + self._limits.idle_timeout - self._loop.time()
        if left > 0:
            self._idle_timer = self._loop.call_later(left, self._idle)
            return
        if not self._streams:
            self.goaway()

    @property
    def streams(self) -> int:
        return len(self._streams)

    def _flush(self) -> None:
        """Write what h2 has queued, once per pass of the event loop: a response's HEADERS and
        DATA, and the answers to a read's frames, go out in one TLS write (as Go's server
        flushes only once its write queue is empty). Nothing queued, nothing scheduled (a
        request's HEADERS frame has no answer of its own)."""
        if not self._flush_pending and self._h2._data_to_send:
            self._flush_pending = True
            self._loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_pending = False
        data = self._h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
