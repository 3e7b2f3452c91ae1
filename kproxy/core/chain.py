"""The filter chain: the request/response types every filter sees, and the chain itself.

A filter is an onion layer with the shape of an aiohttp middleware (docs/developing/architecture.md)::

    class Filter(Protocol):
        name: ClassVar[str]
        async def __call__(self, ex: Exchange, call_next: Handler) -> Reply: ...

and may have the hooks ``start(ctx)``, ``stop()``, ``ready()`` and ``effective_settings()``
(:class:`Starts`, :class:`Stops`, :class:`Readiness`, :class:`ShowsSettings`). Third-party
filters import these names from :mod:`kproxy.filterapi`, the public filter API, not from here.

It may change the request before ``call_next``, answer without calling it, or change the
``Reply`` on its way back. Filters never know of each other; the config orders them.

Bodies are streamed by default: a request or response body is a ``StreamBody`` that yields
chunks as they arrive and is passed through untouched unless a filter asks for the whole
thing (``await body.read()``), which then happens once and is shared.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from multidict import CIMultiDict, MultiDict

from kproxy.core.errorreply import negotiated_status
from kproxy.core.requestinfo import RequestInfo
from kproxy.gocompat.url import encode_query, parse_query

if TYPE_CHECKING:
    from kproxy.core.context import FilterContext
from kproxy.core.status import StatusError, request_entity_too_large

__all__ = [
    "ANSWERED_BY_FILTER",
    "Body",
    "BytesBody",
    "Chain",
    "Exchange",
    "Filter",
    "FilterBase",
    "FilterTimer",
    "Handler",
    "Identity",
    "Readiness",
    "Reply",
    "ShowsSettings",
    "Starts",
    "Stops",
    "StreamBody",
    "UpgradeBody",
]


@dataclass(slots=True)
class Identity:
    """Who the caller is, when a filter or the credentials mode has learned it."""

    user: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


class BytesBody:
    """A complete body held in memory, with its media type.

    ``data`` is the exact bytes; nothing re-encodes them unless a filter replaces the body.
    """

    __slots__ = ("data", "media_type")

    def __init__(self, data: bytes, media_type: str = "") -> None:
        self.data = data
        self.media_type = media_type

    @property
    def length(self) -> int | None:
        return len(self.data)

    async def read(self) -> bytes:
        return self.data

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.data:
            yield self.data


class StreamBody:
    """A body that arrives as a stream of chunks and is passed on as it arrives.

    ``length`` is the declared Content-Length when there is one. ``limit`` bounds what may be
    read (request bodies): passing it raises the apiserver's 413 Status, whether the body is
    streamed through or read whole. ``read()`` consumes the stream once and keeps the bytes,
    so a second reader (or the upstream) gets the same data.
    """

    __slots__ = (
        "_buffered",
        "_consumed",
        "_on_abort",
        "_on_end",
        "_source",
        "length",
        "limit",
        "media_type",
        "received",
    )

    def __init__(
        self,
        source: AsyncIterator[bytes],
        length: int | None = None,
        media_type: str = "",
        limit: int | None = None,
        on_abort: Callable[[], object] | None = None,
        on_end: Callable[[], object] | None = None,
    ) -> None:
        self._source = source
        self._on_abort = on_abort
        self._on_end = on_end
        self.received = 0  # bytes taken from the source so far
        self._buffered: bytes | None = None
        self._consumed = False
        self.length = length
        self.media_type = media_type
        self.limit = limit

    def abort(self) -> None:
        """Stop the source (closes the upstream response); the reader sees the stream end."""
        if self._on_abort is not None:
            self._on_abort()

    def end_cleanly(self) -> None:
        """End the stream where its reader can stop (drain, reload): a watch after a whole event,
        so the reader sees a normal end of its source, whatever it wraps around it (a gzip
        stream gets its trailer). ``on_end`` does it (a body that wraps another passes the call
        on to it); a body without one is aborted. ``abort`` stays the hard stop."""
        if self._on_end is not None:
            self._on_end()
        else:
            self.abort()

    async def read(self) -> bytes:
        if self._buffered is None:
            parts = [chunk async for chunk in self.chunks()]
            self._buffered = b"".join(parts)
        return self._buffered

    async def chunks(self) -> AsyncIterator[bytes]:
        if self._buffered is not None:
            if self._buffered:
                yield self._buffered
            return
        if self._consumed:
            raise RuntimeError("stream body already consumed")
        self._consumed = True
        limit = self.limit
        async for chunk in self._source:
            self.received += len(chunk)
            if limit is not None and self.received > limit:
                raise request_entity_too_large(limit)
            yield chunk


class UpgradeBody:
    """The upstream accepted a protocol upgrade (101): the server splices the two sockets.

    ``reader``/``writer`` are the upstream connection after the 101 response head; ``head``
    is any data the upstream sent after the head that was already read.
    """

    __slots__ = ("head", "reader", "writer")

    def __init__(self, reader: Any, writer: Any, head: bytes = b"") -> None:
        self.reader = reader
        self.writer = writer
        self.head = head

    @property
    def length(self) -> int | None:
        return None


Body = BytesBody | StreamBody | UpgradeBody


class Exchange:
    """One client request, as it will be sent upstream, plus what kproxy knows about it.

    ``raw_path`` and ``raw_query`` are kept exactly as the client sent them (percent-encoding
    included) so that a request no filter touches goes upstream byte for byte; for an
    absolute-form target (``http://host/api/...``) they are its origin form, the part Go's server
    routes. ``host`` is Go's ``req.Host``: the authority of an absolute-form target, else the Host
    header. A filter that changes the query uses ``query`` (read as Go reads it, on first use) and
    ``set_query``, or ``kproxy.gocompat.url.with_param`` to enforce one parameter.

    ``upgrade`` says the caller asked for a protocol upgrade (``Connection: upgrade`` and an
    ``Upgrade`` header): the request goes upstream on a connection of its own, its headers as
    sent, and is spliced only if the upstream answers 101. It says nothing about what the
    apiserver does with the request: it upgrades only its connect subresources
    (``info.is_connect``) and WebSocket watches, and serves any other request carrying such
    headers as an ordinary one. A filter therefore never skips its work because of ``upgrade``
    alone; it may leave a request to the apiserver untouched (its answer then being the
    apiserver's own), never let a write through that the apiserver would judge otherwise.
    """

    __slots__ = (
        "_query",
        "body",
        "client",
        "headers",
        "host",
        "identity",
        "info",
        "method",
        "raw_path",
        "raw_query",
        "started",
        "state",
        "upgrade",
    )

    def __init__(
        self,
        method: str,
        raw_path: str,
        raw_query: str,
        headers: CIMultiDict[str],
        body: Body,
        info: RequestInfo,
        *,
        client: Any = None,
        upgrade: bool = False,
        host: str = "",
    ) -> None:
        self.method = method
        self.raw_path = raw_path
        self.raw_query = raw_query
        self.headers = headers
        self.body = body
        self.info = info
        self.client = client
        self.upgrade = upgrade
        self.host = host
        self.identity: Identity | None = None
        self.state: dict[str, Any] = {}
        self.started = time.monotonic()
        self._query: MultiDict[str] | None = None

    @property
    def query(self) -> MultiDict[str]:
        """The query parameters as Go's ``url.ParseQuery`` reads them (the pairs it drops are not
        here); parsed once, on first use."""
        if self._query is None:
            self._query = MultiDict(
                (p.key, p.value) for p in parse_query(self.raw_query) if p.key is not None and p.value is not None
            )
        return self._query

    def set_query(self, query: Mapping[str, str] | MultiDict[str]) -> None:
        """Replace the query; it is re-encoded for the upstream request."""
        items = list(query.items())
        self._query = MultiDict(items)
        self.raw_query = encode_query(items)

    @property
    def target(self) -> str:
        """Path and query as sent upstream."""
        return f"{self.raw_path}?{self.raw_query}" if self.raw_query else self.raw_path


@dataclass(slots=True)
class Reply:
    """A response on its way back to the client."""

    status: int
    headers: CIMultiDict[str]
    body: Body
    reason: str | None = None

    @classmethod
    def from_status(cls, err: StatusError, ex: Exchange) -> Reply:
        """A Reply carrying a Kubernetes Status error, written as the apiserver writes it.

        In the media type the request ``ex`` negotiates, as the apiserver's
        ``responsewriters.ErrorNegotiated`` does: JSON, YAML or protobuf per ``Accept`` (no
        ``as=`` conversions), pretty JSON for ``?pretty`` or a human User-Agent, indented JSON
        when nothing is acceptable (see :mod:`kproxy.core.errorreply`). APF's 429 is plain text,
        never negotiated, as the apiserver's.
        """
        if getattr(err, "plain_text", False):  # APF's 429 (kproxy.core.fairness)
            headers = CIMultiDict(err.headers())
            return cls(err.http_status, headers, BytesBody(err.body(), headers["Content-Type"]))
        status, headers, data, media = negotiated_status(err, ex.headers, ex.query)
        return cls(status, headers, BytesBody(data, media))


Handler = Callable[[Exchange], Awaitable[Reply]]


@runtime_checkable
class Filter(Protocol):
    """One layer of the chain: its config ``name`` and the call. The hooks below are optional;
    the chain calls those a filter has (:class:`FilterBase` has all three)."""

    name: ClassVar[str]

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply: ...


@runtime_checkable
class Starts(Protocol):
    """Optional hook: ``start(ctx)`` runs once before the filter's first request (and again for
    the new instance a config reload builds, with the same context)."""

    async def start(self, ctx: FilterContext) -> None: ...


@runtime_checkable
class Stops(Protocol):
    """Optional hook: ``stop()`` runs when the filter's chain is retired (shutdown, or a reload
    once the last request through the old chain has finished)."""

    async def stop(self) -> None: ...


@runtime_checkable
class Readiness(Protocol):
    """Optional hook: ``ready()`` is asked by ``/readyz``; False keeps kproxy not ready."""

    def ready(self) -> bool: ...


@runtime_checkable
class ShowsSettings(Protocol):
    """Optional hook: ``effective_settings()`` is what ``kproxy check-config`` prints for the
    filter (its settings with what it derived from them); without it, its ``settings`` model."""

    def effective_settings(self) -> dict[str, object]: ...


class FilterBase:
    """Convenience base: keeps the context it is started with, always ready."""

    name: ClassVar[str] = ""
    ctx: FilterContext | None = None

    async def start(self, ctx: FilterContext) -> None:
        self.ctx = ctx

    async def stop(self) -> None:
        return None

    def ready(self) -> bool:
        return True


FilterTimer = Callable[[str, float], None]

#: ``Exchange.state`` key: the name of the filter that answered without calling the rest of the
#: chain (the innermost such filter; unset when the upstream answered). Read by the access log
#: and the request metrics' ``answered_by``.
ANSWERED_BY_FILTER = "kproxy.answered_by"


class Chain:
    """The ordered filters in front of a terminal handler (the upstream).

    Built once per config; ``handle`` runs one request through it. When ``observe`` is given it
    is called with each filter's own time (its total minus the time spent further down the
    chain), which is what the per-filter metric reports. A filter that returns (or raises)
    without calling ``call_next`` is recorded in ``ex.state[ANSWERED_BY_FILTER]``.
    """

    def __init__(
        self,
        filters: list[Filter],
        terminal: Handler,
        observe: FilterTimer | None = None,
    ) -> None:
        self.filters = filters
        self._terminal = terminal
        self._observe = observe
        self._entry = self._build()
        # Requests (streams and upgrades included) still running through this chain; a chain
        # replaced by a config reload is stopped only when the last of them has finished.
        self.active = 0
        self.retired = False

    def _build(self) -> Handler:
        handler = self._terminal
        for flt in reversed(self.filters):
            handler = self._wrap(flt, handler)
        return handler

    def _wrap(self, flt: Filter, call_next: Handler) -> Handler:
        observe = self._observe
        name = flt.name
        if observe is None:

            async def plain(ex: Exchange) -> Reply:
                called = False

                async def next_plain(inner: Exchange) -> Reply:
                    nonlocal called
                    called = True
                    return await call_next(inner)

                try:
                    return await flt(ex, next_plain)
                finally:
                    if not called:
                        ex.state.setdefault(ANSWERED_BY_FILTER, name)

            return plain

        async def timed(ex: Exchange) -> Reply:
            below = 0.0
            called = False

            async def next_timed(inner: Exchange) -> Reply:
                nonlocal below, called
                called = True
                t = time.perf_counter()
                try:
                    return await call_next(inner)
                finally:
                    below += time.perf_counter() - t

            t0 = time.perf_counter()
            try:
                return await flt(ex, next_timed)
            finally:
                observe(name, time.perf_counter() - t0 - below)
                if not called:  # this filter answered (or refused) without the rest of the chain
                    ex.state.setdefault(ANSWERED_BY_FILTER, name)

        return timed

    async def handle(self, ex: Exchange) -> Reply:
        return await self._entry(ex)

    async def start(self, ctx: FilterContext) -> None:
        for flt in self.filters:
            if isinstance(flt, Starts):
                await flt.start(ctx)

    async def stop(self) -> None:
        for flt in reversed(self.filters):
            if isinstance(flt, Stops):
                await flt.stop()

    def not_ready(self) -> list[str]:
        """Names of filters that say they are not ready (for /readyz)."""
        out = []
        for flt in self.filters:
            if isinstance(flt, Readiness) and not flt.ready():
                out.append(flt.name)
        return out
