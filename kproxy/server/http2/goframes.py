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
import hyperframe.frame
from h2.frame_buffer import FrameBuffer
from hpack import HeaderTuple
from hpack.exceptions import HPACKDecodingError, OversizedHeaderListError
from hpack.hpack import Decoder, Encoder, _unicode_if_needed
from hpack.table import table_entry_size
from hyperframe.frame import ContinuationFrame, HeadersFrame, RstStreamFrame


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


class TruncatingDecoder(Decoder):
    """HPACK's decoder, keeping Go's hpack decoder's behaviour past the header list limit: the
    whole block is still decoded (the dynamic table must stay in step with the client's), fields
    past the limit are dropped, and ``truncated`` says so (Go's ``MetaHeadersFrame.Truncated``).
    hpack's own decoder raises midway instead, leaving the table out of step: a connection error.
    Past ``MAX_FIELDS`` fields a list is truncated too; past ``MAX_DECODED_FIELDS`` decoding stops
    (a connection error)."""

    def __init__(self, base: Decoder) -> None:
        super().__init__(base.max_allowed_table_size)
        self.max_header_list_size = base.max_header_list_size
        self.truncated = False

    def decode(self, data: bytes, raw: bool = False) -> Any:
        self.truncated = False
        view = memoryview(data)
        headers: list[HeaderTuple] = []
        size = fields = 0
        pos, end = 0, len(data)
        limit = self.max_header_list_size
        while pos < end:
            current = data[pos]
            header: Any
            if current & 0x80:
                header, consumed = self._decode_indexed(view[pos:])
            elif current & 0x40:
                header, consumed = self._decode_literal_index(view[pos:])
            elif current & 0x20:
                if headers or self.truncated:
                    raise HPACKDecodingError("Table size update not at the start of the block")
                consumed = self._update_encoding_context(view[pos:])
                header = None
            else:
                header, consumed = self._decode_literal_no_index(view[pos:])
            pos += consumed
            if not header:
                continue
            fields += 1
            if fields > MAX_DECODED_FIELDS:
                raise OversizedHeaderListError(f"more than {MAX_DECODED_FIELDS} header fields")
            if not self.truncated:
                size += table_entry_size(header[0], header[1])
                if size > limit or fields > MAX_FIELDS:
                    self.truncated = True  # decoded on, kept no more
                else:
                    headers.append(header)
        self._assert_valid_table_size()
        return [_unicode_if_needed(h, raw) for h in headers]
