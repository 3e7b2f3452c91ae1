"""One cached resource: its spec, WatchCache, Reflector, and freshness for consistent reads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

from kproxy import gctuning
from kproxy.cacher import Reflector, WatchCache
from kproxy.cacher.broadcaster import Broadcaster
from kproxy.cacher.fields import SelectableFields, builtin_fields, crd_fields
from kproxy.cacher.ingest import ObjectFactory
from kproxy.cacher.objects import JsonEncoder
from kproxy.cacher.persist import ResourceStore
from kproxy.codec import ProtobufCodec
from kproxy.core.context import ApiClient
from kproxy.core.crdfeed import CrdFeed
from kproxy.core.listwatch import HttpListerWatcher
from kproxy.core.status import resource_expired
from kproxy.core.upstreamversion import UpstreamVersion

from .cachemetrics import CacheMetrics, WatchCounters
from .clusterid import ClusterIdentity, StateDiscarded, VerifiedListerWatcher, same_cluster
from .frames import FrameEncoder
from .resources import ResourceSpec

log = logging.getLogger("kproxy.watchcache")


def selectable_fields(spec: ResourceSpec, crd_paths: tuple[str, ...] | None) -> SelectableFields:
    """Built-in kinds: the apiserver's field table. Custom resources (``crd_paths`` not None):
    metadata.name, metadata.namespace when namespaced, and the CRD version's selectableFields."""
    if crd_paths is None:
        return builtin_fields(spec.group, spec.resource)
    return crd_fields(crd_paths, namespaced=spec.namespaced)


class ResourceCache:
    def __init__(
        self,
        spec: ResourceSpec,
        api: ApiClient,
        codec: ProtobufCodec,
        metrics: CacheMetrics,
        *,
        window: float,
        max_events: int,
        page_size: int,
        crd_paths: tuple[str, ...] | None = None,
        encode_ahead: bool = True,
        watch_buffer: int = 100,
        bookmark_interval: float = 60.0,
        version: UpstreamVersion | None = None,
        store: ResourceStore | None = None,
        feed: CrdFeed | None = None,
        cluster: ClusterIdentity | None = None,
    ) -> None:
        self.spec = spec
        # A state loaded from disk is unverified until the apiserver's kube-system UID is
        # compared with the one it recorded (``cluster``, :meth:`verify`).
        self._cluster = cluster
        self._recorded: str | None = None
        self.unverified = False
        self.verify_error: Exception | None = None
        self._must_list = False  # the state was dropped: the reflector lists instead of resuming
        self._ahead_unchecked = False  # loaded from disk: compared with the apiserver's latest first
        self._retry: asyncio.Task[None] | None = None  # a comparison tried again for a read (verify_soon)
        self._retried_at = -math.inf
        # With ``feed`` (the process's one CRD list+watch, ``kproxy.core.discovery``) the cache
        # and its reflector are the feed's: shared, started and stopped by it, not persisted.
        self._feed = feed
        self.store = store if feed is None else None
        self._persist_loads = metrics.persist_loads
        self.crd_paths = crd_paths
        self.fields = selectable_fields(spec, crd_paths)
        self.version = version or UpstreamVersion()
        label = spec.label
        self._objects = metrics.objects.labels(label)
        self._progress = metrics.progress.labels(label)
        relists = metrics.relists
        self._relisted = lambda reason: relists.labels(label, reason).inc()
        if feed is not None:
            self.factory = feed.factory
            self.cache = feed.cache
            self.reflector = feed.reflector
            feed.relist_hooks.append(self._relisted)
            feed.rv_hooks.append(self._upstream_rv)
        else:
            self.factory = ObjectFactory(spec.kind, self.fields, codec)
            self.cache = WatchCache(spec.kind, window=window, max_events=max_events)
            self.reflector = Reflector(
                label,
                VerifiedListerWatcher(
                    HttpListerWatcher(api, spec, self.factory), self._before_watch, self._before_contact
                ),
                self.cache,
                page_size=page_size,
                on_relist=self._relisted,
                on_upstream_rv=self._upstream_rv,
            )
        self.cache.add_listener(self._count)
        self.cache.on_late = metrics.late_events.labels(label).inc
        self.frames = FrameEncoder(spec.kind, codec, self.version)
        self.broadcaster = Broadcaster(
            self.cache,
            self.frames,
            buffer=watch_buffer,
            bookmark_interval=bookmark_interval,
            counters=WatchCounters(metrics, label),
        )
        self._expire: asyncio.Task[None] | None = None
        self._encode_ahead = encode_ahead and spec.kind.protobuf
        self._warm: asyncio.Task[None] | None = None

    def _count(self, _events: object) -> None:
        self._objects.set(len(self.cache))

    def _upstream_rv(self, rv: int) -> None:
        self._objects.set(len(self.cache))
        self._progress.set_to_current_time()

    @property
    def partial_encode(self) -> JsonEncoder:
        """The JSON encoder of its objects' metadata-only form (built-in kinds), the frames' own."""
        return self.frames.partial_encode

    @property
    def selectable(self) -> SelectableFields:
        """The field selectors the upstream's minor accepts (those of a newer minor pass upstream)."""
        return self.fields.at(self.version.minor)

    def start(self) -> None:
        self.broadcaster.start()
        if self.store is not None:
            self._load()
        if self._feed is None:
            self.reflector.start()
        else:
            self._objects.set(len(self.cache))
        self._expire = asyncio.create_task(self._expire_loop())
        if self._encode_ahead:
            self._warm = asyncio.create_task(self._warm_loop())

    def _load(self) -> None:
        """The persisted state, if any, into the cache before the reflector starts: it then
        resumes the upstream watch from the state's resource version instead of listing."""
        store = self.store
        assert store is not None
        started = time.perf_counter()
        with gctuning.paused():  # long-lived objects (see kproxy.gctuning)
            loaded = store.load(self.factory.restore, self.cache)
        outcome = "loaded" if loaded is not None else store.load_outcome
        self._persist_loads.labels(self.spec.label, outcome).inc()
        if loaded is not None:
            self.unverified = store.unconfirmed = self._cluster is not None
            self._ahead_unchecked = True
            self._recorded = loaded.cluster
            self._objects.set(len(self.cache))
            log.info(
                "%s: %d objects at resource version %d loaded from disk in %.3f s",
                self.spec.label,
                len(self.cache),
                self.cache.applied_rv,
                time.perf_counter() - started,
            )
        store.attach(self.cache, loaded)

    async def verify(self) -> None:
        """Compare the cluster a state loaded from disk was recorded for with the apiserver's (at
        most once; one request shared by every cache). Another cluster, or none recorded, or one
        kproxy may not read: the state is dropped (the cache emptied and not ready, its files
        removed; the reflector lists). Raises (keeping the error in ``verify_error``) when the
        apiserver could not be asked: the state stays as it was loaded, unverified."""
        if not self.unverified or self._cluster is None:
            return
        try:
            found = await self._cluster.read()
        except Exception as err:
            self.verify_error = err
            raise
        if not self.unverified:  # another caller concluded meanwhile
            return
        self.unverified = False
        self.verify_error = None
        if self.store is not None:
            self.store.unconfirmed = False
        if same_cluster(self._recorded, found):
            return
        self._must_list = True
        self._ahead_unchecked = False  # listed: nothing loaded is resumed
        self._cluster.discarded(self._recorded, found)
        cache = self.cache
        # The watches served from it end with the 410 the apiserver sends for a resource version
        # it no longer has: a client that watched again from the last one it saw (the other
        # cluster's, which this apiserver may accept) would keep the objects it was sent.
        rv = cache.applied_rv
        self.broadcaster.expire_all(resource_expired(f"too old resource version: {rv} ({rv + 1})").to_dict())
        cache.unready()  # readers go upstream, open watches end, the store removes the files
        cache.clear()
        self._objects.set(0)
        if self.store is not None:
            self.store.forget()

    def verify_soon(self) -> None:
        """Try the comparison again in the background, at most once a second, for a read served
        from a state not yet compared because the apiserver could not be reached: it may be back
        before the reflector's next attempt (its backoff grows to 30 s), and from then on another
        cluster's state must stop being served within a round trip, not a backoff."""
        now = time.monotonic()
        if (self._retry is not None and not self._retry.done()) or now - self._retried_at < 1.0:
            return
        self._retried_at = now
        self._retry = asyncio.create_task(self.verify(), name=f"kproxy-watchcache-verify-{self.spec.label}")
        self._retry.add_done_callback(_consume)

    async def _before_watch(self) -> str | None:
        """Before each upstream watch: why the state it would resume is listed again instead
        (``discarded``: dropped as another cluster's; ``ahead``: ahead of the apiserver), or None."""
        await self.verify()
        if self._must_list:
            self._must_list = False
            return "discarded"
        if self._ahead_unchecked:
            # A state loaded from disk whose resource version the apiserver has not reached (the
            # same cluster's etcd restored from a backup goes back in revisions): the apiserver
            # holds a watch from a revision it has not reached open without an event until it gets
            # there (its cache watcher sends only events newer than the watch's revision,
            # staging/src/k8s.io/apiserver/pkg/storage/cacher/cache_watcher.go ``process``), and the
            # objects the restore took away would never be deleted. One consistent read of nothing
            # (the apiserver's latest revision) before the first resume: listed instead.
            latest = await self.reflector.current_rv()
            self._ahead_unchecked = False
            if self.cache.applied_rv > latest:
                log.warning(
                    "%s: persisted state at resource version %d, ahead of the apiserver's %d"
                    " (etcd restored from a backup?): listed again",
                    self.spec.label,
                    self.cache.applied_rv,
                    latest,
                )
                # Not served while it is listed again: it holds objects the apiserver does not.
                self.cache.unready()
                return "ahead"
        return None

    async def _before_contact(self) -> None:
        """Before a read's own request to the apiserver (a freshness or compaction probe): a state
        loaded from disk is compared first, that request being possibly the first contact; raises
        StateDiscarded when it was dropped (the read then goes to the apiserver), or what reaching
        the apiserver raised."""
        if not self.unverified:
            return
        await self.verify()
        if not self.cache.ready:
            raise StateDiscarded(f"{self.spec.label}: the persisted state belongs to another cluster")

    @property
    def confirmed(self) -> bool:
        """Whether the upstream's watch has answered since the state was loaded from disk. A state
        loaded from disk may be ahead of the apiserver (the same cluster's etcd restored from a
        backup goes back in revisions): its resource version being the apiserver's latest or more
        does not make it a consistent read's answer until the resumed watch has answered (the
        reflector lists when the apiserver never reached that resource version)."""
        return not self.reflector.resumed

    async def stop(self) -> None:
        await self.broadcaster.stop()  # open watches end cleanly; their clients watch again
        self.cache.remove_listener(self._count)
        feed = self._feed
        if feed is None:
            await self.reflector.stop()
        else:
            feed.relist_hooks.remove(self._relisted)
            feed.rv_hooks.remove(self._upstream_rv)
        if self.store is not None:
            await self.store.close()
        for task in (self._expire, self._warm, self._retry):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _warm_loop(self) -> None:
        """Make every object's JSON ahead of the first JSON read (the codec's cost, ~0.1 ms an
        object, is then paid while idle, a few objects at a time between other work)."""
        seen = -1
        while True:
            await asyncio.sleep(0.5)
            cache = self.cache
            if not cache.ready or cache.generation == seen:
                continue
            seen = cache.generation
            pending = [o for o in cache.store.values() if not o.has_json]
            for i, obj in enumerate(pending):
                try:
                    obj.item_json  # noqa: B018 - made and kept
                except Exception as err:  # a reader would meet the same error and answer it
                    log.debug("%s: cannot encode %s ahead: %s", self.spec.label, obj.key, err)
                if i % 32 == 31:
                    await asyncio.sleep(0)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            self.cache.history.expire()
            self._objects.set(len(self.cache))

    async def fresh(self, rv: int, timeout: float) -> bool:
        """Wait until the cache has reached ``rv``, asking the upstream to confirm its progress
        when events alone do not get it there soon; False after ``timeout``."""
        cache = self.cache
        if cache.ready and cache.rv >= rv:
            return True
        if await cache.wait_until(rv, min(0.05, timeout)):
            return True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            probe = asyncio.ensure_future(self.reflector.request_progress())
            # A probe left behind (the read stopped waiting) may fail later, e.g. on a connection
            # to a restarted apiserver: its error is known already, and must not be logged as a
            # "Task exception was never retrieved" traceback.
            probe.add_done_callback(_consume)
            reached = asyncio.ensure_future(cache.wait_until(rv, remaining))
            done, _ = await asyncio.wait({probe, reached}, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if reached in done and reached.result():
                probe.cancel()
                return True
            reached.cancel()
            if probe in done and probe.exception() is not None:
                if not self.reflector.live:
                    return False  # relisting or reconnecting: the upstream answers sooner
                return await cache.wait_until(rv, max(deadline - loop.time(), 0))
            if cache.ready and cache.rv >= rv:
                return True


def _consume(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()
