"""The pieces of the HTTP/2 listener that decide from a client's bytes: the flood meter, the
decoder that keeps HPACK in step past the header list limit, and Go's answers in h2's state."""

from __future__ import annotations

import h2.config
import h2.errors
import h2.events
import h2.exceptions
import pytest
from hpack import Decoder, Encoder
from hyperframe.frame import ContinuationFrame, HeadersFrame, PingFrame, PriorityFrame, SettingsFrame

from kproxy.server.http2.flood import BURST, RATE, FrameMeter
from kproxy.server.http2.goframes import GoConnectionState, HeaderBlockLimit, TruncatingDecoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pings(n: int, ack: bool = False) -> bytes:
    frame = PingFrame(0, opaque_data=b"12345678")
    if ack:
        frame.flags.add("ACK")
    return frame.serialize() * n


def test_a_burst_of_control_frames_is_allowed_then_a_rate() -> None:
    clock = Clock()
    meter = FrameMeter(clock)
    assert meter.feed(PREFACE + pings(BURST))
    assert not meter.feed(pings(1))  # the burst is spent
    clock.now = 1.0
    meter = FrameMeter(clock)
    assert meter.feed(PREFACE + pings(BURST))
    clock.now += 1.0
    assert meter.feed(pings(int(RATE)))  # a second later, RATE more
    assert not meter.feed(pings(1))


def test_acks_and_frames_split_across_reads_are_counted_right() -> None:
    meter = FrameMeter(Clock())
    data = PREFACE + pings(BURST - 1) + pings(5000, ack=True) + SettingsFrame(0).serialize()
    for i in range(0, len(data), 7):  # frame heads cut anywhere
        assert meter.feed(data[i : i + 7])
    assert not meter.feed(PriorityFrame(1, depends_on=0).serialize())


def test_empty_data_and_continuation_count_headers_do_not() -> None:
    meter = FrameMeter(Clock())
    empty_cont = ContinuationFrame(1).serialize()
    headers = HeadersFrame(1, data=b"").serialize()
    assert meter.feed(PREFACE + headers * (BURST + 10))
    assert meter.feed(empty_cont * BURST)
    assert not meter.feed(empty_cont)


def _server() -> GoConnectionState:
    conn = GoConnectionState(h2.config.H2Configuration(client_side=False, header_encoding=None))
    conn.incoming_buffer = HeaderBlockLimit(1 << 20)
    conn.decoder = TruncatingDecoder(conn.decoder)
    conn.decoder.max_header_list_size = 8192
    conn.initiate_connection()
    conn.data_to_send()
    conn.receive_data(PREFACE + SettingsFrame(0).serialize())
    return conn


REQUEST = [(b":method", b"GET"), (b":path", b"/version"), (b":scheme", b"https"), (b":authority", b"x")]


def test_a_header_list_over_the_limit_is_truncated_and_hpack_stays_in_step() -> None:
    conn = _server()
    enc = Encoder()
    bomb = enc.encode([*REQUEST, (b"x-big", b"a" * 4000)] + [(b"x-big", b"a" * 4000)] * 5)
    events = conn.receive_data(HeadersFrame(1, data=bomb, flags=["END_HEADERS", "END_STREAM"]).serialize())
    assert conn.truncated == {1}
    assert any(isinstance(e, h2.events.RequestReceived) for e in events)
    # The next request refers to the table the bomb filled: it decodes as the client meant it.
    after = enc.encode([*REQUEST, (b"x-big", b"a" * 4000)])
    events = conn.receive_data(HeadersFrame(3, data=after, flags=["END_HEADERS", "END_STREAM"]).serialize())
    received = next(e for e in events if isinstance(e, h2.events.RequestReceived))
    assert (b"x-big", b"a" * 4000) in list(received.headers or [])
    assert 3 not in conn.truncated


def test_a_header_block_over_the_limit_in_bytes_is_a_connection_error() -> None:
    conn = _server()
    conn.incoming_buffer = HeaderBlockLimit(1000)
    frames = HeadersFrame(1, data=b"\x00" * 600).serialize() + ContinuationFrame(1, data=b"\x00" * 600).serialize()
    with pytest.raises(h2.exceptions.ProtocolError):
        conn.receive_data(frames)


def test_a_frame_over_the_size_limit_is_refused_on_its_head() -> None:
    conn = _server()
    head = HeadersFrame(1, data=b"\x00" * 20000).serialize()[:9]  # only the head has arrived
    with pytest.raises(h2.exceptions.FrameTooLargeError):
        conn.receive_data(head)


def test_a_stream_over_the_limit_is_refused_and_the_connection_goes_on() -> None:
    conn = GoConnectionState(h2.config.H2Configuration(client_side=False, header_encoding=None))
    conn.local_settings.max_concurrent_streams = 1
    conn.local_settings.acknowledge()
    conn.initiate_connection()
    conn.receive_data(PREFACE + SettingsFrame(0).serialize())
    conn.data_to_send()
    enc = Encoder()
    conn.receive_data(HeadersFrame(1, data=enc.encode(REQUEST), flags=["END_HEADERS"]).serialize())
    three = [*REQUEST, (b"x-three", b"only-in-stream-3")]
    conn.receive_data(HeadersFrame(3, data=enc.encode(three), flags=["END_HEADERS"]).serialize())
    out = conn.data_to_send()
    assert out[3] == 0x3 and int.from_bytes(out[5:9], "big") == 3  # RST_STREAM on stream 3
    assert int.from_bytes(out[9:13], "big") == h2.errors.ErrorCodes.PROTOCOL_ERROR
    conn.reset_stream(1)
    # Stream 3's block went into the HPACK table: stream 5 refers to its entry and decodes.
    events = conn.receive_data(HeadersFrame(5, data=enc.encode(three), flags=["END_HEADERS"]).serialize())
    received = next(e for e in events if isinstance(e, h2.events.RequestReceived))
    assert (b"x-three", b"only-in-stream-3") in list(received.headers or [])


def test_what_kproxy_sends_is_not_huffman_coded() -> None:
    """hpack's Huffman encoder is quadratic: a 900 KB header value took it over a minute, which a
    caller's header forwarded upstream (or a large response header) would cost kproxy's event loop."""
    from kproxy.server.http2.goframes import PlainEncoder

    value = b"a" * 900_000
    block = PlainEncoder().encode([(b"x-big", value)])
    assert value in block  # the literal bytes, not a Huffman code
    decoded = Decoder()
    decoded.max_header_list_size = 1 << 21
    assert decoded.decode(block, raw=True) == [(b"x-big", value)]
