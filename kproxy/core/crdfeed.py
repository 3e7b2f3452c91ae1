"""The process's one list+watch of CustomResourceDefinitions (``kproxy.core.discovery`` starts it).

The cache engine's ``Reflector`` over ``kproxy.core.listwatch`` into a ``WatchCache``: a watch
that ends is resumed from the cache's resource version, a 410 relists, and a relist's
differences reach the listeners as events like any other change.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from kproxy.cacher import MODIFIED, CacheEvent, Kind, Reflector, WatchCache
from kproxy.cacher.fields import builtin_fields
from kproxy.cacher.ingest import ObjectFactory
from kproxy.codec import ProtobufCodec
from kproxy.core.ownapi import OwnApi

CRD_GROUP = "apiextensions.k8s.io"
CRD_VERSION = "v1"
CRD_RESOURCE = "customresourcedefinitions"
#: The collection the CRD feed lists and watches.
CRDS = f"/apis/{CRD_GROUP}/{CRD_VERSION}/{CRD_RESOURCE}"
#: The CRD feed's history: the apiserver's own window and the watch cache's default bound.
CRD_HISTORY_WINDOW = 75.0
CRD_HISTORY_EVENTS = 102400


@dataclass(frozen=True, slots=True)
class _CrdTarget:
    list_path: str
    kind: Kind


class CrdFeed:
    """The one list+watch of CustomResourceDefinitions, into a cache-engine ``WatchCache``.

    Whoever follows CRDs reads ``cache`` (their current state) and gets its events through
    :meth:`Discovery.subscribe_crds`; the watch cache serves ``customresourcedefinitions`` from
    the same ``cache`` and ``reflector``. ``live``: a watch feeds the cache right now."""

    def __init__(self, api: OwnApi, codec: ProtobufCodec, on_events: Callable[[list[CacheEvent]], None]) -> None:
        api_version = f"{CRD_GROUP}/{CRD_VERSION}"
        kind = Kind(
            api_version,
            "CustomResourceDefinition",
            "CustomResourceDefinitionList",
            codec.knows(api_version, "CustomResourceDefinition"),
        )
        self.kind = kind
        self.fields = builtin_fields(CRD_GROUP, CRD_RESOURCE)
        self.factory = ObjectFactory(kind, self.fields, codec)
        self.cache = WatchCache(kind, window=CRD_HISTORY_WINDOW, max_events=CRD_HISTORY_EVENTS)
        #: Called with a relist's reason, and with each resource version seen upstream (the watch
        #: cache's metrics of the resource, while it serves it).
        self.relist_hooks: list[Callable[[str], None]] = []
        self.rv_hooks: list[Callable[[int], None]] = []
        # Imported here: the list+watch line reads the link measurement, whose module imports the
        # context, which holds this service (a module-level import would make a cycle).
        from kproxy.core.listwatch import HttpListerWatcher

        self.reflector = Reflector(
            f"{CRD_RESOURCE}.{CRD_GROUP}",
            HttpListerWatcher(api, _CrdTarget(CRDS, kind), self.factory),
            self.cache,
            on_relist=self._relisted,
            on_upstream_rv=self._upstream_rv,
        )
        self.cache.add_listener(on_events)
        self._on_events = on_events
        # A relist that went back in time (etcd restored from a backup) resets the history and
        # sends no differences: the followers hear of every definition as changed instead.
        self.cache.add_reset_listener(self._reset)
        self._expire: asyncio.Task[None] | None = None

    def _relisted(self, reason: str) -> None:
        for hook in list(self.relist_hooks):
            hook(reason)

    def _upstream_rv(self, rv: int) -> None:
        for hook in list(self.rv_hooks):
            hook(rv)

    def _reset(self) -> None:
        now = time.monotonic()  # the cache's own clock
        changed = [CacheEvent(MODIFIED, obj, None, obj.rv, now) for obj in self.cache.store.values()]
        if changed:
            self._on_events(changed)

    @property
    def live(self) -> bool:
        return self.cache.ready and self.reflector.live

    def start(self) -> None:
        self.reflector.start()
        self._expire = asyncio.create_task(self._expire_loop(), name="kproxy-crd-history")

    async def stop(self) -> None:
        await self.reflector.stop()
        task, self._expire = self._expire, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            self.cache.history.expire()

    def get(self, name: str) -> dict[str, Any] | None:
        """The definition named ``name`` (``plural.group``) as JSON, if the cache holds it."""
        held = self.cache.get(name) if self.cache.ready else None
        if held is None:
            return None
        doc = orjson.loads(held.object_json(self.kind))
        return doc if isinstance(doc, dict) else None
