"""The upstream kube-apiserver: the chain's terminal handler, and kproxy's own aiohttp session.

Callers' requests are sent as the client sent them (path and query byte for byte, body
streamed), with hop-by-hop headers removed and the credentials the mode asks for, on kproxy's
connection pool (``kproxy.server.pool``) or, for upgrades, a raw connection (``kproxy.server.upgrade``); both
write the head with ``kproxy.server.httputil.request_head``, which refuses what Go's ``Transport``
would not send (a caller gets a 400 Status; nothing is written). Nothing is decoded or added:
no default Accept, Accept-Encoding or User-Agent (the apiserver attributes field ownership to
the User-Agent), and header bytes go out as they came in.

The aiohttp session carries kproxy's own requests (``FilterContext.api``): it never decodes
bodies (``auto_decompress=False``) and never adds headers of its own either.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Literal, Protocol

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from kproxy.core.chain import Body, BytesBody, Exchange, Reply, StreamBody
from kproxy.core.negotiation import JSON, PROTOBUF
from kproxy.core.outage import NoAnswer, upstream_failed
from kproxy.core.status import StatusError, internal_error
from kproxy.core.upstreamlink import UpstreamLink
from kproxy.gocompat.httpguts import valid_header_field_value
from kproxy.gocompat.strings import to_lower
from kproxy.identity.impersonate import UnrepresentableIdentity, impersonation_headers, strip_impersonation
from kproxy.server.http2.callers import CallerPools
from kproxy.server.http2.client import H2Pool, H2Response, H2Unavailable
from kproxy.server.httputil import InvalidRequestHead
from kproxy.server.kubeconfig import UpstreamTarget
from kproxy.server.pool import NotSent, Pool
from kproxy.server.upgrade import dial_upgrade

log = logging.getLogger("kproxy.upstream")

# Responses up to this size with a Content-Length are read whole: cheaper than streaming them
# chunk by chunk, and filters that need the body get it without another read.
READ_WHOLE_LIMIT = 256 * 1024

_SKIP_AUTO = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
_UPSTREAM_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError, OSError)

Mode = Literal["proxy", "forward", "impersonate"]

#: ``Exchange.state`` key: the number of the client HTTP/2 connection a request came on.
CLIENT_H2 = "kproxy.server.client_h2"

#: The request-header (front proxy) authenticator's default header names
#: (--requestheader-username-headers, --requestheader-uid-headers, --requestheader-group-headers,
#: --requestheader-extra-headers-prefix as kubeadm and most clusters set them).
FRONT_PROXY_HEADERS = ("x-remote-user", "x-remote-uid", "x-remote-group")
FRONT_PROXY_PREFIXES = ("x-remote-extra-",)


def strip_front_proxy_headers(headers: CIMultiDict[str]) -> None:
    """Remove the caller's front-proxy identity headers, in every mode and spelling.

    The apiserver's request-header authenticator (staging/src/k8s.io/apiserver/pkg/authentication/
    request/headerrequest/requestheader.go) names the caller from them on a connection whose client
    certificate its request-header CA verifies; it runs before every other authenticator. Should
    kproxy's own certificate be such a one, a caller's headers would name anyone. Go reads the
    names through ``Header.Get`` (ASCII case-insensitive) and the extra prefix through
    ``strings.ToLower``; both are matched here with Go's ``ToLower``."""
    for name in {k for k in headers if _front_proxy_name(k)}:
        headers.popall(name)


def _front_proxy_name(name: str) -> bool:
    lowered = to_lower(name)
    return lowered in FRONT_PROXY_HEADERS or lowered.startswith(FRONT_PROXY_PREFIXES)


class Upstream:
    """Sends exchanges to the kube-apiserver; the terminal handler of every chain."""

    def __init__(
        self,
        target: UpstreamTarget,
        mode: Mode = "proxy",
        connect_timeout: float = 10.0,
        max_connections: int = 0,
        on_error: Callable[[str], None] | None = None,
        http2: bool = True,
    ) -> None:
        self.target = target
        self.mode = mode
        self.base = URL(target.server)
        self.connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._on_error = on_error
        # The proxy's own credentials (proxy mode, and filters' background work in any mode).
        self.ssl_own = target.ssl_context(with_client_cert=True)
        # Forwarded callers: trust the upstream's CA, carry no certificate of the proxy's (the
        # same context when the proxy has none: loading the system's roots takes ~20 ms a copy).
        own_cert = bool(target.client_cert_pem and target.client_key_pem)
        self.ssl_forward = target.ssl_context(with_client_cert=False) if own_cert else self.ssl_own
        # Where callers' requests go, computed once for the pool and the upgrade path alike.
        self.ssl_callers = self.ssl_forward if mode == "forward" else self.ssl_own
        self.host = self.base.host or "127.0.0.1"
        self.port = self.base.port or (443 if self.ssl_callers else 80)
        self.server_hostname = (target.tls_server_name or self.host) if self.ssl_callers else None
        # A server URL with a path (an apiserver behind a path-routing gateway) prefixes every path.
        self.prefix = self.base.raw_path.rstrip("/")
        self.session: aiohttp.ClientSession | None = None
        self._pool: Pool | None = None
        # HTTP/2 (kproxy.server.http2.client) when the upstream negotiates it by ALPN: callers'
        # requests and kproxy's own share its connections when they carry the same credentials.
        # Own TLS contexts, so that the HTTP/1.1 pool and the upgrade path never offer h2.
        self.http2 = http2 and self.ssl_callers is not None
        self._h2: H2Pool | None = None
        self._h2_own: H2Pool | None = None
        #: forward mode: each caller credential's own HTTP/2 connections (kproxy.server.http2.callers)
        self._h2_callers: CallerPools | None = None
        #: The round trip to the upstream, from every request's time to its response head
        #: (kproxy.core.upstreamlink; the server shares it with the filters).
        self.link = UpstreamLink()

    def _session(self, ssl_ctx: ssl.SSLContext | None) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            ssl=ssl_ctx if ssl_ctx is not None else False,
            limit=self._max_connections,
            limit_per_host=0,
            enable_cleanup_closed=True,
        )
        timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout, sock_read=None)
        return aiohttp.ClientSession(
            connector=connector,
            timeout=timeout,
            auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO,
            cookie_jar=aiohttp.DummyCookieJar(),
            read_bufsize=256 * 1024,
            trace_configs=[self._timing()],
        )

    def _timing(self) -> aiohttp.TraceConfig:
        """kproxy's own requests on HTTP/1.1 are samples of the link too: aiohttp signals a
        request's end once its response head is read."""
        trace = aiohttp.TraceConfig()

        async def start(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: aiohttp.TraceRequestStartParams) -> None:
            ctx.sent = time.monotonic()

        async def end(_s: aiohttp.ClientSession, ctx: SimpleNamespace, _p: aiohttp.TraceRequestEndParams) -> None:
            self.link.observe(time.monotonic() - ctx.sent)

        trace.on_request_start.append(start)
        trace.on_request_end.append(end)
        return trace

    async def start(self) -> None:
        self.session = self._session(self.ssl_own)
        self._pool = Pool(
            self.host,
            self.port,
            self.ssl_callers,
            self.server_hostname,
            self.connect_timeout,
            max_connections=self._max_connections,
        )
        if self.http2:
            self._h2 = self._h2_pool(self.mode == "forward")
            self._h2_own = self._h2 if self.mode != "forward" else self._h2_pool(False)
            if self.mode == "forward":
                self._h2_callers = CallerPools(lambda: self._h2_pool(True))

    def _h2_pool(self, forward: bool) -> H2Pool:
        ctx = self.target.ssl_context(with_client_cert=not forward)
        assert ctx is not None
        return H2Pool(self.host, self.port, H2Pool.alpn_context(ctx), self.server_hostname, self.connect_timeout)

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
        for h2pool in {self._h2, self._h2_own}:
            if h2pool is not None:
                h2pool.close()
        if self._h2_callers is not None:
            self._h2_callers.close()
        if self.session is not None:
            await self.session.close()

    def client_gone(self, connection: int) -> None:
        """A client HTTP/2 connection closed (forward mode: its upstream connections go too)."""
        if self._h2_callers is not None:
            self._h2_callers.connection_closed(connection)

    async def own_auth_header(self) -> str | None:
        """``Bearer <token>`` for the proxy's own credentials, if it authenticates by token."""
        if self.target.token is None:
            return None
        token = await self.target.token.token()
        if not token:
            return None
        if not valid_header_field_value(token):
            # client-go's transport refuses to send such a token too ("invalid header field value").
            raise internal_error("kproxy's own bearer token has a byte no HTTP header can carry")
        return f"Bearer {token}"

    async def request_headers(self, ex: Exchange) -> CIMultiDict[str]:
        """The headers sent upstream: the exchange's own (already end-to-end, see the server),
        completed in place with the credentials of the mode and X-Forwarded-For."""
        headers = ex.headers
        strip_front_proxy_headers(headers)
        if self.mode != "forward":
            headers.popall("Authorization", None)
            auth = await self.own_auth_header()
            if auth:
                headers["Authorization"] = auth
        if self.mode == "impersonate":
            # The server authenticated the caller before the chain ran (kproxy.identity.impersonate).
            if ex.identity is None:
                raise internal_error("kproxy: impersonate mode reached the upstream without a caller identity")
            strip_impersonation(headers)
            try:
                headers.extend(impersonation_headers(ex.identity))
            except UnrepresentableIdentity as err:
                # CallerAuthenticator refused such a caller already; an identity set elsewhere
                # gets the same answer, never a header it cannot carry.
                raise err.status() from None
        if ex.client:
            prior = headers.get("X-Forwarded-For")
            headers["X-Forwarded-For"] = f"{prior}, {ex.client}" if prior else str(ex.client)
        return headers

    def target_of(self, ex: Exchange) -> str:
        """The request target sent upstream: the server URL's path prefix, then path and query."""
        return self.prefix + ex.target

    def url(self, ex: Exchange) -> URL:
        return self.url_for(ex.target)

    def url_for(self, target: str) -> URL:
        """The URL of a path-and-query (already percent-encoded) on the upstream."""
        return URL(str(self.base.origin()) + self.prefix + target, encoded=True)

    async def __call__(self, ex: Exchange) -> Reply:
        """Terminal handler: send the exchange upstream and wrap the response as a Reply.

        Requests go through the lean pool; upgrades on a raw connection.
        """
        if ex.upgrade:
            return await dial_upgrade(self, ex)
        assert self._pool is not None, "Upstream.start() was not awaited"
        headers = await self.request_headers(ex)
        data, length = _request_data(ex.body)
        resp: UpstreamResponse
        try:
            headers.popall("Content-Length", None)  # the pool frames the body itself
            sent = time.monotonic()
            resp = await self._send(ex.method, self.target_of(ex), headers, data, length, ex.state.get(CLIENT_H2))
            self.link.observe(time.monotonic() - sent)
        except InvalidRequestHead as err:
            raise err.status() from None
        except StatusError:
            raise
        except _UPSTREAM_ERRORS as err:
            cause = err.__cause__ or err.__context__
            if isinstance(cause, StatusError):
                raise cause from None
            raise self.failed(ex.method, err) from None
        return await self._reply(ex, resp)

    async def _send(
        self,
        method: str,
        target: str,
        headers: CIMultiDict[str],
        data: bytes | AsyncIterator[bytes] | None,
        length: int | None,
        client_h2: int | None = None,
    ) -> UpstreamResponse:
        """On HTTP/2 when the upstream speaks it, else on the HTTP/1.1 pool. In forward mode on
        HTTP/2 connections of the caller's own (``kproxy.server.http2.callers``): its client
        HTTP/2 connection's (numbered ``client_h2``), or its credential's."""
        h2pool, key = self._h2, b""
        if h2pool is not None and not h2pool.unavailable:
            if self._h2_callers is not None:
                h2pool, key = self._h2_callers.pool(headers.get("Authorization"), client_h2)
            if h2pool is not None:
                try:
                    resp = await h2pool.request(method, target, headers.items(), data, length)
                except H2Unavailable:
                    log.info("upstream %s does not offer HTTP/2; using HTTP/1.1", self.base)
                    if self._h2 is not None:
                        self._h2.unavailable = True
                else:
                    if resp.status == 401 and self._h2_callers is not None:
                        self._h2_callers.refused(key)
                    return resp
        assert self._pool is not None
        return await self._pool.request(method, target, headers.items(), data, length)

    async def own_request(
        self, method: str, target: str, headers: dict[str, str], data: bytes | None, prefixed: bool = True
    ) -> H2Response | None:
        """kproxy's own request (``ApiClient``) on HTTP/2 with kproxy's credentials, or None when
        the upstream does not speak it (the aiohttp session carries it then). ``target`` is
        under the server URL's path unless ``prefixed`` is false."""
        h2pool = self._h2_own
        if h2pool is None or h2pool.unavailable:
            return None
        sent = time.monotonic()
        try:
            resp = await h2pool.request(method, (self.prefix if prefixed else "") + target, headers.items(), data, None)
        except H2Unavailable:
            return None
        self.link.observe(time.monotonic() - sent)
        return resp

    async def _reply(self, ex: Exchange, resp: UpstreamResponse) -> Reply:
        headers = resp.headers  # end-to-end already
        media_type = resp.headers.get("Content-Type", "")
        length = resp.content_length
        if length is not None and length <= READ_WHOLE_LIMIT:
            try:
                data = await resp.read()
            except _UPSTREAM_ERRORS as err:
                resp.close()
                raise self.failed(ex.method, err) from None
            return Reply(resp.status, headers, BytesBody(data, media_type), resp.reason)
        framing = _watch_framing(ex, resp)
        if framing is not None:
            watch = WatchPassThrough(resp, framing)
            body = StreamBody(watch.chunks(), length, media_type, on_abort=resp.close, on_end=watch.end)
        else:
            body = StreamBody(resp.chunks(), length, media_type, on_abort=resp.close)
        return Reply(resp.status, headers, body, resp.reason)

    def failed(self, method: str, err: BaseException) -> StatusError | NoAnswer:
        """What a caller gets when the upstream cannot be reached or breaks off (see
        ``kproxy.core.outage``): a read a 429 with ``Retry-After``, a write no answer. Counted
        here, where it is known to be the upstream's failure (not any answer a filter might give)."""
        log.warning("upstream %s unreachable: %s", self.base, err or type(err).__name__)
        if self._on_error is not None:
            self._on_error(type(err).__name__)
        return upstream_failed(method, str(err) or type(err).__name__, sent=not isinstance(err, NotSent))

    def unreachable(self, err: BaseException) -> StatusError:
        """The answer to an upgrade (exec, attach, port-forward) that cannot reach the upstream:
        a 429 Status whatever its method, since nothing was sent (an interactive session is
        started again by its user, not retried by a recorder that would lose it)."""
        answer = self.failed("GET", err)
        assert isinstance(answer, StatusError)
        return answer


def _request_data(body: Body) -> tuple[bytes | AsyncIterator[bytes] | None, int | None]:
    """What to send upstream: known bytes, or the client's stream (with its length, if declared)."""
    if isinstance(body, BytesBody):
        return body.data or None, None
    if isinstance(body, StreamBody) and (body.length is None or body.length > 0):
        return body.chunks(), body.length
    return None, None


class UpstreamResponse(Protocol):
    """What the terminal handler needs of a response: kproxy's pool and aiohttp's client both fit."""

    @property
    def status(self) -> int: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def headers(self) -> CIMultiDict[str]:
        """The response's end-to-end headers (hop-by-hop ones removed)."""

    @property
    def content_length(self) -> int | None: ...
    async def read(self) -> bytes: ...
    def chunks(self) -> AsyncIterator[bytes]: ...
    def close(self) -> None: ...


def _watch_framing(ex: Exchange, resp: UpstreamResponse) -> str | None:
    """How the events of a watch the apiserver streams are delimited, when kproxy can tell from
    the bytes: "json" (the ``jsonFramer`` of
    staging/src/k8s.io/apimachinery/pkg/runtime/serializer/json/json.go writes each event as
    ``encoding/json``'s Encoder does: one compact object, then a newline, and no newline inside
    it, as Go escapes control characters in strings), "protobuf" (the
    ``LengthDelimitedFramer`` of staging/src/k8s.io/apimachinery/pkg/util/framer/framer.go: a
    4-byte big-endian length, then the event). None for anything else (another format, an
    encoded body): such a stream is only ever aborted."""
    if ex.info.verb != "watch" or resp.status != 200 or resp.headers.get("Content-Encoding"):
        return None
    media = resp.headers.get("Content-Type", "").partition(";")[0].strip().lower()
    if media == PROTOBUF:
        return "protobuf"
    if media == JSON:
        return "json"
    return None


class WatchPassThrough:
    """A watch passed through from the apiserver that can end after a whole event (drain,
    reload), as a watch served from the cache does (``kproxy.core.eventstream``): the client
    sees a normal end of stream and watches again from the last event it got, instead of a
    torn event (client-go: unexpected EOF) or a gzip stream without its trailer.

    ``end()`` at a boundary (the usual idle watch) closes the upstream response at once, which
    wakes the pending read; inside an event, the rest of that event is passed on first, then the
    stream ends there (what follows it in the same read is dropped: the client asks for it again).
    Only where events end is followed here; the bytes are passed on as they came."""

    __slots__ = ("_head", "_json", "_left", "_resp", "_whole", "ending")

    def __init__(self, resp: UpstreamResponse, framing: str) -> None:
        self._resp = resp
        self._json = framing == "json"
        self._whole = True  # JSON: the bytes passed on so far end with a whole event
        self._head = bytearray()  # protobuf: the part of the next length prefix seen so far
        self._left = 0  # protobuf: bytes of the current event still to come
        self.ending = False

    def at_boundary(self) -> bool:
        if self._json:
            return self._whole
        return self._left == 0 and not self._head

    def end(self) -> None:
        if self.ending:
            return
        self.ending = True
        if self.at_boundary():
            self._resp.close()

    def _advance(self, chunk: bytes, stop: bool) -> int:
        """Follow ``chunk``; with ``stop``, only up to the first end of an event in it. Returns
        how much of it was followed."""
        size = len(chunk)
        if self._json:
            if not stop:
                self._whole = chunk.endswith(b"\n")
                return size
            if self._whole:
                return 0
            i = chunk.find(b"\n")
            if i < 0:
                return size
            self._whole = True
            return i + 1
        pos = 0
        head = self._head
        while pos < size:
            if stop and self._left == 0 and not head:
                break
            if self._left:
                take = min(self._left, size - pos)
                self._left -= take
                pos += take
                continue
            take = min(4 - len(head), size - pos)
            head += chunk[pos : pos + take]
            pos += take
            if len(head) == 4:
                self._left = int.from_bytes(head, "big")
                head.clear()
        return pos

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.chunks():
                if not chunk:
                    continue
                ending = self.ending
                used = self._advance(chunk, ending)
                if used:
                    yield chunk if used == len(chunk) else chunk[:used]
                if self.ending and self.at_boundary():
                    return
        except Exception:
            if self.ending and self.at_boundary():
                return  # the read ``end()`` woke by closing the response
            raise
        finally:
            if self.ending:
                self._resp.close()
