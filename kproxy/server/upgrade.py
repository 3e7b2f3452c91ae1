"""Upgraded connections (exec, attach, portforward, proxy; SPDY/3.1 and WebSocket).

The upgrade request is forwarded on a raw connection of its own (aiohttp's client cannot hand
over a socket after a 101). If the upstream answers ``101 Switching Protocols``, the 101 goes to
the client and the two sockets are spliced both ways until either side closes. Any other answer
(400 "Upgrade request required", 403, ...) is read whole and returned as an ordinary Reply.

On the listener side the client's connection is taken from aiohttp after the 101 with
``RequestHandler.set_parser`` — the hook aiohttp's own WebSocketResponse uses — so every byte
the client sends afterwards reaches the splice, whatever the Upgrade protocol is.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any, Protocol

from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from kproxy.core.chain import BytesBody, Exchange, Reply, StreamBody, UpgradeBody
from kproxy.core.status import StatusError
from kproxy.server.httputil import HEADER_CHARSET, InvalidRequestHead, request_head


class UpgradeTarget(Protocol):
    """What an upgrade needs of the upstream (``kproxy.server.upstream.Upstream`` is one)."""

    base: URL
    host: str
    port: int
    ssl_callers: ssl.SSLContext | None
    server_hostname: str | None
    connect_timeout: float

    async def request_headers(self, ex: Exchange) -> CIMultiDict[str]: ...
    def target_of(self, ex: Exchange) -> str: ...
    def unreachable(self, err: BaseException) -> StatusError: ...


MAX_HEAD = 64 * 1024
_PIPE_HIGH_WATER = 1024 * 1024
_PIECE = 65536


async def dial_upgrade(up: UpgradeTarget, ex: Exchange) -> Reply:
    """Send an upgrade request upstream on its own connection; see the module docstring.

    The head is written (and refused, before any connection is opened) by the same writer as
    every other upstream request: ``kproxy.server.httputil.request_head``."""
    headers = await up.request_headers(ex)
    body = await ex.body.read() if isinstance(ex.body, (BytesBody, StreamBody)) else b""
    # The body is framed by what is sent, never by the caller's header (a filter may have
    # replaced the body; a chunked one lost its Transfer-Encoding as hop-by-hop).
    headers.popall("Content-Length", None)
    if body:
        headers["Content-Length"] = str(len(body))
    try:
        head = request_head(ex.method, up.target_of(ex), up.base.raw_authority, headers.items())
    except InvalidRequestHead as err:
        raise err.status() from None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                up.host,
                up.port,
                ssl=up.ssl_callers,
                server_hostname=up.server_hostname,
                limit=MAX_HEAD,
            ),
            up.connect_timeout,
        )
    except (TimeoutError, OSError) as err:
        raise up.unreachable(err) from None
    try:
        writer.write(head + body)
        await writer.drain()
        answer = await reader.readuntil(b"\r\n\r\n")
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
        writer.close()
        raise up.unreachable(err) from None
    try:
        status, reason, resp_headers = _parse_head(answer)
    except (ValueError, IndexError):
        writer.close()
        raise up.unreachable(ValueError("malformed upgrade response head")) from None
    if status == 101:
        return Reply(101, resp_headers, UpgradeBody(reader, writer), reason)
    # Not upgraded: the apiserver answered the request as an ordinary one (any route but its
    # connect subresources and WebSocket watches), or refused the upgrade. The answer is streamed
    # back as it arrives, as the apiserver's UpgradeAwareHandler copies a refusal
    # (staging/src/k8s.io/apimachinery/pkg/util/proxy/upgradeaware.go tryUpgrade): never held
    # whole, so a watch or a large list asked for with an Upgrade header costs no memory.
    chunked = "chunked" in resp_headers.get("Transfer-Encoding", "").lower()
    declared = resp_headers.get("Content-Length")
    for h in ("Transfer-Encoding", "Connection", "Upgrade", "Keep-Alive", "Content-Length"):
        resp_headers.popall(h, None)
    media_type = resp_headers.get("Content-Type", "")
    if ex.method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        writer.close()  # no body (RFC 9112 6.3), whatever Content-Length says
        if declared is not None:
            resp_headers["Content-Length"] = declared
        return Reply(status, resp_headers, BytesBody(b"", media_type), reason)
    length: int | None = None
    if not chunked and declared is not None:
        try:
            length = int(declared)
        except ValueError:
            writer.close()
            raise up.unreachable(ValueError("malformed upgrade response Content-Length")) from None
        if length < 0:
            writer.close()
            raise up.unreachable(ValueError("malformed upgrade response Content-Length"))
    source = _answer_chunks(reader, writer, chunked, length)
    return Reply(status, resp_headers, StreamBody(source, length, media_type, on_abort=writer.close), reason)


def _parse_head(head: bytes) -> tuple[int, str, CIMultiDict[str]]:
    lines = head.decode(HEADER_CHARSET, "surrogateescape").split("\r\n")
    parts = lines[0].split(" ", 2)
    status = int(parts[1])
    reason = parts[2] if len(parts) > 2 else ""
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.add(name.strip(), value.strip())
    return status, reason, headers


async def _answer_chunks(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, chunked: bool, length: int | None
) -> AsyncIterator[bytes]:
    """The body of a response that did not upgrade, piece by piece as it arrives (chunked,
    Content-Length or until the upstream closes); the upstream connection is closed at the end."""
    try:
        if chunked:
            while True:
                line = await reader.readuntil(b"\n")
                size = int(line.split(b";", 1)[0].strip() or b"x", 16)
                if size == 0:
                    while (await reader.readuntil(b"\n")).strip():  # trailers, then the blank line
                        pass
                    return
                while size > 0:
                    data = await reader.read(min(size, _PIECE))
                    if not data:
                        raise asyncio.IncompleteReadError(b"", size)
                    size -= len(data)
                    yield data
                if (await reader.readexactly(2)) != b"\r\n":
                    raise ValueError("malformed chunk")
        elif length is not None:
            while length > 0:
                data = await reader.read(min(length, _PIECE))
                if not data:
                    raise asyncio.IncompleteReadError(b"", length)
                length -= len(data)
                yield data
        else:
            while data := await reader.read(_PIECE):
                yield data
    except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
        raise ConnectionResetError(f"upstream answer cut short: {err}") from None
    finally:
        writer.close()


class _ClientFeed:
    """Stands in for aiohttp's payload parser after the 101: pushes the client's bytes upstream,
    pausing the client socket while the upstream is slow to take them."""

    def __init__(self, upstream: asyncio.StreamWriter, client_transport: asyncio.Transport) -> None:
        self.upstream = upstream
        self.client = client_transport
        self.closed = asyncio.get_running_loop().create_future()
        self._draining = False
        self._drain_task: asyncio.Future[None] | None = None

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if self.upstream.is_closing():
            return True, b""
        self.upstream.write(data)
        transport = self.upstream.transport
        if not self._draining and transport.get_write_buffer_size() > _PIPE_HIGH_WATER:
            self._draining = True
            self.client.pause_reading()
            self._drain_task = asyncio.ensure_future(self._drain())
        return False, b""

    async def _drain(self) -> None:
        try:
            await self.upstream.drain()
        except OSError:
            pass
        finally:
            self._draining = False
            with contextlib.suppress(Exception):
                self.client.resume_reading()

    def feed_eof(self) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


async def splice(request: web.BaseRequest, reply: Reply) -> web.StreamResponse:
    """Send the upstream's 101 to the client and copy bytes both ways until one side closes."""
    body = reply.body
    assert isinstance(body, UpgradeBody)
    resp = web.StreamResponse(status=101, reason=reply.reason or "Switching Protocols", headers=reply.headers)
    await resp.prepare(request)
    transport = request.transport
    protocol: Any = request.protocol
    if transport is None:
        body.writer.close()
        return resp
    feed = _ClientFeed(body.writer, transport)
    protocol.set_parser(feed)

    async def upstream_to_client() -> None:
        reader: asyncio.StreamReader = body.reader
        if body.head:
            transport.write(body.head)
        while True:
            data = await reader.read(65536)
            if not data or transport.is_closing():
                return
            transport.write(data)
            if transport.get_write_buffer_size() > _PIPE_HIGH_WATER:
                await protocol._drain_helper()

    down = asyncio.ensure_future(upstream_to_client())
    try:
        await asyncio.wait([down, feed.closed], return_when=asyncio.FIRST_COMPLETED)
    finally:
        down.cancel()
        with contextlib.suppress(BaseException):
            await down
        body.writer.close()
        protocol.force_close()
        transport.close()
    return resp
