"""The listener's HTTP/1.1 edge: Go's answers to requests it cannot read.

aiohttp's server answers a request it cannot parse with its own text (the parser's internals,
``HTTP/1.0``, a ``Server: Python/… aiohttp/…`` header) and logs a traceback for it; it keeps
per-line limits of its own instead of Go's limit on the whole head; and a chunked body that
turns malformed after the head was parsed leaves the request waiting for a body that never
ends. ``GoServer`` and ``GoRequestHandler`` answer as Go's net/http server in front of the
apiserver does. They reach into aiohttp's ``RequestHandler`` (its ``_parser``), so an aiohttp
upgrade is checked by tests/e2e/test_proxy_http_malformed.py.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadStatusLine, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("kproxy")

#: Go's limit on a request's head (request line and headers): the apiserver's MaxHeaderBytes
#: (1 MiB, net/http's default) plus the 4096 bytes of read-buffer slack net/http allows on top.
MAX_HEAD_BYTES = (1 << 20) + 4096
#: Go counts no headers, only bytes; this bounds what a head of MAX_HEAD_BYTES costs in Python.
MAX_HEADERS = 1 << 16

_GO_ERROR_HEADERS = b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"


class HeadTooLarge(BadHttpMessage):
    """A request head over MAX_HEAD_BYTES (or MAX_HEADERS lines)."""

    code = 431

    def __init__(self) -> None:
        super().__init__("request head too large")


class MalformedBody(Exception):
    """The client's chunked body broke off into something that is not HTTP; ``str`` is Go's text."""


def go_parse_error(err: BaseException) -> bytes:
    """What Go's net/http writes (then closes the connection) for a request it cannot read.

    Its texts (net/http ``conn.serve``): ``431 Request Header Fields Too Large``; ``Unsupported
    transfer encoding`` (501); a status error with its text (a protocol version other than 1.x,
    a missing Host); ``400 Bad Request`` for anything else."""
    msg = str(err)
    if isinstance(err, (HeadTooLarge, LineTooLong)) or "Too many headers" in msg:
        public = b"431 Request Header Fields Too Large"
    elif isinstance(err, BadStatusLine) and "Invalid HTTP version" in msg:
        public = b"505 HTTP Version Not Supported: unsupported protocol version"
    elif "Missing 'Host' header" in msg:
        public = b"400 Bad Request: missing required Host header"
    elif "Transfer-Encoding" in msg and "Content-Length" not in msg:
        return b"HTTP/1.1 501 Not Implemented" + _GO_ERROR_HEADERS + b"Unsupported transfer encoding"
    else:
        public = b"400 Bad Request"
    return b"HTTP/1.1 " + public + _GO_ERROR_HEADERS + public


def go_chunked_error(err: BaseException) -> str:
    """Go's chunked reader's error (net/http/internal/chunked.go) for llhttp's complaint."""
    msg = str(err)
    if "Invalid character in chunk size" in msg:
        return "invalid byte in chunk length"
    if "overflow" in msg.lower():
        return "http chunk length too large"
    return "malformed chunked encoding"


class _RawAnswer(web.StreamResponse):
    """An answer written as given bytes, then the connection closes (Go's answers to unreadable
    requests are written straight to the connection, outside its ResponseWriter)."""

    def __init__(self, raw: bytes) -> None:
        super().__init__(status=400)
        self._raw = raw
        self.force_close()

    async def prepare(self, request: web.BaseRequest) -> None:
        transport = request.transport
        if transport is not None and not transport.is_closing():
            transport.write(self._raw)

    async def write_eof(self, data: bytes = b"") -> None:
        return None


class _HeadLimit:
    """The request parser, with Go's limit on the bytes of a head and its handling of a body
    that turns malformed: the request already being served sees the error, no new one starts."""

    def __init__(self, parser: Any, protocol: RequestHandler) -> None:
        self._parser = parser
        self._protocol = protocol
        self._body: Any = None  # the body of the last request whose head was parsed
        self._head = 0  # bytes received since that head

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)

    def feed_data(self, data: bytes) -> Any:
        body = self._body
        in_body = body is not None and not body.is_eof()
        if not in_body:
            self._head += len(data)
            if self._head > MAX_HEAD_BYTES:
                raise HeadTooLarge()
        try:
            messages, upgraded, tail = self._parser.feed_data(data)
        except HttpProcessingError as err:
            if not in_body or body.is_eof():
                raise  # the error is in what follows a whole request: aiohttp answers it after that one
            # Go's server hands the chunked reader's error to the handler reading the body,
            # and reads nothing after it; the apiserver answers it (500) and closes.
            body.set_exception(MalformedBody(go_chunked_error(err)))
            body.feed_eof()  # every read still raises; aiohttp does not linger over the rest
            self._protocol.close()
            return (), False, b""
        if messages:
            self._body = messages[-1][1]
            self._head = 0
        return messages, upgraded, tail


class GoRequestHandler(RequestHandler):
    """aiohttp's request handler with Go's answers at the HTTP/1.1 level (see above)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        parser = getattr(self, "_parser", None)
        if not hasattr(parser, "feed_data"):  # aiohttp's internals moved: fail loudly, not open
            raise RuntimeError("kproxy.listener needs aiohttp's RequestHandler._parser (aiohttp 3.14)")
        self._parser = _HeadLimit(parser, self)  # type: ignore[assignment]

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):
            return super().handle_error(request, status, exc, message)
        # A malformed request is the client's problem, not kproxy's: no traceback (Go logs nothing).
        log.debug("unreadable request from %s: %s", request.remote, exc)
        return _RawAnswer(go_parse_error(exc))


class GoServer(web.Server):
    """``web.Server`` whose connections use GoRequestHandler, with Go's head limits."""

    def __init__(self, handler: Any, **kwargs: Any) -> None:
        kwargs.update(max_line_size=MAX_HEAD_BYTES, max_field_size=MAX_HEAD_BYTES, max_headers=MAX_HEADERS)
        # A request body goes upstream as the client sent it: aiohttp would otherwise inflate a
        # ``Content-Encoding: gzip`` body (the apiserver does not) and forward it under the
        # client's Content-Length, desynchronizing the pooled upstream connection.
        kwargs["auto_decompress"] = False
        super().__init__(handler, **kwargs)

    def __call__(self) -> RequestHandler:
        return GoRequestHandler(self, loop=self._loop, **self._kwargs)
