"""Prometheus metrics, in a registry of kproxy's own (the only process-wide state).

Every label takes its values from a bounded set, never from what a caller sent as it is (a
series per random resource name would grow the registry, and each scrape, without end). As the
apiserver's own ``apiserver_request_total``
(staging/src/k8s.io/apiserver/pkg/endpoints/metrics/metrics.go): the verb is a known verb or
``other`` (its ``cleanVerb`` against ``validRequestMethods``); ``group``, ``resource`` and
``subresource`` are the apiserver's label names, kept as the request names them when the
apiserver serves that resource (or subresource), known from its discovery
(``kproxy.server.servedresources``), else ``resource="other"`` (the apiserver counts requests
only on the routes it installed), all three empty for non-resource paths; code is the HTTP
status. ``answered_by`` says who answered: the upstream, the watch ``cache``, a ``filter``
(dryrun, validation, … answering locally) or ``kproxy`` itself (a refusal before any filter, or the
outage answer for an apiserver it could not reach).

As a Prometheus client's default registry does, the registry carries the ``process_*`` (CPU,
memory, open files), ``python_info`` and ``python_gc_*`` collectors, and ``kproxy_build_info``;
counters and histograms export no ``_created`` series (one per label set, doubling the series
count for a value no dashboard reads).
"""

from __future__ import annotations

import functools
import gc
import platform
from collections.abc import Collection
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
)

import kproxy
from kproxy.core.chain import ANSWERED_BY_FILTER
from kproxy.core.requestinfo import RequestInfo
from kproxy.server.connections import CLOSE_REASONS, WAITING_STATES, Connections
from kproxy.server.servedresources import OTHER, ServedResources

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_GC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_FILTER_BUCKETS = (0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.1, 1)

#: The ``verb`` label's values: RequestInfo's verbs, and the lower-cased methods of non-resource
#: requests that the apiserver serves; any other method is ``other``.
KNOWN_VERBS = frozenset(
    (
        "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "proxy",
        "connect", "post", "put", "head", "options",
    )
)  # fmt: skip


#: ``answered_by``: who wrote the answer. ``cache``: the watch cache served it from its store
#: (or refused it there, e.g. a 403 from its authorization); ``filter``: another filter answered
#: without calling the rest of the chain (dryrun, validation's local refusals, …); ``kproxy``:
#: the server answered itself outside any filter: refused before the chain (body too large,
#: ``credentials: proxy``'s guard, an impersonated caller the apiserver would refuse) or for an
#: apiserver it could not reach (the outage answers); ``upstream``: the apiserver answered.
ANSWERERS = ("upstream", "cache", "filter", "kproxy")
#: The filter whose local answers are the cache's.
_CACHE_FILTER = "watchcache"

#: Prometheus client's default: a ``_created`` series beside every counter and histogram child.
disable_created_metrics()  # type: ignore[no-untyped-call]


#: ``Exchange.state`` key the server sets when the chain returned a reply (rather than raising
#: the Status kproxy answers itself, e.g. for an apiserver it could not reach).
CHAIN_REPLIED = "kproxy.chain_replied"


def answered_by(state: dict[str, Any]) -> str:
    """The ``answered_by`` value of a finished request (see ``ANSWERERS``): a filter that answered
    without calling the rest of the chain; else the upstream when the chain returned its reply;
    else kproxy itself (refused before the chain, or a Status raised through it, such as the
    outage answer for an apiserver kproxy could not reach, or no answer at all)."""
    name = state.get(ANSWERED_BY_FILTER)
    if name is not None:
        return "cache" if name == _CACHE_FILTER else "filter"
    return "upstream" if state.get(CHAIN_REPLIED) else "kproxy"


def _version() -> str:
    return getattr(kproxy, "__version__", "") or "unknown"


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        Gauge(
            "kproxy_build_info",
            "Always 1; the labels say which kproxy runs, on which Python.",
            ["version", "python_version", "python_implementation"],
            registry=r,
        ).labels(_version(), platform.python_version(), platform.python_implementation()).set(1)
        self.requests = Counter(
            "kproxy_requests_total",
            "Requests served, by verb, group, resource, subresource, HTTP code and who answered.",
            ["verb", "group", "resource", "subresource", "code", "answered_by"],
            registry=r,
        )
        self.latency = Histogram(
            "kproxy_request_duration_seconds",
            "Time from request to the end of the response (watches excluded), by who answered.",
            ["verb", "group", "resource", "subresource", "answered_by"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.bytes_in = Counter("kproxy_request_bytes_total", "Request body bytes received from clients.", registry=r)
        self.bytes_out = Counter("kproxy_response_bytes_total", "Response body bytes sent to clients.", registry=r)
        self.in_flight = Gauge("kproxy_requests_in_flight", "Requests being served (watches excluded).", registry=r)
        self.open_watches = Gauge("kproxy_open_watches", "Watch and other long-running streams open.", registry=r)
        self.upgrades = Gauge(
            "kproxy_open_upgraded_connections", "Spliced exec/attach/portforward connections.", registry=r
        )
        self.upstream_errors = Counter(
            "kproxy_upstream_errors_total", "Upstream requests that failed before a response.", ["reason"], registry=r
        )
        self.filter_time = Histogram(
            "kproxy_filter_duration_seconds",
            "Time spent in each filter itself (excluding the rest of the chain).",
            ["filter"],
            buckets=_FILTER_BUCKETS,
            registry=r,
        )
        self.rejected = Counter(
            "kproxy_rejected_requests_total",
            "Requests kproxy answered itself with an error Status.",
            ["reason"],
            registry=r,
        )
        self.connections_closed = Counter(
            "kproxy_connections_closed_total",
            "Client connections kproxy closed itself, by reason: a deadline passed (tls_handshake_timeout, "
            "read_header_timeout, idle_timeout) or a bound was reached (max_tls_handshakes, "
            "max_unfinished_heads, max_unfinished_head_bytes, max_idle_connections, max_connections, "
            "max_connections_per_source; the last two also refuse a new connection at once).",
            ["reason"],
            registry=r,
        )
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason)
        self.open_connections = Gauge("kproxy_open_connections", "Client connections open.", registry=r)
        self.http2_connections = Gauge(
            "kproxy_http2_connections", "Client connections that speak HTTP/2 (ALPN h2).", registry=r
        )
        self.http2_streams = Gauge(
            "kproxy_http2_streams", "Streams open on client HTTP/2 connections (requests and watches).", registry=r
        )
        self.connections_reading_head = Gauge(
            "kproxy_connections_reading_head",
            "Client connections reading a request head (new ones, and kept-alive ones whose next request began).",
            registry=r,
        )
        self.unfinished_head_bytes = Gauge(
            "kproxy_unfinished_head_bytes",
            "Estimated memory of request heads received and not yet served, all client connections together.",
            registry=r,
        )
        self.client_connections = Gauge(
            "kproxy_client_connections",
            "Client connections by state: tls_handshake, reading_head, active (being served: a request, "
            "a watch, an upgraded session), idle (kept alive between requests).",
            ["state"],
            registry=r,
        )
        self.max_client_connections = Gauge(
            "kproxy_max_client_connections",
            "The bound on client connections in force (connections.max_connections, or what the "
            "file-descriptor limit leaves room for); 0: none.",
            registry=r,
        )
        self.fd_limit = Gauge(
            "kproxy_open_fds_limit", "The process's file-descriptor limit (RLIMIT_NOFILE) as read at start.", registry=r
        )
        #: The resources the apiserver serves (filled from its discovery once kproxy runs).
        self.served = ServedResources()

        self.config_reloads = Counter(
            "kproxy_config_reloads_total", "Config reloads (file change or SIGHUP), by result.", ["result"], registry=r
        )
        self.config_loaded = Gauge(
            "kproxy_config_last_load_timestamp_seconds", "When the running config was loaded.", registry=r
        )
        self.config_loaded.set_to_current_time()
        # Filled by kproxy.gctuning.observe_pauses in a `kproxy run` process.
        self.gc_pause = Histogram(
            "kproxy_gc_pause_seconds",
            "Garbage-collector runs (everything in the process waits), by generation.",
            ["generation"],
            buckets=_GC_BUCKETS,
            registry=r,
        )
        for generation in ("0", "1", "2"):
            self.gc_pause.labels(generation)
        self.gc_frozen = Gauge(
            "kproxy_gc_frozen_objects", "Objects frozen out of garbage collection after start-up.", registry=r
        )
        self.gc_frozen.set_function(gc.get_freeze_count)

        # Label children cached per label set: prometheus-client's labels() validates and locks on
        # every call, which showed in the per-request profile.
        self._counts: dict[tuple[str, ...], Any] = {}
        self._latencies: dict[tuple[str, ...], Any] = {}
        self._filters: dict[str, Any] = {}

    def watch_connections(self, conns: Connections) -> None:
        """Export the main listener's connection bookkeeping (read when scraped)."""
        self.open_connections.set_function(lambda: conns.open)
        self.connections_reading_head.set_function(lambda: len(conns.reading))
        self.unfinished_head_bytes.set_function(lambda: conns.held)
        for state in WAITING_STATES:
            self.client_connections.labels(state).set_function(functools.partial(conns.count, state))
        self.client_connections.labels("active").set_function(lambda: conns.active)
        self.max_client_connections.set_function(lambda: conns.max_connections)
        self.fd_limit.set_function(lambda: conns.fd_limit)
        closed = {reason: self.connections_closed.labels(reason) for reason in CLOSE_REASONS}
        conns.on_close = lambda reason: closed[reason].inc()

    def watch_http2(self, connections: Collection[Any]) -> None:
        """Export the HTTP/2 connections of the main listener (read when scraped)."""
        self.http2_connections.set_function(lambda: len(connections))
        self.http2_streams.set_function(lambda: sum(c.streams for c in list(connections)))

    def labels_for(self, info: RequestInfo) -> tuple[str, str, str, str]:
        """The bounded ``verb``, ``group``, ``resource`` and ``subresource`` labels of a request
        (see the module docstring)."""
        verb = info.verb if info.verb in KNOWN_VERBS else OTHER
        gr = info.group_resource
        if not gr:
            return verb, "", "", ""
        if self.served.label(gr) == OTHER:
            return verb, "", OTHER, ""
        sub = info.subresource
        if sub:
            # Discovery names a subresource as ``resource/subresource`` (kproxy.server.servedresources).
            named = f"{info.resource}/{sub}"
            sub = sub if (f"{named}.{info.api_group}" if info.api_group else named) in self.served.known else OTHER
        return verb, info.api_group, info.resource, sub

    def count(self, info: RequestInfo, code: int, answerer: str) -> None:
        key = (*self.labels_for(info), str(code), answerer)
        child = self._counts.get(key)
        if child is None:
            child = self._counts[key] = self.requests.labels(*key)
        child.inc()

    def observe_latency(self, info: RequestInfo, answerer: str, seconds: float) -> None:
        key = (*self.labels_for(info), answerer)
        child = self._latencies.get(key)
        if child is None:
            child = self._latencies[key] = self.latency.labels(*key)
        child.observe(seconds)

    def observe_filter(self, name: str, seconds: float) -> None:
        child = self._filters.get(name)
        if child is None:
            child = self._filters[name] = self.filter_time.labels(name)
        child.observe(seconds)
