"""The HTTP/2 client pool to the upstream against an in-process h2 server (TLS, ALPN): stream
limits, GOAWAY, flow control both ways, resets, PING health, header encoding."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest

from kproxy.localcluster import certs
from kproxy.server.http2.client import STREAM_WINDOW, H2Pool, H2Unavailable, request_fields
from kproxy.server.httputil import InvalidRequestHead
from kproxy.server.pool import NotSent, UpstreamClosed
from kproxy.testing.eventually import eventually_async


class Req:
    """A request as the server got it."""

    def __init__(self, conn: ServerConn, sid: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.conn = conn
        self.sid = sid
        self.headers = headers
        self.body = bytearray()
        self.ended = asyncio.Event()
        self.reset: h2.errors.ErrorCodes | None = None
        self.reset_seen = asyncio.Event()

    def header(self, name: bytes) -> bytes | None:
        return next((v for k, v in self.headers if k == name), None)

    async def respond(
        self, status: int = 200, headers: tuple[tuple[bytes, bytes], ...] = (), body: bytes = b""
    ) -> None:
        c = self.conn
        c.h2.send_headers(self.sid, [(b":status", str(status).encode()), *headers], end_stream=not body)
        c.flush()
        if body:
            await c.send(self.sid, body, end=True)


Handler = Callable[[Req], Awaitable[None]]


class ServerConn(asyncio.Protocol):
    def __init__(self, server: H2Server) -> None:
        self.server = server
        # Sends what the test says, even what h2 would refuse to send.
        cfg = h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_outbound_headers=False, normalize_outbound_headers=False
        )
        self.h2 = h2.connection.H2Connection(cfg)
        self.reqs: dict[int, Req] = {}
        self.transport: asyncio.Transport | None = None
        self.window_waiters: list[asyncio.Future[None]] = []
        self.frozen = False  # reads nothing more (no PING answer)
        self.sent_data = 0
        self.window_exhausted = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: self.server.max_streams},
        )
        self.h2.initiate_connection()
        self.flush()
        self.server.conns.append(self)

    def flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        if self.frozen:
            return
        for ev in self.h2.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived):
                req = Req(self, ev.stream_id, list(ev.headers))
                self.reqs[ev.stream_id] = req
                self.server.requests.append(req)
                if ev.stream_ended is not None:
                    req.ended.set()
                self.server.tasks.add(asyncio.ensure_future(self.server.handler(req)))
            elif isinstance(ev, h2.events.DataReceived):
                req = self.reqs[ev.stream_id]
                req.body += ev.data
                if self.server.ack_request_data:
                    self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                self.reqs[ev.stream_id].ended.set()
            elif isinstance(ev, h2.events.StreamReset):
                req = self.reqs[ev.stream_id]
                req.reset = ev.error_code
                req.reset_seen.set()
            elif isinstance(ev, h2.events.WindowUpdated):
                for w in self.window_waiters:
                    if not w.done():
                        w.set_result(None)
                self.window_waiters.clear()
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        for w in self.window_waiters:
            if not w.done():
                w.set_exception(ConnectionResetError())

    async def send(self, sid: int, data: bytes, end: bool) -> None:
        view = memoryview(data)
        while view:
            n = min(self.h2.local_flow_control_window(sid), self.h2.max_outbound_frame_size, len(view))
            if n <= 0:
                self.window_exhausted.set()
                w = asyncio.get_running_loop().create_future()
                self.window_waiters.append(w)
                await w
                continue
            self.h2.send_data(sid, view[:n].tobytes())
            self.sent_data += n
            view = view[n:]
            self.flush()
        if end:
            self.h2.end_stream(sid)
            self.flush()

    def goaway(self, last_stream_id: int) -> None:
        self.h2.close_connection(last_stream_id=last_stream_id)
        self.flush()
        # Go's server finishes the streams up to last_stream_id after its GOAWAY; h2 alone
        # would refuse to send on them.
        self.h2.state_machine.state = h2.connection.ConnectionState.SERVER_OPEN


class H2Server:
    def __init__(self, tmp: Path, handler: Handler, max_streams: int = 100, alpn: tuple[str, ...] = ("h2",)) -> None:
        self.handler = handler
        self.max_streams = max_streams
        self.alpn = alpn
        self.conns: list[ServerConn] = []
        self.requests: list[Req] = []
        self.tasks: set[asyncio.Future[None]] = set()
        self.ack_request_data = True
        ca = certs.generate_ca("h2-test-ca")
        leaf = certs.generate_serving_cert(ca, ["127.0.0.1"])
        self.ca_pem = ca.cert_pem
        self.crt = certs.write_pem(tmp / "srv.crt", leaf.cert_pem, private=False)
        self.key = certs.write_pem(tmp / "srv.key", leaf.key_pem, private=True)

    async def __aenter__(self) -> H2Server:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(str(self.crt), str(self.key))
        ctx.set_alpn_protocols(list(self.alpn))
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: ServerConn(self), "127.0.0.1", 0, ssl=ctx)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    def pool(self) -> H2Pool:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cadata=self.ca_pem.decode())
        return H2Pool("127.0.0.1", self.port, H2Pool.alpn_context(ctx), "127.0.0.1", 5.0)


async def _echo(req: Req) -> None:
    await req.ended.wait()
    body = b"\n".join(b"%s: %s" % kv for kv in req.headers) + b"\nbody=" + bytes(req.body)
    await req.respond(200, ((b"content-type", b"text/plain"), (b"x-kube-thing", b"v")), body)


async def test_request_and_response_fields(tmp_path: Path) -> None:
    async with H2Server(tmp_path, _echo) as srv:
        pool = srv.pool()
        headers = [
            ("User-Agent", "kubectl/v1.37"),
            ("Connection", "keep-alive"),
            ("Keep-Alive", "timeout=5"),
            ("TE", "gzip"),
            ("X-Odd", "caf\udcc3\udca9 bytes"),  # a non-UTF-8 byte pair read with surrogateescape
            ("Authorization", "Bearer secret"),
        ]
        resp = await pool.request("POST", "/api/v1/namespaces?x=1", headers, b"hello", None)
        assert resp.status == 200 and resp.reason == "OK"
        # Go's client canonicalizes the names (CanonicalMIMEHeaderKey), as its HTTP/1.1 server writes them.
        assert list(resp.headers.keys()) == ["Content-Type", "X-Kube-Thing"]
        body = await resp.read()
        got = srv.requests[0].headers
        assert got[:4] == [
            (b":authority", f"127.0.0.1:{srv.port}".encode()),
            (b":method", b"POST"),
            (b":path", b"/api/v1/namespaces?x=1"),
            (b":scheme", b"https"),
        ]
        names = [k for k, _ in got]
        assert b"connection" not in names and b"keep-alive" not in names and b"te" not in names
        assert (b"x-odd", b"caf\xc3\xa9 bytes") in got  # the bytes as they came, lower-cased name
        assert (b"content-length", b"5") in got
        assert (b"authorization", b"Bearer secret") in got
        assert body.endswith(b"body=hello")
        pool.close()


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ([("X-A", "a\r\nX-Injected: 1")], 'invalid HTTP header value for header "X-A"'),
        ([("X-A", "nul\x00")], 'invalid HTTP header value for header "X-A"'),
        ([("Bad Name", "v")], 'invalid HTTP header name "Bad Name"'),
        ([("X-A", "lone \ud800")], 'invalid HTTP header value for header "X-A"'),
    ],
)
async def test_refused_heads_write_nothing(tmp_path: Path, headers: list[tuple[str, str]], message: str) -> None:
    async with H2Server(tmp_path, _echo) as srv:
        pool = srv.pool()
        with pytest.raises(InvalidRequestHead) as err:
            await pool.request("GET", "/api", headers, None, None)
        assert str(err.value) == message
        assert "Injected" not in str(err.value)
        # Nothing was written: no connection was even needed.
        assert pool.dials == 0 and srv.requests == []
        # The pool still works (no HPACK state was touched).
        resp = await pool.request("GET", "/api", [("X-A", "fine")], None, None)
        assert resp.status == 200
        pool.close()


def test_request_fields_refuses_what_go_refuses() -> None:
    with pytest.raises(InvalidRequestHead, match="invalid method"):
        request_fields("GE T", "/", "h", [])
    with pytest.raises(InvalidRequestHead, match="invalid request :path"):
        request_fields("GET", "api", "h", [])
    with pytest.raises(InvalidRequestHead, match="invalid request :path"):
        request_fields("GET", "/a\x7fb", "h", [])
    with pytest.raises(InvalidRequestHead, match="invalid Host header"):
        request_fields("GET", "/", "h\x00", [])
    # TE: trailers is the one TE HTTP/2 carries.
    fields = request_fields("GET", "/", "h", [("TE", "trailers"), ("Upgrade", "x"), ("Host", "other")])
    assert [(bytes(k), bytes(v)) for k, v in fields[4:]] == [(b"te", b"trailers")]
    # Credentials never enter the HPACK table.
    auth = next(f for f in request_fields("GET", "/", "h", [("Authorization", "Bearer t")]) if f[0] == b"authorization")
    assert not auth.indexable


def test_request_fields_are_the_same_for_names_seen_before() -> None:
    """Names are remembered once checked: a second request with them gives the same fields, and
    a name never seen is still checked (a bad one refused even beside known ones)."""
    headers = [
        ("Accept", "application/json"),
        ("AUTHORIZATION", "Bearer t"),
        ("Te", "gzip"),
        ("TE", "trailers"),
        ("Keep-Alive", "1"),
        ("Content-Length", "9"),
        ("Impersonate-User", "alice"),
    ]
    first = request_fields("POST", "/a", "h", headers, 3)
    second = request_fields("POST", "/a", "h", headers, 3)
    assert first == second
    assert [type(f).__name__ for f in first] == [type(f).__name__ for f in second]
    assert [(k, v) for k, v in first[4:]] == [
        (b"accept", b"application/json"),
        (b"authorization", b"Bearer t"),
        (b"te", b"trailers"),
        (b"impersonate-user", b"alice"),
        (b"content-length", b"3"),
    ]
    assert [getattr(f, "indexable", True) for f in first[4:]] == [True, False, True, True, True]
    with pytest.raises(InvalidRequestHead, match="invalid HTTP header name"):
        request_fields("GET", "/", "h", [*headers, ("X Y", "1")])
    with pytest.raises(InvalidRequestHead, match="invalid HTTP header value for header"):
        request_fields("GET", "/", "h", [*headers, ("Accept", "a\rb")])


async def test_stream_limit_opens_a_second_connection_and_never_blocks(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def held(req: Req) -> None:
        await release.wait()
        await req.respond(200, body=b"ok")

    async with H2Server(tmp_path, held, max_streams=3) as srv:
        pool = srv.pool()
        tasks = [asyncio.ensure_future(pool.request("GET", f"/r{i}", [], None, None)) for i in range(7)]
        # Every request reaches the server while none has been answered: 3 + 3 + 1 streams.
        await eventually_async(lambda: len(srv.requests) == 7, 10, "all 7 requests to arrive unanswered", 0.005)
        assert len(srv.conns) == 3
        assert sorted(len(c.reqs) for c in srv.conns) == [1, 3, 3]
        release.set()
        for resp in await asyncio.gather(*tasks):
            assert await resp.read() == b"ok"
        # Freed streams are reused: more requests open no connection.
        for resp in await asyncio.gather(*(pool.request("GET", "/again", [], None, None) for _ in range(6))):
            await resp.read()
        assert len(srv.conns) == 3
        pool.close()


async def test_goaway_resends_unprocessed_streams_on_a_new_connection(tmp_path: Path) -> None:
    first_conn_streams: list[Req] = []
    gate = asyncio.Event()

    async def handler(req: Req) -> None:
        if len(srv.conns) == 1:
            first_conn_streams.append(req)
            await gate.wait()
            if req.sid == first_conn_streams[0].sid:
                await req.ended.wait()
                await req.respond(200, body=b"first, finished after GOAWAY")
            return
        await _echo(req)

    async with H2Server(tmp_path, handler) as srv:
        pool = srv.pool()
        first = asyncio.ensure_future(pool.request("GET", "/first", [], None, None))
        await eventually_async(lambda: len(first_conn_streams) == 1, 10, "the first stream", 0.005)
        others = [
            asyncio.ensure_future(pool.request("GET", "/get", [], None, None)),
            asyncio.ensure_future(pool.request("POST", "/create", [("Content-Type", "x")], b"created once", None)),
        ]
        await eventually_async(lambda: len(first_conn_streams) == 3, 10, "three streams on the first connection", 0.005)
        srv.conns[0].goaway(last_stream_id=first_conn_streams[0].sid)
        gate.set()
        # The stream the server processes finishes on the old connection ...
        resp = await first
        assert await resp.read() == b"first, finished after GOAWAY"
        # ... the others were sent again, on a new connection, once each.
        get, post = await asyncio.gather(*others)
        assert (await get.read()).endswith(b"body=")
        assert (await post.read()).endswith(b"body=created once")
        assert len(srv.conns) == 2
        second = [r for r in srv.requests if r.conn is srv.conns[1]]
        assert sorted(r.header(b":path") or b"" for r in second) == [b"/create", b"/get"]
        # New requests go to the new connection.
        await (await pool.request("GET", "/new", [], None, None)).read()
        assert srv.requests[-1].conn is srv.conns[1]
        pool.close()


async def test_goaway_for_a_streamed_body_already_sent_is_not_sent(tmp_path: Path) -> None:
    arrived = asyncio.Event()

    async def handler(req: Req) -> None:
        arrived.set()

    async def body() -> Any:
        yield b"part one"
        await asyncio.sleep(3600)

    async with H2Server(tmp_path, handler) as srv:
        pool = srv.pool()
        task = asyncio.ensure_future(pool.request("POST", "/stream", [], body(), None))
        await arrived.wait()
        await eventually_async(lambda: bytes(srv.requests[0].body) == b"part one", 10, "the first part", 0.005)
        srv.conns[0].goaway(last_stream_id=0)
        with pytest.raises(NotSent):
            await task
        assert len(srv.requests) == 1  # never sent twice: its body cannot be sent again
        pool.close()


async def test_slow_consumer_holds_one_window_per_stream(tmp_path: Path) -> None:
    total = 16 * STREAM_WINDOW
    payload = bytes(range(256)) * (total // 256)

    async def big(req: Req) -> None:
        req.conn.h2.send_headers(req.sid, [(b":status", b"200")])
        await req.conn.send(req.sid, payload, end=True)

    async with H2Server(tmp_path, big) as srv:
        pool = srv.pool()
        resp = await pool.request("GET", "/watch", [], None, None)
        conn = srv.conns[0]
        # Nobody reads: the server runs out of window after one stream window.
        await asyncio.wait_for(conn.window_exhausted.wait(), 10)
        assert conn.sent_data <= STREAM_WINDOW
        st = resp._stream
        await eventually_async(lambda: st.buffered == conn.sent_data, 10, "the window's data to arrive", 0.005)
        assert st.buffered <= STREAM_WINDOW
        # Reading gives the window back, bit by bit; the body arrives whole and in order.
        got = bytearray()
        async for chunk in resp.chunks():
            got += chunk
            assert st.buffered <= STREAM_WINDOW
        assert bytes(got) == payload
        pool.close()


async def test_close_before_the_end_resets_the_stream(tmp_path: Path) -> None:
    async def endless(req: Req) -> None:
        req.conn.h2.send_headers(req.sid, [(b":status", b"200")])
        req.conn.h2.send_data(req.sid, b'{"type":"ADDED"}\n')
        req.conn.flush()

    async with H2Server(tmp_path, endless) as srv:
        pool = srv.pool()
        resp = await pool.request("GET", "/watch?watch=1", [], None, None)
        chunks = resp.chunks()
        assert await chunks.__anext__() == b'{"type":"ADDED"}\n'
        resp.close()
        req = srv.requests[0]
        await asyncio.wait_for(req.reset_seen.wait(), 10)
        assert req.reset == h2.errors.ErrorCodes.CANCEL
        # The connection carries on.
        srv.handler = _echo
        assert (await pool.request("GET", "/next", [], None, None)).status == 200
        assert len(srv.conns) == 1
        pool.close()


async def test_request_body_under_flow_control(tmp_path: Path) -> None:
    size = 5 * 1024 * 1024 + 7
    data = bytes(i % 251 for i in range(size))
    async with H2Server(tmp_path, _echo) as srv:
        srv.ack_request_data = False  # the server takes nothing until told to
        pool = srv.pool()
        task = asyncio.ensure_future(pool.request("PUT", "/big", [], data, None))
        await eventually_async(
            lambda: bool(srv.requests) and len(srv.requests[0].body) == 65535, 10, "one initial window", 0.005
        )
        await asyncio.sleep(0)
        assert not task.done() and len(srv.requests[0].body) == 65535  # stopped at the window
        srv.ack_request_data = True
        req = srv.requests[0]
        req.conn.h2.acknowledge_received_data(65535, req.sid)
        req.conn.flush()
        resp = await asyncio.wait_for(task, 30)
        assert (await resp.read()).endswith(b"body=" + data)
        pool.close()


async def test_unanswered_ping_closes_the_connection(tmp_path: Path) -> None:
    async def silent(req: Req) -> None:
        req.conn.frozen = True  # reads nothing more: a dead peer

    async with H2Server(tmp_path, silent) as srv:
        pool = srv.pool()
        pool.read_idle_timeout = 0.3
        pool.ping_timeout = 0.3
        with pytest.raises(UpstreamClosed, match="PING"):
            await asyncio.wait_for(pool.request("POST", "/hangs", [], b"x", None), 10)
        assert pool.conns == []
        pool.close()


async def test_upstream_without_h2_is_reported(tmp_path: Path) -> None:
    async with H2Server(tmp_path, _echo, alpn=("http/1.1",)) as srv:
        pool = srv.pool()
        with pytest.raises(H2Unavailable):
            await pool.request("GET", "/", [], None, None)
        assert pool.unavailable
        pool.close()


async def test_concurrent_identities_never_mix(tmp_path: Path) -> None:
    async with H2Server(tmp_path, _echo) as srv:
        pool = srv.pool()

        async def one(i: int) -> None:
            headers = [("Authorization", f"Bearer token-{i}"), ("Impersonate-User", f"user-{i}")]
            headers += [("Impersonate-Group", f"group-{i}-{g}") for g in range(i % 4)]
            resp = await pool.request("GET", f"/who/{i}", headers, None, None)
            text = await resp.read()
            lines = [line for line in text.split(b"\n") if not line.startswith(b":")]
            mine = sorted(line for line in lines if line.startswith((b"authorization", b"impersonate")))
            expected = [b"authorization: Bearer token-%d" % i, b"impersonate-user: user-%d" % i]
            expected += [b"impersonate-group: group-%d-%d" % (i, g) for g in range(i % 4)]
            assert mine == sorted(expected)

        await asyncio.gather(*(one(i) for i in range(60)))
        assert len(srv.conns) == 1
        pool.close()


async def test_abandoned_streams_give_the_connection_window_back(tmp_path: Path) -> None:
    async def window_full(req: Req) -> None:
        # Every other response is whole (ended) but never read; the others are cut off.
        req.conn.h2.send_headers(req.sid, [(b":status", b"200")])
        await req.conn.send(req.sid, b"w" * STREAM_WINDOW, end=req.sid % 4 == 1)

    async with H2Server(tmp_path, window_full) as srv:
        pool = srv.pool()
        pool.connection_window = STREAM_WINDOW  # one stream's worth for the whole connection
        for i in range(4):
            # Each stream fills the connection's whole window; nobody reads it; it is abandoned.
            # Were its data not counted back, the next stream would never receive a byte.
            resp = await pool.request("GET", f"/w{i}", [], None, None)
            st = resp._stream
            await eventually_async(lambda st=st: st.buffered == STREAM_WINDOW, 10, f"stream {i}'s data", 0.005)  # type: ignore[misc]
            resp.close()
        assert len(srv.conns) == 1
        pool.close()


async def test_a_burst_beyond_every_connection_is_never_refused(tmp_path: Path) -> None:
    release = asyncio.Event()

    async def held(req: Req) -> None:
        await release.wait()
        await req.respond(200, body=b"ok")

    async with H2Server(tmp_path, held, max_streams=10) as srv:
        pool = srv.pool()
        tasks = [asyncio.ensure_future(pool.request("GET", f"/b{i}", [], None, None)) for i in range(95)]
        await eventually_async(lambda: len(srv.requests) == 95, 10, "the whole burst at the server", 0.005)
        assert len(srv.conns) == 10
        release.set()
        assert [r.status for r in await asyncio.gather(*tasks)] == [200] * 95
        pool.close()


async def test_upstream_falls_back_to_http11_when_h2_is_not_offered(tmp_path: Path) -> None:
    from kproxy.server.kubeconfig import UpstreamTarget
    from kproxy.server.upstream import Upstream
    from kproxy.testing.exchange import make_exchange

    ca = certs.generate_ca("h1-ca")
    leaf = certs.generate_serving_cert(ca, ["127.0.0.1"])
    crt = certs.write_pem(tmp_path / "h1.crt", leaf.cert_pem, private=False)
    key = certs.write_pem(tmp_path / "h1.key", leaf.key_pem, private=True)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(crt), str(key))
    ctx.set_alpn_protocols(["http/1.1"])
    lines: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines.append(head.split(b"\r\n")[0])
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nh1")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=ctx)
    port = server.sockets[0].getsockname()[1]
    up = Upstream(UpstreamTarget(server=f"https://127.0.0.1:{port}", ca_pem=ca.cert_pem))
    await up.start()
    try:
        for _ in range(2):
            reply = await up(make_exchange("GET", "/api", []))
            assert reply.status == 200
        assert up._h2 is not None and up._h2.unavailable and up._h2.dials == 1  # asked once
        assert lines == [b"GET /api HTTP/1.1", b"GET /api HTTP/1.1"]
    finally:
        await up.close()
        server.close()


@pytest.mark.parametrize(
    "bad",
    [
        (b"x-a", b"one\r\nx-injected: 1"),
        (b"x-a", b"nul\x00"),
        (b"X-Upper", b"v"),
        (b":path", b"/pseudo-in-a-response"),
    ],
)
async def test_malformed_response_heads_reset_the_stream(tmp_path: Path, bad: tuple[bytes, bytes]) -> None:
    async def answer(req: Req) -> None:
        if req.header(b":path") == b"/bad":  # the head, and the stream left open
            req.conn.h2.send_headers(req.sid, [(b":status", b"200"), bad])
            req.conn.flush()
        else:
            await req.respond(200, body=b"fine")

    async with H2Server(tmp_path, answer) as srv:
        pool = srv.pool()
        with pytest.raises(UpstreamClosed, match="malformed response header"):
            await pool.request("GET", "/bad", [], None, None)
        req = srv.requests[0]
        await asyncio.wait_for(req.reset_seen.wait(), 10)
        assert req.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR  # as Go's client resets it
        # Only that stream: the connection serves the next request.
        assert await (await pool.request("GET", "/good", [], None, None)).read() == b"fine"
        assert len(srv.conns) == 1
        pool.close()


async def test_content_reads_frames_and_lines_across_chunks() -> None:
    from kproxy.server.http2.client import Content

    async def chunks(*parts: bytes) -> Any:
        for p in parts:
            yield p

    content = Content(chunks(b"\x00\x00", b"\x00\x03ab", b'c{"a":1}\n{"b"', b":2}\n", b"tail"))
    assert await content.readexactly(4) == b"\x00\x00\x00\x03"
    assert await content.readexactly(3) == b"abc"
    assert [line async for line in content] == [b'{"a":1}\n', b'{"b":2}\n', b"tail"]
    # At a clean end of stream: IncompleteReadError with nothing read, as aiohttp's reader raises it
    # (the watch cache's protobuf framing ends there).
    with pytest.raises(asyncio.IncompleteReadError) as err:
        await content.readexactly(4)
    assert err.value.partial == b""
    cut = Content(chunks(b"\x00\x00\x00\x09", b"short"))
    await cut.readexactly(4)
    with pytest.raises(asyncio.IncompleteReadError) as err:
        await cut.readexactly(9)
    assert err.value.partial == b"short"


async def test_upstream_sends_callers_requests_on_h2_and_refuses_what_go_would(tmp_path: Path) -> None:
    from kproxy.core.status import StatusError
    from kproxy.server.kubeconfig import UpstreamTarget
    from kproxy.server.upstream import Upstream
    from kproxy.testing.exchange import make_exchange

    async with H2Server(tmp_path, _echo) as srv:
        target = UpstreamTarget(server=f"https://127.0.0.1:{srv.port}/gw/", ca_pem=srv.ca_pem)
        up = Upstream(target)
        await up.start()
        try:
            for value in ("a\x00b", "a\x7f", "a\x1bb", "a\r\nImpersonate-Group: system:masters"):
                with pytest.raises(StatusError) as err:
                    await up(make_exchange("POST", "/api/v1/pods", [("X-Caller", value)], b"{}"))
                assert err.value.code == 400
                assert 'invalid HTTP header value for header "X-Caller"' in err.value.message
            assert srv.requests == []  # nothing was written
            reply = await up(make_exchange("POST", "/api/v1/pods?x=1", [("X-Caller", "a\tb ü")], b"{}"))
            assert reply.status == 200
            got = srv.requests[0]
            assert got.header(b":path") == b"/gw/api/v1/pods?x=1"  # the server URL's path prefix
            assert got.header(b"x-caller") == "a\tb ü".encode()
            assert got.header(b"content-length") == b"2" and bytes(got.body) == b"{}"
        finally:
            await up.close()
