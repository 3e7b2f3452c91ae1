"""A small well-behaved HTTP/2 client for the tests (h2 over asyncio, TLS with ALPN ``h2``): what
the tests need that kubectl does not show, namely the frames themselves (the server's SETTINGS,
GOAWAY, resets), many streams on one connection, and reading a stream slowly."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from hyperframe.frame import Frame, GoAwayFrame


@dataclass
class Response:
    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    headers_in: asyncio.Event = field(default_factory=asyncio.Event)
    reset: int | None = None  # the RST_STREAM error code, if the server reset the stream
    data_in: asyncio.Event = field(default_factory=asyncio.Event)

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name.lower()), None)


class H2Client:
    """One HTTP/2 connection. ``auto_ack=False`` keeps received DATA unacknowledged (a client
    that does not read: the server's windows close)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, auto_ack: bool = True) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.auto_ack = auto_ack
        self.responses: dict[int, Response] = {}
        self.server_settings: dict[int, int] = {}
        self.settings_in = asyncio.Event()
        self.goaway: GoAwayFrame | None = None
        self.goaway_in = asyncio.Event()
        self.closed = asyncio.Event()
        self.window_open = asyncio.Event()
        self.pings = 0
        self._raw = b""
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(cls, url: str, ca: str | None = None, **kwargs: bool) -> H2Client:
        host, port = url.split("//", 1)[1].split(":")
        ctx = ssl.create_default_context(cafile=ca)
        if ca is None:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2", "http/1.1"])
        reader, writer = await asyncio.open_connection(host, int(port.rstrip("/")), ssl=ctx)
        alpn = writer.get_extra_info("ssl_object").selected_alpn_protocol()
        if alpn != "h2":
            writer.close()
            raise AssertionError(f"ALPN chose {alpn!r}, not h2")
        client = cls(reader, writer, **kwargs)
        client.conn.initiate_connection()
        client.flush()
        client._task = asyncio.create_task(client._read())
        await asyncio.wait_for(client.settings_in.wait(), 10)
        return client

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

    async def _read(self) -> None:
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    break
                try:
                    events = self.conn.receive_data(self._frames(data))
                except h2.exceptions.ProtocolError:
                    break
                for ev in events:
                    self._event(ev)
                self.flush()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            self.closed.set()
            for resp in self.responses.values():
                resp.ended.set()
                resp.headers_in.set()

    def _frames(self, data: bytes) -> bytes:
        """The whole frames received so far, but GOAWAY, which is noted here: h2 takes nothing
        after a GOAWAY, but the streams the server still serves go on (what the tests check)."""
        self._raw += data
        keep = []
        while len(self._raw) >= 9:
            frame, length = Frame.parse_frame_header(memoryview(self._raw[:9]))
            if len(self._raw) < 9 + length:
                break
            if isinstance(frame, GoAwayFrame):
                frame.parse_body(memoryview(self._raw[9 : 9 + length]))
                self.goaway = frame
                self.goaway_in.set()
            else:
                keep.append(self._raw[: 9 + length])
            self._raw = self._raw[9 + length :]
        return b"".join(keep)

    def _event(self, ev: h2.events.Event) -> None:
        if isinstance(ev, h2.events.RemoteSettingsChanged):
            self.server_settings.update({int(k): v.new_value for k, v in ev.changed_settings.items()})
            self.settings_in.set()
            self.window_open.set()
        elif isinstance(ev, h2.events.ResponseReceived):
            resp = self.responses[ev.stream_id]
            resp.headers = [(k, v) for k, v in ev.headers if not k.startswith(":")]  # type: ignore[misc]
            resp.status = int(dict(ev.headers)[":status"])  # type: ignore[arg-type]
            resp.headers_in.set()
        elif isinstance(ev, h2.events.DataReceived):
            resp = self.responses[ev.stream_id]
            resp.body += ev.data
            resp.data_in.set()
            if self.auto_ack:
                self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.StreamEnded):
            self.responses[ev.stream_id].ended.set()
        elif isinstance(ev, h2.events.StreamReset):
            resp = self.responses.setdefault(ev.stream_id, Response())
            resp.reset = ev.error_code
            resp.ended.set()
            resp.headers_in.set()
        elif isinstance(ev, h2.events.WindowUpdated):
            self.window_open.set()
        elif isinstance(ev, h2.events.PingAckReceived):
            self.pings += 1

    def open(self, method: str, path: str, headers: Iterable[tuple[str, str]] = (), end: bool = True) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.responses[sid] = Response()
        hdrs = [(":method", method), (":path", path), (":scheme", "https"), (":authority", "127.0.0.1"), *headers]
        self.conn.send_headers(sid, hdrs, end_stream=end)
        self.flush()
        return sid

    async def send_body(self, sid: int, body: bytes) -> None:
        """Send ``body`` as the windows allow, then end the stream."""
        view = memoryview(body)
        while view:
            n = min(len(view), self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if n <= 0:
                self.window_open.clear()
                await asyncio.wait_for(self.window_open.wait(), 30)
                continue
            self.conn.send_data(sid, view[:n].tobytes())
            self.flush()
            view = view[n:]
        self.conn.end_stream(sid)
        self.flush()

    async def request(
        self, method: str, path: str, headers: Iterable[tuple[str, str]] = (), body: bytes | None = None
    ) -> Response:
        sid = self.open(method, path, headers, end=body is None)
        if body is not None:
            await self.send_body(sid, body)
        resp = self.responses[sid]
        await asyncio.wait_for(resp.ended.wait(), 60)
        return resp

    def ping(self) -> None:
        self.conn.ping(b"kproxy!!")
        self.flush()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.writer.close()
