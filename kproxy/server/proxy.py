"""The aiohttp listener, the admin listener, and the proxy's lifecycle.

Each request becomes an ``Exchange`` (RequestInfo parsed once), runs through the chain, and the
resulting ``Reply`` is written back: complete bodies in one write, streams chunk by chunk as
they arrive (watches see each event as soon as the upstream sends it), upgrades spliced.

The main listener uses aiohttp's low-level ``web.Server`` (no router, no middlewares): every
path goes to one handler, which keeps the per-request cost of the proxy itself small.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kproxy.config import BodiesConfig, Config, metrics_authorized
from kproxy.core import offload
from kproxy.core.bodybudget import BodyBudget, BudgetLimits
from kproxy.core.chain import BytesBody, Chain, Exchange, Filter, Reply, Starts, Stops, StreamBody, UpgradeBody
from kproxy.core.context import ApiClient, FilterContext
from kproxy.core.eventstream import EventStreamBody, serve_events
from kproxy.core.fairness import FairLimits, flow_of
from kproxy.core.outage import NoAnswer
from kproxy.core.status import StatusError, internal_error, request_entity_too_large
from kproxy.core.upstreamlink import UPSTREAM_LINK
from kproxy.gocompat.httpguts import valid_host_header
from kproxy.identity.authn import authenticator
from kproxy.identity.impersonate import STRIPPED_WARNING, CallerAuthenticator, has_impersonation
from kproxy.identity.reviewlimit import review_limiter
from kproxy.server.adminauth import MetricsAuthorizer
from kproxy.server.bind import bind, bound_address, format_address, server_ssl
from kproxy.server.clientbody import ClientBody, expects_continue
from kproxy.server.connections import Connections, admin_limits, raise_fd_limit
from kproxy.server.http2.h2stream import H2Request
from kproxy.server.http2.respond import respond as respond_h2
from kproxy.server.http2.server import H2ServerConnection
from kproxy.server.http2.settings import H2Limits
from kproxy.server.httputil import REQUEST_SKIP, UPGRADE_REQUEST_SKIP, end_to_end, is_upgrade
from kproxy.server.kubeconfig import UpstreamTarget
from kproxy.server.listener import (
    GoAppRunner,
    GoServer,
    Http2Serving,
    go_transfer_encoding_refused,
)
from kproxy.server.metrics import CHAIN_REPLIED, Metrics, answered_by
from kproxy.server.proxyguard import proxy_guard
from kproxy.server.reload import RESTART_KEYS, build_chain, restart_changes
from kproxy.server.requesttarget import is_long_running, read_target
from kproxy.server.responses import (
    H2_WRITTEN,
    SLICE,
    TransparentResponse,
    TransparentStreamResponse,
    refuse_head,
    write_sliced,
)
from kproxy.server.upgrade import splice
from kproxy.server.upstream import CLIENT_H2, Upstream

log = logging.getLogger("kproxy")
access = logging.getLogger("kproxy.access")

_STREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


@dataclass(slots=True, eq=False)
class _OpenStream:
    """A response being streamed; shutdown ends it cleanly."""

    body: StreamBody
    watch: bool
    ending: bool = False
    h2: H2Request | None = None  # served on an HTTP/2 stream
    since: float = 0.0  # the loop's time when it started (HTTP/2)

    def end(self) -> None:
        """End it cleanly: a watch after a whole event (the client watches again)."""
        if not self.ending:
            self.ending = True
            self.body.end_cleanly()


@dataclass(slots=True)
class _ReadyCache:
    ok: bool = False
    reason: str = "not checked yet"
    at: float = field(default=-1e9)


#: client-go's reflector takes a watch that ends less than a second after it began, with no event,
#: for an error and lists again (staging/src/k8s.io/client-go/tools/cache/reflector.go,
#: ``VeryShortWatchError``): a watch ended only to move it to a new connection is ended no sooner.
_SHORTEST_WATCH = 1.0


class ProxyServer:
    """kproxy: listener + chain + upstream + admin listener."""

    def __init__(self, cfg: Config, target: UpstreamTarget, filters: list[Filter] | None = None) -> None:
        self.cfg = cfg
        self.metrics = Metrics()
        self.upstream = Upstream(
            target,
            cfg.credentials,
            connect_timeout=cfg.upstream.connect_timeout,
            max_connections=cfg.upstream.max_connections,
            http2=cfg.upstream.http2,
            on_error=lambda kind: self.metrics.upstream_errors.labels(kind).inc(),
        )
        self.chain = Chain(list(filters or []), self.upstream, observe=self.metrics.observe_filter)
        self.access_log = cfg.log.access_log
        self._limit = cfg.max_request_body_bytes
        self.bodies = BodyBudget(_budget_limits(cfg.bodies))
        self.connections = Connections(cfg.connections)
        self.guard = proxy_guard(cfg, self._guard_refused)
        self.metrics.watch_connections(self.connections)
        self._in_flight = 0
        # Read when /metrics is scraped rather than updated (under a lock) twice per request.
        self.metrics.in_flight.set_function(lambda: self._in_flight)
        self._idle = asyncio.Event()
        self._idle.set()
        self._streams: set[_OpenStream] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._draining: set[Chain] = set()  # replaced by a reload, requests still running on them
        self.callers: CallerAuthenticator | None = None
        self._stopping = False
        self._ready = _ReadyCache()
        self._runner: web.ServerRunner | None = None
        self._admin_runner: web.AppRunner | None = None
        self._sites: list[web.BaseSite] = []
        self.bound: tuple[str, int] | None = None
        self.admin_bound: tuple[str, int] | None = None
        self.admin_connections = Connections()  # the admin listener's own bounds
        self.http2 = Http2Serving(self.handle, H2Limits())  # the TLS listener's h2 connections
        self.http2.gone = self._h2_gone
        self._h2_leaving: set[int] = set()  # HTTP/2 connections sent GOAWAY, by number
        self.metrics.watch_http2(self.http2.registry)

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await self.upstream.start()
        self.context = FilterContext(
            ApiClient(self.upstream),
            self.cfg.credentials,
            self.metrics.registry,
            anonymous_auth=self.cfg.upstream.anonymous_auth,
        )
        offload.install(self.context, _fair_limits(self.cfg.bodies))
        self.context.provide(UPSTREAM_LINK, self.upstream.link)  # the compression filter's upstream_gzip: auto
        reviews = self.cfg.token_reviews
        review_limiter(self.context, reviews.max_in_flight, reviews.max_in_flight_per_client)
        if self.cfg.credentials == "impersonate":
            imp = self.cfg.impersonate
            self.callers = CallerAuthenticator(
                self.context, imp.token_cache_ttl, imp.rejected_token_cache_ttl, lambda: self.cfg.impersonate
            )
        await self.chain.start(self.context)
        ssl_ctx = server_ssl(self.cfg, http2=self.cfg.http2.enabled)
        # Connections are bounded below the file-descriptor limit (kproxy.server.connections).
        self.connections.fd_limit = raise_fd_limit()
        # HTTP/2 for TLS clients that offer it (ALPN), with the apiserver's settings.
        self.http2.limits = H2Limits(
            max_concurrent_streams=self.cfg.http2.max_concurrent_streams,
            idle_timeout=self.cfg.connections.idle_timeout,
        )
        # GoServer: Go's limits on a request head and its answers to requests it cannot read.
        server = GoServer(
            self.handle,
            self.connections,
            ssl_ctx,
            self.http2 if ssl_ctx is not None and self.cfg.http2.enabled else None,
            handler_cancellation=True,
            access_log=None,
        )
        self._runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=1.0)
        await self._runner.setup()
        # The socket listens in plain TCP: GoServer admits each connection, then does its handshake.
        site = web.TCPSite(self._runner, self.cfg.listen.host, self.cfg.listen.port, backlog=1024)
        await bind(site, "listen", self.cfg.listen)
        self._sites.append(site)
        self.bound = bound_address(site)

        admin = web.Application()
        admin.router.add_get("/metrics", self._metrics)
        admin.router.add_get("/healthz", self._healthz)
        admin.router.add_get("/livez", self._healthz)
        admin.router.add_get("/readyz", self._readyz)
        admin_ssl = server_ssl(self.cfg, http2=False) if self.cfg.admin_tls else None
        # Bounded too, from the descriptors kept out of the main listener's bound.
        self.admin_connections.limits = admin_limits(self.cfg.connections, self.connections.fd_limit)
        self._admin_runner = GoAppRunner(
            admin, self.admin_connections, admin_ssl, handle_signals=False, access_log=None
        )
        await self._admin_runner.setup()
        self._metrics_auth = MetricsAuthorizer(self.context)
        asite = web.TCPSite(self._admin_runner, self.cfg.admin_listen.host, self.cfg.admin_listen.port)
        await bind(asite, "admin_listen", self.cfg.admin_listen)
        self.admin_bound = bound_address(asite)
        # The metrics' resource labels follow discovery from now on: once both listeners are bound
        # (a port in use is one line on stderr, before anything asks the apiserver).
        self.metrics.served.start(self.context.discovery)
        scheme = "https" if ssl_ctx else "http"
        log.info(
            "kproxy listening",
            extra={
                "listen": f"{scheme}://{format_address(self.bound)}",
                "admin": f"{'https' if admin_ssl else 'http'}://{format_address(self.admin_bound)}",
                "upstream": str(self.upstream.base),
                "upstream_from": self.upstream.target.source,
                "credentials": self.cfg.credentials,
                "filters": [f.name for f in self.chain.filters],
            },
        )

    async def apply_config(self, cfg: Config) -> list[str]:
        """Swap in the chain and the reloadable settings of ``cfg`` (see ``kproxy.server.reload``).

        Returns the restart-only keys that changed and were left as they are. Raises
        ConfigError, or whatever a new filter's ``start`` raised, with nothing changed."""
        ignored = restart_changes(self.cfg, cfg)
        chain, fresh = build_chain(self, cfg)
        started: list[Filter] = []
        try:
            for flt in fresh:
                if isinstance(flt, Starts):
                    await flt.start(self.context)
                started.append(flt)
        except BaseException:
            await _stop_filters(started)
            raise
        keep = {k.split(".")[0]: getattr(self.cfg, k.split(".")[0]) for k in RESTART_KEYS if k in ignored}
        if "log.format" in ignored:
            keep["log"] = cfg.log.model_copy(update={"format": self.cfg.log.format})
        old, self.chain = self.chain, chain
        running, self.cfg = self.cfg, cfg.model_copy(update=keep)
        self.access_log = cfg.log.access_log
        self._limit = cfg.max_request_body_bytes
        self.connections.limits = cfg.connections
        self.connections.fd_limit = raise_fd_limit()  # read again: `prlimit` may have changed it
        self.admin_connections.limits = admin_limits(cfg.connections, self.connections.fd_limit)
        self.bodies.limits = _budget_limits(cfg.bodies)
        offload.install(self.context, _fair_limits(cfg.bodies))
        self.guard = proxy_guard(self.cfg, self._guard_refused)
        logging.getLogger().setLevel(cfg.log.level.upper())
        old.retired = True
        self._draining.add(old)
        # HTTP/2 clients move to new connections, served by the new chain (an HTTP/1.1 watch
        # stays on the old chain until it ends: nothing tells its client to leave). A reload that
        # changed nothing (a SIGHUP, the same file written again) sends no one away.
        if self.cfg != running:
            self._h2_go_away(list(self.http2.registry), self.cfg.shutdown_timeout)
        if old.active == 0:
            await self._retire(old)
        return ignored

    def _h2_go_away(self, conns: list[H2ServerConnection], deadline: float) -> None:
        """A graceful GOAWAY (NO_ERROR) to each HTTP/2 connection, on a drain or a reload: the
        streams it opened are served to their end and its watches end cleanly (after a whole
        event, none younger than a second: ``_move_watch``), so its client opens its next
        streams, and watches again, on a new connection; each closes once its streams are done.
        A watch not over ``deadline`` seconds on (its client reads nothing) is reset; any other
        answer is never cut here. (A drain then ends every watch at once, HTTP/1.1's too.)"""
        leaving = {conn.number for conn in conns}
        for conn in conns:
            conn.drain()
        self._h2_leaving |= leaving
        for stream in list(self._streams):
            if stream.watch and stream.h2 is not None and stream.h2.connection in leaving:
                self._move_watch(stream)
        if leaving:
            asyncio.get_running_loop().call_later(deadline, self._h2_gone_away, leaving)

    def _h2_gone_away(self, leaving: set[int]) -> None:
        """The drain deadline of connections sent GOAWAY: their watches still open are reset."""
        stuck = [s for s in self._streams if s.watch and s.h2 is not None and s.h2.connection in leaving]
        for stream in stuck:
            stream.h2.transport.abort()  # type: ignore[union-attr]
        serving = [conn for conn in self.http2.registry if conn.number in leaving]
        if serving:
            log.info(
                "HTTP/2 connections still serving after GOAWAY (the drain deadline passed)",
                extra={"connections": len(serving), "streams": sum(c.streams for c in serving), "reset": len(stuck)},
            )

    def _move_watch(self, stream: _OpenStream) -> None:
        """End a watch so that its client watches again on a new connection: at once, or once
        it is a second old (``_SHORTEST_WATCH``)."""
        loop = asyncio.get_running_loop()
        wait = stream.since + _SHORTEST_WATCH - loop.time()
        if wait > 0:
            loop.call_later(wait, stream.end)
        else:
            stream.end()

    def _h2_gone(self, number: int) -> None:
        self._h2_leaving.discard(number)
        self.upstream.client_gone(number)

    async def _retire(self, old: Chain) -> None:
        """Stop the filters of a drained chain that no chain still in use holds (the current
        one, or another replaced chain whose requests have not all finished)."""
        self._draining.discard(old)
        in_use = {id(f) for chain in (self.chain, *self._draining) for f in chain.filters}
        await _stop_filters([f for f in old.filters if id(f) not in in_use])

    async def _close_discovery(self) -> None:
        """End the discovery service's reads and its CRD watch (``kproxy.core.discovery``)."""
        context: FilterContext | None = getattr(self, "context", None)  # set by start()
        if context is not None:
            await context.discovery.close()

    async def close_unstarted(self) -> None:
        """Release what a :meth:`start` that failed had opened (no drain: nothing was served)."""
        for runner in (self._runner, self._admin_runner):
            if runner is not None:
                await runner.cleanup()
        await self.chain.stop()
        await self.metrics.served.stop()
        await self._close_discovery()
        await self.upstream.close()

    async def shutdown(self, deadline: float | None = None) -> None:
        """Stop accepting, end open watches cleanly, let in-flight requests finish (bounded)."""
        deadline = self.cfg.shutdown_timeout if deadline is None else deadline
        self._stopping = True
        for site in self._sites:
            await site.stop()
        log.info("draining", extra={"in_flight": self._in_flight, "streams": len(self._streams)})
        until = asyncio.get_running_loop().time() + deadline
        self._h2_go_away(list(self.http2.registry), deadline)  # clients open new streams elsewhere
        for stream in list(self._streams):
            if stream.watch:
                stream.end()
        try:
            await asyncio.wait_for(self._idle.wait(), deadline)
        except TimeoutError:
            log.warning("drain deadline passed", extra={"in_flight": self._in_flight})
        for stream in list(self._streams):
            if not (stream.watch and stream.ending):  # an ending watch finishes its event: bounded below
                stream.ending = True
                stream.body.abort()
        # An ended watch is over once its last bytes and its end of stream have been written out
        # (a watch served from the cache waits for that, kproxy.core.eventstream.serve_events);
        # the runner's cleanup closes connections and would cut it short. Wait for those ends
        # within the same deadline, as Go's Shutdown waits for its handlers to return.
        while watches := [s for s in self._streams if s.watch]:
            if asyncio.get_running_loop().time() >= until:
                log.warning("drain deadline passed", extra={"watches": len(watches)})
                for stream in watches:
                    stream.body.abort()  # the hard stop: one still inside an event its client does not take
                break
            for stream in watches:
                stream.end()  # one that started since
            await asyncio.sleep(0.05)
        # HTTP/2 connections write out what their streams left (a watch's last events, its
        # END_STREAM) before they close, within the same deadline; then they are cut.
        for conn in list(self.http2.registry):
            conn.close()
        while self.http2.registry and asyncio.get_running_loop().time() < until:
            await asyncio.sleep(0.05)
        for conn in list(self.http2.registry):
            conn.abort()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.chain.stop()
        await self.metrics.served.stop()
        await self._close_discovery()
        await self.upstream.close()

    # ----------------------------------------------------------------- main listener

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        started = time.perf_counter()
        raw = request.raw_path
        target = read_target(request.method, raw)
        if target is None:  # Go's server refuses this target before any handler runs
            return refuse_head(request)
        if not valid_host_header(request.headers.get("Host", "")):  # net/http readRequest, before any handler
            return refuse_head(request, "malformed Host header")
        refused_te = go_transfer_encoding_refused(request.version, request.headers.getall("Transfer-Encoding", []))
        if refused_te is not None:
            return refused_te
        uri, info = target
        upgrade = is_upgrade(request.headers)
        # The exchange carries the headers as they will go upstream: end-to-end only (the upgrade
        # pair kept for upgrades), no Host (the upstream's own is set when sending).
        headers = end_to_end(request.headers, UPGRADE_REQUEST_SKIP if upgrade else REQUEST_SKIP)
        length = request.content_length
        expect = request.headers.get("Expect", "")
        client = ClientBody(request, expects_continue(expect) and request.version >= (1, 1))
        if not is_long_running(info):
            # An Upgrade header exempts nothing: the apiserver's request timeout spares only its
            # long-running requests (connect subresources among them), whatever the headers say.
            client.bound(self.bodies, self.cfg.bodies.read_timeout)
        ex = Exchange(
            request.method,
            uri.escaped_path,
            uri.raw_query,
            headers,
            # The body's media type is the Content-Type that goes upstream: one the caller named
            # in Connection is hop-by-hop and dropped, and no filter may judge the body by it.
            _NO_BODY
            if request.method == "CONNECT"
            else client.body(length, self._limit, headers.get("Content-Type", "")),
            info,
            client=request.remote,
            upgrade=upgrade,
            host=uri.host or request.headers.get("Host", ""),
        )
        if isinstance(request, H2Request):
            ex.state[CLIENT_H2] = request.connection  # forward mode: its upstream connections
        client.caller = lambda: flow_of(self.context, ex)
        if self.cfg.credentials == "forward":
            # Impersonate mode identifies every caller before the chain (_impersonating); proxy
            # mode's callers are all kproxy itself.
            client.identify = lambda: authenticator(self.context).identify(ex)
        long_running = info.verb == "watch" or upgrade
        chain = self.chain  # a reload swaps self.chain; this request stays on the one it started on
        chain.active += 1
        if not long_running:
            self._in_flight += 1
            self._idle.clear()
        status = 500
        sent = 0
        audit_id = ""
        # A CONNECT's body (framed as Go frames it, kproxy.server.h1request) does not go upstream:
        # no apiserver route serves CONNECT, and its 405 or 404 comes before any body is read.
        # The connection closes after the answer.
        close = request.method == "CONNECT"
        try:
            if expect and not expects_continue(expect):
                # Go's sendExpectationFailed (before any handler): 417, no body, connection closed.
                reply, close = Reply(417, CIMultiDict(), BytesBody(b"")), True
            elif self.guard is not None and (refused := self.guard.refuse(ex)) is not None:
                reply = refused  # credentials: proxy: kubectl proxy's host, path and method filter
            elif length is not None and length > self._limit:
                reply = self._reject(request_entity_too_large(self._limit), ex)
            elif self.callers is not None:
                reply = await self._impersonating(request, chain, ex)
            else:
                reply = await self._run_chain(chain, ex)
            status = reply.status
            audit_id = reply.headers.get("Audit-Id", "")
            resp, sent = await self._write(request, ex, reply)
            if close or self._stopping or client.closes_connection() or _refused_connect(ex, status):
                resp.force_close()
            return resp
        except NoAnswer:
            # The upstream failed a write: the client sees what a client of an unreachable
            # apiserver sees, a closed connection (kproxy.core.outage). Metrics say code 0.
            status = 0
            if request.transport is not None:
                request.transport.close()
            return web.Response()  # never written: aiohttp finds the transport closing
        finally:
            await client.settle()
            client.close()
            chain.active -= 1
            if chain.retired and chain.active == 0:
                self._background(self._retire(chain))
            if not long_running:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.set()
            elapsed = time.perf_counter() - started
            resource = info.group_resource
            m = self.metrics
            answerer = answered_by(ex.state)
            m.count(info, status, answerer)
            if not long_running:
                m.observe_latency(info, answerer, elapsed)
            if sent:
                m.bytes_out.inc(sent)
            if isinstance(ex.body, StreamBody) and ex.body.received:
                m.bytes_in.inc(ex.body.received)
            if self.access_log:
                access.info(
                    "%s %s %d",
                    request.method,
                    raw,
                    status,
                    extra={
                        "audit_id": audit_id,
                        "duration_ms": round(elapsed * 1000, 3),
                        "bytes": sent,
                        "verb": info.verb,
                        "resource": resource,
                        "answered_by": answerer,
                        "user_agent": request.headers.get("User-Agent", ""),
                        "protocol": f"HTTP/{request.version.major}.{request.version.minor}",
                    },
                )

    def _guard_refused(self, check: str) -> None:
        self.metrics.rejected.labels(f"ProxyFilter{check.capitalize()}").inc()

    def _reject(self, err: StatusError, ex: Exchange) -> Reply:
        """A Status kproxy answers itself, in the media type the request negotiates."""
        self.metrics.rejected.labels(err.reason or str(err.code)).inc()
        return Reply.from_status(err, ex)

    async def _impersonating(self, request: web.BaseRequest, chain: Chain, ex: Exchange) -> Reply:
        """Impersonate mode: authenticate the caller first; a caller the apiserver would refuse
        gets the apiserver's answer, and no filter sees the request."""
        assert self.callers is not None
        transport = request.transport
        tls = transport.get_extra_info("ssl_object") if transport is not None else None
        # The DER: the apiserver's user for it needs its bytes (kproxy.identity.certname, credential id).
        peercert = tls.getpeercert(binary_form=True) if tls is not None else None
        try:
            await self.callers.identify(ex, peercert)
        except StatusError as err:
            return self._reject(err, ex)
        reply = await self._run_chain(chain, ex)
        if has_impersonation(request.headers):
            reply.headers.add("Warning", STRIPPED_WARNING)
        return reply

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_chain(self, chain: Chain, ex: Exchange) -> Reply:
        try:
            reply = await chain.handle(ex)
        except StatusError as err:
            return self._reject(err, ex)
        except (asyncio.CancelledError, NoAnswer):
            raise
        except Exception as err:  # a filter bug must still get a Status, never a traceback
            log.exception("request failed", extra={"path": ex.raw_path})
            return self._reject(internal_error(f"kproxy: {type(err).__name__}: {err}"), ex)
        ex.state[CHAIN_REPLIED] = True
        return reply

    async def _write(self, request: web.BaseRequest, ex: Exchange, reply: Reply) -> tuple[web.StreamResponse, int]:
        if isinstance(request, H2Request):
            request.last = self._unauthenticated_h2(ex, reply)
            track = functools.partial(self._open_stream, h2=request)
            return H2_WRITTEN, await respond_h2(request, ex, reply, track)
        body = reply.body
        if isinstance(body, BytesBody):
            if request.method == "HEAD":
                # A HEAD answer has no body but keeps the Content-Length of the GET it stands for.
                return TransparentResponse(status=reply.status, reason=reply.reason, headers=reply.headers), 0
            reply.headers.popall("Content-Length", None)
            if len(body.data) > SLICE:
                # A big body (a cached list) written whole would be copied into the transport's
                # buffer once per slow connection; in slices, each awaited, memory stays flat.
                return await write_sliced(request, reply, body.data), len(body.data)
            resp = TransparentResponse(status=reply.status, reason=reply.reason, headers=reply.headers, body=body.data)
            return resp, len(body.data)
        if isinstance(body, EventStreamBody):
            return await self._serve_events(request, reply, body)
        if isinstance(body, UpgradeBody):
            self.metrics.upgrades.inc()
            try:
                return await splice(request, reply), 0
            finally:
                self.metrics.upgrades.dec()
        return await self._stream(request, ex, reply, body)

    async def _stream(
        self, request: web.BaseRequest, ex: Exchange, reply: Reply, body: StreamBody
    ) -> tuple[web.StreamResponse, int]:
        """Write a streamed body as it arrives. A watch that the upstream or shutdown ends gets a
        clean end of stream (as the apiserver ends watches); any other body cut short aborts the
        connection, so the client cannot mistake a truncated body for a whole one."""
        resp = TransparentStreamResponse(status=reply.status, reason=reply.reason, headers=reply.headers)
        if body.length is not None:
            resp.content_length = body.length
        watch = ex.info.verb == "watch"
        stream = _OpenStream(body, watch)
        self._streams.add(stream)
        if watch:
            self.metrics.open_watches.inc()
        sent = 0
        try:
            await resp.prepare(request)
            try:
                async for chunk in body.chunks():
                    await resp.write(chunk)
                    sent += len(chunk)
            except _STREAM_ERRORS as err:
                transport = request.transport
                if transport is None or transport.is_closing():
                    return resp, sent  # the client went away; the upstream side is closed below
                if not (watch or stream.ending):
                    log.warning("upstream stream broke", extra={"path": ex.raw_path, "error": str(err)})
                    transport.abort()
                    return resp, sent
            await resp.write_eof()
            return resp, sent
        finally:
            self._streams.discard(stream)
            body.abort()
            if watch:
                self.metrics.open_watches.dec()

    def _unauthenticated_h2(self, ex: Exchange, reply: Reply) -> bool:
        """Whether the apiserver would end this HTTP/2 connection after the request: one from the
        anonymous user, or one it answers 401 (its UnauthenticatedHTTP2DOSMitigation, which
        degrades unauthenticated clients to a request per connection:
        staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go). In proxy mode every
        caller reaches the apiserver as kproxy, so none is."""
        if self.cfg.credentials == "proxy":
            return False
        if reply.status == 401:
            return True
        if ex.identity is not None:  # impersonate: the caller kproxy identified
            return ex.identity.user == "system:anonymous" and "system:unauthenticated" in ex.identity.groups
        return "Authorization" not in ex.headers  # forward: only a token reaches the apiserver

    @contextlib.contextmanager
    def _open_stream(self, body: StreamBody, watch: bool, h2: H2Request) -> Iterator[_OpenStream]:
        """A streamed answer on an HTTP/2 stream, known to the drain as HTTP/1.1's are."""
        stream = _OpenStream(body, watch, h2=h2)
        self._streams.add(stream)
        if watch:
            stream.since = asyncio.get_running_loop().time()
            if h2.connection in self._h2_leaving:
                self._move_watch(stream)  # its connection was sent GOAWAY while it was on its way
        if watch:
            self.metrics.open_watches.inc()
        try:
            yield stream
        finally:
            self._streams.discard(stream)
            body.abort()
            if watch:
                self.metrics.open_watches.dec()

    async def _serve_events(
        self, request: web.BaseRequest, reply: Reply, body: EventStreamBody
    ) -> tuple[web.StreamResponse, int]:
        """A watch kproxy serves itself: headers out at once (as the apiserver flushes them
        before the first event), then its frames go straight to the transport until the watch
        ends (timeout, slow client, shutdown) or the client goes away."""
        resp = TransparentStreamResponse(status=reply.status, reason=reply.reason, headers=reply.headers)
        stream = _OpenStream(body, True)
        self._streams.add(stream)
        self.metrics.open_watches.inc()
        try:
            await serve_events(request, resp, body)
            return resp, 0
        finally:
            self._streams.discard(stream)
            body.abort()
            self.metrics.open_watches.dec()

    # ----------------------------------------------------------------- admin listener

    async def _metrics(self, request: web.Request) -> web.Response:
        if metrics_authorized(self.cfg):
            refused = await self._metrics_auth.refusal(request)
            if refused is not None:
                return refused
        data = generate_latest(self.metrics.registry)
        return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _readyz(self, request: web.Request) -> web.Response:
        problems = []
        if self._stopping:
            problems.append("shutting down")
        ok, reason = await self.upstream_ready()
        if not ok:
            problems.append(f"upstream: {reason}")
        problems += [f"filter {name} not ready" for name in self.chain.not_ready()]
        if problems:
            return web.Response(status=503, text="\n".join(problems) + "\n")
        return web.Response(text="ok")

    async def upstream_ready(self) -> tuple[bool, str]:
        """Ask the upstream's /readyz (readable without credentials by default), at most once a second."""
        now = time.monotonic()
        cache = self._ready
        if now - cache.at < 1.0:
            return cache.ok, cache.reason
        session = self.upstream.session
        assert session is not None
        headers: dict[str, Any] = {}
        auth = await self.upstream.own_auth_header()
        if auth:
            headers["Authorization"] = auth
        try:
            async with asyncio.timeout(5):  # on the HTTP/2 connections when the upstream speaks it
                answer = await self.upstream.own_request("GET", "/readyz", headers, None, prefixed=False)
                if answer is not None:
                    await answer.read()
                    cache.ok, cache.reason = answer.status == 200, f"/readyz answered {answer.status}"
            if answer is None:
                async with session.get(
                    self.upstream.base.with_path("/readyz"), headers=headers, timeout=aiohttp.ClientTimeout(total=5)
                ) as resp:
                    await resp.read()
                    cache.ok, cache.reason = resp.status == 200, f"/readyz answered {resp.status}"
        except _STREAM_ERRORS as err:
            cache.ok, cache.reason = False, str(err) or type(err).__name__
        cache.at = now
        return cache.ok, cache.reason


def _budget_limits(cfg: BodiesConfig) -> BudgetLimits:
    return BudgetLimits(cfg.max_buffered_bytes, cfg.max_buffered_bytes_per_caller, cfg.buffer_wait)


def _fair_limits(cfg: BodiesConfig) -> FairLimits:
    return FairLimits(
        cfg.workers, cfg.workers_per_caller, cfg.queue_per_caller, cfg.queue_total, cfg.queue_wait, cfg.large_body_bytes
    )


_NO_BODY = BytesBody(b"")


def _refused_connect(ex: Exchange, status: int) -> bool:
    """An upgrade to a connect subresource (exec, attach, port-forward, proxy) that the upstream
    refused: the apiserver hijacks the connection to copy the refusal and then closes it
    (staging/src/k8s.io/apimachinery/pkg/util/proxy/upgradeaware.go tryUpgrade), so nothing the
    client sent after the head is read as another request."""
    return ex.upgrade and status >= 400 and ex.info.is_connect


async def _stop_filters(filters: list[Filter]) -> None:
    for flt in reversed(filters):
        if not isinstance(flt, Stops):
            continue
        try:
            await flt.stop()
        except Exception:
            log.exception("filter failed to stop", extra={"filter": flt.name})
