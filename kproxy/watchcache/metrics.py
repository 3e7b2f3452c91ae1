"""The watch cache's metrics, registered once per process (they outlive a config reload)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Gauge

from kproxy.context import FilterContext


@dataclass(frozen=True, slots=True)
class CacheMetrics:
    objects: Gauge
    lag: Gauge
    reads: Counter
    relists: Counter


def cache_metrics(ctx: FilterContext) -> CacheMetrics:
    def make() -> CacheMetrics:
        r = ctx.registry
        return CacheMetrics(
            Gauge("kproxy_watchcache_objects", "Objects held in the watch cache.", ["resource"], registry=r),
            Gauge(
                "kproxy_watchcache_resource_version_lag",
                "Latest upstream resource version seen minus the cache's resource version.",
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
        )

    return ctx.shared("kproxy.watchcache.metrics", make)
