"""The pieces of the HTTP/2 listener that decide from a client's bytes: the flood meter, the
decoder that keeps HPACK in step past the header list limit, and Go's answers in h2's state."""

from __future__ import annotations

import random

import h2.config
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import pytest
from hpack import Decoder, Encoder
from hyperframe.frame import ContinuationFrame, HeadersFrame, PingFrame, PriorityFrame, SettingsFrame

from kproxy.server.http2.flood import BURST, RATE, FrameMeter
from kproxy.server.http2.goframes import GoConnectionState, HeaderBlockLimit, TruncatingDecoder
from kproxy.testing.clock import FakeClock

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def pings(n: int, ack: bool = False) -> bytes:
    frame = PingFrame(0, opaque_data=b"12345678")
    if ack:
        frame.flags.add("ACK")
    return frame.serialize() * n


def test_a_burst_of_control_frames_is_allowed_then_a_rate() -> None:
    clock = FakeClock(0.0)
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
    meter = FrameMeter(FakeClock(0.0))
    data = PREFACE + pings(BURST - 1) + pings(5000, ack=True) + SettingsFrame(0).serialize()
    for i in range(0, len(data), 7):  # frame heads cut anywhere
        assert meter.feed(data[i : i + 7])
    assert not meter.feed(PriorityFrame(1, depends_on=0).serialize())


def test_empty_data_and_continuation_count_headers_do_not() -> None:
    meter = FrameMeter(FakeClock(0.0))
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


# ---------------------------------------------------------------------------------------------
# kproxy's own passes over what h2 and hpack did generically: each must decide exactly as they do.


def _random_fields(rng: random.Random) -> list[tuple[bytes, bytes]]:
    names = [
        b":method",
        b":path",
        b":scheme",
        b":authority",
        b":status",
        b":protocol",
        b":bogus",
        b"host",
        b"te",
        b"connection",
        b"keep-alive",
        b"upgrade",
        b"transfer-encoding",
        b"proxy-connection",
        b"accept",
        b"Accept",
        b"x-a:b",
        b"x a",
        b"",
        b"x\x7f",
        b"\xc3\xa9",
        b"cookie",
        b"content-length",
    ]
    values = [
        b"GET",
        b"CONNECT",
        b"POST",
        b"/",
        b"",
        b"/api",
        b"https",
        b"h",
        b"h2",
        b"trailers",
        b"Trailers",
        b"gzip",
        b" x",
        b"x ",
        b"\tx",
        b"a\x00b",
        b"a\rb",
        b"a\nb",
        b"ok value",
        b"\xff",
    ]
    fields = [
        (b":method", rng.choice([b"GET", b"CONNECT"])),
        (b":scheme", b"https"),
        (b":path", b"/x"),
        (b":authority", b"h"),
    ]
    rng.shuffle(fields)
    del fields[: rng.choice([0, 0, 1, 2, 4])]
    for _ in range(rng.randrange(4)):
        fields.insert(rng.randrange(len(fields) + 1), (rng.choice(names), rng.choice(values)))
    return fields


@pytest.mark.parametrize("trailer", [False, True])
def test_the_request_field_check_refuses_what_h2s_validation_refuses(trailer: bool) -> None:
    """check_request_fields replaces h2's validate_headers (h2/utilities.py) on the listener: on
    thousands of mixed request (and trailer) header lists it refuses exactly what h2 refuses."""
    from h2.utilities import HeaderValidationFlags, validate_headers

    from kproxy.server.http2.goframes import check_request_fields

    flags = HeaderValidationFlags(is_client=False, is_trailer=trailer, is_response_header=False, is_push_promise=False)
    rng = random.Random(28)
    refused = 0
    for _ in range(20_000):
        fields = _random_fields(rng)
        try:
            list(validate_headers(fields, flags))
            h2_refuses = False
        except h2.exceptions.ProtocolError:
            h2_refuses = True
        try:
            check_request_fields(fields, trailer)
            ours = False
        except h2.exceptions.ProtocolError:
            ours = True
        assert ours == h2_refuses, fields
        refused += ours
    assert 1_000 < refused < 19_000  # both outcomes were exercised


def test_the_decoder_reads_blocks_as_hpack_does() -> None:
    """TruncatingDecoder's own literal and indexed paths give hpack's fields (never-indexed ones
    kept as such), and refuse what hpack refuses, on valid and random blocks."""
    from hpack import NeverIndexedHeaderTuple
    from hpack.exceptions import HPACKError

    rng = random.Random(7)
    enc, ref, ours = Encoder(), Decoder(), TruncatingDecoder(Decoder())
    ref.max_header_list_size = ours.max_header_list_size = 1 << 30
    for _ in range(2_000):
        fields: list[tuple[bytes, bytes]] = []
        for _ in range(rng.randrange(1, 10)):
            name = rng.choice(
                [b"a", b"user-agent", b":path", b"authorization", b"x-" + rng.randbytes(rng.randrange(1, 150))]
            )
            value = bytes(rng.choices(b"abc/-_019XYZ", k=rng.choice([0, 1, 40, 126, 127, 128, 300])))
            fields.append(NeverIndexedHeaderTuple(name, value) if rng.random() < 0.2 else (name, value))
        block = enc.encode(fields, huffman=rng.random() < 0.5)
        want, got = ref.decode(block, raw=True), ours.decode(block, raw=True)
        assert [tuple(f) for f in got] == [tuple(f) for f in want]
        assert [isinstance(f, NeverIndexedHeaderTuple) for f in got] == [
            isinstance(f, NeverIndexedHeaderTuple) for f in want
        ]
    for _ in range(20_000):
        block = rng.randbytes(rng.randrange(1, 30))
        outcomes = []
        for decoder in (Decoder(), TruncatingDecoder(Decoder())):
            try:
                outcomes.append([tuple(f) for f in decoder.decode(block, raw=True)])
            except HPACKError:
                outcomes.append(None)
        assert outcomes[0] == outcomes[1], block
    # Small tables the encoder resizes as it goes: entries evicted, an entry larger than the
    # whole table emptying it, the table kept equal to hpack's after every block.
    enc, ref, ours = Encoder(), Decoder(), TruncatingDecoder(Decoder())
    ref.max_header_list_size = ours.max_header_list_size = 1 << 30
    for i in range(3_000):
        if i % 50 == 0:
            enc.header_table_size = rng.choice([0, 40, 100, 300, 4096])
        fields = [
            (rng.choice([b"audit-id", b"date", b"x-" + bytes(rng.choices(b"abc", k=rng.randrange(1, 90)))]),
             bytes(rng.choices(b"0123456789abcdef-", k=rng.randrange(0, 120))))
            for _ in range(rng.randrange(1, 5))
        ]  # fmt: skip
        block = enc.encode(fields, huffman=rng.random() < 0.7)
        want, got = ref.decode(block, raw=True), ours.decode(block, raw=True)
        assert [tuple(f) for f in got] == [tuple(f) for f in want]
        assert list(ours.header_table.dynamic_entries) == list(ref.header_table.dynamic_entries)
        assert ours.header_table._current_size == ref.header_table._current_size
    # The upstream client's mode: hpack's error past the header list limit, not a truncation.
    for _ in range(2_000):
        limit = rng.choice([50, 200, 1 << 20])
        fields = [(b"x-%d" % i, b"v" * rng.randrange(60)) for i in range(rng.randrange(1, 8))]
        block = Encoder().encode(fields, huffman=rng.random() < 0.5)
        outcomes = []
        for decoder in (Decoder(), TruncatingDecoder(Decoder(), truncate=False)):
            decoder.max_header_list_size = limit
            try:
                outcomes.append([tuple(f) for f in decoder.decode(block, raw=True)])
            except HPACKError as err:
                outcomes.append(type(err).__name__)
        assert outcomes[0] == outcomes[1], (limit, fields)


def test_literal_blocks_decode_to_the_fields_sent_and_keep_credentials_out_of_the_table() -> None:
    """PlainEncoder.encode_literal: any HPACK decoder reads back the fields; only the fields of
    INDEXED_NAMES enter the dynamic table, within its size (never evicting); a credential goes
    out never-indexed; after the peer resizes the table nothing more is indexed."""
    from hpack import NeverIndexedHeaderTuple

    from kproxy.server.http2.goframes import INDEXED_NAMES, PlainEncoder

    rng = random.Random(3)
    enc, dec = PlainEncoder(), Decoder()
    for i in range(3_000):
        fields: list[tuple[bytes, bytes]] = [
            (b":status", rng.choice([b"200", b"201", b"404", b"431"])),
            (b":method", rng.choice([b"GET", b"PATCH"])),
            (b"content-type", rng.choice([b"application/json", b"application/yaml"])),
            (b"x-kubernetes-pf-flowschema-uid", b"uid-%d" % rng.randrange(300)),
            (b"audit-id", b"%d" % i),
            (b"impersonate-user", b"user-%d" % rng.randrange(5)),
            NeverIndexedHeaderTuple(b"authorization", b"Bearer t%d" % i),
            (b"x-long", b"v" * rng.randrange(300)),
        ]
        if i == 2_000:
            enc.header_table_size = dec.header_table_size = 1_000
        got = dec.decode(enc.encode_literal(fields), raw=True)
        assert [tuple(f) for f in got] == [tuple(f) for f in fields]
        assert isinstance(got[6], NeverIndexedHeaderTuple)
        assert all(name in INDEXED_NAMES for name, _ in dec.header_table.dynamic_entries)
        assert dec.header_table._current_size <= dec.header_table.maxsize


def test_the_meters_quick_pass_counts_as_the_general_one() -> None:
    """FrameMeter.feed's pass over whole frames that cost nothing leaves the meter as reading the
    same bytes a byte at a time (the general path) does, whatever the reads' boundaries."""
    rng = random.Random(11)
    kinds = [0x0, 0x1, 0x2, 0x3, 0x4, 0x6, 0x8, 0x9]
    for _ in range(300):
        stream = PREFACE
        for _ in range(rng.randrange(1, 40)):
            length = rng.choice([0, 0, 1, 8, 30])
            head = (
                length.to_bytes(3, "big") + bytes((rng.choice(kinds), rng.choice([0, 1, 4, 5]))) + b"\x00\x00\x00\x01"
            )
            stream += head + rng.randbytes(length)
        clock_a, clock_b = FakeClock(0.0), FakeClock(0.0)
        chunked, bytewise = FrameMeter(clock_a), FrameMeter(clock_b)
        pos = 0
        while pos < len(stream):
            step = rng.choice([1, 9, 17, 64, 1000])
            a = chunked.feed(stream[pos : pos + step])
            b = all([bytewise.feed(stream[i : i + 1]) for i in range(pos, min(pos + step, len(stream)))])
            assert a == b
            pos += step
        assert chunked._tokens == bytewise._tokens and chunked._skip == bytewise._skip


def test_send_request_headers_opens_streams_as_h2_send_headers_does() -> None:
    """goframes.send_request_headers (its own stream opening and transitions) against h2's
    ``send_headers`` for the same streams: the same stream and connection state, the same
    refusals (an even stream id, one over the peer's stream limit)."""
    from kproxy.server.http2.goframes import PlainEncoder, send_request_headers

    def client() -> h2.connection.H2Connection:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        conn.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20}
        )  # as the upstream client's (kproxy.server.http2.client)
        conn.encoder = PlainEncoder()
        conn.initiate_connection()
        conn.data_to_send()
        return conn

    rng = random.Random(11)
    ours, theirs = client(), client()
    fields = [(b":authority", b"h"), (b":method", b"GET"), (b":path", b"/"), (b":scheme", b"https")]
    sid = 1
    for i in range(400):
        if i % 50 == 10:  # the server's settings change: stream limit, initial window
            frame = SettingsFrame(0)
            frame.settings = {
                SettingsFrame.MAX_CONCURRENT_STREAMS: rng.choice([3, 100]),
                SettingsFrame.INITIAL_WINDOW_SIZE: rng.choice([65535, 1 << 20]),
            }
            for conn in (ours, theirs):
                conn.receive_data(frame.serialize())
                conn.data_to_send()
        r = rng.random()
        # the next id; now and then an even one, or one past the next (both as h2 takes them;
        # an id used before is never sent: kproxy takes h2's next one)
        sid = sid + 2 if r < 0.8 else rng.choice([sid + 1, sid + 4])
        end = rng.random() < 0.7
        reset = rng.random() < 0.3
        outcomes = []
        for conn in (ours, theirs):
            try:
                if conn is ours:
                    send_request_headers(conn, sid, fields, end)
                else:
                    conn.send_headers(sid, fields, end_stream=end)
                raised = None
            except h2.exceptions.ProtocolError as err:
                raised = type(err).__name__
            stream = conn.streams.get(sid)
            machine = None if stream is None else stream.state_machine
            outcomes.append(
                (
                    raised,
                    conn.state_machine.state,
                    conn.highest_outbound_stream_id,
                    # (h2 forgets closed streams at every count, send_request_headers near the limit)
                    sorted(n for n, st in conn.streams.items() if st.open),
                    None
                    if stream is None
                    else (
                        machine.state,
                        machine.client,
                        machine.headers_sent,
                        machine.stream_closed_by,
                        stream.outbound_flow_control_window,
                        stream._inbound_window_manager.max_window_size,
                        stream.max_outbound_frame_size,
                        stream._authority,
                        stream.request_method,
                    ),
                )
            )
            if reset and stream is not None and not raised:
                conn.reset_stream(sid)  # some close again, so the limit is reached and left
                conn.data_to_send()
        assert outcomes[0] == outcomes[1], i
        sid = max(sid, ours.highest_outbound_stream_id)
