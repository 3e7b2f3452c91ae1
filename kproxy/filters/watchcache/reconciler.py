"""The watch cache's resources kept in line with discovery and CustomResourceDefinitions.

Which resources are cached follows the process's discovery service (``kproxy.core.discovery``,
``ctx.discovery``), read every ``rediscovery_interval`` with ``*`` and soon after any CRD change:
a cache is made for each configured resource discovery lists, and one discovery stops listing is
dropped once its absence is confirmed (``resources.Departures``). A definition's ``DELETED``
event, from the process's one CRD list+watch, drops its resource's cache at once (after the
objects' own deletions reached the cache's watchers).

:class:`Reconciler` is that part of the filter (``WatchCacheFilter`` is one); it makes each cache
with the filter's ``_new_cache``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Protocol

from prometheus_client import Gauge

from kproxy.cacher import DELETED, CacheEvent
from kproxy.codec import ProtobufCodec
from kproxy.core.context import FilterContext
from kproxy.core.upstreamversion import UpstreamVersion
from kproxy.filters.watchcache.cachemetrics import CacheMetrics
from kproxy.filters.watchcache.resource_cache import ResourceCache
from kproxy.filters.watchcache.resources import (
    Departures,
    Key,
    ResourceSpec,
    list_watch_resources,
    missing_note,
    resolve,
)

log = logging.getLogger("kproxy.watchcache")
_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
_UNKNOWN: Any = object()  # a definition that could not be read: keep what the cache has
_DRAIN_TIMEOUT = 5.0  # seconds a deleted definition's cache waits for its objects' deletions


class SyncSettings(Protocol):
    """The settings the reconciler reads (``WatchCacheSettings`` has them)."""

    resources: list[str]
    rediscovery_interval: float


class Reconciler:
    """The caches (``caches``) kept in line with discovery and the CRDs' events."""

    settings: SyncSettings
    ctx: FilterContext | None
    caches: dict[Key, ResourceCache]
    _metrics: CacheMetrics | None
    _codec: ProtobufCodec | None
    _version: UpstreamVersion
    _unconfirmed: Gauge
    _sync: asyncio.Task[None] | None
    _kicked: asyncio.Task[None] | None
    _sync_lock: asyncio.Lock
    _stopped: bool
    _discovered: asyncio.Event
    _confirm_every: float
    _departures: Departures
    _absent: frozenset[Key]
    _crd_gone: set[str]
    _tasks: set[asyncio.Task[None]]

    def _new_cache(self, spec: ResourceSpec, crd_paths: tuple[str, ...] | None) -> ResourceCache:
        raise NotImplementedError

    async def _fetch(self, path: str) -> Any:
        assert self.ctx is not None
        status, doc = await self.ctx.api.json("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise ConnectionError(f"discovery {path}: upstream answered {status}")
        return doc

    async def _sync_loop(self) -> None:
        wildcard = "*" in self.settings.resources
        delay = 0.5
        warned: set[str] = set()
        while True:
            try:
                missing = await self._sync_once()
                if missing:
                    # Others are cached meanwhile; these may appear (a CRD not yet installed).
                    # Said once per name (a typo would otherwise repeat every few seconds forever).
                    new = [m for m in missing if m not in warned]
                    if new:
                        log.warning(
                            "watchcache: resources: %s not served by the apiserver: not cached; kproxy "
                            "keeps looking (a custom resource is cached once its definition is installed)",
                            ", ".join(new),
                        )
                    else:
                        log.debug("watchcache: still not served: %s", ", ".join(missing))
                    warned = set(missing)
                    delay = min(max(delay * 2, 1.0), 10.0)
                else:
                    delay = self.settings.rediscovery_interval if wildcard else 0
                if self._departures.pending:  # confirm (or not) that they are gone
                    delay = min(delay, self._confirm_every) if delay else self._confirm_every
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("watchcache: discovery failed (%s); retrying", err)
                delay = min(max(delay * 2, 1.0), 30.0)
            if delay == 0:
                return
            await asyncio.sleep(delay)

    def rediscover_soon(self) -> None:
        """CRDs changed: look at discovery again now (and once more shortly, as a new CRD's
        group version appears in discovery a moment after it is established)."""
        asyncio.get_running_loop().call_later(1.0, self._kick)
        asyncio.get_running_loop().call_later(5.0, self._kick)

    def _kick(self) -> None:
        if self._sync is not None and not self._stopped:
            self._kicked = asyncio.create_task(self._sync_guarded())

    async def _sync_guarded(self) -> None:
        try:
            await self._sync_once()
        except Exception as err:
            log.warning("watchcache: discovery failed (%s)", err)

    async def _sync_once(self) -> list[str]:
        """Bring the caches in line with discovery; the configured names it does not have."""
        async with self._sync_lock:  # the loop and a CRD-triggered refresh never interleave
            return await self._sync_locked()

    async def _upstream_ready(self) -> bool | None:
        """The apiserver's /readyz: True (200), False (anything else, or no answer), None when
        kproxy may not ask (401, 403, 404: then consecutive reads of discovery alone decide)."""
        assert self.ctx is not None
        try:
            async with self.ctx.api.request("GET", "/readyz", timeout=5.0) as resp:
                await resp.read()
                status = resp.status
        except asyncio.CancelledError:
            raise
        except Exception:
            return False
        if status in (401, 403, 404):
            return None
        return status == 200

    async def _sync_locked(self) -> list[str]:
        assert self.ctx is not None and self._codec is not None and self._metrics is not None
        codec = self._codec
        # Asked before discovery: an apiserver ready then had discovery assembled when read.
        ready = await self._upstream_ready() is not False
        await self._version.read(self.ctx.api)  # a few answers differ by minor (docs/compatibility.md)
        served = list_watch_resources(await self.ctx.discovery.read())
        specs, missing = resolve(self.settings.resources, served, codec.knows)
        wanted = {s.key: s for s in specs if not self._definition_deleted(s)}
        self._note_absent(wanted, ready)
        gone = self._departures.observe(list(self.caches), wanted, ready=ready, now=asyncio.get_running_loop().time())
        for key in gone:
            n = self._departures.confirmations
            await self._drop(key, f"not in discovery for {n} reads in a row (the apiserver ready)")
        for key, spec in wanted.items():
            crd_paths = await self._crd_paths(spec)
            old = self.caches.get(key)
            if old is not None:
                if crd_paths is _UNKNOWN or (crd_paths is None) != (old.crd_paths is None):
                    continue  # the definition unreadable (or not found) this time: keep the cache
                if old.crd_paths == crd_paths:
                    continue
                # The CRD's selectable fields changed: objects must be read again with the new set.
                log.info("watchcache: %s: selectable fields changed; caching it again", spec.label)
                del self.caches[key]
                await old.stop()
            if crd_paths is _UNKNOWN:
                crd_paths = ()  # only metadata fields are served, the rest pass through
            self._new_cache(spec, crd_paths)
        self._discovered.set()
        return [missing_note(name, served) for name in missing]

    def _note_absent(self, wanted: dict[Key, ResourceSpec], ready: bool) -> None:
        """Log what discovery lacks of the cached resources when that changes."""
        absent = frozenset(k for k in self.caches if k not in wanted)
        if absent == self._absent:
            return
        labels = ", ".join(sorted(self.caches[k].spec.label for k in absent))
        back = ", ".join(sorted(self.caches[k].spec.label for k in self._absent - absent if k in self.caches))
        self._absent = absent
        if back:
            log.info("watchcache: discovery lists %s again; their caches were kept", back)
        if not absent:
            return
        if ready:
            log.info(
                "watchcache: discovery lacks %s; their caches keep serving until %d reads in a row confirm it",
                labels,
                self._departures.confirmations,
            )
        else:
            log.info(
                "watchcache: discovery lacks %s while the apiserver is not ready; their caches keep serving",
                labels,
            )

    async def _drop(self, key: Key, why: str) -> None:
        assert self._metrics is not None
        rc = self.caches.pop(key, None)
        self._departures.forget(key)
        if rc is None:
            return
        log.info("watchcache: %s %s; dropping its cache", rc.spec.label, why)
        self._metrics.objects.labels(rc.spec.label).set(0)
        with contextlib.suppress(KeyError):
            self._unconfirmed.remove(rc.spec.label)
        await rc.stop()  # its watches end, as the apiserver ends them when it stops serving one
        if rc.store is not None:
            rc.store.forget()  # not served any more: a restart must not answer from it

    def _definition_deleted(self, spec: ResourceSpec) -> bool:
        """Whether ``spec`` is a custom resource whose definition was deleted (discovery may list
        it a moment longer): not cached again until the definition is created again."""
        return f"{spec.resource}.{spec.group}" in self._crd_gone

    def _crds_changed(self, events: list[CacheEvent]) -> None:
        """The cached CustomResourceDefinitions changed: a deleted one drops its resource's cache
        at once (the definition's DELETED event is the apiserver's word that it is gone); any
        change has discovery read again soon."""
        deleted: list[str] = []
        for ev in events:
            name = ev.obj.name  # a definition's name is PLURAL.GROUP
            if ev.type == DELETED:
                self._crd_gone.add(name)
                deleted.append(name)
            else:
                self._crd_gone.discard(name)
        if deleted and not self._stopped:
            task = asyncio.create_task(self._definitions_deleted(deleted))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self.rediscover_soon()

    async def _definitions_deleted(self, names: list[str]) -> None:
        try:
            await self._drop_definitions(names)
        except Exception as err:  # the discovery refresh drops them later (confirmed absence)
            log.warning("watchcache: dropping the caches of deleted definitions failed (%s)", err)

    async def _drop_definitions(self, names: list[str]) -> None:
        for name in names:
            resource, _, group = name.partition(".")
            for key, rc in [(k, rc) for k, rc in self.caches.items() if k[0] == group and k[2] == resource]:
                # The definition goes after its objects (the apiserver's cleanup finalizer deletes
                # them first): let their DELETED events, on the resource's own stream, reach the
                # cache and its watchers before the watches end.
                await _drained(rc, _DRAIN_TIMEOUT)
                async with self._sync_lock:
                    if name in self._crd_gone and self.caches.get(key) is rc:
                        await self._drop(key, "has had its CustomResourceDefinition deleted")

    async def _crd_paths(self, spec: ResourceSpec) -> Any:
        """A custom resource's selectableFields (jsonPaths) for the cached version; None for a
        built-in or aggregated resource (no CustomResourceDefinition of that name); ``_UNKNOWN``
        when the definition could not be read."""
        if spec.kind.protobuf or not spec.group or "." not in spec.group:
            return None
        name = f"{spec.resource}.{spec.group}"
        assert self.ctx is not None
        feed = self.ctx.discovery.crd_feed
        held = feed.get(name) if feed is not None else None
        if held is not None:  # the definitions are watched (``*``, or validation): no request per refresh
            return _selectable_paths(held, spec.version)
        try:
            crd = await self._fetch(f"{_CRDS}/{name}")
        except Exception as err:
            log.warning("watchcache: %s: cannot read its CRD (%s)", spec.label, err)
            return _UNKNOWN
        if not isinstance(crd, dict):
            return None
        return _selectable_paths(crd, spec.version)


async def _drained(rc: ResourceCache, timeout: float) -> None:
    """Wait (at most ``timeout``) until ``rc`` holds no object or its upstream watch has ended."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(rc.cache) and rc.reflector.live and loop.time() < deadline:
        await asyncio.sleep(0.05)


def _selectable_paths(crd: dict[str, Any], version: str) -> tuple[str, ...]:
    for v in (crd.get("spec") or {}).get("versions") or []:
        if v.get("name") == version:
            return tuple(f.get("jsonPath", "") for f in v.get("selectableFields") or [])
    return ()
