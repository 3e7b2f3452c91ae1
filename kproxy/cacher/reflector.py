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
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from kproxy import gctuning

from .compaction import CompactionTracker
from .history import ADDED, DELETED, MODIFIED
from .objects import CachedObject
from .watch_cache import WatchCache

log = logging.getLogger("kproxy.cache")
_PROBE_WAIT = 0.01  # the least a probe's answer waits for the main watch (Reflector.probe_wait)
_PROBE_WAIT_MAX = 0.25

BOOKMARK = "BOOKMARK"


class Expired(Exception):
    """The upstream no longer has the requested resource version (410 / Expired)."""

    #: The ``reason`` of ``kproxy_watchcache_relists_total`` for the list it makes.
    reason = "expired"


class NotResumed(Expired):
    """The cache's state is not resumed but listed again, for ``reason``: it was loaded from disk
    and found to be another cluster's (``discarded``), or ahead of the apiserver (``ahead``)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class TooLarge(Exception):
    """The upstream has not reached the requested resource version (its 504 "Too large resource
    version"): it is behind, or it is not the upstream the version came from."""


class NotServed(Exception):
    """The upstream no longer serves the resource (404: its CustomResourceDefinition is gone)."""


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

    async def servable_at(self, rv: int) -> bool:
        """Whether the upstream still serves a list at exactly ``rv`` (False: its 410, the
        revision is compacted). Raises for any other answer."""
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
        backoff: tuple[float, float] = (0.1, 30.0),
    ) -> None:
        self.name = name
        self.lw = lw
        self.cache = cache
        self.page_size = page_size
        self._on_relist = on_relist
        self._on_upstream_rv = on_upstream_rv
        # Seconds to wait after a failed list/watch: the first retry, and the cap it doubles to.
        self.backoff = backoff
        self._task: asyncio.Task[None] | None = None
        self.streaming_list = True
        self.last_error = ""
        # The last failure of the list/watch (None once a stream delivers again): whether the
        # upstream is unreachable is decided from it by the caller (``kproxy.cacher.outage``).
        self.last_exception: Exception | None = None
        # Wall-clock time until which the cache is known to have been equal to the upstream: while
        # a live watch runs, now; after it ends, when it ended (0: never since start).
        self._confirmed_until = 0.0
        self._answering = False  # the running stream has delivered something: it reached the upstream
        self.upstream_rv = 0
        self._progress: asyncio.Future[int] | None = None
        self._relist_reason = "relist"
        #: A list replaces a state that was there (an Expired, a state not resumed): counted in
        #: ``on_relist`` even when the cache was made unready before it.
        self._relist_owed = False
        self._probe_task: asyncio.Task[None] | None = None
        # The probe the readers that arrived during the one in flight wait for (consistent_rv).
        self._next_progress: asyncio.Future[int] | None = None
        self.probes = 0  # progress probes sent
        self._need_list = True
        self._delivered = 0  # events received on any stream (a working stream resets the backoff)
        # The id of the watch whose events are being applied straight to the cache, if one runs.
        self._live: int | None = None
        self._streams = 0
        # The cache was filled from disk and no stream has delivered anything since: a watch the
        # upstream cannot resume (it never reached that resource version: another etcd, or one
        # restored from a backup) means listing again rather than retrying.
        self.resumed = False
        # Whether a continue token's revision is compacted upstream (asked only for tokens).
        self.compaction = CompactionTracker(lambda rv: self.lw.servable_at(rv))

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
        probe, self._probe_task = self._probe_task, None
        if probe is not None and not probe.done():
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
        for pending in (self._progress, self._next_progress):
            if pending is not None and not pending.done():
                pending.cancel()
        self._next_progress = None
        await self.compaction.close()

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
        events before it (already sent on the main watch) have been applied. Raises (the
        upstream's error, or ConnectionError when no live watch feeds the cache or it restarted
        meanwhile) without moving the cache."""
        fut = self._progress
        if fut is None or fut.done():
            fut = self._start_probe(asyncio.get_running_loop().create_future())
        await asyncio.shield(fut)

    def probe_wait(self) -> float:
        """How long a probe's answer waits for the events the main watch may still carry: 10 ms,
        and twice the lateness of the events that came after such a wait lately, at most 250 ms."""
        return min(_PROBE_WAIT_MAX, _PROBE_WAIT + 2 * self.cache.lateness())

    async def consistent_rv(self) -> int:
        """A resource version at least the upstream's latest when this was called, confirmed by
        a progress probe sent after the call (the cache has reached it when this returns): what a
        consistent read must be served at. The probe is the apiserver's own consistent read, a
        streaming list that matches nothing: its cacher takes the latest revision from etcd
        (``storage.GetCurrentResourceVersion`` in ``Cacher.getWatchCacheResourceVersion``)
        and waits until its watch cache has it before the end-of-initial-events bookmark
        (staging/src/k8s.io/apiserver/pkg/storage/cacher/cacher.go), one round trip.

        Readers arriving together share probes as the apiserver's progress requester shares its
        etcd progress requests (cacher/progress/watch_progress.go): with none in flight a probe
        starts now; one already in flight may have read etcd before this reader arrived, so
        the reader waits for the next one, started as soon as that one ends and shared by every
        reader that arrived meanwhile. However many arrive, a read costs at most the rest of one
        probe and one more.

        With no live watch feeding the cache (it lists, or reconnects) no probe can move it:
        this is the upstream's current resource version then (a consistent read of nothing,
        its own error if it cannot answer), which the cache's events must reach."""
        if self._live is None:
            return await self.current_rv()
        fut = self._progress
        if fut is None or fut.done():
            fut = self._start_probe(asyncio.get_running_loop().create_future())
        else:
            if self._next_progress is None:
                self._next_progress = asyncio.get_running_loop().create_future()
            fut = self._next_progress
        return await asyncio.shield(fut)

    def _probe_ended(self, _task: asyncio.Task[None]) -> None:
        nxt, self._next_progress = self._next_progress, None
        if nxt is None or nxt.done():
            return
        if self._task is None:  # stopped
            self._fail(nxt, ConnectionError("the cache stopped"))
            return
        self._start_probe(nxt)

    def _start_probe(self, fut: asyncio.Future[int]) -> asyncio.Future[int]:
        self._progress = fut
        self._probe_task = asyncio.create_task(self._probe(fut))
        self._probe_task.add_done_callback(self._probe_ended)
        return fut

    async def _probe(self, fut: asyncio.Future[int]) -> None:
        # The answer only says something about the cache while one live watch (events applied
        # straight to the cache) runs from before the probe until after it: not while the
        # reflector relists (the store is about to be replaced) or retries a broken watch.
        live = self._live
        asked = time.monotonic()  # the compaction tracker's clock
        try:
            if live is None:
                raise ConnectionError("the cache's watch is not running")
            self.probes += 1
            rv = await self.lw.progress_rv()
        except BaseException as err:
            self._fail(fut, err if isinstance(err, Exception) else RuntimeError("cancelled"))
            if not isinstance(err, Exception):
                raise  # a cancelled probe (stop()) stays cancelled
            return
        self.saw_upstream_rv(rv)
        # The apiserver had every event up to rv when it answered, but its main watch is another
        # stream, with no order between the two: wait a moment for the events it is still carrying.
        # Nothing marks their end, so the wait is a bound learnt from the events that came later
        # than it before (WatchCache.lateness), which a loaded apiserver or link makes longer.
        await asyncio.sleep(self.probe_wait())
        if self._live != live:
            self._fail(fut, ConnectionError("the cache's watch restarted during the progress probe"))
            return
        # Not in order with the main watch: an event up to rv that is still on its way is
        # applied when it arrives, not dropped as a repeat.
        self.cache.progress(rv, in_order=False)
        # The upstream's latest revision is one it serves a list at (etcd compacts only older
        # ones): a continue token at rv or later needs no compaction probe of its own until the
        # tracker's answers go stale, as after a probe at rv (kproxy.cacher.compaction).
        self.compaction.saw_served(rv, asked)
        if not fut.done():
            fut.set_result(rv)

    @staticmethod
    def _fail(fut: asyncio.Future[int], err: Exception) -> None:
        if not fut.done():
            fut.set_exception(err)
            fut.exception()  # retrieved: nobody may be waiting any more

    # -- the loop ---------------------------------------------------------------------------------
    async def _run(self) -> None:
        # Cleared by _replace once a list (streaming or paged) has been applied: from then on a
        # stream that ends or breaks is resumed, also when it was the streaming list's own.
        # A cache loaded from disk is resumed from its resource version, as after a broken watch.
        self._need_list = not self.cache.ready
        self.resumed = self.cache.ready
        first_backoff, max_backoff = self.backoff
        backoff = first_backoff
        while True:
            delivered = self._delivered
            try:
                if self._need_list:
                    if self.streaming_list:
                        try:
                            await self._stream(listing=True)
                        except StreamingListUnsupported:
                            log.info("%s: the upstream has no streaming lists; listing by pages", self.name)
                            self.streaming_list = False
                            continue
                    else:
                        await self._paged_list()
                        await self._stream(listing=False)
                else:
                    await self._stream(listing=False)
                backoff = first_backoff
                self.last_error = ""
            except asyncio.CancelledError:
                raise
            except TooLarge as err:
                self.last_exception = err  # the upstream answered
                if not (self.resumed and self._delivered == delivered):
                    self.last_error = f"TooLarge: {err}"
                    log.warning("%s: upstream watch failed (%s); retrying in %.1fs", self.name, err, backoff)
                    await asyncio.sleep(backoff * (1 + random.random() / 2))
                    backoff = min(backoff * 2, max_backoff)
                    continue
                log.info(
                    "%s: the upstream never reached the persisted resource version %d; listing",
                    self.name,
                    self.cache.applied_rv,
                )
                self._need_list = True
                self._relist_reason = "expired"
            except Expired as err:
                self.last_exception = err  # the upstream answered: it is reachable
                if isinstance(err, NotResumed):
                    log.info("%s: %s", self.name, err)
                else:
                    rv = self.cache.applied_rv
                    log.info("%s: resource version %d expired upstream; listing again", self.name, rv)
                self._need_list = True
                self._relist_reason = err.reason
                # The list replaces a state: counted, also when one not resumed was made unready.
                self._relist_owed = self.cache.ready or isinstance(err, NotResumed)
            except Exception as err:
                if isinstance(err, NotServed) and self.cache.ready:
                    # Readers go to the apiserver (and get its 404) until it serves it again.
                    log.info("%s: no longer served upstream; the cache is not ready", self.name)
                    self.cache.unready()
                    self._need_list = True
                if self._delivered != delivered:
                    backoff = first_backoff  # the stream worked for a while: this is a new failure
                self.last_error = f"{type(err).__name__}: {err}"
                self.last_exception = err
                log.warning(
                    "%s: upstream list/watch failed (%s); retrying in %.1fs", self.name, self.last_error, backoff
                )
                # A relist still owed keeps the reason it was started for (an Expired).
                await asyncio.sleep(backoff * (1 + random.random() / 2))
                backoff = min(backoff * 2, max_backoff)

    async def _paged_list(self) -> None:
        objects: list[CachedObject] = []
        token = ""
        rv = 0
        with gctuning.paused():  # the list's objects are long-lived (see kproxy.gctuning)
            while True:
                page = await self.lw.list(limit=self.page_size, continue_token=token)
                objects.extend(page.objects)
                rv = rv or page.rv
                token = page.continue_token
                if not token:
                    break
            self.saw_upstream_rv(rv)
            self._replace(objects, rv)

    def _go_live(self) -> None:
        self._streams += 1
        self._live = self._streams
        self.cache.stream_live()

    @property
    def confirmed_at(self) -> float:
        """When (``time.time()``) the cache was last confirmed equal to the upstream: now while a
        live watch that has delivered something (so reached the upstream) feeds it, else when the
        last such watch ended (0.0: never since start)."""
        return time.time() if self._live is not None and self._answering else self._confirmed_until

    @property
    def live(self) -> bool:
        """Whether a watch is feeding the cache right now (not listing, not waiting to retry)."""
        return self._live is not None

    def _replace(self, objects: list[CachedObject], rv: int) -> None:
        if (self.cache.ready or self._relist_owed) and self._on_relist is not None:
            self._on_relist(self._relist_reason)
        self._relist_owed = False
        if rv < self.cache.applied_rv:
            self.compaction.reset()  # the upstream went back in time: its revisions are new ones
        self.cache.replace(objects, rv)
        self._need_list = False
        self.resumed = False

    async def _stream(self, *, listing: bool) -> None:
        cache = self.cache
        pending: list[CachedObject] | None = [] if listing else None
        # From what the stream itself delivered: the cache's rv may be ahead (a progress probe).
        rv = "" if listing else str(cache.applied_rv)
        # The initial events are applied with collection held back (see kproxy.gctuning).
        listing_pause = contextlib.ExitStack()
        # Resumed from a persisted state, the watch first carries what changed while kproxy was
        # down, and nothing marks the end of that: a progress probe answered meanwhile would let
        # the cache claim a resource version whose events are still on their way. So it counts
        # as live (probes believed, consistent reads answered) from its first bookmark on, which
        # comes after every event before it; until then consistent reads go to the apiserver.
        defer_live = not listing and self.resumed
        if listing:
            listing_pause.enter_context(gctuning.paused())
        elif not defer_live:
            self._go_live()
        try:
            if defer_live:
                log.info("%s: resuming from the persisted state at resource version %s", self.name, rv)
            async for ev in self.lw.watch(resource_version=rv, send_initial_events=listing):
                self._delivered += 1
                if not listing:
                    # The resumed watch answered. A list's stream does not clear it: until the list
                    # replaces the cache, what the cache holds is still the state from disk.
                    self.resumed = False
                self.last_exception = None
                self._answering = True
                if defer_live and ev.type == BOOKMARK:
                    defer_live = False
                    self._go_live()
                if pending is not None:
                    if ev.type == ADDED and ev.obj is not None:
                        pending.append(ev.obj)
                    elif ev.type == BOOKMARK and ev.initial_events_end:
                        self.saw_upstream_rv(ev.rv)
                        self._replace(pending, ev.rv)
                        pending = None
                        listing_pause.close()
                        self._go_live()
                    continue
                if ev.type == BOOKMARK:
                    self.saw_upstream_rv(ev.rv)
                    cache.progress(ev.rv)
                elif ev.type in (ADDED, MODIFIED, DELETED) and ev.obj is not None:
                    self.saw_upstream_rv(ev.rv)
                    cache.apply(ev.type, ev.obj)
        finally:
            listing_pause.close()
            if self._live is not None and self._answering:
                self._confirmed_until = time.time()
            self._answering = False
            self._live = None
        if pending is not None:
            raise ConnectionError("the streaming list ended before its initial events were complete")
