"""Reflector: keeps a WatchCache equal to the upstream, through one list + watch (client-go's name).

It lists with a streaming list (a watch with ``sendInitialEvents=true``: the current objects as
ADDED events, then a bookmark marking their end, then live events on the same stream) where the
upstream supports it, and with a paginated list followed by a watch otherwise. A watch that ends
or breaks is resumed from the cache's resource version; a ``410 Expired`` (the upstream no longer
has the history, e.g. after an apiserver restart or an etcd compaction) makes it list again, and
the cache reconciles the new list with what it had by difference.

The HTTP side is a ``ListerWatcher`` supplied by the caller; nothing here knows about HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from .history import ADDED, DELETED, MODIFIED
from .objects import CachedObject
from .watch_cache import WatchCache

log = logging.getLogger("kproxy.cache")

BOOKMARK = "BOOKMARK"


class Expired(Exception):
    """The upstream no longer has the requested resource version (410 / Expired)."""


class StreamingListUnsupported(Exception):
    """The upstream refused ``sendInitialEvents`` (WatchList disabled): list by pages instead."""


@dataclass(slots=True)
class UpstreamEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    rv: int
    obj: CachedObject | None = None
    initial_events_end: bool = False


@dataclass(slots=True)
class ListPage:
    objects: list[CachedObject]
    rv: int
    continue_token: str = ""


class ListerWatcher(Protocol):
    async def list(self, *, limit: int, continue_token: str) -> ListPage:
        """One page of a list (resourceVersion unset: a consistent read)."""
        ...

    def watch(self, *, resource_version: str, send_initial_events: bool) -> AsyncIterator[UpstreamEvent]:
        """A watch with bookmarks. Raises Expired for a 410 (as an HTTP status or an ERROR
        event), StreamingListUnsupported when ``send_initial_events`` is refused."""
        ...

    async def current_rv(self) -> int:
        """The upstream's current resource version, cheaply (a consistent read of one item)."""
        ...

    async def progress_rv(self) -> int:
        """A resource version up to which the upstream has sent this resource's watchers every
        event (a streaming list that matches nothing: its end-of-initial-events bookmark)."""
        ...


class Reflector:
    def __init__(
        self,
        name: str,
        lw: ListerWatcher,
        cache: WatchCache,
        *,
        page_size: int = 500,
        on_relist: Callable[[str], None] | None = None,
        on_upstream_rv: Callable[[int], None] | None = None,
    ) -> None:
        self.name = name
        self.lw = lw
        self.cache = cache
        self.page_size = page_size
        self._on_relist = on_relist
        self._on_upstream_rv = on_upstream_rv
        self._task: asyncio.Task[None] | None = None
        self.streaming_list = True
        self.last_error = ""
        self.upstream_rv = 0
        self._progress: asyncio.Future[int] | None = None
        self._relist_reason = "relist"
        self._probe_task: asyncio.Task[None] | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kproxy-reflector-{self.name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._progress is not None and not self._progress.done():
            self._progress.cancel()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # -- freshness --------------------------------------------------------------------------------
    def saw_upstream_rv(self, rv: int) -> None:
        if rv > self.upstream_rv:
            self.upstream_rv = rv
            if self._on_upstream_rv is not None:
                self._on_upstream_rv(rv)

    async def current_rv(self) -> int:
        rv = await self.lw.current_rv()
        self.saw_upstream_rv(rv)
        return rv

    async def request_progress(self) -> None:
        """Ask the upstream to confirm how far this resource's events have been sent; one probe
        at a time, shared by every waiter. The confirmed RV becomes the cache's RV once the
        events before it (already sent on the main watch) have been applied."""
        fut = self._progress
        if fut is None or fut.done():
            fut = self._progress = asyncio.get_running_loop().create_future()
            self._probe_task = asyncio.create_task(self._probe(fut))
        await asyncio.shield(fut)

    async def _probe(self, fut: asyncio.Future[int]) -> None:
        try:
            rv = await self.lw.progress_rv()
        except BaseException as err:
            if not fut.done():
                fut.set_exception(err if isinstance(err, Exception) else RuntimeError("cancelled"))
                fut.exception()
            return
        self.saw_upstream_rv(rv)
        # The main watch carries every event up to rv in order before this answer could be
        # made; give the loop a moment to read what is already on the wire.
        await asyncio.sleep(0.01)
        self.cache.progress(rv)
        if not fut.done():
            fut.set_result(rv)

    # -- the loop ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        need_list = True
        backoff = 0.1
        while True:
            try:
                if need_list:
                    if self.streaming_list:
                        try:
                            await self._stream(listing=True)
                        except StreamingListUnsupported:
                            log.info("%s: the upstream has no streaming lists; listing by pages", self.name)
                            self.streaming_list = False
                            continue
                    else:
                        await self._paged_list()
                        need_list = False
                        await self._stream(listing=False)
                else:
                    await self._stream(listing=False)
                need_list = False
                backoff = 0.1
                self.last_error = ""
            except asyncio.CancelledError:
                raise
            except Expired:
                log.info("%s: resource version %d expired upstream; listing again", self.name, self.cache.rv)
                need_list = True
                self._relist_reason = "expired"
            except Exception as err:
                self.last_error = f"{type(err).__name__}: {err}"
                log.warning(
                    "%s: upstream list/watch failed (%s); retrying in %.1fs", self.name, self.last_error, backoff
                )
                if not self.cache.ready:
                    need_list = True
                self._relist_reason = "error"
                await asyncio.sleep(backoff * (1 + random.random() / 2))
                backoff = min(backoff * 2, 30.0)

    async def _paged_list(self) -> None:
        objects: list[CachedObject] = []
        token = ""
        rv = 0
        while True:
            page = await self.lw.list(limit=self.page_size, continue_token=token)
            objects.extend(page.objects)
            rv = rv or page.rv
            token = page.continue_token
            if not token:
                break
        self.saw_upstream_rv(rv)
        self._replace(objects, rv)

    def _replace(self, objects: list[CachedObject], rv: int) -> None:
        if self.cache.ready and self._on_relist is not None:
            self._on_relist(self._relist_reason)
        self.cache.replace(objects, rv)

    async def _stream(self, *, listing: bool) -> None:
        cache = self.cache
        pending: list[CachedObject] | None = [] if listing else None
        rv = "" if listing else str(cache.rv)
        async for ev in self.lw.watch(resource_version=rv, send_initial_events=listing):
            if pending is not None:
                if ev.type == ADDED and ev.obj is not None:
                    pending.append(ev.obj)
                elif ev.type == BOOKMARK and ev.initial_events_end:
                    self.saw_upstream_rv(ev.rv)
                    self._replace(pending, ev.rv)
                    pending = None
                continue
            if ev.type == BOOKMARK:
                self.saw_upstream_rv(ev.rv)
                cache.progress(ev.rv)
            elif ev.type in (ADDED, MODIFIED, DELETED) and ev.obj is not None:
                self.saw_upstream_rv(ev.rv)
                cache.apply(ev.type, ev.obj)
        if pending is not None:
            raise ConnectionError("the streaming list ended before its initial events were complete")
