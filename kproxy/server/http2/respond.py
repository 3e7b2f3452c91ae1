"""Writing a ``Reply`` on an HTTP/2 stream: what ``ProxyServer._write`` does on HTTP/1.1.

A complete body goes out with its Content-Length; a streamed one as it arrives, each chunk as the
client's windows allow; a watch served from the cache through an ``H2Sink``. A watch that the
upstream or a drain ends gets a clean END_STREAM (as the apiserver ends watches); any other body
cut short resets the stream (INTERNAL_ERROR, what Go's server sends for a handler that aborts), so
the client cannot take a truncated body for a whole one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import aiohttp
import h2.errors

from kproxy.core.chain import BytesBody, Exchange, Reply, StreamBody, UpgradeBody
from kproxy.core.eventstream import EventStreamBody
from kproxy.server.http2.h2stream import H2Request, H2Sink

_STREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)

#: ``track(body, watch)``: the server's bookkeeping of an open stream (a drain ends it through
#: the object it yields, whose ``ending`` says the drain ended it).
Track = Callable[[StreamBody, bool], AbstractContextManager[Any]]


async def respond(request: H2Request, ex: Exchange, reply: Reply, track: Track) -> int:
    """Write ``reply``; the bytes of body sent."""
    resp = request.response
    body = reply.body
    headers = reply.headers
    if request.last:
        request.response.goaway()
    if isinstance(body, BytesBody):
        if request.method == "HEAD":  # no body, the GET's Content-Length kept
            resp.start(reply.status, headers, end=True)
            return 0
        headers.popall("Content-Length", None)
        data = body.data
        headers["Content-Length"] = str(len(data))
        if not resp.start_whole(reply.status, headers, data):
            await resp.write(data, end=True)
        return len(data)
    if isinstance(body, EventStreamBody):
        with track(body, True):
            resp.start(reply.status, headers)
            sink = request.sink()
            body.attach(sink)
            await sink.done
            if not sink.closing():
                if not sink.wrote:
                    sink.write(body.empty_end())
                await resp.end()
        return 0
    if isinstance(body, UpgradeBody):
        # HTTP/2 has no upgrades (a request asking for one is malformed before it gets here).
        resp.reset(h2.errors.ErrorCodes.INTERNAL_ERROR)
        return 0
    assert isinstance(body, StreamBody)
    watch = ex.info.verb == "watch"
    if body.length is not None:
        headers["Content-Length"] = str(body.length)
    with track(body, watch) as stream:
        resp.start(reply.status, headers)
        try:
            async for chunk in body.chunks():
                await resp.write(chunk)
        except _STREAM_ERRORS:
            if resp.closing():
                return resp.sent  # the client reset the stream or went away
            if not (watch or stream.ending):
                resp.reset(h2.errors.ErrorCodes.INTERNAL_ERROR)
                return resp.sent
        await resp.end()
        return resp.sent


def is_h2(request: object) -> bool:
    return isinstance(request, H2Request)


__all__ = ["H2Sink", "respond"]
