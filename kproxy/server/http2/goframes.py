"""h2's connection state, with Go's server's answers where they differ (golang.org/x/net/http2
server.go, frame.go): a stream over the limit is refused and the connection goes on; DATA past a
stream's window resets that stream; a frame is judged by its head, a header block by its bytes
across CONTINUATION frames; a header list that decodes larger than the limit is answered 431 with
the HPACK state kept (not a connection error)."""

from __future__ import annotations

import binascii
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import h2.stream
import hpack.hpack
import hpack.table
import hyperframe.frame
from h2.frame_buffer import FrameBuffer
from hpack import NeverIndexedHeaderTuple
from hpack.exceptions import HPACKDecodingError, OversizedHeaderListError
from hpack.hpack import VARINT_MAX_LENGTH, Decoder, Encoder, _unicode_if_needed, decode_integer, encode_integer
from hpack.table import HeaderTable
from hyperframe.frame import ContinuationFrame, HeadersFrame, RstStreamFrame

from kproxy.server.http2.huffman import decode_huffman

_DATA, _HEADERS, _CONTINUATION = 0x0, 0x1, 0x9
_END_STREAM, _END_HEADERS = 0x1, 0x4


class HeaderBlockLimit(FrameBuffer):
    """h2's frame buffer, bounding a header block's bytes across its CONTINUATION frames (h2 bounds
    only their number): Go's server stops at its header list limit (CVE-2023-45288)."""

    def __init__(self, limit: int) -> None:
        super().__init__(server=True)
        self._limit = limit
        self._block = 0

    def __next__(self) -> Any:
        # h2 checks a frame's length once the whole frame has arrived; Go as soon as its head has.
        if len(self._data) >= 9:
            self._validate_frame_length(int.from_bytes(self._data[:3], "big"))
        return super().__next__()

    def _update_header_buffer(self, f: Any) -> Any:
        if isinstance(f, (HeadersFrame, ContinuationFrame)):
            self._block = len(f.data) if isinstance(f, HeadersFrame) else self._block + len(f.data)
            if self._block > self._limit:
                raise h2.exceptions.ProtocolError("header block over the header list limit")
        return super()._update_header_buffer(f)


#: Bytes a field name may hold: visible ASCII but upper case (RFC 9113 8.2.1, 8.2); ``translate``
#: deletes them, so what is left of a name is what it may not hold.
_NAME_BYTES = bytes([*range(0x21, 0x41), *range(0x5B, 0x7F)])
_PSEUDO_FIELDS = frozenset((b":method", b":scheme", b":authority", b":path", b":status", b":protocol"))
_CONNECTION_FIELDS = frozenset((b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"))
_SPECIAL_FIELDS = _CONNECTION_FIELDS | {b"te", b"host"}
_BLANKS = frozenset((0x20, 0x09))
#: Short names that passed the name checks (bounded in number and size: a client chooses them).
_GOOD_NAMES: set[bytes] = set()
_GOOD_NAMES_MAX = 4096


def check_request_fields(headers: Any, trailer: bool) -> None:
    """The checks h2 makes of a request's (or its trailers') header list when
    ``validate_inbound_headers`` is on (h2/utilities.py ``validate_headers``: ten chained
    generators, a fifth of what a small request cost kproxy's listener), in one pass, each
    failure the same ``ProtocolError`` (h2 ends the connection with PROTOCOL_ERROR): a name that
    is empty, upper case, or holds a control, space, non-ASCII byte or a colon past the first
    byte; a value with NUL, CR or LF or that starts or ends with a space or tab; TE other than
    ``trailers``; a connection-specific field; a pseudo-header repeated, after a regular field,
    unknown, in trailers, or one a request may not carry; a request without ``:method`` (and,
    but for CONNECT, ``:scheme`` and ``:path``), with an empty ``:path``, with neither
    ``:authority`` nor Host, with two Hosts or a Host that differs from ``:authority``. Go's
    server refuses the same fields (http2 server.go ``processHeaders``, ``checkValidHTTP2RequestHeaders``,
    frame.go ``checkPseudos``; httpguts ``ValidHeaderFieldName``/``ValidHeaderFieldValue``)."""
    pseudo: dict[bytes, bytes] = {}
    regular = False
    host: bytes | None = None
    good = _GOOD_NAMES
    for name, value in headers:
        if name not in good:
            if not name or name.translate(None, _NAME_BYTES) or name.find(b":", 1) != -1:
                raise h2.exceptions.ProtocolError(f"Invalid header name {name!r}")
            if len(good) < _GOOD_NAMES_MAX and len(name) <= 64:
                good.add(name)
        if value and (
            value[0] in _BLANKS or value[-1] in _BLANKS or b"\n" in value or b"\r" in value or b"\x00" in value
        ):
            raise h2.exceptions.ProtocolError(f"Invalid header value for {name!r}")
        if name[0] == 0x3A:
            if regular or trailer:
                raise h2.exceptions.ProtocolError(f"Received pseudo-header field out of sequence: {name!r}")
            if name in pseudo or name not in _PSEUDO_FIELDS:
                raise h2.exceptions.ProtocolError(f"Received duplicate or unknown pseudo-header field {name!r}")
            pseudo[name] = value
            continue
        regular = True
        if name not in _SPECIAL_FIELDS:
            continue
        if name in _CONNECTION_FIELDS:
            raise h2.exceptions.ProtocolError(f"Connection-specific header field present: {name!r}.")
        if name == b"te" and value.lower() != b"trailers":
            raise h2.exceptions.ProtocolError(f"Invalid value for TE header: {value!r}")
        if name == b"host" and not trailer:
            if host is not None:
                raise h2.exceptions.ProtocolError("Request header block has multiple Host headers.")
            host = value
    if trailer:
        return
    method = pseudo.get(b":method")
    if method is None or b":status" in pseudo:
        raise h2.exceptions.ProtocolError("Request header block without :method, or with :status")
    if method == b"CONNECT" and b":protocol" not in pseudo:
        if b":scheme" in pseudo or b":path" in pseudo:
            raise h2.exceptions.ProtocolError("Ordinary CONNECT MUST NOT include :scheme or :path")
    else:
        if b":scheme" not in pseudo or b":path" not in pseudo:
            raise h2.exceptions.ProtocolError("Request header block without :scheme or :path")
        if b":protocol" in pseudo and method != b"CONNECT":
            raise h2.exceptions.ProtocolError("Encountered connect-request-only headers")
    if pseudo.get(b":path", b"-") == b"":
        raise h2.exceptions.ProtocolError("An empty :path header is forbidden")
    authority = pseudo.get(b":authority")
    if authority is None and host is None:
        raise h2.exceptions.ProtocolError("Request header block does not have an :authority or Host header.")
    if authority is not None and host is not None and authority != host:
        raise h2.exceptions.ProtocolError("Request header block has mismatched :authority and Host headers")


def write_header_block(out: bytearray, stream_id: int, block: bytes, end_stream: bool, frame_size: int) -> None:
    """A header block as a HEADERS frame and as many CONTINUATION frames as ``frame_size`` needs."""
    sid = stream_id.to_bytes(4, "big")
    flags = _END_STREAM if end_stream else 0
    if len(block) <= frame_size:
        out += len(block).to_bytes(3, "big") + bytes((_HEADERS, flags | _END_HEADERS)) + sid + block
        return
    kind = _HEADERS
    for pos in range(0, len(block), frame_size):
        piece = block[pos : pos + frame_size]
        last = pos + frame_size >= len(block)
        out += len(piece).to_bytes(3, "big") + bytes((kind, flags | (_END_HEADERS if last else 0))) + sid + piece
        kind, flags = _CONTINUATION, 0


_CLIENT_OPEN = h2.connection.ConnectionState.CLIENT_OPEN
_STREAM_OPEN = h2.stream.StreamState.OPEN
_HALF_CLOSED_LOCAL = h2.stream.StreamState.HALF_CLOSED_LOCAL

#: Streams h2 may hold (open, and closed ones not yet forgotten) before its count is taken.
_COUNT_AT = 128


def send_request_headers(
    conn: h2.connection.H2Connection, stream_id: int, fields: list[Any], end_stream: bool, limit: int | None = None
) -> None:
    """h2's ``send_headers`` opening a client stream, without its generic pipeline (kproxy's
    upstream client checked the fields itself, as Go's transport does): h2's stream limit, the
    same state transitions and stream, the block from ``PlainEncoder.encode_literal``. ``fields``
    start with ``:authority`` and ``:method`` (``client.request_fields``). ``limit``: the peer's
    SETTINGS_MAX_CONCURRENT_STREAMS as the caller holds it (default: read from h2)."""
    if limit is None:
        limit = conn.remote_settings.max_concurrent_streams
    # h2's count of open streams walks every stream it holds (and forgets the closed ones): only
    # when it can matter, the streams it holds, closed ones among them, being as many as the limit
    # (or past a bound, so that closed ones are forgotten).
    if len(conn.streams) >= min(limit, _COUNT_AT) and conn.open_outbound_streams + 1 > limit:
        raise h2.exceptions.TooManyStreamsError("Max outbound streams reached")
    if conn.state_machine.state is not _CLIENT_OPEN:  # (CLIENT_OPEN takes SEND_HEADERS unchanged)
        conn.state_machine.process_input(h2.connection.ConnectionInputs.SEND_HEADERS)
    if stream_id > conn.highest_outbound_stream_id and stream_id % 2:
        # h2's ``_begin_new_stream`` for a valid new client stream, without its debug logging
        stream = h2.stream.H2Stream(
            stream_id,
            config=conn.config,
            inbound_window_size=conn.local_settings.initial_window_size,
            outbound_window_size=conn.remote_settings.initial_window_size,
        )
        stream.max_outbound_frame_size = conn.max_outbound_frame_size
        conn.streams[stream_id] = stream
        conn.highest_outbound_stream_id = stream_id
    else:
        stream = conn._begin_new_stream(stream_id, h2.connection.AllowedStreamIDs.ODD)  # raises
    # The stream's SEND_HEADERS from IDLE (h2/stream.py ``request_sent``: OPEN), then
    # SEND_END_STREAM (HALF_CLOSED_LOCAL): h2's transitions, without its table lookups.
    machine = stream.state_machine
    machine.client = True
    machine.headers_sent = True
    machine.state = _STREAM_OPEN
    encoder = conn.encoder
    assert isinstance(encoder, PlainEncoder)
    block = encoder.encode_literal(fields)
    if end_stream:
        machine.state = _HALF_CLOSED_LOCAL
    stream._authority = fields[0][1]
    stream.request_method = fields[1][1]  # a HEAD's answer has no body (h2 checks its length)
    write_header_block(conn._data_to_send, stream_id, block, end_stream, conn.max_outbound_frame_size)


class GoConnectionState(h2.connection.H2Connection):
    """h2's connection state, with Go's answers: a stream opened over the limit is refused (its
    header block still decoded, to keep HPACK in step) and the connection goes on; a stream whose
    header list decoded over the limit is noted in ``truncated``."""

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config=config)
        #: Streams whose header list was over the limit (answered 431, as Go's server answers them).
        self.truncated: set[int] = set()

    def _receive_headers_frame(self, frame: HeadersFrame) -> Any:
        decoder = self.decoder
        try:
            frames, events = super()._receive_headers_frame(frame)
            if isinstance(decoder, TruncatingDecoder) and decoder.truncated:
                self.truncated.add(frame.stream_id)
            if not self.config.validate_inbound_headers:
                for event in events:
                    if isinstance(event, (h2.events.RequestReceived, h2.events.TrailersReceived)):
                        check_request_fields(event.headers or (), isinstance(event, h2.events.TrailersReceived))
            return frames, events
        except h2.exceptions.TooManyStreamsError:
            h2.connection._decode_headers(self.decoder, frame.data)
            if frame.stream_id > self.highest_inbound_stream_id:
                self.highest_inbound_stream_id = frame.stream_id
            # Settings sent and not yet acknowledged keep their old value beside the new one.
            acked = len(self.local_settings._settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS]) == 1
            code = h2.errors.ErrorCodes.PROTOCOL_ERROR if acked else h2.errors.ErrorCodes.REFUSED_STREAM
            rst = RstStreamFrame(frame.stream_id)
            rst.error_code = code
            return [rst], []

    def send_literal_headers(
        self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool, informational: bool = False
    ) -> None:
        """h2's ``send_headers`` for an answer on a stream the client opened, without its generic
        pipeline (header normalization and validation off anyway, hpack's indexing encoder, one
        hyperframe object per frame): the same state transitions, the block from
        ``PlainEncoder.encode_literal``, cut into HEADERS and CONTINUATION frames of at most the
        client's frame size."""
        stream = self.streams.get(stream_id)
        if stream is None:
            raise h2.exceptions.StreamClosedError(stream_id)
        self.state_machine.process_input(h2.connection.ConnectionInputs.SEND_HEADERS)
        machine = stream.state_machine
        if informational:
            if end_stream:
                raise h2.exceptions.ProtocolError("Cannot set END_STREAM on informational responses.")
            machine.process_input(h2.stream.StreamInputs.SEND_INFORMATIONAL_HEADERS)
        else:
            machine.process_input(h2.stream.StreamInputs.SEND_HEADERS)
        encoder = self.encoder
        assert isinstance(encoder, PlainEncoder)
        block = encoder.encode_literal(headers)
        if end_stream:
            machine.process_input(h2.stream.StreamInputs.SEND_END_STREAM)
        write_header_block(self._data_to_send, stream_id, block, end_stream, self.max_outbound_frame_size)

    def send_window(self, stream_id: int) -> tuple[int, int]:
        """What may be sent on the stream now (h2's ``local_flow_control_window`` and frame size)."""
        stream = self.streams.get(stream_id)
        if stream is None:
            raise h2.exceptions.StreamClosedError(stream_id)
        window = min(self.outbound_flow_control_window, stream.outbound_flow_control_window)
        return window, self.max_outbound_frame_size

    def send_data_frame(self, stream_id: int, data: bytes, end_stream: bool) -> None:
        """h2's ``send_data`` for one unpadded frame within the windows and the frame size (the
        caller sized it by ``send_window``): the same state transitions and window accounting,
        the frame written without hyperframe's objects."""
        stream = self.streams.get(stream_id)
        if stream is None:
            raise h2.exceptions.StreamClosedError(stream_id)
        size = len(data)
        if size > min(self.outbound_flow_control_window, stream.outbound_flow_control_window):
            raise h2.exceptions.FlowControlError(f"Cannot send {size} bytes, over the flow control window")
        if size > self.max_outbound_frame_size:
            raise h2.exceptions.FrameTooLargeError(f"Cannot send frame size {size}")
        self.state_machine.process_input(h2.connection.ConnectionInputs.SEND_DATA)
        machine = stream.state_machine
        machine.process_input(h2.stream.StreamInputs.SEND_DATA)
        if end_stream:
            machine.process_input(h2.stream.StreamInputs.SEND_END_STREAM)
        stream.outbound_flow_control_window -= size
        self.outbound_flow_control_window -= size
        out = self._data_to_send
        out += size.to_bytes(3, "big") + bytes((_DATA, _END_STREAM if end_stream else 0)) + stream_id.to_bytes(4, "big")
        out += data

    def _receive_data_frame(self, frame: Any) -> Any:
        """DATA past a stream's window resets that stream (FLOW_CONTROL_ERROR) and gives the
        connection's window back, as Go's server does; past the connection's window it is h2's
        connection error, as in Go."""
        try:
            return super()._receive_data_frame(frame)
        except h2.exceptions.FlowControlError:
            if self._inbound_flow_control_window_manager.current_window_size < 0 or frame.stream_id not in self.streams:
                raise
            self.increment_flow_control_window(frame.flow_controlled_length)
            self.reset_stream(frame.stream_id, h2.errors.ErrorCodes.FLOW_CONTROL_ERROR)
            event = h2.events.StreamReset(
                stream_id=frame.stream_id, error_code=h2.errors.ErrorCodes.FLOW_CONTROL_ERROR, remote_reset=False
            )
            return [], [event]


#: Fields a request keeps; past them the rest are dropped and the stream is answered 431 (kproxy's
#: own bound: Go counts only bytes, but each field costs Python's h2 ~100 times what it costs Go, so
#: 30,000 one-byte fields under the byte limit would hold the event loop for a fifth of a second).
#: client-go sends about ten.
MAX_FIELDS = 1000
#: Fields decoded at all: past them decoding stops, and since the HPACK table is then out of step
#: with the client's, the connection ends (GOAWAY ENHANCE_YOUR_CALM).
MAX_DECODED_FIELDS = 16 * 1024


class PlainEncoder(Encoder):
    """HPACK's encoder without Huffman coding: hpack codes each byte in a Python loop, the largest
    part of what a response's HEADERS frame cost kproxy (headers grow by about a fifth on the wire;
    Go codes a string with Huffman only when that is shorter, which a decoder need not know)."""

    def encode(self, headers: Any, huffman: bool = False) -> bytes:
        return super().encode(headers, huffman=False)

    def encode_literal(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        """``headers`` as HPACK without hpack's table search: a pseudo-header field the static
        table holds whole as its index, a ``NeverIndexedHeaderTuple`` (a credential) as a literal
        never indexed, a field of ``INDEXED_NAMES`` (values that repeat) entered in the dynamic
        table the first time and then sent as its index, any other field as a literal that is not
        indexed (RFC 7541 6.2.2; a static-table name by its index).
        Entries are added only while the table has room for them (nothing is ever evicted, so
        each entry's index is known from the order they were added); once the peer changes the
        table's size no more are added or used. A table size change is signalled first, as hpack's
        ``encode`` does. hpack's encoder searched its whole dynamic table for every field (in
        Python), most of a response's HEADERS cost; don't mix this with ``encode`` on one
        connection (that one enters fields in the table this does not know of)."""
        parts: list[bytes] = []
        if self.table_size_changes or self.header_table.resized:
            parts.append(self._encode_table_size_change())
            self.header_table.resized = False
            self._entries = None  # the peer's table changed under ours: index nothing more
        entries = self._entries
        for field in headers:
            name, value = field
            if name[:1] == b":":
                exact = _STATIC_EXACT.get((name, value))
                if exact is not None:
                    parts.append(exact)
                    continue
            n = len(value)
            if field.__class__ is NeverIndexedHeaderTuple:  # a credential: never indexed (6.2.3)
                index = _STATIC_NAMES.get(name)
                if index is not None:
                    head = encode_integer(index, 4)
                    head[0] |= 0x10
                    parts.append(bytes(head))
                else:
                    parts.append(b"\x10" + bytes(encode_integer(len(name), 7)) + name)
                parts.append(_SHORT_LENGTHS[n] if n < 127 else bytes(encode_integer(n, 7)))
                parts.append(value)
                continue
            if entries is not None and name in INDEXED_NAMES:
                added = entries.get((name, value))
                if added is not None:
                    index = 62 + len(entries) - 1 - added  # the newest entry is 62
                    if index < 127:
                        parts.append(_INDEXED[index])
                    else:
                        head = encode_integer(index, 7)
                        head[0] |= 0x80
                        parts.append(bytes(head))
                    continue
                size = len(name) + n + 32  # RFC 7541 4.1
                if self._table_used + size <= self.header_table.maxsize:
                    self._table_used += size
                    entries[(name, value)] = len(entries)
                    index = _STATIC_NAMES.get(name)
                    if index is not None:
                        head = encode_integer(index, 6)
                        head[0] |= 0x40
                        parts.append(bytes(head))
                    else:
                        parts.append(b"\x40" + bytes(encode_integer(len(name), 7)) + name)
                    parts.append(_SHORT_LENGTHS[n] if n < 127 else bytes(encode_integer(n, 7)))
                    parts.append(value)
                    continue
            prefix = _NAME_PREFIX.get(name)
            if prefix is None:
                prefix = _name_prefix(name)
            parts.append(prefix)
            parts.append(_SHORT_LENGTHS[n] if n < 127 else bytes(encode_integer(n, 7)))
            parts.append(value)
        return b"".join(parts)

    #: ``encode_literal``'s dynamic table: the fields it added, each with its order of adding
    #: (None: it adds and uses none), and their size.
    _entries: dict[tuple[bytes, bytes], int] | None
    _table_used = 0

    def __init__(self) -> None:
        super().__init__()
        self._entries = {}


#: Fields whose values repeat from one message to the next (the apiserver's content type and cache
#: control, the APF flow schema and priority level of a caller; the host, user agent and accepted
#: types of kproxy's requests): entered in the HPACK dynamic table by
#: ``PlainEncoder.encode_literal``. Nothing that may be a credential or names a caller.
INDEXED_NAMES = frozenset(
    (
        b":authority",
        b"accept",
        b"accept-encoding",
        b"user-agent",
        b"content-type",
        b"cache-control",
        b"content-encoding",
        b"vary",
        b"x-kubernetes-pf-flowschema-uid",
        b"x-kubernetes-pf-prioritylevel-uid",
    )
)


#: HPACK's static table (RFC 7541 appendix A), index 1 first.
_STATIC = HeaderTable.STATIC_TABLE
_STATIC_LENGTH = len(_STATIC)
#: Pseudo-header fields the HPACK static table holds whole (RFC 7541 Appendix A: ``:method GET``,
#: ``:scheme https``, ``:status 200``...), as indexed field lines.
_STATIC_EXACT = {
    (name, value): bytes((0x80 | i,))
    for i, (name, value) in enumerate(HeaderTable.STATIC_TABLE, 1)
    if name[:1] == b":" and value
}
#: A name's first static table index, for a literal with an indexed name.
_STATIC_NAMES: dict[bytes, int] = {}
for _i, (_name, _) in enumerate(HeaderTable.STATIC_TABLE, 1):
    _STATIC_NAMES.setdefault(_name, _i)
#: Encoded name parts of the fields sent, by name (bounded: names come from upstream answers).
_NAME_PREFIX: dict[bytes, bytes] = {}
_NAME_PREFIX_MAX = 1024
#: Indexed field lines (RFC 7541 6.1) of the indices under 127.
_INDEXED = [bytes((0x80 | i,)) for i in range(127)]
#: A string's length as a 7-bit prefix integer with the Huffman bit clear, for lengths under 127.
_SHORT_LENGTHS = [bytes((n,)) for n in range(127)]


def _name_prefix(name: bytes) -> bytes:
    """The start of a "literal header field without indexing" line for ``name``: the 4-bit
    prefix index of a static-table name, else a zero index and the name as a plain string."""
    index = _STATIC_NAMES.get(name)
    if index is not None:
        prefix = bytes(encode_integer(index, 4))  # the pattern 0000 keeps the high bits clear
    else:
        prefix = b"\x00" + bytes(encode_integer(len(name), 7)) + name
    if len(_NAME_PREFIX) < _NAME_PREFIX_MAX and len(name) <= 64:
        _NAME_PREFIX[name] = prefix
    return prefix


def _shown_hex(data: bytes | None) -> str:
    """hyperframe's ``_raw_data_repr``, with the same result, hexlifying only the bytes it shows.
    h2 builds the repr of every frame it receives for a trace log it does not write
    (h2/connection.py ``_receive_frame``), which hexlified each DATA frame's whole payload: a
    tenth of a large LIST's CPU in kproxy."""
    if not data:
        return "None"
    shown = binascii.hexlify(data[:11]).decode("ascii")
    return "<hex:" + (shown[:20] + "..." if len(shown) > 20 else shown) + ">"


hyperframe.frame._raw_data_repr = _shown_hex


def _frame_kind(frame: object) -> str:
    return type(frame).__name__


# h2/connection.py ``_receive_frame`` builds ``repr(frame)`` of every frame for that trace log
# (flags, the payload's head in hex: a tenth of a small request's frame handling); its only
# ``repr`` call, now naming the frame's type.
h2.connection.repr = _frame_kind  # type: ignore[attr-defined]


class _Unlogged:
    """hpack's module loggers, replaced: hpack logs every integer and field it codes at DEBUG
    (about thirty calls for a small request and its answer, a tenth of what the listener spent
    on it), and those records hold header values, credentials among them."""

    @staticmethod
    def debug(*args: Any, **kwargs: Any) -> None:
        return None


hpack.hpack.log = _Unlogged()  # type: ignore[assignment]
hpack.table.log = _Unlogged()  # type: ignore[assignment]


#: Huffman-coded strings a connection's decoder keeps decoded (a client that sends a path or a
#: value again as a literal, as nghttp2 sends ``:path``): how many, and up to what length.
_HUFFMAN_CACHED = 64
_HUFFMAN_CACHED_LENGTH = 128


def _integer(data: bytes, pos: int, bits: int) -> tuple[int, int]:
    """The HPACK integer with a ``bits`` prefix at ``pos``, and the position after it."""
    mask = (1 << bits) - 1
    value = data[pos] & mask
    if value < mask:
        return value, pos + 1
    value, used = decode_integer(data[pos : pos + VARINT_MAX_LENGTH + 1], bits)
    return value, pos + used


class TruncatingDecoder(Decoder):
    """HPACK's decoder, keeping Go's hpack decoder's behaviour past the header list limit: the
    whole block is still decoded (the dynamic table must stay in step with the client's), fields
    past the limit are dropped, and ``truncated`` says so (Go's ``MetaHeadersFrame.Truncated``).
    hpack's own decoder raises midway instead, leaving the table out of step: a connection error.
    Past ``MAX_FIELDS`` fields a list is truncated too; past ``MAX_DECODED_FIELDS`` decoding stops
    (a connection error)."""

    def __init__(self, base: Decoder, truncate: bool = True) -> None:
        super().__init__(base.max_allowed_table_size)
        self.max_header_list_size = base.max_header_list_size
        self.truncated = False
        #: False: hpack's behaviour past the limit instead (``OversizedHeaderListError``, no field
        #: count bounds), for the upstream client, with this decoder's speed.
        self._truncate = truncate
        self._huffman_cache: dict[bytes, bytes] = {}

    def _literal(self, data: bytes, pos: int, should_index: bool) -> tuple[Any, int]:
        """hpack's ``_decode_literal`` for the field line at ``pos``: the field (a
        ``NeverIndexedHeaderTuple`` when sent as never indexed) and the bytes it took. It reads
        the block in place (hpack's copies the rest of the block for each literal: quadratic in
        the block's length) and decodes a short Huffman string once per connection. A field with
        incremental indexing enters the table as hpack's ``HeaderTable.add`` enters it."""
        start, end = pos, len(data)
        first = data[pos]
        if should_index:
            index, bits, never = first & 0x3F, 6, False
        else:
            index, bits, never = first & 0x0F, 4, bool(first & 0x10)
        if index:
            index, pos = _integer(data, pos, bits)
            name = self._entry(index)[0]
        else:
            pos += 1
            name, pos = self._string(data, pos, end, True)
        value, pos = self._string(data, pos, end, not should_index)
        if should_index:
            table = self.header_table
            size = 32 + len(name) + len(value)  # table_entry_size (RFC 7541 4.1)
            if size > table._maxsize:
                table.dynamic_entries.clear()
                table._current_size = 0
            else:
                table.dynamic_entries.appendleft((name, value))
                table._current_size += size
                if table._current_size > table._maxsize:
                    table._shrink()
        return (NeverIndexedHeaderTuple(name, value) if never else (name, value)), pos - start

    def _entry(self, index: int) -> tuple[bytes, bytes]:
        """hpack's ``HeaderTable.get_by_index`` (1-based; its error for an index past the table)."""
        if 0 < index <= _STATIC_LENGTH:
            return _STATIC[index - 1]
        dynamic = self.header_table.dynamic_entries
        if _STATIC_LENGTH < index <= _STATIC_LENGTH + len(dynamic):
            return dynamic[index - _STATIC_LENGTH - 1]
        return self.header_table.get_by_index(index)  # raises InvalidTableIndex

    def _string(self, data: bytes, pos: int, end: int, cached: bool) -> tuple[bytes, int]:
        """The string at ``pos`` and the position after it. A short Huffman-coded one is kept
        decoded when ``cached`` (a value entered in the table comes again by its index, not as a
        literal: those are not kept)."""
        if pos >= end:
            raise HPACKDecodingError("Truncated header block")
        huffman = data[pos] & 0x80
        length, pos = _integer(data, pos, 7)
        text = data[pos : pos + length]
        if len(text) != length:
            raise HPACKDecodingError("Truncated header block")
        pos += length
        if not huffman:
            return text, pos
        if length > _HUFFMAN_CACHED_LENGTH or not cached:
            return decode_huffman(text), pos
        cache = self._huffman_cache
        plain = cache.get(text)
        if plain is None:
            plain = decode_huffman(text)
            if len(cache) >= _HUFFMAN_CACHED:
                cache.clear()
            cache[text] = plain
        return plain, pos

    def decode(self, data: bytes, raw: bool = False) -> Any:
        self.truncated = False
        view = memoryview(data)
        headers: list[Any] = []
        size = fields = 0
        pos, end = 0, len(data)
        limit = self.max_header_list_size
        truncate = self._truncate
        entry = self._entry
        while pos < end:
            current = data[pos]
            header: Any
            if current & 0x80:
                if 0x80 < current < 0xFF:  # an index in the prefix byte (most fields)
                    header, consumed = entry(current & 0x7F), 1
                else:
                    header, consumed = self._decode_indexed(view[pos:])
            elif current & 0x40:
                header, consumed = self._literal(data, pos, True)
            elif current & 0x20:
                if headers or self.truncated:
                    raise HPACKDecodingError("Table size update not at the start of the block")
                consumed = self._update_encoding_context(view[pos:])
                header = None
            else:
                header, consumed = self._literal(data, pos, False)
            pos += consumed
            if not header:
                continue
            fields += 1
            if fields > MAX_DECODED_FIELDS and truncate:
                raise OversizedHeaderListError(f"more than {MAX_DECODED_FIELDS} header fields")
            if not self.truncated:
                size += 32 + len(header[0]) + len(header[1])  # table_entry_size (RFC 7541 4.1)
                if size > limit or (fields > MAX_FIELDS and truncate):
                    if not truncate:
                        raise OversizedHeaderListError(f"A header list larger than {limit} has been received")
                    self.truncated = True  # decoded on, kept no more
                else:
                    headers.append(header)
        self._assert_valid_table_size()
        return headers if raw else [_unicode_if_needed(h, raw) for h in headers]
