"""The client's request body as the chain sees it: ``100 Continue``, the body budget, the read
deadline and Go's errors for a malformed body (:class:`ClientBody`)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

from kproxy.core.bodybudget import BodyBudget, Lease, body_timeout
from kproxy.core.chain import BytesBody, StreamBody
from kproxy.core.status import generic
from kproxy.server.http2.h2stream import H2Request
from kproxy.server.listener import MalformedBody

__all__ = ["ClientBody", "expects_continue"]

_CONTINUE = re.compile(r"(?:^|[ ,\t])100-continue(?:$|[ ,\t])", re.IGNORECASE)


def expects_continue(expect: str) -> bool:
    """Go's ``expectsContinue``: the (first) Expect header holds the token ``100-continue``.
    Any other non-empty Expect fails with 417; an empty one is no expectation."""
    return bool(expect) and _CONTINUE.search(expect) is not None


class ClientBody:
    """The client's request body as the chain sees it, read as Go's server reads it.

    ``100 Continue`` goes out when the body is first read (Go's expectContinueReader), so an
    answer given without reading it (a 413, a policy refusal) is not preceded by one; the
    connection then closes after the answer, as Go closes it. A chunked body that turns
    malformed gets the apiserver's 500 Status with Go's chunked-reader error, and the
    connection closes (nothing after it can be read).

    Once :meth:`bound`, the body must arrive within ``read_timeout`` of the request's start (the
    apiserver's request timeout: its 504 Timeout, then the connection closes). A body read whole
    (a filter's ``read()``) holds its bytes in kproxy: they are taken from the process's
    :class:`BodyBudget` and given back by :meth:`close`. The apiserver authenticates before any
    handler reads a body (``staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go``:
    a rejected token is its 401, no byte read, no ``100 Continue``), so the caller is identified
    first (``identify()``: its 401 StatusError stands for the body), and the bytes are charged to
    it (``caller()``): a caller known by its user takes its declared length before the first byte
    is read (or ``100 Continue`` sent); one known only by its address (``credentials: proxy``,
    where every caller is kproxy itself) is charged the bytes it has sent, so addresses that
    declare bodies and send nothing hold nothing. A body streamed through to the apiserver takes
    no budget: it holds at most the connection's read buffer (the upstream's back-pressure
    stops the reads), which the connection limits bound."""

    __slots__ = (
        "_budget",
        "_continue",
        "_deadline",
        "_expired",
        "_lease",
        "_reader",
        "_request",
        "_whole",
        "caller",
        "identify",
    )

    def __init__(self, request: web.BaseRequest, expect_continue: bool) -> None:
        self._request = request
        self._continue = expect_continue and request.body_exists
        self._budget: BodyBudget | None = None
        self._deadline: float | None = None
        self._lease: Lease | None = None
        self._expired = False
        self._whole = False
        self._reader: asyncio.Task[Any] | None = None  # the task reading the body, while it does
        self.caller: Callable[[], str] = lambda: ""
        self.identify: Callable[[], Awaitable[object]] | None = None

    def bound(self, budget: BodyBudget, read_timeout: float) -> None:
        self._budget = budget
        if read_timeout > 0:
            self._deadline = asyncio.get_running_loop().time() + read_timeout

    def body(self, length: int | None, limit: int, media_type: str) -> BytesBody | StreamBody:
        if not self._request.body_exists:
            return BytesBody(b"", media_type)
        return _WholeMarking(self, self._chunks(), length, media_type, limit)

    async def _chunks(self) -> AsyncIterator[bytes]:
        request = self._request
        lease = None
        if self._budget is not None and self._whole:
            if self.identify is not None:
                await self.identify()  # the apiserver's 401 for a rejected token: nothing read
            key = self.caller()
            lease = self._lease = self._budget.lease(key)
            if not key.startswith(_ADDRESS_FLOW):
                await lease.cover(request.content_length or 0)
        if self._continue:
            self._continue = False
            if isinstance(request, H2Request):
                await request.send_continue()
            else:
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                request.writer.output_size = 0
        received = 0
        content = request.content
        deadline = self._deadline
        self._reader = asyncio.current_task()
        try:
            while True:
                if deadline is None:
                    chunk = await content.readany()
                else:
                    try:
                        async with asyncio.timeout_at(deadline):
                            chunk = await content.readany()
                    except TimeoutError:
                        self._expired = True
                        raise body_timeout() from None
                if not chunk:
                    return
                received += len(chunk)
                if lease is not None:
                    await lease.cover(received)
                yield chunk
        except MalformedBody as err:
            raise generic(500, "", str(err)) from None
        finally:
            self._reader = None

    async def settle(self) -> None:
        """The request is answered: a task still reading the body stops. An HTTP/2 upstream
        sends the body beside the wait for its answer, and an answer that came early (the
        apiserver's 404 before reading a body) leaves that task waiting for the client's next
        bytes; the server's own reader of what is left (aiohttp's lingering read before it
        closes the connection) must be the only one."""
        task = self._reader
        if task is None or task is asyncio.current_task() or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    def close(self) -> None:
        """Give back the bytes the body held (the request has been answered). A body that was
        to wait for ``100 Continue`` and never got it is not coming: the connection closes once
        the answer is out, without lingering over it (Go's server closes such a connection:
        ``expectContinueReader`` not read, ``closeAfterReply``; net/http/server.go); nor is the
        rest of a body whose deadline passed."""
        if self._lease is not None:
            self._lease.close()
        if self._continue or self._expired:
            self._request.content.feed_eof()

    def closes_connection(self) -> bool:
        """Whether the answer must close the connection: the body was expected to wait for a
        100 Continue that never went out, was malformed, or was answered before it all came
        (the upstream refused it early): Go's server then closes rather than read on."""
        content = self._request.content
        return self._continue or not content.is_eof() or isinstance(content.exception(), MalformedBody)


#: The prefix of :func:`kproxy.core.fairness.flow_of` for a caller known only by its address.
_ADDRESS_FLOW = "addr:"


class _WholeMarking(StreamBody):
    """The client's body; reading it whole (``read()``) first tells its :class:`ClientBody`, which
    then takes budget for it (a body streamed through with ``chunks()`` takes none)."""

    __slots__ = ("_client",)

    def __init__(
        self, client: ClientBody, source: AsyncIterator[bytes], length: int | None, media_type: str, limit: int
    ) -> None:
        super().__init__(source, length, media_type, limit)
        self._client = client

    async def read(self) -> bytes:
        self._client._whole = True
        return await super().read()
