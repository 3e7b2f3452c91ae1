"""A raw HTTP/2 client for the edge attacks (frames and HPACK blocks written by hand, so it sends
what a well-behaved client would not), a keep-alive HTTP/1.1 loop, and a bomb of tiny header
fields. Reads wait on the socket with a deadline, never for a fixed time."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

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
PROTOCOL_ERROR, INTERNAL_ERROR = 0x1, 0x2

Fields = list[tuple[str, str]]


@dataclass
class Stream:
    status: str | None = None
    headers: Fields = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    ended: bool = False
    reset: int | None = None

    def json(self) -> Any:
        return json.loads(bytes(self.body))

    def is_status(self) -> bool:
        """A Kubernetes Status body (what kproxy answers for anything it refuses)."""
        try:
            return bool(self.json().get("kind") == "Status")
        except ValueError:
            return False

    def short(self) -> str:
        return f"status={self.status} reset={self.reset} body={bytes(self.body[:300])!r}"


class Wire:
    """One TLS connection that negotiated ``h2`` by ALPN, spoken frame by frame."""

    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection((host, port), timeout=timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = ctx.wrap_socket(raw, server_hostname=host)
        assert self.sock.selected_alpn_protocol() == "h2", self.sock.selected_alpn_protocol()
        self.authority = f"{host}:{port}"
        self.encoder = Encoder()
        self.decoder = Decoder()
        self.decoder.max_header_list_size = 1 << 24
        self.streams: dict[int, Stream] = {}
        self.goaway: int | None = None
        self.closed = False
        self.next_id = 1
        self._buf = bytearray()
        self.sock.sendall(PREFACE + SettingsFrame(0, settings={}).serialize())
        self.sock.sendall(WindowUpdateFrame(0, window_increment=1 << 30).serialize())

    @classmethod
    def to(cls, url_or_port: str | int) -> Wire:
        if isinstance(url_or_port, int):
            return cls("127.0.0.1", url_or_port)
        host, port = url_or_port.split("//", 1)[1].rstrip("/").rsplit(":", 1)
        return cls(host, int(port))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> Wire:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, *frames: Frame | bytes) -> bool:
        data = b"".join(f if isinstance(f, bytes) else f.serialize() for f in frames)
        try:
            self.sock.sendall(data)
            return True
        except (OSError, ssl.SSLError):
            return False

    def block(self, fields: Iterable[tuple[str, str]]) -> bytes:
        return bytes(self.encoder.encode(list(fields)))

    def fields(self, method: str, path: str, token: str | None = None, extra: Iterable[tuple[str, str]] = ()) -> Fields:
        out = [(":method", method), (":scheme", "https"), (":authority", self.authority), (":path", path)]
        if token is not None:
            out.append(("authorization", f"Bearer {token}"))
        return [*out, *extra]

    def open(self, block: bytes, body: bytes | None = None, trailers: bytes | None = None) -> int:
        """Send one request (its header block already encoded); its stream id."""
        sid, self.next_id = self.next_id, self.next_id + 2
        self.streams[sid] = Stream()
        frames: list[Frame] = []
        head, rest = block[:16_000], block[16_000:]
        ends = body is None and trailers is None
        frames.append(
            HeadersFrame(sid, data=head, flags=(["END_STREAM"] if ends else []) + ([] if rest else ["END_HEADERS"]))
        )
        while rest:
            head, rest = rest[:16_000], rest[16_000:]
            frames.append(ContinuationFrame(sid, data=head, flags=[] if rest else ["END_HEADERS"]))
        if body is not None:
            frames.append(DataFrame(sid, data=body, flags=[] if trailers is not None else ["END_STREAM"]))
        if trailers is not None:
            frames.append(HeadersFrame(sid, data=trailers, flags=["END_HEADERS", "END_STREAM"]))
        self.send(*frames)
        return sid

    def request(
        self,
        method: str,
        path: str,
        token: str | None = None,
        extra: Iterable[tuple[str, str]] = (),
        body: bytes | None = None,
        timeout: float = 10.0,
    ) -> Stream:
        sid = self.open(self.block(self.fields(method, path, token, extra)), body)
        return self.wait(sid, timeout)

    def wait(self, sid: int, timeout: float = 10.0) -> Stream:
        self.until(lambda: self.streams[sid].ended or self.streams[sid].reset is not None, timeout)
        return self.streams[sid]

    def until(self, done: Any, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            frame = self._read(deadline)
            if frame is None:
                return bool(done())
            self._record(frame)
        return True

    def _record(self, frame: Frame) -> None:
        st = self.streams.get(frame.stream_id)
        if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
            self.send(SettingsFrame(0, flags=["ACK"]))
        elif isinstance(frame, PingFrame) and "ACK" not in frame.flags:
            self.send(PingFrame(0, opaque_data=frame.opaque_data, flags=["ACK"]))
        elif isinstance(frame, GoAwayFrame):
            self.goaway = frame.error_code
        elif st is None:
            return
        elif isinstance(frame, RstStreamFrame):
            st.reset = frame.error_code
        elif isinstance(frame, HeadersFrame | ContinuationFrame):
            got = [(str(k), str(v)) for k, v in self.decoder.decode(bytes(frame.data), raw=False)]
            st.headers.extend(got)
            st.status = st.status or dict(got).get(":status")
            st.ended = st.ended or "END_STREAM" in frame.flags
        elif isinstance(frame, DataFrame):
            st.body += frame.data
            st.ended = st.ended or "END_STREAM" in frame.flags
            if frame.flow_controlled_length:
                self.send(WindowUpdateFrame(frame.stream_id, window_increment=frame.flow_controlled_length))

    def _read(self, deadline: float) -> Frame | None:
        while True:
            if len(self._buf) >= 9:
                frame, length = Frame.parse_frame_header(memoryview(bytes(self._buf[:9])))
                if len(self._buf) >= 9 + length:
                    frame.parse_body(memoryview(bytes(self._buf[9 : 9 + length])))
                    del self._buf[: 9 + length]
                    return frame
            if self.closed:
                return None
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                return None
            except (OSError, ssl.SSLError):
                chunk = b""
            if not chunk:
                self.closed = True
                continue
            self._buf += chunk


def tiny_fields_block(w: Wire, path: str, token: str, fields: int) -> bytes:
    """A request whose header list is ``fields`` copies of the empty field ``a`` (33 bytes each
    against the header list limit: ~31,000 fit in Go's 1 MiB) as one byte each on the wire: the
    field is put into the dynamic table once, then named by its index (62)."""
    return w.block([*w.fields("GET", path, token), ("a", "")]) + b"\xbe" * fields


class Http11:
    """One keep-alive HTTP/1.1 connection over TLS (ALPN ``http/1.1``)."""

    def __init__(self, url: str, timeout: float = 30.0) -> None:
        host, port = url.split("//", 1)[1].rstrip("/").rsplit(":", 1)
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["http/1.1"])
        self.host = host
        self.sock = ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=timeout), server_hostname=host)
        self.file = self.sock.makefile("rb")

    def request(self, method: str, target: str, token: str, body: bytes = b"") -> tuple[int, bytes]:
        head = f"{method} {target} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + body)
        line = self.file.readline()
        if not line:
            raise ConnectionError("closed")
        length = 0
        while (h := self.file.readline()) not in (b"\r\n", b""):
            if h.lower().startswith(b"content-length:"):
                length = int(h.split(b":", 1)[1])
        return int(line.split()[1]), self.file.read(length)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
