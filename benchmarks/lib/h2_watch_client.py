"""The HTTP/2 client side of ``benchmarks.http2``: one process holding a few h2 connections, each
carrying many streams, as client-go multiplexes a program's watches on one connection.

It speaks the same pipe protocol as ``benchmarks.lib.watch_client`` (``Connected``, then the
measured window, then ``ClientResult``, then a message to close), so the runner drives HTTP/1.1 and
HTTP/2 watchers alike. Per stream the events are counted and timed by that module's ``Watcher``
(one ``bytes.find`` per event, no JSON parse): an h2 DATA frame carries the watch's bytes without
chunk framing, which ``Watcher.body`` reads the same way.

Modes (``H2ClientSpec.mode``):

- ``watch``: every stream a GET of ``target`` (a watch); ready when each has its 200 head;
- ``idle``: connections only (TLS, ALPN h2, the preface and settings exchanged), no stream;
- ``unfinished``: every stream a POST of ``target`` whose body (``Content-Length`` 1,000) stops
  after 10 bytes: a request in flight, its body still arriving.

``idle`` and ``unfinished`` are ready when the server has answered a PING sent after the streams:
frames are handled in order, so the server has seen every stream by then.

Windows as Go's client opens them (x/net/http2 transport.go: ``transportDefaultStreamFlow`` 4 MiB,
``transportDefaultConnFlow`` 1 GiB); the bytes read are given back as they arrive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings

from benchmarks.lib.watch_client import ClientResult, Connected, Stats, Watcher, raise_nofile, recv

_CONNECT_TIMEOUT = 120.0
_STREAM_WINDOW = 4 << 20
_CONN_WINDOW = 1 << 30
_PING = b"kproxyb!"


@dataclass
class H2ClientSpec:
    host: str
    port: int
    #: request target, e.g. ``/api/v1/namespaces/x/pods?watch=1&resourceVersion=5``
    target: str
    connections: int
    #: streams per connection
    streams: int
    #: the CA to trust (the server is always TLS: h2 is negotiated by ALPN)
    ca: str
    #: ``watch``, ``idle`` or ``unfinished``
    mode: str = "watch"
    token: str | None = None
    #: handshakes in flight at once
    connect_concurrency: int = 25


class H2Conn(asyncio.Protocol):
    """One h2 connection and its streams."""

    def __init__(self, spec: H2ClientSpec, stats: Stats, loop: asyncio.AbstractEventLoop) -> None:
        self.spec = spec
        self.stats = stats
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None, validate_inbound_headers=False)
        )
        self.transport: Any = None
        self.watchers: dict[int, Watcher] = {}
        self.pending = 0  # streams without their answer yet (watch) / the PING not answered yet
        self.ready: asyncio.Future[None] = loop.create_future()
        self.failed: Counter[str] = Counter()
        self.loop = loop

    # ------------------------------------------------------------------ asyncio protocol

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if transport.get_extra_info("ssl_object").selected_alpn_protocol() != "h2":
            self.failed["no h2 (ALPN)"] += 1
            self._done()
            return
        conn = self.h2
        conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _STREAM_WINDOW,
            },
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(_CONN_WINDOW - 65535)
        spec = self.spec
        auth = [(b"authorization", b"Bearer " + spec.token.encode())] if spec.token else []
        base = [
            (b":scheme", b"https"),
            (b":authority", f"{spec.host}:{spec.port}".encode()),
            (b":path", spec.target.encode()),
        ]
        if spec.mode == "watch":
            headers = [
                (b":method", b"GET"),
                *base,
                (b"accept", b"application/json"),
                (b"user-agent", b"kproxy-http2-bench"),
                *auth,
            ]
            for _ in range(spec.streams):
                sid = conn.get_next_available_stream_id()
                conn.send_headers(sid, headers, end_stream=True)
                self.watchers[sid] = Watcher(self.stats, b"", self.loop.create_future())
            self.pending = spec.streams
        else:
            if spec.mode == "unfinished":
                headers = [
                    (b":method", b"POST"),
                    *base,
                    (b"content-type", b"application/json"),
                    (b"content-length", b"1000"),
                    (b"user-agent", b"kproxy-http2-bench"),
                    *auth,
                ]
                for _ in range(spec.streams):
                    sid = conn.get_next_available_stream_id()
                    conn.send_headers(sid, headers)
                    conn.send_data(sid, b'{"kind": "')
            conn.ping(_PING)
            self.pending = 1
        if not spec.streams and spec.mode == "watch":
            self._done()
        self.flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.h2.receive_data(data)
        except Exception as e:  # a protocol error from the server's side: this connection fails
            self.failed[type(e).__name__] += 1
            self._done()
            self.transport.abort()
            return
        for ev in events:
            if isinstance(ev, h2.events.DataReceived):
                w = self.watchers.get(ev.stream_id)
                if w is not None:
                    w.body(ev.data)
                if ev.flow_controlled_length:
                    self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.ResponseReceived):
                status = dict(ev.headers or ()).get(b":status", b"?")
                if status != b"200":
                    self.failed[f"HTTP {status.decode(errors='replace')}"] += 1
                    self.watchers.pop(ev.stream_id, None)
                self._answered()
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                w = self.watchers.pop(ev.stream_id, None)
                if w is not None and time.time() < self.stats.end_at:
                    why = "stream ended" if isinstance(ev, h2.events.StreamEnded) else "stream reset"
                    self.stats.closed_early[why] += 1
            elif isinstance(ev, h2.events.PingAckReceived):
                self._answered()
            elif isinstance(ev, h2.events.ConnectionTerminated) and not self.ready.done():
                self.failed[f"GOAWAY {ev.error_code!s}"] += 1
                self._done()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.failed[type(exc).__name__ if exc else "closed before the answers"] += 1
            self._done()
        elif self.watchers and time.time() < self.stats.end_at:
            self.stats.closed_early[type(exc).__name__ if exc else "connection closed"] += len(self.watchers)
        self.watchers.clear()

    # ------------------------------------------------------------------ helpers

    def _answered(self) -> None:
        self.pending -= 1
        if self.pending <= 0:
            self._done()

    def _done(self) -> None:
        if not self.ready.done():
            self.ready.set_result(None)

    def flush(self) -> None:
        out = self.h2.data_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    @property
    def ok_streams(self) -> int:
        if self.spec.mode == "watch":
            return len(self.watchers)
        return self.spec.streams if not self.failed else 0


async def run(spec: H2ClientSpec, conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    ctx = ssl.create_default_context(cafile=spec.ca)
    ctx.set_alpn_protocols(["h2"])
    stats = Stats()
    conns: list[H2Conn] = []
    failed: Counter[str] = Counter()
    sem = asyncio.Semaphore(spec.connect_concurrency)

    async def connect() -> None:
        async with sem:
            c = H2Conn(spec, stats, loop)
            try:
                async with asyncio.timeout(_CONNECT_TIMEOUT):
                    await loop.create_connection(lambda: c, spec.host, spec.port, ssl=ctx)
                    await c.ready
            except (OSError, TimeoutError, ssl.SSLError) as e:
                failed["timeout" if isinstance(e, TimeoutError) else type(e).__name__] += spec.streams or 1
                if c.transport is not None:
                    c.transport.abort()
                return
            failed.update(c.failed)
            conns.append(c)

    t0 = time.monotonic()
    await asyncio.gather(*(connect() for _ in range(spec.connections)))
    ok = sum(c.ok_streams for c in conns) if spec.streams else len(conns)
    conn.send(Connected(ok, dict(failed), time.monotonic() - t0))

    window = await recv(conn)
    assert isinstance(window, tuple)
    stats.start_at, stats.end_at = window
    await asyncio.sleep(max(0.0, stats.end_at - time.time()) + 0.05)
    per = sorted(w.events for c in conns for w in c.watchers.values()) or [0]
    conn.send(
        ClientResult(
            events=stats.events,
            unreadable=stats.unreadable,
            payload_bytes=stats.payload_bytes,
            histogram={i: n for i, n in enumerate(stats.hist) if n},
            closed_early=dict(stats.closed_early),
            min_per_watcher=per[0],
            max_per_watcher=per[-1],
            reads_with_events=stats.reads,
        )
    )
    await recv(conn)  # "close"
    for c in conns:
        if c.transport is not None:
            c.transport.abort()
    await asyncio.sleep(0)


def client_main(spec: H2ClientSpec, conn: Connection) -> None:
    """Entry point of one client process (``multiprocessing`` spawn target)."""
    import uvloop

    raise_nofile()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(run(spec, conn))
