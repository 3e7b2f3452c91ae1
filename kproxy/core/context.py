"""What a filter gets from the server when it starts: kproxy's own line to the upstream, the
credentials mode, and the metrics registry.

Filters are built from their settings alone (so ``kproxy check-config`` needs no upstream);
the context arrives with ``start(ctx)``. A filter that needs to ask the apiserver something of
its own (a TokenReview, the OpenAPI documents, a list+watch for the cache) uses ``ctx.api``,
which carries kproxy's own credentials whatever the mode; one that forwards a caller's request
calls ``call_next`` as usual.
"""

from __future__ import annotations

import asyncio
import hashlib
import warnings
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, cast

import aiohttp
import orjson
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry
from yarl import URL

from kproxy.core.discovery import Discovery

T = TypeVar("T")

CredentialsMode = Literal["proxy", "forward", "impersonate"]


class UpstreamLine(Protocol):
    """What :class:`ApiClient` needs of the upstream: its URL, kproxy's own credentials and session
    (the server's ``kproxy.server.upstream.Upstream`` is one; the core does not import the server)."""

    base: URL
    connect_timeout: float
    session: aiohttp.ClientSession | None

    async def own_auth_header(self) -> str | None: ...
    def url_for(self, target: str) -> URL: ...


class OwnStreamReader(Protocol):
    """The body reader kproxy's own requests use (aiohttp's ``StreamReader`` is one)."""

    async def readexactly(self, n: int) -> bytes: ...
    async def readline(self) -> bytes: ...
    def __aiter__(self) -> AsyncIterator[bytes]: ...


class OwnResponse(Protocol):
    """A response to kproxy's own request: aiohttp's on HTTP/1.1, the HTTP/2 client's
    (``kproxy.server.http2.client.H2Response``) on HTTP/2."""

    @property
    def status(self) -> int: ...
    @property
    def headers(self) -> CIMultiDict[str] | CIMultiDictProxy[str]: ...
    @property
    def content(self) -> Any: ...
    async def read(self) -> bytes: ...
    def close(self) -> None: ...


class OwnRequests(Protocol):
    """An upstream line that can carry kproxy's own requests on HTTP/2 (``own_request`` answers
    None when the upstream does not speak it)."""

    async def own_request(
        self, method: str, target: str, headers: dict[str, str], data: bytes | None
    ) -> OwnResponse | None: ...


class ApiClient:
    """kproxy's own requests to the upstream apiserver (its own credentials, its own session).

    Not the hot path: callers' requests go through the chain's terminal handler. Paths are
    relative to the server URL (its path prefix is added here).
    """

    def __init__(self, upstream: UpstreamLine, user_agent: str = "kproxy") -> None:
        self._upstream = upstream
        self.user_agent = user_agent

    @property
    def server(self) -> str:
        return str(self._upstream.base)

    @property
    def trust(self) -> str:
        """A digest of the CA bundle kproxy checks the upstream's certificate against ("" when
        it uses the system's roots or has none): two clusters at one URL, each with its own CA,
        differ here though their URLs do not (in-cluster, every cluster is
        ``https://kubernetes.default.svc``)."""
        ca = getattr(getattr(self._upstream, "target", None), "ca_pem", None)
        return hashlib.sha256(ca).hexdigest()[:32] if isinstance(ca, bytes) and ca else ""

    @property
    def rtt(self) -> float | None:
        """The round trip to the upstream as measured (``kproxy.core.upstreamlink``), None
        before enough requests or when the line measures none."""
        link = getattr(self._upstream, "link", None)
        rtt = getattr(link, "rtt", None)
        return rtt if isinstance(rtt, float) else None

    async def _headers(self, extra: dict[str, str] | None) -> dict[str, str]:
        headers = {"User-Agent": self.user_agent}
        auth = await self._upstream.own_auth_header()
        if auth:
            headers["Authorization"] = auth
        if extra:
            headers.update(extra)
        return headers

    @asynccontextmanager
    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        timeout: float | None = 30.0,
    ) -> AsyncIterator[OwnResponse]:
        """An upstream response to read or stream (``resp.content``); released on exit.

        On HTTP/2 when the upstream speaks it (sharing the connections of callers' requests),
        else on the aiohttp session. ``timeout`` bounds the whole exchange; pass ``None`` for
        watches."""
        own = getattr(self._upstream, "own_request", None)
        if own is not None:
            async with asyncio.timeout(timeout) if timeout is not None else nullcontext():
                answer = await cast(OwnRequests, self._upstream).own_request(
                    method, target, await self._headers(headers), data
                )
                if answer is not None:
                    try:
                        yield answer
                    finally:
                        answer.close()
                    return
        session = self._upstream.session
        if session is None:
            raise RuntimeError("the upstream is not started")
        url = self._upstream.url_for(target)
        t = aiohttp.ClientTimeout(total=timeout, connect=self._upstream.connect_timeout)
        async with session.request(
            method, url, headers=await self._headers(headers), data=data, timeout=t, allow_redirects=False
        ) as resp:
            yield resp

    async def json(
        self,
        method: str,
        target: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        timeout: float | None = 30.0,
    ) -> tuple[int, Any]:
        """Send ``body`` (encoded as JSON when not None) and decode the JSON answer."""
        hdrs = {"Accept": "application/json"}
        data = None
        if body is not None:
            hdrs["Content-Type"] = "application/json"
            data = orjson.dumps(body)
        if headers:
            hdrs.update(headers)
        async with self.request(method, target, headers=hdrs, data=data, timeout=timeout) as resp:
            raw = await resp.read()
            try:
                return resp.status, orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                return resp.status, raw.decode("utf-8", "replace")


class ServiceKey(Generic[T]):
    """The typed name of a service several filters share through :class:`FilterContext`.

    ``ctx.service(KEY, make)`` is a ``T``: the key says what it holds, so no caller casts. Keys are
    module constants named ``f"{__name__}.<what>"`` (a key made per settings adds them after a
    colon, as the watch cache's access reviewer does); two keys with one name are one service."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"ServiceKey({self.name!r})"


@dataclass(slots=True)
class FilterContext:
    """Handed to every filter's ``start(ctx)``.

    Its services are what several filters share (one authenticator, the body-work pool, each
    filter's metrics): a config reload starts a filter's new instance next to the old one with
    the same context, so anything registered once per process (prometheus series) or meant to
    outlive an instance lives here, made by :meth:`service` under a typed :class:`ServiceKey`.
    """

    api: ApiClient
    credentials: CredentialsMode
    registry: CollectorRegistry
    services: dict[str, Any] = field(default_factory=dict)
    #: ``upstream.anonymous_auth``: whether the apiserver takes a caller without credentials as
    #: ``system:anonymous`` (else its 401, which kproxy then answers itself where it decides).
    anonymous_auth: bool = True
    #: The apiserver's discovery and its CustomResourceDefinitions, read and watched once for
    #: the process whatever reads them (:class:`kproxy.core.discovery.Discovery`).
    discovery: Discovery = field(init=False)

    def __post_init__(self) -> None:
        self.discovery = Discovery(self.api)

    def service(self, key: ServiceKey[T], make: Callable[[], T]) -> T:
        """The service under ``key``, made by ``make()`` the first time it is asked for."""
        if key.name not in self.services:
            self.services[key.name] = make()
        return cast(T, self.services[key.name])

    def find(self, key: ServiceKey[T]) -> T | None:
        """The service under ``key`` if it has been made or provided, else None."""
        return cast("T | None", self.services.get(key.name))

    def provide(self, key: ServiceKey[T], value: T) -> None:
        """Put ``value`` under ``key`` (the server's configured instance, before filters ask)."""
        self.services[key.name] = value

    def shared(self, key: str, factory: Callable[[], T]) -> T:
        """Deprecated (kept for third-party filters written for 0.1.0, removed in the next
        release): a service under a bare string key; use :meth:`service` with a :class:`ServiceKey`."""
        warnings.warn(
            "FilterContext.shared(str, factory) is deprecated: use FilterContext.service(ServiceKey[T](name), factory)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.service(ServiceKey[T](key), factory)
