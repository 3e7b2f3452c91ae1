"""The upstream connection pool against a tiny local HTTP/1.1 server (framing, reuse, failures)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from kproxy.core.status import StatusError, request_entity_too_large
from kproxy.server.pool import Pool, UpstreamClosed
from kproxy.testing.eventually import eventually_async
from kproxy.testing.exchange import make_exchange

Handler = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []

    async def __aenter__(self) -> Server:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                await self.handler(head, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def read_body(head: bytes, reader: asyncio.StreamReader) -> bytes:
    text = head.decode().lower()
    if "transfer-encoding: chunked" in text:
        out = b""
        while True:
            size = int((await reader.readline()).strip(), 16)
            if size == 0:
                await reader.readline()
                return out
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    for line in text.split("\r\n"):
        if line.startswith("content-length:"):
            return await reader.readexactly(int(line.split(":")[1]))
    return b""


def pool_for(srv: Server) -> Pool:
    return Pool("127.0.0.1", srv.port, None, None, 5.0)


async def test_keep_alive_reuse_and_framing() -> None:
    async def ok(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_body(head, reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-A: 1\r\nX-A: 2\r\n\r\n%s" % (len(body), body))

    async with Server(ok) as srv:
        pool = pool_for(srv)
        for i in range(3):
            resp = await pool.request("POST", "/x?y=%2F", [("Content-Type", "application/json")], b"body%d" % i, None)
            assert resp.status == 200 and resp.reason == "OK"
            assert resp.headers.getall("X-A") == ["1", "2"]
            assert await resp.read() == b"body%d" % i
        assert srv.connections == 1
        assert srv.heads[0].startswith(b"POST /x?y=%2F HTTP/1.1\r\nHost: 127.0.0.1:")
        pool.close()


async def test_read_whole_or_in_pieces_gives_the_connection_back() -> None:
    """read() takes a body that arrived whole at once, and waits for one that comes in pieces;
    either way the connection serves the next request."""

    async def answer(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if head.startswith(b"GET /pieces"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nabc")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"def")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nwhole")

    async with Server(answer) as srv:
        pool = pool_for(srv)
        for path, body in (("/whole", b"whole"), ("/pieces", b"abcdef"), ("/whole", b"whole")):
            resp = await pool.request("GET", path, [], None, None)
            assert await resp.read() == body
            assert len(pool.idle) == 1 and not pool.busy
        assert srv.connections == 1
        pool.close()


async def gen(*chunks: bytes) -> AsyncIterator[bytes]:
    for c in chunks:
        await asyncio.sleep(0)
        yield c


async def test_streamed_request_body_chunked_or_with_length() -> None:
    async def echo(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await read_body(head, reader)
        writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    async with Server(echo) as srv:
        pool = pool_for(srv)
        resp = await pool.request("POST", "/", [], gen(b"ab", b"", b"cd"), None)
        assert await resp.read() == b"abcd"
        assert b"Transfer-Encoding: chunked" in srv.heads[-1]
        resp = await pool.request("PUT", "/", [], gen(b"ab", b"cd"), 4)
        assert await resp.read() == b"abcd"
        assert b"Content-Length: 4" in srv.heads[-1]
        pool.close()


async def test_streamed_response_arrives_chunk_by_chunk_and_abandon_closes() -> None:
    gate = asyncio.Event()

    async def watch(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await gate.wait()
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")

    async with Server(watch) as srv:
        pool = pool_for(srv)
        resp = await pool.request("GET", "/watch", [], None, None)
        it = resp.chunks()
        assert await it.__anext__() == b"first"  # before the server sends the rest
        gate.set()
        assert await it.__anext__() == b"second"
        with pytest.raises(StopAsyncIteration):
            await it.__anext__()
        assert len(pool.idle) == 1
        resp.close()  # after the end: must not close the pooled connection
        assert len(pool.idle) == 1
        gate.clear()
        resp2 = await pool.request("GET", "/watch", [], None, None)
        assert await resp2.chunks().__anext__() == b"first"
        resp2.close()  # abandoned mid-stream: the connection is dropped
        assert not pool.idle and not pool.busy
        pool.close()


async def test_what_arrived_while_the_reader_was_away_comes_as_one_chunk() -> None:
    """Several HTTP chunks that arrived before the body is read again (a watch's events of one
    loop pass) are handed on joined, in order; the next read still gets what comes later."""
    gate = asyncio.Event()

    async def watch(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await gate.wait()
        for event in (b"two\n", b"three\n", b"four\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
        writer.write(b"4\r\nlast\r\n0\r\n\r\n")

    async with Server(watch) as srv:
        pool = pool_for(srv)
        resp = await pool.request("GET", "/watch", [], None, None)
        conn = resp._conn
        it = resp.chunks()
        assert await it.__anext__() == b"first"
        gate.set()
        # Every chunk is in before the reader comes back.
        await eventually_async(lambda: conn.complete, 5, "the whole response read", 0.01)
        assert len(conn.chunks) > 1
        assert await it.__anext__() == b"two\nthree\nfour\nlast"
        assert conn.buffered == 0
        with pytest.raises(StopAsyncIteration):
            await it.__anext__()
        assert len(pool.idle) == 1
        pool.close()


async def test_body_delimited_by_close_and_premature_close() -> None:
    async def until_close(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if b"/short" in head:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    async with Server(until_close) as srv:
        pool = pool_for(srv)
        assert await (await pool.request("GET", "/", [], None, None)).read() == b"all of it"
        resp = await pool.request("GET", "/short", [], None, None)
        with pytest.raises(UpstreamClosed):
            await resp.read()
        pool.close()


async def test_stale_idle_connection_is_retried_once() -> None:
    served = 0

    async def once(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        served += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # the server drops keep-alive connections after each response

    async with Server(once) as srv:
        pool = pool_for(srv)
        assert await (await pool.request("GET", "/", [], None, None)).read() == b"ok"
        await asyncio.sleep(0.05)  # let the close arrive
        assert await (await pool.request("GET", "/", [], None, None)).read() == b"ok"
        assert served == 2
        pool.close()


async def test_a_create_on_a_dead_connection_is_never_sent_twice() -> None:
    seen = 0

    async def drop(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        seen += 1
        if seen == 1:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            return
        await read_body(head, reader)
        writer.close()  # took the POST, then died without answering

    async with Server(drop) as srv:
        pool = pool_for(srv)
        assert await (await pool.request("GET", "/", [], None, None)).read() == b"ok"
        with pytest.raises(OSError):
            await pool.request("POST", "/", [], b"{}", None)
        assert seen == 2  # not retried
        pool.close()


async def test_body_limit_error_propagates_and_drops_the_connection() -> None:
    async def never(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_body(head, reader)

    async def too_big() -> AsyncIterator[bytes]:
        yield b"x" * 10
        raise request_entity_too_large(5)

    async with Server(never) as srv:
        pool = pool_for(srv)
        with pytest.raises(StatusError):
            await pool.request("POST", "/", [], too_big(), None)
        assert not pool.idle and not pool.busy
        pool.close()


async def test_connect_refused_is_an_oserror() -> None:
    pool = Pool("127.0.0.1", 1, None, None, 2.0)
    with pytest.raises(OSError):
        await pool.request("GET", "/", [], None, None)


async def test_max_connections_bounds_connections_in_use() -> None:
    gate = asyncio.Event()

    async def slow(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await gate.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async with Server(slow) as srv:
        pool = Pool("127.0.0.1", srv.port, None, None, 5.0, max_connections=2)

        async def get() -> bytes:
            return await (await pool.request("GET", "/", [], None, None)).read()

        tasks = [asyncio.ensure_future(get()) for _ in range(5)]
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert srv.connections == 2  # the other three wait for a free connection
        gate.set()
        assert await asyncio.gather(*tasks) == [b"ok"] * 5
        assert srv.connections == 2  # and then reuse the two
        pool.close()


async def test_upstream_server_url_path_prefix_and_error_count() -> None:
    """A kubeconfig server URL with a path (an apiserver behind a path-routing gateway) prefixes
    every request, on the pool (HEAD too) and the upgrade path alike; an unreachable
    upstream is counted once, as the upstream's failure."""

    from kproxy.core.chain import Exchange
    from kproxy.server.kubeconfig import UpstreamTarget
    from kproxy.server.upstream import Upstream

    async def answer(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if b"Upgrade: x" in head:
            writer.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 2\r\n\r\nno")
        elif head.startswith(b"HEAD "):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")  # no body for HEAD
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def ex(method: str, target: str, upgrade: bool = False) -> Exchange:
        headers = [("Connection", "Upgrade"), ("Upgrade", "x")] if upgrade else []
        return make_exchange(method, target, headers, upgrade=upgrade)

    async with Server(answer) as srv:
        up = Upstream(UpstreamTarget(server=f"http://127.0.0.1:{srv.port}/gw/c1/"))
        await up.start()
        try:
            assert (await up(ex("GET", "/api/v1/pods?labelSelector=a%3Db"))).status == 200
            assert (await up(ex("HEAD", "/api"))).status == 200
            assert (await up(ex("GET", "/api/v1/namespaces/n/pods/p/exec", upgrade=True))).status == 400
        finally:
            await up.close()
        lines = [h.split(b"\r\n")[0] for h in srv.heads]
        assert lines == [
            b"GET /gw/c1/api/v1/pods?labelSelector=a%3Db HTTP/1.1",
            b"HEAD /gw/c1/api HTTP/1.1",
            b"GET /gw/c1/api/v1/namespaces/n/pods/p/exec HTTP/1.1",
        ]

    errors: list[str] = []
    dead = Upstream(UpstreamTarget(server="http://127.0.0.1:1"), on_error=errors.append)
    await dead.start()
    try:
        with pytest.raises(StatusError) as err:
            await dead(ex("GET", "/api"))
        assert err.value.code == 429  # a read; a write gets no answer (kproxy.core.outage)
        assert len(errors) == 1
    finally:
        await dead.close()


async def test_head_responses_end_with_their_head_and_the_connection_is_reused() -> None:
    """HEAD goes through the pool (and its one head writer): the answer's Content-Length
    announces the GET's body, which never comes; the next request on the connection is framed
    right."""

    async def answer(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if head.startswith(b"HEAD "):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")

    async with Server(answer) as srv:
        pool = pool_for(srv)
        for method, body in (("HEAD", b""), ("GET", b"hello"), ("HEAD", b""), ("GET", b"hello")):
            resp = await asyncio.wait_for(pool.request(method, "/x", [], None, None), 5)
            assert resp.content_length == 5
            assert await asyncio.wait_for(resp.read(), 5) == body
        assert srv.connections == 1
        pool.close()


async def test_a_refused_head_reaches_no_upstream() -> None:
    """A header Go's Transport would not send gets the caller a 400 Status from the pool and the
    upgrade path alike, before any connection is opened (nothing written upstream)."""

    from kproxy.core.chain import Exchange
    from kproxy.server.kubeconfig import UpstreamTarget
    from kproxy.server.upstream import Upstream

    async def answer(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def ex(method: str, value: str, upgrade: bool) -> Exchange:
        pairs = [("Connection", "Upgrade"), ("Upgrade", "websocket")] if upgrade else []
        target = "/api/v1/namespaces/n/pods/p/exec"
        return make_exchange(method, target, [*pairs, ("X-Caller", value)], upgrade=upgrade)

    async with Server(answer) as srv:
        up = Upstream(UpstreamTarget(server=f"http://127.0.0.1:{srv.port}"))
        await up.start()
        try:
            for method, upgrade in (("GET", False), ("HEAD", False), ("POST", False), ("GET", True)):
                for value in ("a\x00b", "a\x7f", "a\x1bb", "a\r\nImpersonate-Group: system:masters"):
                    with pytest.raises(StatusError) as err:
                        await up(ex(method, value, upgrade))
                    assert err.value.code == 400
                    assert 'invalid header field value for "X-Caller"' in err.value.message
            assert (await up(ex("GET", "a\tb ü", False))).status == 200
        finally:
            await up.close()
    assert srv.connections == 1 and len(srv.heads) == 1  # only the last, valid request
