"""How the server writes a reply on an aiohttp connection: responses without aiohttp's ``Server``
header, a large complete body written in slices, and the refusal of a request head Go's server
cannot read."""

from __future__ import annotations

import h2.errors
from aiohttp import web
from multidict import CIMultiDict

from kproxy.core.chain import Reply
from kproxy.server.http2.h2stream import H2Request
from kproxy.server.listener import go_bad_request

__all__ = [
    "H2_WRITTEN",
    "SLICE",
    "TransparentResponse",
    "TransparentStreamResponse",
    "refuse_head",
    "write_sliced",
]


class _Transparent:
    """aiohttp adds ``Server: Python/… aiohttp/…`` to every response; the apiserver sends no
    Server header, so neither does kproxy unless the upstream sent one."""

    async def _prepare_headers(self) -> None:
        headers: CIMultiDict[str] = self.headers  # type: ignore[attr-defined]
        had_server = "Server" in headers
        await super()._prepare_headers()  # type: ignore[misc]
        if not had_server:
            headers.popall("Server", None)


class TransparentResponse(_Transparent, web.Response):
    pass


class TransparentStreamResponse(_Transparent, web.StreamResponse):
    pass


#: A complete body larger than this is written in slices of this size.
SLICE = 1 << 20

#: What ``handle`` returns for a request answered on an HTTP/2 stream (written there already).
H2_WRITTEN = web.StreamResponse()


async def write_sliced(request: web.BaseRequest, reply: Reply, data: bytes) -> web.StreamResponse:
    resp = TransparentStreamResponse(status=reply.status, reason=reply.reason, headers=reply.headers)
    resp.content_length = len(data)
    await resp.prepare(request)
    view = memoryview(data)
    try:
        for i in range(0, len(view), SLICE):
            await resp.write(view[i : i + SLICE])
        await resp.write_eof()
    except ConnectionError:
        pass  # the client went away mid-body; nothing to tell it
    return resp


def refuse_head(request: web.BaseRequest, why: str = "") -> web.StreamResponse:
    """Go's answer to a request it cannot make an ``http.Request`` of: over HTTP/1.1 its raw 400;
    over HTTP/2 the stream is reset PROTOCOL_ERROR (golang.org/x/net/http2/server.go)."""
    if isinstance(request, H2Request):
        request.response.reset(h2.errors.ErrorCodes.PROTOCOL_ERROR)
        return H2_WRITTEN
    return go_bad_request(why)
