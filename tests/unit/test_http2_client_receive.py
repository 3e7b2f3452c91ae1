"""The upstream client's own reading of answers (``H2Conn._receive_answers``: HEADERS and DATA
without h2's frame buffer) against h2's ``receive_data`` for the same bytes: random and hostile
frame sequences from a fake server, cut at random points, must give the same bodies, heads,
errors, windows, stream states and frames sent back."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import h2.errors
import h2.settings
import pytest
from hpack import Encoder

from kproxy.server.http2 import client
from kproxy.server.http2.client import H2Conn, request_fields
from kproxy.testing.h2fakes import FakeH2Pool as _Pool
from kproxy.testing.h2fakes import MemoryTransport as _Transport
from kproxy.testing.h2fakes import frame as _frame


def _settings(values: dict[int, int], ack: bool = False) -> bytes:
    payload = b"".join(k.to_bytes(2, "big") + v.to_bytes(4, "big") for k, v in values.items())
    return _frame(0x4, 0x1 if ack else 0, 0, b"" if ack else payload)


def _client(fast: bool, streams: int, heads: list[int], window: int | None = None) -> tuple[H2Conn, _Transport]:
    """A client connection; ``window``: the streams' and the connection's receive windows, small
    enough for the answers to make the client send WINDOW_UPDATEs (default: kproxy's)."""
    pool = _Pool()
    saved = client.STREAM_WINDOW
    if window is not None:
        pool.connection_window = window
        client.STREAM_WINDOW = window
    try:
        conn = H2Conn(pool)  # type: ignore[arg-type]
    finally:
        client.STREAM_WINDOW = saved
    if not fast:
        conn._receive_answers = conn.h2.receive_data  # type: ignore[method-assign]
        conn._more_of_a_body = lambda data: False  # type: ignore[method-assign]
        conn.give_back = conn._give_back_h2  # type: ignore[method-assign]
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    conn.data_received(_settings({h2.settings.SettingCodes.MAX_FRAME_SIZE: 16384}) + _settings({}, ack=True))
    conn.flush_now()
    for i in range(streams):
        method = "HEAD" if i in heads else "GET"
        fields = request_fields(method, f"/api/v1/pods/p{i}", "127.0.0.1:6443", [("Accept", "application/json")])
        conn.open_stream(fields, end_stream=i % 3 != 2)  # every third keeps its request body open
    conn.flush_now()
    transport.written.clear()
    return conn, transport


def _snapshot(conn: H2Conn, transport: _Transport, sids: list[int]) -> Any:
    c = conn.h2
    seen: list[Any] = [
        bytes(transport.written),
        conn.closed,
        c.state_machine.state,
        c._inbound_flow_control_window_manager.current_window_size,
        c._inbound_flow_control_window_manager._bytes_processed,
        c.outbound_flow_control_window,
    ]
    transport.written.clear()
    for sid in sids:
        st = conn.streams.get(sid)
        hs = c.streams.get(sid)
        seen.append(
            None
            if hs is None
            else (
                hs.state_machine.state,
                hs.state_machine.stream_closed_by,
                hs._inbound_window_manager.current_window_size,
                hs._inbound_window_manager._bytes_processed,
                hs._actual_content_length,
            )
        )
        if st is not None:
            head: Any = None
            if st.head.done():
                exc = st.head.exception()
                head = (type(exc).__name__, str(exc)) if exc else "ok"
            err = st.error
            seen.append(
                (
                    head,
                    st.status,
                    list(st.headers),
                    # the bytes and their window, not the chunking: consecutive DATA frames
                    # of one stream may arrive as one chunk
                    (b"".join(c for c, _ in st.chunks), sum(f for _, f in st.chunks)),
                    all(c or f for c, f in st.chunks),  # no empty chunk for the consumer
                    st.remote_ended,
                    st.local_ended,
                    st.done,
                    st.unprocessed,
                    None if err is None else (type(err).__name__, str(err)),
                )
            )
    return seen


class _FakeServer:
    """Frames an upstream might send, many of them wrong."""

    def __init__(self, rng: random.Random, sids: list[int]) -> None:
        self.rng = rng
        self.sids = sids
        self.encoder = Encoder()

    def block(self) -> bytes:
        rng = self.rng
        status = rng.choice([b"200", b"200", b"404", b"100", b"103", b"20", b"abc"])
        fields: list[tuple[bytes, bytes]] = []
        if rng.random() < 0.95:
            fields.append((b":status", status))
        fields += [(b"content-type", b"application/json"), (b"audit-id", b"%032x" % rng.getrandbits(128))]
        if rng.random() < 0.3:
            fields.append((b"content-length", rng.choice([b"0", b"5", b"12", b"x", b"100000"])))
        if rng.random() < 0.1:
            fields.append((b"Bad-Name", b"v"))
        if rng.random() < 0.05:
            fields.append((b"x-big", b"y" * rng.randrange(1, 30000)))
        if rng.random() < 0.05:
            fields.insert(0, (b":path", b"/"))
        block = self.encoder.encode(fields, huffman=rng.random() < 0.5)
        if rng.random() < 0.03:
            block = block[: rng.randrange(len(block) + 1)] + bytes(rng.randrange(256) for _ in range(3))
        return block

    def sid(self) -> int:
        rng = self.rng
        r = rng.random()
        if r < 0.85:
            return rng.choice(self.sids)
        if r < 0.9:
            return 0
        if r < 0.95:
            return max(self.sids) + 2 * rng.randrange(1, 4) - rng.randrange(2)
        return rng.choice(self.sids) | 0x80000000  # the reserved bit

    def frame(self) -> bytes:
        rng = self.rng
        r = rng.random()
        sid = self.sid()
        end = 0x1 if rng.random() < 0.4 else 0
        if r < 0.35:
            block = self.block()
            if rng.random() < 0.15 and len(block) > 2:
                cut = rng.randrange(1, len(block))
                out = _frame(0x1, end, sid, block[:cut])
                if rng.random() < 0.2:
                    out += _frame(0x0, 0, sid, b"in between")
                return out + _frame(0x9, 0x4, sid if rng.random() < 0.9 else sid + 2, block[cut:])
            flags = end | 0x4
            payload = block
            if rng.random() < 0.05:
                flags |= 0x20
                payload = bytes((0, 0, 0, 1, 15)) + block  # PRIORITY on stream 1
            if rng.random() < 0.05:
                flags |= 0x08
                pad = rng.randrange(0, 5)
                payload = bytes((pad,)) + payload + bytes(pad)
            return _frame(0x1, flags, sid, payload)
        if r < 0.75:
            size = rng.choice([0, 1, 100, 4000, 16384, 16385, rng.randrange(0, 20000)])
            if rng.random() < 0.07:
                pad = rng.randrange(0, 10)
                padded = bytes((pad,)) + b"d" * size + bytes(pad)
                return _frame(0x0, end | 0x08, sid, padded[: max(1, len(padded) - rng.randrange(2))])
            return _frame(0x0, end, sid, b"d" * size)
        if r < 0.8:
            return _frame(0x3, 0, sid, rng.choice([0, 7, 8, 2]).to_bytes(4, "big"))  # RST_STREAM
        if r < 0.84:
            return _frame(0x8, 0, rng.choice([0, sid]), rng.randrange(0, 70000).to_bytes(4, "big"))
        if r < 0.87:
            return _frame(0x6, rng.choice([0, 1]), 0, b"12345678")  # PING
        if r < 0.89:
            return _settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: rng.randrange(0, 1 << 20)})
        if r < 0.9:
            last = rng.choice(self.sids)
            return _frame(0x7, 0, 0, last.to_bytes(4, "big") + bytes(4))  # GOAWAY
        if r < 0.93:
            return _frame(0x2, 0, sid, bytes((0, 0, 0, 0, 15)))  # PRIORITY
        if r < 0.95:
            return _frame(0x5, 0x4, sid, (sid + 1).to_bytes(4, "big") + self.block())  # PUSH_PROMISE
        if r < 0.98:
            return _frame(0x21, rng.randrange(256), sid, b"unknown")
        return _frame(0x9, 0x4, sid, self.block())  # CONTINUATION without HEADERS


def _answers(rng: random.Random, sids: list[int], server: _FakeServer) -> list[bytes]:
    """Mostly well-formed answers (HEADERS, DATA..., END_STREAM), interleaved with hostile frames;
    half the time the streams' frames are interleaved too, as a server sends several answers'
    DATA in turn."""
    each: list[list[bytes]] = []
    for sid in rng.sample(sids, len(sids)):
        out: list[bytes] = []
        if rng.random() < 0.7:
            out.append(_frame(0x1, 0x4, sid, server.block()))
            for _ in range(rng.randrange(0, 6)):
                out.append(_frame(0x0, 0, sid, b"b" * rng.randrange(0, 3000)))
            out.append(_frame(0x0, 0x1, sid, b"e" * rng.randrange(0, 50)))
        for _ in range(rng.choice([0, 0, 1, 3])):
            out.append(server.frame())
        each.append(out)
    if rng.random() < 0.5:
        return [frame for out in each for frame in out]
    merged: list[bytes] = []
    each = [out for out in each if out]
    while each:
        out = rng.choice(each)
        merged.append(out.pop(0))
        if not out:
            each.remove(out)
    return merged


def _chunks(rng: random.Random, data: bytes) -> list[bytes]:
    cuts: list[bytes] = []
    pos = 0
    while pos < len(data):
        n = rng.choice([len(data), rng.randrange(1, 40), rng.randrange(1, 5000), 9])
        cuts.append(data[pos : pos + n])
        pos += n
    return cuts


async def test_fast_receive_matches_h2_on_random_and_hostile_frames() -> None:
    compared = 0
    for seed in range(600):
        rng = random.Random(seed)
        streams = rng.randrange(1, 6)
        heads = [i for i in range(streams) if rng.random() < 0.15]
        window = rng.choice([4096, 16384, 65535]) if rng.random() < 0.3 else None
        fast, fast_out = _client(True, streams, heads, window)
        slow, slow_out = _client(False, streams, heads, window)
        sids = sorted(fast.streams)
        assert sids == sorted(slow.streams)
        server = _FakeServer(rng, sids)
        frames = _answers(rng, sids, server)
        # A frame per read (as a large answer arrives), or the frames cut anywhere.
        pieces = frames if rng.random() < 0.3 else _chunks(rng, b"".join(frames))
        for piece in pieces:
            take = rng.random()
            results = []
            for conn, out in ((fast, fast_out), (slow, slow_out)):
                try:
                    conn.data_received(piece)
                    raised = None
                except Exception as err:  # compared: both must fail alike
                    raised = (type(err).__name__, str(err))
                conn.flush_now()
                if take < 0.5:
                    for sid in sorted(conn.streams):
                        st = conn.streams[sid]
                        if st.chunks:
                            st.take()
                    conn.flush_now()
                elif take < 0.55:
                    for sid in sorted(conn.streams)[:1]:
                        conn.cancel(conn.streams[sid])
                    conn.flush_now()
                results.append((raised, _snapshot(conn, out, sids)))
            assert results[0] == results[1], f"seed {seed}"
            compared += 1
        for conn in (fast, slow):
            if conn._timer is not None:
                conn._timer.cancel()
    assert compared > 600


async def test_fast_receive_takes_a_whole_answer_without_the_frame_buffer() -> None:
    """A small answer arriving whole is read by ``_receive_answers`` (h2's frame buffer is never
    used), and its body and window are as h2 would leave them."""
    conn, transport = _client(True, 1, [])
    sid = next(iter(conn.streams))
    st = conn.streams[sid]
    used: list[bytes] = []
    real = conn.h2.receive_data
    conn.h2.receive_data = lambda data: used.append(data) or real(data)  # type: ignore[method-assign]
    block = Encoder().encode([(b":status", b"200"), (b"content-type", b"application/json")])
    conn.data_received(_frame(0x1, 0x4, sid, block) + _frame(0x0, 0, sid, b"{}") + _frame(0x0, 0x1, sid, b""))
    assert used == []
    assert st.status == 200 and st.remote_ended and st.take() == b"{}"
    assert conn.h2._inbound_flow_control_window_manager.current_window_size == (1 << 30) - 2
    conn.flush_now()
    assert transport.written == b""  # 2 bytes: too few to send a WINDOW_UPDATE for, as in h2
    assert conn._timer is not None
    conn._timer.cancel()
    await asyncio.sleep(0)


async def test_a_window_run_dry_is_given_back_as_h2_gives_it_back() -> None:
    """The connection's window used up by two answers, one of them consumed: h2 sends a
    WINDOW_UPDATE for less than half the window when the window is empty (h2/windows.py), and
    so must the client's own accounting of consumed data."""
    results = []
    for fast in (True, False):
        conn, transport = _client(fast, 2, [], window=65535)
        a, b = sorted(conn.streams)
        block = Encoder().encode([(b":status", b"200")])
        answers = _frame(0x1, 0x4, a, block) + _frame(0x1, 0x4, b, block)
        for sid, size in ((a, 16384), (a, 3616), (b, 16384), (b, 16384), (b, 12767)):
            answers += _frame(0x0, 0, sid, b"d" * size)
        conn.data_received(answers)
        assert conn.h2._inbound_flow_control_window_manager.current_window_size == 0
        conn.streams[a].take()  # 20,000 bytes: under half the window
        conn.flush_now()
        results.append(_snapshot(conn, transport, [a, b]))
        assert conn._timer is not None
        conn._timer.cancel()
    assert results[0] == results[1]
    assert results[0][0], "a WINDOW_UPDATE was sent"


@pytest.mark.parametrize(
    ("stream_window", "sizes", "gives"),
    [
        # the stream's window exactly half consumed: h2 sends a WINDOW_UPDATE from there
        (8192, [4096], [4096]),
        (8192, [4096], [4095, 1]),
        # the stream's window run dry: less than half given back is sent at once when over 1024
        (8192, [4096, 4096], [1024, 1, 7167]),
        (8192, [4096, 4096], [1025, 3000]),
        (4096, [1024, 3072], [1024, 1, 3071]),
        # the connection's window (65,535 here) exactly half consumed, the stream's far from it
        (1 << 20, [16384, 16383, 1], [16384, 16383, 1]),
        (1 << 20, [16384, 16383], [32766, 1]),
        # the same once the answer ended (the stream closed: only the connection's window counts)
        (1 << 20, [16384, 16383, -1], [16384, 16383, 1]),
        (1 << 20, [16384, 16383, -1], [32766, 1]),
        (1 << 20, [16384, 16384, 16384, 16383, -1], [1024, 1, 65530]),
        (1 << 20, [16384, 16384, 16384, 16383, -1], [1025]),
    ],
)
async def test_data_given_back_at_the_windows_edges_as_h2_gives_it_back(
    stream_window: int, sizes: list[int], gives: list[int]
) -> None:
    """Consumed data given back by the client's own accounting (``give_back``) at the exact
    edges of h2's rule (h2/windows.py ``_maybe_update_window``): half the window, and a window
    run dry, for an open stream and a closed one; the same frames sent and the same windows left
    as h2's ``acknowledge_received_data``."""
    results = []
    for fast in (True, False):
        saved = client.STREAM_WINDOW
        client.STREAM_WINDOW = stream_window
        try:
            conn, transport = _client(fast, 1, [])
        finally:
            client.STREAM_WINDOW = saved
        conn.h2._inbound_flow_control_window_manager.max_window_size = 65535
        conn.h2._inbound_flow_control_window_manager.current_window_size = 65535
        sid = next(iter(conn.streams))
        st = conn.streams[sid]
        frames = _frame(0x1, 0x4, sid, Encoder().encode([(b":status", b"200")]))
        for size in sizes:  # -1: an empty frame that ends the answer
            frames += _frame(0x0, 0x1, sid, b"") if size < 0 else _frame(0x0, 0, sid, b"d" * size)
        conn.data_received(frames)
        st.chunks.clear()  # (how the data was cut into chunks is not compared here)
        seen = []
        for n in gives:
            conn.give_back(st, n) if fast else conn._give_back_h2(st, n)
            conn.flush_now()
            seen.append(_snapshot(conn, transport, [sid]))
        results.append(seen)
        assert conn._timer is not None
        conn._timer.cancel()
    assert results[0] == results[1]


async def test_an_empty_data_frame_gives_the_consumer_no_empty_chunk() -> None:
    for fast in (True, False):
        conn, _ = _client(fast, 1, [])
        sid = next(iter(conn.streams))
        st = conn.streams[sid]
        conn.data_received(_frame(0x1, 0x4, sid, Encoder().encode([(b":status", b"200")])))
        conn.data_received(_frame(0x0, 0, sid, b""))
        assert not st.chunks, fast
        conn.data_received(_frame(0x0, 0, sid, b"x"))
        assert list(st.chunks) == [(b"x", 1)], fast
        assert conn._timer is not None
        conn._timer.cancel()


@pytest.mark.parametrize(
    ("frame", "window"),
    [
        (_frame(0x0, 0, 1, b"d" * 16385), 1 << 30),  # over the frame size: a connection error
        (_frame(0x0, 0, 1, b"d" * 5000), 4096),  # over the connection's window, within the stream's
        (_frame(0x0, 0, 1, b"d" * 100), 4096),  # within both
    ],
)
async def test_a_frame_read_alone_is_judged_as_h2_judges_it(frame: bytes, window: int) -> None:
    """A DATA frame arriving as a read of its own (``_more_of_a_body``) against h2's own reading:
    the frame size and the connection's window are checked before anything is taken."""
    results = []
    for fast in (True, False):
        conn, transport = _client(fast, 1, [])
        conn.h2._inbound_flow_control_window_manager.current_window_size = window
        sid = next(iter(conn.streams))
        assert sid == 1
        conn.data_received(_frame(0x1, 0x4, sid, Encoder().encode([(b":status", b"200")])))
        try:
            conn.data_received(frame)
            raised = None
        except Exception as err:
            raised = (type(err).__name__, str(err))
        conn.flush_now()
        results.append((raised, _snapshot(conn, transport, [sid])))
        if conn._timer is not None:
            conn._timer.cancel()
    assert results[0] == results[1]
