"""watchcache: LIST and GET answered from a local cache fed by one upstream list+watch per resource.

The cache answers a read only when it can answer exactly as the apiserver would (``plan.py``);
anything else goes to the apiserver untouched, counted with its reason. Before anything leaves
the cache the caller is checked as the apiserver would check them (``kproxy.identity.access``), except in
``credentials: proxy`` where kproxy itself is the only identity.

Package: this module is the filter; ``cachesettings`` its settings; beside them its HTTP side of
the cache engine (``kproxy.cacher``):
``resources`` (which resources, from the discovery service ``kproxy.core.discovery``, whose one
CRD list+watch also serves ``customresourcedefinitions``), ``resource_cache`` (one cached
resource, listed and watched through ``kproxy.core.listwatch``), ``plan`` and ``watch_plan`` (which reads and watches
the cache answers), ``encode`` and ``frames`` (the bodies and watch frames it answers with),
``watches`` (a served watch), ``listbodies`` (whole lists' bodies kept, the cached read's reply),
``gzipreply`` (a cached answer gzipped as the apiserver's),
``cachemetrics``, ``reconciler`` (the caches kept in line with discovery
and the CRDs), ``clusterid`` (which cluster a persisted state is: kube-system's UID, compared
before a state loaded from disk resumes or is served).
May import: ``kproxy.core``, ``kproxy.identity``, the engines and ``kproxy.config``;
never another filter nor ``kproxy.server``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from kproxy.cacher import Kind, object_key, select
from kproxy.cacher.persist import (
    ResourceStore,
    Sealer,
    UnsafeStorage,
    discard,
    persisted,
    prepare_dir,
    read_key_file,
)
from kproxy.codec import ProtobufCodec, shared_codec
from kproxy.compress.backends import gzip_codec
from kproxy.config import ConfigError as KproxyConfigError
from kproxy.core.chain import Exchange, FilterBase, Handler, Reply
from kproxy.core.context import FilterContext, ServiceKey
from kproxy.core.negotiation import JSON, PROTOBUF
from kproxy.core.status import StatusError, not_found
from kproxy.core.upstreamversion import UPSTREAM_VERSION, UpstreamVersion
from kproxy.filters.watchcache.cachemetrics import CacheMetrics, cache_metrics
from kproxy.filters.watchcache.cachesettings import (
    ALWAYS_SENSITIVE,
    PersistSettings,
    WatchCacheSettings,
)
from kproxy.filters.watchcache.clusterid import ClusterIdentity
from kproxy.filters.watchcache.continuation import continue_snapshot
from kproxy.filters.watchcache.encode import items_part, list_body, object_body
from kproxy.filters.watchcache.gzipreply import gzip_as_the_apiserver
from kproxy.filters.watchcache.listbodies import MAX_WHOLE_LISTS, WholeList, cached_reply
from kproxy.filters.watchcache.outage_serving import Outage, unconfirmed_gauge, unreachable
from kproxy.filters.watchcache.partial import base_media, partial_media
from kproxy.filters.watchcache.plan import Pass, Read, plan
from kproxy.filters.watchcache.reconciler import Reconciler
from kproxy.filters.watchcache.resource_cache import ResourceCache
from kproxy.filters.watchcache.resources import (
    CONFIRMATION_SPACING,
    CONFIRMATIONS,
    Departures,
    Key,
    ResourceSpec,
    parse_name,
)
from kproxy.filters.watchcache.watch_plan import WATCH_LIST_GZIP_SINCE, WatchRead, plan_watch
from kproxy.filters.watchcache.watches import open_watch, too_large_rv
from kproxy.filters.watchcache.writes import OBJECT_SUBRESOURCES, WRITE_VERBS, own_event_first
from kproxy.identity.access import AccessReviewer, UndecidedError, access_reviewer, authorize
from kproxy.identity.offline import allowed_offline, remember_for

log = logging.getLogger("kproxy.watchcache")
_CRD_KEY = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")


def _matches(name: str, spec: ResourceSpec, *, wildcard: bool = True) -> bool:
    group, version, resource = parse_name(name)
    if resource == "*":
        return wildcard
    return (
        spec.resource == resource
        and (group is None or group == spec.group)
        and (version is None or version == spec.version)
    )


class WatchCacheFilter(Reconciler, FilterBase):
    """LIST and GET of the configured resources answered from a local cache kept by one upstream
    streaming list+watch per resource, with the apiserver's resource-version semantics; every
    cached read authorized first (SubjectAccessReview) outside ``credentials: proxy``."""

    name: ClassVar[str] = "watchcache"
    config_model: ClassVar[type[BaseModel]] = WatchCacheSettings
    settings: WatchCacheSettings

    def __init__(self, settings: WatchCacheSettings) -> None:
        self.settings = settings
        self.caches: dict[tuple[str, str, str], ResourceCache] = {}
        self._metrics: CacheMetrics | None = None
        self._reviewer: AccessReviewer | None = None
        self._codec: ProtobufCodec | None = None
        self._sync: asyncio.Task[None] | None = None
        self._discovered = asyncio.Event()
        self._kicked: asyncio.Task[None] | None = None
        self._sync_lock = asyncio.Lock()
        self._stopped = False
        # Reads of discovery, while resources it stopped listing wait for confirmation.
        self._confirm_every = min(settings.rediscovery_interval, CONFIRMATION_SPACING)
        self._departures = Departures(span=(CONFIRMATIONS - 1) * self._confirm_every)
        self._absent: frozenset[Key] = frozenset()  # what discovery lacked at the last read
        self._crd_gone: set[str] = set()  # definitions deleted (``plural.group``), not created again
        self._tasks: set[asyncio.Task[None]] = set()
        self._gzip = gzip_codec(1)  # the apiserver's gzipContentEncodingLevel
        self._version = UpstreamVersion()  # the shared one once started
        self._persist: _Persist | None = None
        self._outage = Outage(settings.outage)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, ctx: FilterContext) -> None:
        await super().start(ctx)
        self._metrics = cache_metrics(ctx)
        self._codec = shared_codec()
        self._version = ctx.service(UPSTREAM_VERSION, UpstreamVersion)
        a = self.settings.authorization
        if ctx.credentials != "proxy":
            self._reviewer = access_reviewer(ctx, allow_ttl=a.allow_ttl, deny_ttl=a.deny_ttl, max_entries=a.max_entries)
            if self.settings.outage.serve:
                remember_for(ctx, self._reviewer, self.settings.outage.authorization_ttl)
        self._unconfirmed = unconfirmed_gauge(ctx)
        if self.settings.persist is not None:
            self._persist = _open_persist(ctx, self.settings.persist)
            self._preload()
        ctx.discovery.subscribe_crds(self._crds_changed)
        self._sync = asyncio.create_task(self._sync_loop(), name="kproxy-watchcache-discovery")

    async def stop(self) -> None:
        self._stopped = True
        if self.ctx is not None:
            self.ctx.discovery.unsubscribe_crds(self._crds_changed)
        for task in (self._sync, self._kicked, *self._tasks):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        for rc in list(self.caches.values()):
            await rc.stop()
        self.caches.clear()

    def ready(self) -> bool:
        return self._discovered.is_set()

    def _new_cache(self, spec: ResourceSpec, crd_paths: tuple[str, ...] | None) -> ResourceCache:
        assert self.ctx is not None and self._codec is not None and self._metrics is not None
        s = self.settings
        # CustomResourceDefinitions are the process's one CRD list+watch (``ctx.discovery``),
        # which the validation filter follows too: served from it, not watched a second time.
        feed = self.ctx.discovery.crds() if spec.key == _CRD_KEY else None
        store = self._persist.store(spec, crd_paths) if self._persist is not None and feed is None else None
        rc = ResourceCache(
            spec,
            self.ctx.api,
            self._codec,
            self._metrics,
            window=s.history_window,
            max_events=s.history_max_events,
            page_size=s.page_size,
            crd_paths=crd_paths,
            encode_ahead=s.encode_ahead,
            watch_buffer=s.watch_buffer,
            bookmark_interval=s.bookmark_interval,
            version=self._version,
            store=store,
            feed=feed,
            cluster=self._persist.cluster if store is not None and self._persist is not None else None,
        )
        self.caches[spec.key] = rc
        self._unconfirmed.labels(spec.label).set_function(lambda: Outage.unconfirmed(rc))
        rc.start()
        return rc

    def _preload(self) -> None:
        """Start the caches persisted on disk before asking the apiserver anything (discovery
        then keeps them, or drops those it no longer serves): they answer ``resourceVersion=0``
        reads at once and resume their watches from the persisted resource versions."""
        assert self._persist is not None
        directory = self._persist.directory
        for ident, head in persisted(directory, self._persist.sealer):
            described = self._persisted_spec(head)
            if described is None:
                log.info("watchcache: persisted state %s not readable (another key, or none); removed", ident)
                discard(directory, ident)
                continue
            spec, crd_paths = described
            if spec.key in self.caches:
                continue
            wanted = any(_matches(n, spec) for n in self.settings.resources) and self._persist.persists(spec)
            # CustomResourceDefinitions are the process's one CRD feed, listed at start, not persisted.
            if not wanted or spec.key == _CRD_KEY or (
                spec.kind.protobuf
                and self._codec is not None
                and not self._codec.knows(spec.kind.api_version, spec.kind.kind)
            ):
                log.info("watchcache: persisted state of %s: no longer to be persisted; removed", spec.label)
                discard(directory, ident)
                continue
            self._new_cache(spec, crd_paths)

    @staticmethod
    def _persisted_spec(head: dict[str, Any] | None) -> tuple[ResourceSpec, tuple[str, ...] | None] | None:
        """The resource a snapshot header describes (None: none it can describe)."""
        if head is None:
            return None
        spec_doc = head.get("spec") or {}
        try:
            spec = ResourceSpec(
                str(spec_doc["group"]),
                str(spec_doc["version"]),
                str(spec_doc["resource"]),
                bool(spec_doc["namespaced"]),
                Kind(
                    str(spec_doc["api_version"]),
                    str(spec_doc["kind"]),
                    str(spec_doc["list_kind"]),
                    bool(spec_doc["protobuf"]),
                ),
            )
            paths = spec_doc.get("crd_paths")
            crd_paths = None if paths is None else tuple(str(p) for p in paths)
        except (KeyError, TypeError):
            return None
        return spec, crd_paths

    # -- requests ---------------------------------------------------------------------------------
    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        info = ex.info
        if info.is_resource_request and info.verb in WRITE_VERBS and info.subresource in OBJECT_SUBRESOURCES:
            written = self.caches.get((info.api_group, info.api_version, info.resource))
            if written is not None:
                return await own_event_first(
                    written, ex, await call_next(ex), self.settings.write_wait, self._waited(written)
                )
        if not info.is_resource_request or info.subresource or info.verb not in ("list", "get", "watch"):
            return await call_next(ex)
        rc = self.caches.get((info.api_group, info.api_version, info.resource))
        if rc is None:
            return await call_next(ex)
        if info.verb == "watch":
            return await self._watch(ex, call_next, rc)
        reads = self._metrics.reads if self._metrics is not None else None
        label = rc.spec.label
        decided = plan(ex, protobuf=rc.spec.kind.protobuf, selectable=rc.selectable, namespaced=rc.spec.namespaced)
        if isinstance(decided, Read) and not rc.cache.ready:
            decided = Pass("not ready")
        if isinstance(decided, Read) and not await _verified(rc):
            decided = Pass("unverified")
        if isinstance(decided, Pass):
            if reads is not None:
                reads.labels(label, info.verb, "upstream", decided.reason).inc()
            return await call_next(ex)
        offline = _Offline(self._outage.serves(rc))
        try:
            if not await self._authorize(ex, rc, offline):
                if reads is not None:
                    reads.labels(label, info.verb, "upstream", "outage unauthorized").inc()
                return await call_next(ex)
            unservable = await self._unservable_after_review(rc, offline)
            if unservable:
                if reads is not None:
                    reads.labels(label, info.verb, "upstream", unservable).inc()
                return await call_next(ex)
            reply = await self._serve(rc, decided, offline)
            if reply is not None and not rc.cache.ready:
                # Emptied while the read waited for the apiserver (another cluster's state found
                # out by the read's own probe): what it was about to answer is not this cluster's.
                if reads is not None:
                    reads.labels(label, info.verb, "upstream", "not ready").inc()
                return await call_next(ex)
        except UndecidedError:
            # The authorizer gave no reusable answer: the apiserver decides for itself.
            if reads is not None:
                reads.labels(label, info.verb, "upstream", "undecided").inc()
            return await call_next(ex)
        except StatusError as err:
            if reads is not None:
                reads.labels(label, info.verb, "cache", f"status {err.code}").inc()
            return Reply.from_status(err, ex)
        if reply is None:
            if reads is not None:
                reads.labels(label, info.verb, "upstream", "stale").inc()
            return await call_next(ex)
        if reads is not None:
            reads.labels(label, info.verb, "cache", decided.mode).inc()
        if offline.used or (offline.allowed and self._outage.down(rc)):
            reply.headers.add("Warning", self._outage.warning(rc, consistent=decided.mode == "consistent"))
        return gzip_as_the_apiserver(ex, reply, self._gzip)

    async def _authorize(self, ex: Exchange, rc: ResourceCache, offline: _Offline) -> bool:
        """Authorize a cached read as :func:`authorize` does (raising its Status errors). While the
        upstream cannot be reached and the outage options cover ``rc``, a caller the apiserver
        allowed within ``outage.authorization_ttl`` is allowed (``offline.used``); False: the caller
        has no such decision, and gets the answer it would get without the cache."""
        if self._reviewer is None or self.ctx is None:
            return True
        try:
            await authorize(self.ctx, self._reviewer, ex)
        except UndecidedError:
            raise
        except StatusError as err:
            # Only in an outage the cache's own watch confirms (down, within the bound): a review
            # that failed while the apiserver answers the watch is not a reason to use older decisions.
            outage = self._outage
            if not (
                offline.allowed and err.code == 500 and unreachable(err) and outage.down(rc) and outage.within_bound(rc)
            ):
                raise
            within = self._outage.settings.authorization_ttl
            if allowed_offline(self.ctx, self._reviewer, ex, within) is None:
                return False
            offline.used = True
        return True

    async def _unservable_after_review(self, rc: ResourceCache, offline: _Offline) -> str:
        """Why the cache may no longer answer once the caller's access was reviewed ("": it may).
        A state loaded from disk not yet confirmed as this cluster's is compared now, when the
        apiserver answered the review (authorized from remembered decisions, in an outage, it is
        served as loaded); and the cache may have been emptied meanwhile (another cluster's state
        dropped, the resource no longer served)."""
        reviewed = self._reviewer is not None and not offline.used
        if rc.unverified and reviewed and not await _verified(rc, reached=True):
            return "unverified"
        return "" if rc.cache.ready else "not ready"

    def _waited(self, rc: ResourceCache) -> Callable[[str, float], None] | None:
        if self._metrics is None:
            return None
        hist, label = self._metrics.write_wait, rc.spec.label
        return lambda outcome, seconds: hist.labels(label, outcome).observe(seconds)

    async def _watch(self, ex: Exchange, call_next: Handler, rc: ResourceCache) -> Reply:
        """A watch from the cache (authorized when it starts, as the apiserver does), or passed on."""
        assert self._metrics is not None
        reads = self._metrics.reads
        label = rc.spec.label
        decided: WatchRead | Pass = plan_watch(
            ex,
            protobuf=rc.spec.kind.protobuf,
            selectable=rc.selectable,
            namespaced=rc.spec.namespaced,
            list_gzip=self._version.at_least(WATCH_LIST_GZIP_SINCE),
        )
        if isinstance(decided, WatchRead) and not rc.cache.ready:
            decided = Pass("not ready")
        if isinstance(decided, WatchRead) and not await _verified(rc):
            decided = Pass("unverified")
        if isinstance(decided, Pass):
            reads.labels(label, "watch", "upstream", decided.reason).inc()
            return await call_next(ex)
        offline = _Offline(self._outage.serves(rc))
        try:
            if not await self._authorize(ex, rc, offline):
                reads.labels(label, "watch", "upstream", "outage unauthorized").inc()
                return await call_next(ex)
            unservable = await self._unservable_after_review(rc, offline)
            if unservable:
                reads.labels(label, "watch", "upstream", unservable).inc()
                return await call_next(ex)
        except UndecidedError:
            reads.labels(label, "watch", "upstream", "undecided").inc()
            return await call_next(ex)
        except StatusError as err:
            reads.labels(label, "watch", "cache", f"status {err.code}").inc()
            return Reply.from_status(err, ex)
        s = self.settings
        reply = await open_watch(rc, decided, wait=s.wait_timeout, min_timeout=s.min_request_timeout)
        if reply is None:
            reads.labels(label, "watch", "upstream", "stale").inc()
            return await call_next(ex)
        reads.labels(label, "watch", "cache", decided.mode).inc()
        if offline.used or (offline.allowed and self._outage.down(rc)):
            reply.headers.add("Warning", self._outage.warning(rc, consistent=False))
        return reply

    async def _serve(self, rc: ResourceCache, read: Read, offline: _Offline) -> Reply | None:
        """The cache's answer, or None: it cannot answer in time, let the upstream. A consistent
        read is served from what the cache holds, unconfirmed, when its upstream watch is down
        because the upstream cannot be reached, the outage options allow it (``offline``), and
        the probe could not reach the upstream either."""
        cache = rc.cache
        kind = rc.spec.kind
        wait = self.settings.wait_timeout
        if read.verb == "get":
            obj = cache.get(object_key(read.namespace, read.name))
            if obj is None:
                raise not_found(rc.spec.group, rc.spec.resource, read.name)
            return cached_reply(
                object_body(kind, obj, read.media_type, read.pretty, rc.partial_encode), read.media_type
            )
        if read.mode == "consistent":
            try:
                # One shared progress probe: the upstream's latest revision, reached by the cache.
                want = await rc.reflector.consistent_rv()
            except Exception as err:
                log.debug("watchcache: %s: consistent read probe failed: %s", rc.spec.label, err)
                outage = self._outage
                if not (offline.allowed and unreachable(err) and outage.down(rc) and outage.within_bound(rc)):
                    return None
                offline.used = True  # the apiserver cannot be asked: what the cache holds
            else:
                # A state loaded from disk that no watch of this apiserver has answered yet may be
                # ahead of it: only the apiserver answers consistently until then.
                if not rc.confirmed or not await rc.fresh(want, wait):
                    return None
        elif read.mode == "min" and not await rc.fresh(read.min_rv, wait):
            if not rc.reflector.live:
                return None  # the cache is catching up: the upstream knows better than a 504
            raise too_large_rv(read.min_rv, cache.rv)
        if read.mode == "continue":
            assert read.cont is not None
            snap = await continue_snapshot(rc, read.cont)  # or the apiserver's 410 once compacted
            if snap is None:
                return None  # the apiserver continues the same token from etcd (or says 410)
            start = read.cont.start
        else:
            snap = cache.snapshot()
            start = read.cont.start if read.cont is not None else ""  # a token at the latest RV
        assert snap is not None
        labels, fields = read.labels, read.fields
        predicate = None
        if labels is not None or fields is not None:

            def predicate(o: Any) -> bool:
                return (labels is None or labels.matches(o.labels)) and (fields is None or fields.matches(o.fields))

        if read.limit == 0 and not start and snap.rv == cache.rv:
            # A whole list of the current state: its items are kept encoded until an object
            # changes; the body around them (resource version) is cheap to make again.
            base, partial = base_media(read.media_type)
            items_media = PROTOBUF if base == PROTOBUF else JSON  # YAML is made from JSON
            if partial:
                items_media = partial_media(items_media)
            key = (items_media, read.namespace, read.label_text, read.field_text)
            found = cache.bodies.get(key)
            if not isinstance(found, WholeList):
                page = select(snap, namespace=read.namespace, predicate=predicate)
                found = WholeList(items_part(kind, page.items, items_media, rc.partial_encode))
                if len(cache.bodies) >= MAX_WHOLE_LISTS:
                    cache.bodies.clear()
                cache.bodies[key] = found
            body = found.body(kind, snap.rv, read.media_type, read.pretty)
            return cached_reply(body, read.media_type)
        page = select(snap, namespace=read.namespace, predicate=predicate, limit=read.limit, start=start)
        remaining = page.remaining if not read.filtered else None
        body = list_body(
            kind, page.items, page.rv, page.continue_token, remaining, read.media_type, read.pretty, rc.partial_encode
        )
        return cached_reply(body, read.media_type)


async def _verified(rc: ResourceCache, *, reached: bool = False) -> bool:
    """Whether ``rc`` may answer: anything but a state loaded from disk whose cluster is not
    yet confirmed (its first reader waits for the one read of the cluster's identity). While the
    apiserver cannot be reached such a state is served as loaded, on its URL and CA alone: reads
    through an outage need it, and the identity is compared at first contact, before the watch
    resumes (and tried again in the background, at most once a second while such reads arrive, so
    that the apiserver's return ends the window within a round trip). Anything else that stops
    the comparison (the apiserver answered, but not with the UID or a refusal) sends the read to
    the apiserver. ``reached``: the caller's access review was just authorized, so the apiserver
    may be back: the comparison is tried again now."""
    if not rc.unverified:
        return rc.cache.ready
    if not reached and unreachable(rc.verify_error):
        rc.verify_soon()  # the apiserver may be back before the watch's next attempt
        return True  # the last attempt could not reach the apiserver
    try:
        await rc.verify()
    except Exception as err:
        return unreachable(err)
    return rc.cache.ready


@dataclass(slots=True)
class _Offline:
    """Whether a read may be served through an outage (``allowed``), and whether it was (``used``:
    authorized from remembered decisions, or consistent without the apiserver's confirmation)."""

    allowed: bool
    used: bool = False


@dataclass(slots=True)
class _Persist:
    """The persist settings made real: the directory (checked, locked), the key, the owners."""

    settings: PersistSettings
    directory: Path
    sealer: Sealer | None
    owners: dict[str, object]
    upstream: str
    cluster: ClusterIdentity

    def sensitive(self, spec: ResourceSpec) -> bool:
        return any(_matches(n, spec) for n in (*ALWAYS_SENSITIVE, *self.settings.sensitive))

    def persists(self, spec: ResourceSpec) -> bool:
        """Whether ``spec`` is persisted: named by ``persist.resources`` (a sensitive one by name,
        not through ``*``, and only with a key)."""
        names = self.settings.resources
        if self.sensitive(spec):
            return self.sealer is not None and any(_matches(n, spec, wildcard=False) for n in names)
        return any(_matches(n, spec) for n in names)

    def store(self, spec: ResourceSpec, crd_paths: tuple[str, ...] | None) -> ResourceStore | None:
        """The store of ``spec``'s cache, or None when it is not to be persisted."""
        p = self.settings
        if not self.persists(spec):
            return None
        sensitive = self.sensitive(spec)
        parts = (spec.group or "core", spec.version, spec.resource)
        if not all(_SAFE_NAME.fullmatch(x) for x in parts):
            log.warning("watchcache: %s: not persisted (its name does not make a file name)", spec.label)
            return None
        identity = {
            "upstream": self.upstream,
            "group": spec.group,
            "version": spec.version,
            "resource": spec.resource,
            "kind": spec.kind.kind,
            "protobuf": spec.kind.protobuf,
            "encrypted": sensitive,
        }
        kind = spec.kind
        about: dict[str, Any] = {"group": spec.group, "version": spec.version, "resource": spec.resource}
        about |= {"namespaced": spec.namespaced, "crd_paths": None if crd_paths is None else list(crd_paths)}
        about |= {"api_version": kind.api_version, "kind": kind.kind, "list_kind": kind.list_kind}
        about["protobuf"] = kind.protobuf
        return ResourceStore(
            self.directory,
            "+".join(parts),
            identity,
            self.sealer if sensitive else None,
            compact_min_bytes=p.compact_min_bytes,
            owners=self.owners,
            spec=about,
            cluster=self.cluster,
        )


_SAFE_NAME = re.compile(r"[a-z0-9][a-z0-9.-]*")


#: Per process (a config reload keeps them): each persist directory's lock (its descriptor), and
#: per directory, which store owns each resource's files.
_PERSIST_LOCKS: ServiceKey[dict[str, int]] = ServiceKey(f"{__name__}.persist.locks")
_PERSIST_OWNERS: ServiceKey[dict[str, dict[str, object]]] = ServiceKey(f"{__name__}.persist.owners")


def _open_persist(ctx: FilterContext, p: PersistSettings) -> _Persist:
    """Check the directory and the key file, and take the directory's lock (held until the
    process exits: a config reload in the same process keeps it). Refuses with a config error."""
    try:
        directory = prepare_dir(p.dir)
        sealer = read_key_file(p.encryption_key_file) if p.encryption_key_file else None
    except UnsafeStorage as err:
        raise KproxyConfigError(f"watchcache: persist: {err}") from None
    locks = ctx.service(_PERSIST_LOCKS, dict)
    key = str(directory.resolve())
    if key not in locks:
        fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise KproxyConfigError(
                f"watchcache: persist: dir {p.dir} is in use by another kproxy process (one per directory)"
            ) from None
        locks[key] = fd
    owners = ctx.service(_PERSIST_OWNERS, dict).setdefault(key, {})
    # The state belongs to one cluster: its URL and the CA that proves who answers there (another
    # cluster at the same URL, a disk moved between clusters, loads nothing of this one's), and
    # the UID of its kube-system namespace, which tells apart clusters sharing a URL and a CA: read
    # with the client the caches list and watch with (``ctx.api``, kproxy's own credentials in
    # every credentials mode), compared before a loaded state resumes (``clusterid.py``).
    trust = ctx.api.trust
    upstream = ctx.api.server + (f" ca-sha256:{trust}" if trust else "")
    return _Persist(p, directory, sealer, owners, upstream, ClusterIdentity(ctx.api))
