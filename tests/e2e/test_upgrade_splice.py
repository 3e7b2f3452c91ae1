"""Upgraded connections through kproxy: SPDY/3.1 and WebSocket splicing.

The splice itself is tested here against small local upstream servers that speak the upgrade: a
raw SPDY-style server (101 then an echo of raw bytes, as the kubelet's stream would carry) and an
aiohttp WebSocket server speaking `v5.channel.k8s.io`, which lets these tests see the exact heads
kproxy sends and provoke upstream misbehaviour. End to end through the real kube-apiserver (kubectl
exec/attach/port-forward over WebSocket and SPDY, the Python client's `stream`) runs in
test_exec_through_apiserver.py, against the stand-in kubelet (tools/envtest/standin-kubelet).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kproxy.testing.proxyproc import ALLOW_EXEC, RunningProxy, start_proxy


class UpstreamThread:
    """Fake upstream servers on their own event loop in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.seen_heads: list[bytes] = []
        self.spdy_port = 0
        self.ws_port = 0
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> None:
        server = await asyncio.start_server(self._spdy, "127.0.0.1", 0)
        self.spdy_port = server.sockets[0].getsockname()[1]
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/exec", self._ws)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.ws_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _spdy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        self.seen_heads.append(head)
        if b"\r\nupgrade: spdy/3.1" not in head.lower():
            body = b"Upgrade request required"
            writer.write(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            await writer.drain()
            writer.close()
            return
        writer.write(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
            b"X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
        )
        await writer.drain()
        while data := await reader.read(65536):
            writer.write(b"echo:" + data)
            await writer.drain()
        writer.close()

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await ws.prepare(request)
        await ws.send_bytes(b"\x01")  # v5: an initial empty message on stdout
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(b"\x01" + msg.data[1:].upper())
        return ws

    def close(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture(scope="module")
def upstream() -> Iterator[UpstreamThread]:
    up = UpstreamThread()
    yield up
    up.close()


def _kubeconfig(path: Path, port: int) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "proxy-token"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def spdy_proxy(upstream: UpstreamThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("spdy")
    rp = start_proxy(tmp, _kubeconfig(tmp / "up.kc", upstream.spdy_port), ready=False, extra={"proxy": ALLOW_EXEC})
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def ws_proxy(upstream: UpstreamThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    tmp = tmp_path_factory.mktemp("ws")
    rp = start_proxy(tmp, _kubeconfig(tmp / "up.kc", upstream.ws_port), ready=False, extra={"proxy": ALLOW_EXEC})
    yield rp
    rp.stop()


def _connect(rp: RunningProxy) -> socket.socket:
    host, port = rp.url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def _read_head(s: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = s.recv(4096)
        assert data, f"connection closed before the response head: {buf!r}"
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def test_spdy_upgrade_is_spliced_both_ways(spdy_proxy: RunningProxy, upstream: UpstreamThread) -> None:
    s = _connect(spdy_proxy)
    s.sendall(
        b"POST /api/v1/namespaces/ns/pods/p/exec?command=sh&stdin=true HTTP/1.1\r\nHost: x\r\n"
        b"Connection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
        b"X-Stream-Protocol-Version: channel.k8s.io\r\nAuthorization: Bearer caller\r\nContent-Length: 0\r\n\r\n"
    )
    head, rest = _read_head(s)
    assert head.startswith(b"HTTP/1.1 101")
    assert b"Upgrade: SPDY/3.1" in head and b"X-Stream-Protocol-Version: v4.channel.k8s.io" in head
    seen = upstream.seen_heads[-1].decode()
    # Upgrade headers and every protocol version reach the upstream; credentials are the proxy's own.
    assert "Connection: Upgrade" in seen and "Upgrade: SPDY/3.1" in seen
    assert seen.count("X-Stream-Protocol-Version") == 2
    assert "Authorization: Bearer proxy-token" in seen and "caller" not in seen
    # Raw bytes (SPDY frames in real life, including binary) flow both ways, in order.
    payload = bytes(range(256)) * 64
    s.sendall(payload)
    got = rest
    while len(got) < len(payload) + 5 * 1:
        data = s.recv(65536)
        assert data
        got += data
        if got.replace(b"echo:", b"") == payload:
            break
    assert got.replace(b"echo:", b"") == payload
    s.close()


def test_upgrade_refused_upstream_passes_the_answer_through(spdy_proxy: RunningProxy) -> None:
    s = _connect(spdy_proxy)
    s.sendall(
        b"GET /api/v1/namespaces/ns/pods/p/exec HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
    )
    head, rest = _read_head(s)
    assert head.startswith(b"HTTP/1.1 400")
    while len(rest) < len(b"Upgrade request required"):
        rest += s.recv(4096)
    assert rest == b"Upgrade request required"
    s.close()


async def test_websocket_v5_channel_is_spliced(ws_proxy: RunningProxy) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(
            ws_proxy.url.replace("http", "ws") + "/api/v1/namespaces/ns/pods/p/exec?command=cat&stdin=true&stdout=true",
            protocols=("v5.channel.k8s.io", "v4.channel.k8s.io"),
        ) as ws,
    ):
        assert ws.protocol == "v5.channel.k8s.io"
        first = await ws.receive(timeout=10)
        assert first.data == b"\x01"
        for word in (b"hello", b"kproxy", b"\x00binary\xff"):
            await ws.send_bytes(b"\x00" + word)
            msg = await ws.receive(timeout=10)
            assert msg.type == aiohttp.WSMsgType.BINARY and msg.data == b"\x01" + word.upper()
        await ws.close()


def test_upstream_closing_closes_the_client(spdy_proxy: RunningProxy) -> None:
    """Closing the client side ends the upstream side and vice versa: nothing is left open."""
    s = _connect(spdy_proxy)
    s.sendall(
        b"POST /api/v1/namespaces/ns/pods/p/exec HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
        b"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n"
    )
    head, _ = _read_head(s)
    assert head.startswith(b"HTTP/1.1 101")
    s.shutdown(socket.SHUT_WR)  # the client is done sending: the upstream echo loop ends and closes
    s.settimeout(10)
    assert s.recv(4096) == b""  # ...and kproxy closes the client side in turn
    s.close()
