"""The schema cache: the upstream's OpenAPI v3 documents, loaded on first use and kept fresh.

``/openapi/v3`` is a small index of group-versions, each pointing at a document URL that
carries a content hash (``?hash=...``, served ``Cache-Control: immutable``): a document is
fetched once per hash and kept, so refreshing is re-reading the index (with ``If-None-Match``
when the upstream gives an ETag) and fetching only documents whose hash changed.

Custom resources change when their CRD does. The apiserver rebuilds a CRD's document
asynchronously after the CRD changes, so for a short while the index may still point at the old
schema: after any CRD event (from the process's one CRD watch, ``kproxy.core.discovery``, made
with kproxy's own credentials) the CRD's group is *unsettled* for ``settle_seconds`` and lookups
for it answer ``None`` (the caller then lets the apiserver validate, which is always exact). A
watch that breaks is resumed, and a relist's differences arrive as events too, so a change made
while disconnected is not missed. While no watch feeds the CRDs (no permission, or
reconnecting) custom resources are not validated locally at all.

No aiohttp here beyond what ``ApiClient`` returns; the fetch function is injectable for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from kproxy.cacher import CacheEvent
from kproxy.core.crdfeed import CrdFeed
from kproxy.core.discovery import Discovery, groups_of
from kproxy.filters.validation.schemanodes import Endpoint, GroupVersionSchemas, Node, load_group_version

log = logging.getLogger("kproxy.validation")

#: fetch(path, etag) -> (status, body bytes, etag or None)
Fetch = Callable[[str, str | None], Awaitable[tuple[int, bytes, str | None]]]



@dataclass(slots=True)
class Resolved:
    """What a request's body is checked against."""

    endpoint: Endpoint
    root: Node
    custom: bool
    meta: Node | None


class SchemaCache:
    """Group-version documents by content hash, the index, and CRD freshness."""

    def __init__(self, fetch: Fetch, *, settle_seconds: float = 10.0, refresh_seconds: float = 60.0) -> None:
        self._fetch = fetch
        self.settle_seconds = settle_seconds
        self.refresh_seconds = refresh_seconds
        self._index: dict[str, str] = {}
        self._index_etag: str | None = None
        self._index_at = -1e9
        self._index_lock = asyncio.Lock()
        self._docs: dict[str, GroupVersionSchemas] = {}
        self._loading: dict[str, asyncio.Task[GroupVersionSchemas | None]] = {}
        self._unsettled: dict[str, float] = {}  # CRD group -> monotonic deadline
        self._crds: CrdFeed | None = None  # the CRD feed followed, if any
        self.document_loads = 0
        self.last_load_seconds = 0.0

    # ------------------------------------------------------------------ index

    async def refresh_index(self, *, force: bool = False) -> None:
        """Re-read ``/openapi/v3`` (at most once a second unless forced)."""
        async with self._index_lock:
            if not force and time.monotonic() - self._index_at < 1.0:
                return
            status, body, etag = await self._fetch("/openapi/v3", self._index_etag)
            self._index_at = time.monotonic()
            if status == 304:
                return
            if status != 200:
                raise OSError(f"/openapi/v3 answered {status}")
            paths = orjson.loads(body).get("paths") or {}
            self._index = {k: str(v.get("serverRelativeURL", "")) for k, v in paths.items() if isinstance(v, dict)}
            self._index_etag = etag

    def unsettle(self, group: str, seconds: float | None = None) -> None:
        """Do not vouch for ``group``'s schemas for a while (its CRD just changed)."""
        self._unsettled[group] = time.monotonic() + (self.settle_seconds if seconds is None else seconds)
        self._index_at = -1e9  # the next lookup re-reads the index

    def settled(self, group: str) -> bool:
        deadline = self._unsettled.get(group)
        if deadline is None:
            return True
        if time.monotonic() >= deadline:
            del self._unsettled[group]
            self._index_at = -1e9
            return True
        return False

    # ------------------------------------------------------------------ documents

    async def group_version(self, group: str, version: str) -> GroupVersionSchemas | None:
        key = f"apis/{group}/{version}" if group else f"api/{version}"
        if time.monotonic() - self._index_at > self.refresh_seconds:
            await self.refresh_index()
        url = self._index.get(key)
        if url is None:
            await self.refresh_index()
            url = self._index.get(key)
            if url is None:
                return None
        doc = self._docs.get(url)
        if doc is not None:
            return doc
        task = self._loading.get(url)
        if task is None:
            task = asyncio.ensure_future(self._load(url))
            self._loading[url] = task
            task.add_done_callback(lambda _t: self._loading.pop(url, None))
        return await asyncio.shield(task)

    async def _load(self, url: str) -> GroupVersionSchemas | None:
        t0 = time.perf_counter()
        status, body, _ = await self._fetch(url, None)
        if status != 200:
            log.warning("validation: %s answered %s; not validating that group-version locally", url, status)
            return None
        doc = load_group_version(orjson.loads(body))
        self.document_loads += 1
        self.last_load_seconds = time.perf_counter() - t0
        # Documents are keyed by their hash URL; drop superseded ones of the same group-version.
        base = url.split("?", 1)[0]
        for old in [u for u in self._docs if u.split("?", 1)[0] == base]:
            del self._docs[old]
        self._docs[url] = doc
        return doc

    async def resolve(self, group: str, version: str, resource: str, subresource: str) -> Resolved | None:
        """The compiled schema a write to this resource is decoded into, or None (unknown,
        unsettled, or not loadable: the apiserver validates it alone)."""
        if group and not self.settled(group):
            return None
        gv = await self.group_version(group, version)
        if gv is None:
            return None
        if gv.custom and not self.watching_crds:
            return None
        endpoint = gv.endpoint(resource, subresource)
        if endpoint is None:
            return None
        return Resolved(endpoint, gv.node(endpoint.ref), gv.custom, gv.object_meta() if gv.custom else None)

    # ------------------------------------------------------------------ CRD changes

    @property
    def watching_crds(self) -> bool:
        """Custom resources are validated locally only while a watch feeds the CRDs."""
        feed = self._crds
        return feed is not None and feed.live

    def follow_crds(self, discovery: Discovery) -> None:
        """Follow CRD changes from ``discovery``'s CRD feed (started if it was not)."""
        if self._crds is None:
            discovery.subscribe_crds(self.crds_changed)
            self._crds = discovery.crds()

    def unfollow_crds(self, discovery: Discovery) -> None:
        discovery.unsubscribe_crds(self.crds_changed)
        self._crds = None

    def crds_changed(self, events: list[CacheEvent]) -> None:
        """CRDs were added, changed or deleted: their groups' schemas are not vouched for a while."""
        for group in groups_of(events):
            if group:
                self.unsettle(group)


async def cancel(task: asyncio.Task[Any] | None) -> None:
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
