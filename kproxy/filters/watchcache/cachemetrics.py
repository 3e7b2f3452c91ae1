"""The watch cache's metrics, registered once per process (they outlive a config reload)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram

from kproxy.core.context import FilterContext, ServiceKey


@dataclass(frozen=True, slots=True)
class CacheMetrics:
    objects: Gauge
    progress: Gauge
    reads: Counter
    relists: Counter
    watches: Gauge
    events: Counter
    deliveries: Counter
    writes: Counter
    coalesced: Counter
    slow_closed: Counter
    latency: Histogram
    write_wait: Histogram
    persist_loads: Counter
    late_events: Counter


_KEY: ServiceKey[CacheMetrics] = ServiceKey(f"{__name__}.CacheMetrics")


def cache_metrics(ctx: FilterContext) -> CacheMetrics:
    def make() -> CacheMetrics:
        r = ctx.registry
        return CacheMetrics(
            Gauge("kproxy_watchcache_objects", "Objects held in the watch cache.", ["resource"], registry=r),
            # Not a difference of resource versions: they are opaque (API conventions), and even
            # read as etcd revisions their difference counts every write in the cluster, not this
            # resource's events. time() minus this is how long the cache has heard nothing new.
            Gauge(
                "kproxy_watchcache_last_progress_timestamp_seconds",
                "Unix time the cache last learned of a newer resource version from the apiserver "
                "(an event, a bookmark, a list or a progress probe).",
                ["resource"],
                registry=r,
            ),
            Counter(
                "kproxy_watchcache_reads_total",
                "Reads of cached resources, by who served them (cache or upstream) and why.",
                ["resource", "verb", "served", "reason"],
                registry=r,
            ),
            Counter(
                "kproxy_watchcache_relists_total",
                "Lists made again after the first (expired resource version, upstream errors).",
                ["resource", "reason"],
                registry=r,
            ),
            Gauge("kproxy_watchcache_watches", "Open watches served from the cache.", ["resource"], registry=r),
            Counter(
                "kproxy_watchcache_events_total",
                "Events into the cache from the upstream (relist differences included).",
                ["resource"],
                registry=r,
            ),
            Counter("kproxy_watchcache_deliveries_total", "Events written to watchers.", ["resource"], registry=r),
            Counter(
                "kproxy_watchcache_watch_writes_total", "Writes to watchers' connections.", ["resource"], registry=r
            ),
            Counter(
                "kproxy_watchcache_coalesced_writes_total",
                "Writes to watchers' connections that carried more than one event.",
                ["resource"],
                registry=r,
            ),
            Counter(
                "kproxy_watchcache_slow_watchers_closed_total",
                "Watchers closed because they did not keep up (their buffer stayed full past the time budget).",
                ["resource"],
                registry=r,
            ),
            Histogram(
                "kproxy_watchcache_delivery_latency_seconds",
                "From an event's arrival from the upstream to its write to every watcher that gets it.",
                ["resource"],
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
                registry=r,
            ),
            Histogram(
                "kproxy_watchcache_write_wait_seconds",
                "How long the answer to a write of a cached resource waited for the write's own event to "
                "be written to the cache's watchers (outcome: delivered, or timeout at write_wait).",
                ["resource", "outcome"],
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
                registry=r,
            ),
            Counter(
                "kproxy_watchcache_persist_loads_total",
                "Starts of a persisted resource's cache, by what was on disk: loaded, none, or discarded "
                "(torn, corrupt, another key or upstream: removed, the resource listed).",
                ["resource", "outcome"],
                registry=r,
            ),
            Counter(
                "kproxy_watchcache_late_events_total",
                "Events that reached the cache after a freshness probe had confirmed their resource version "
                "(a consistent read served in between missed them; the probe's wait grows to cover them).",
                ["resource"],
                registry=r,
            ),
        )

    return ctx.service(_KEY, make)


class WatchCounters:
    """The broadcaster's reports for one resource, as prometheus children."""

    __slots__ = ("_coalesced", "_deliveries", "_events", "_latency", "_slow", "_watches", "_writes")

    def __init__(self, m: CacheMetrics, label: str) -> None:
        self._watches = m.watches.labels(label)
        self._events = m.events.labels(label)
        self._deliveries = m.deliveries.labels(label)
        self._writes = m.writes.labels(label)
        self._coalesced = m.coalesced.labels(label)
        self._slow = m.slow_closed.labels(label)
        self._latency = m.latency.labels(label)

    def delivered(self, deliveries: int, writes: int, coalesced: int) -> None:
        self._deliveries.inc(deliveries)
        self._writes.inc(writes)
        if coalesced:
            self._coalesced.inc(coalesced)

    def latency(self, seconds: float) -> None:
        self._latency.observe(seconds)

    def slow_closed(self) -> None:
        self._slow.inc()

    def watchers(self, count: int) -> None:
        self._watches.set(count)

    def events_in(self, count: int) -> None:
        self._events.inc(count)
