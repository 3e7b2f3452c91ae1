"""Broadcaster: every client watch of one resource served from its WatchCache.

The apiserver's cacher, in one asyncio loop (``cacher.go``, ``cache_watcher.go``,
``time_budget.go``, ``caching_object.go``):

* A watcher is registered synchronously with what it must get first (the objects of a snapshot
  as ADDED events, or the history after a resource version), so no event falls between the two.
* Each event is looked at once per *group* of watchers with the same namespace and selectors (the
  selector transitions: an object that starts matching is ADDED for that group, one that stops
  matching is DELETED, with its last content at the event's resource version), encoded once per
  wire format, and the same bytes are queued to every watcher of the group that wants that format.
* Queued frames are written once per loop pass: every event a watcher got during the pass goes out
  in one write (``coalesced``).
* Watchers whose connection does not take data keep their frames queued, at most ``buffer`` of
  them; past that, a shared time budget (50 ms a second, at most 100 ms, as the cacher's) bounds how
  long they may stay behind before they are closed (the client sees its stream end and re-watches
  from the last resource version it got). Nobody else waits for them.
* A watch ended while its initial events are written (shutdown, its timeout, too slow) ends after
  whole events: a joined initial body is written to its end first, then the end of stream.
* Bookmarks for watchers that asked: about every ``bookmark_interval`` seconds and 2 s before the
  watch's timeout; never queued behind a full buffer.
* An event that cannot be encoded in a watcher's format ends that watcher's stream after what it
  already got, and no other: the apiserver's watch handler does the same when its encoder fails
  (``handlers/watch.go`` ``serveWatch``: ``HandleError``, then return). No object can stop the
  dispatch of an event to everyone else.

Writing is the HTTP side's business (a ``Sink``); framing the wire format is a ``Frames``'.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .history import ADDED, DELETED, MODIFIED, CacheEvent
from .objects import CachedObject
from .shared_stream import Coding, SharedStream
from .time_budget import TimeBudget
from .watch_cache import WatchCache

log = logging.getLogger("kproxy.cache")

Predicate = Callable[[CachedObject], bool]

#: Initial events are written in batches of about this many bytes, each when the last has drained.
INITIAL_BATCH = 256 * 1024
#: Watch deadlines are checked (and bookmarks sent) on this tick, jittered by a quarter.
TICK = 1.0


class _Unencodable(Exception):
    """Internal: an initial event could not be encoded (logged where it happened)."""


class Sink(Protocol):
    """One client connection a watch writes to."""

    def write(self, data: bytes) -> None:
        """Queue ``data`` (one or more complete frames) for the client, without waiting."""

    def writable(self) -> bool:
        """The connection takes data (its buffer is below its high-water mark)."""

    async def drain(self) -> None:
        """Wait until the connection is writable again. Cancelling the wait must leave the
        connection as it was (a watch ended during its initial events has its task cancelled
        here, and its stream still ends cleanly)."""

    def closing(self) -> bool:
        """The client went away."""

    def close(self) -> None:
        """End the stream cleanly (called once)."""


class Frames(Protocol):
    """A wire format's frames for one kind (``kproxy.filters.watchcache.frames.FrameEncoder``)."""

    def event(self, type_: str, obj: CachedObject, media_type: str) -> bytes: ...

    def bookmark(self, rv: int, media_type: str, *, initial_events_end: bool = False) -> bytes: ...

    def error(self, status: dict[str, Any], media_type: str) -> bytes: ...


class Counters(Protocol):
    """Where the broadcaster reports (prometheus children in kproxy; plain counters in tests)."""

    def delivered(self, deliveries: int, writes: int, coalesced: int) -> None: ...

    def latency(self, seconds: float) -> None: ...

    def slow_closed(self) -> None: ...

    def watchers(self, count: int) -> None: ...

    def events_in(self, count: int) -> None: ...


class NoCounters:
    """Counters that count nothing (a base for those that count only some things)."""

    def delivered(self, deliveries: int, writes: int, coalesced: int) -> None:
        pass

    def latency(self, seconds: float) -> None:
        pass

    def slow_closed(self) -> None:
        pass

    def watchers(self, count: int) -> None:
        pass

    def events_in(self, count: int) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Selection:
    """What a watcher sees: a namespace ("" = all) and a predicate over labels and fields.
    ``key`` identifies equal selections (namespace and selector texts), which share the work."""

    namespace: str = ""
    predicate: Predicate | None = None
    key: tuple[str, ...] = ("", "", "")

    def matches(self, obj: CachedObject) -> bool:
        if self.namespace and obj.namespace != self.namespace:
            return False
        return self.predicate is None or self.predicate(obj)


@dataclass(eq=False, slots=True)
class Watcher:
    """One client watch. ``after``: events at or below it are not for this watcher (a watch
    from a resource version the cache has not reached yet waits for the events after it);
    every other event that arrives after it was registered is (it is not in what it got first).
    ``start_rv``: where it started; bookmarks go out only above it."""

    sink: Sink
    selection: Selection
    media_type: str
    bookmarks: bool
    deadline: float
    after: int
    start_rv: int
    pending: list[bytes] = field(default_factory=list)
    initial: bool = False  # its initial events are still being written
    mid_head: bool = False  # writing a joined initial body in slices: a slice may end mid-event
    closed: bool = False
    dirty: bool = False
    draining: bool = False
    overfull_at: float | None = None
    next_bookmark: float | None = None
    timer: asyncio.TimerHandle | None = None
    task: asyncio.Task[None] | None = None
    coding: Coding | None = None  # compressed: every write decodable at once
    stream: SharedStream[Watcher] | None = None  # the shared compressed stream it is in step with


class _Group:
    __slots__ = ("by_media", "selection", "streams")

    def __init__(self, selection: Selection) -> None:
        self.selection = selection
        self.by_media: dict[str, dict[Watcher, None]] = {}
        self.streams: dict[tuple[str, Coding], SharedStream[Watcher]] = {}


class Broadcaster:
    def __init__(
        self,
        cache: WatchCache,
        frames: Frames,
        *,
        buffer: int = 100,
        bookmark_interval: float = 60.0,
        counters: Counters | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cache = cache
        self.frames = frames
        self.buffer = buffer
        self.bookmark_interval = bookmark_interval
        self.counters: Counters = counters or NoCounters()
        self._clock = clock
        self.budget = TimeBudget(clock)
        self._groups: dict[tuple[str, ...], _Group] = {}
        self._watchers: set[Watcher] = set()
        self._dirty: list[Watcher] = []
        self._flush_handle: asyncio.Handle | None = None
        self._flush_waiters: list[asyncio.Future[None]] = []
        self._latencies: list[float] = []
        self._ticker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        cache.add_listener(self._on_events)
        cache.add_reset_listener(self.close_all)

    def __len__(self) -> int:
        return len(self._watchers)

    # -- watchers ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._ticker is None:
            self._ticker = asyncio.create_task(self._tick_loop(), name="kproxy-watch-ticker")

    async def stop(self) -> None:
        self.close_all()
        self.cache.remove_listener(self._on_events)
        tasks = [t for t in (self._ticker, *self._tasks) if t is not None]
        self._ticker = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def watch_initial(
        self,
        sink: Sink,
        selection: Selection,
        media_type: str,
        *,
        bookmarks: bool,
        initial_events_end: bool,
        timeout: float,
        initial_body: Callable[[Sequence[CachedObject]], bytes | None] | None = None,
        coding: Coding | None = None,
    ) -> Watcher:
        """A watch that starts with the current state as ADDED events (resourceVersion 0 or unset,
        or sendInitialEvents), then, when asked, the initial-events-end bookmark at that state's
        resource version, then live events. ``initial_body`` may supply the initial frames
        already joined (a body shared by several watchers of the same state; already compressed,
        as one complete frame, when ``coding`` is given), or None to have them made here one by
        one (as when one of them cannot be encoded: the watch gets those before it, then ends)."""
        snap = self.cache.snapshot()
        assert snap is not None
        lo, hi = snap.namespace_range(selection.namespace)
        pred = selection.predicate
        objects: Sequence[CachedObject] = snap.objects[lo:hi]
        if pred is not None:
            objects = [o for o in objects if pred(o)]
        w = self._register(sink, selection, media_type, bookmarks, timeout, snap.rv)
        w.initial = True
        w.after = 0
        w.coding = coding
        end = self.frames.bookmark(snap.rv, media_type, initial_events_end=True) if initial_events_end else b""
        if end and coding is not None:
            end = coding.solo(end)
        head = initial_body(objects) if initial_body is not None else None
        w.task = self._spawn(self._write_initial(w, objects, head, end))
        return w

    def watch_since(
        self,
        sink: Sink,
        selection: Selection,
        media_type: str,
        *,
        bookmarks: bool,
        timeout: float,
        rv: int,
        coding: Coding | None = None,
    ) -> Watcher:
        """A watch from resource version ``rv``: every event after it from the history (the
        caller has checked that the history covers it), then live events."""
        w = self._register(sink, selection, media_type, bookmarks, timeout, rv)
        w.coding = coding
        for event in self.cache.history.since(rv):
            if not self._deliver_one(w, event):
                self.close(w)  # what came before the event it cannot encode, then the end
                return w
        w.after = rv if rv > self.cache.rv else 0
        if w.pending:
            self._mark(w)
        return w

    def _register(
        self, sink: Sink, selection: Selection, media_type: str, bookmarks: bool, timeout: float, rv: int
    ) -> Watcher:
        now = self._clock()
        w = Watcher(sink, selection, media_type, bookmarks, now + timeout, 0, rv)
        if bookmarks:
            w.next_bookmark = self._next_bookmark(w, now)
        group = self._groups.get(selection.key)
        if group is None:
            group = self._groups[selection.key] = _Group(selection)
        group.by_media.setdefault(media_type, {})[w] = None
        self._watchers.add(w)
        loop = asyncio.get_running_loop()
        w.timer = loop.call_later(max(timeout, 0.0), self.close, w)
        self.counters.watchers(len(self._watchers))
        return w

    def _next_bookmark(self, w: Watcher, now: float) -> float | None:
        """``nextBookmarkTime``: every interval, but the last one 2 s before the deadline."""
        at = now + self.bookmark_interval
        at = min(at, w.deadline - 2.0)
        return at if at >= now else None

    def close(self, w: Watcher, *, flush: bool = True) -> None:
        """End a watch: what is queued is written first (``flush``), then the stream ends."""
        if w.closed:
            return
        w.closed = True
        self._watchers.discard(w)
        group = self._groups.get(w.selection.key)
        if group is not None:
            ws = group.by_media.get(w.media_type)
            if ws is not None:
                ws.pop(w, None)
                if not ws:
                    del group.by_media[w.media_type]
            if not group.by_media:
                del self._groups[w.selection.key]
        if w.timer is not None:
            w.timer.cancel()
        # A joined initial body is written to its end first (its slices do not end on event
        # boundaries, and an end of stream after part of an event is no clean end): its task ends
        # the stream then. The cacher's watcher stops between events too (cache_watcher.go
        # ``sendWatchCacheEvent``).
        finishing = w.mid_head
        if w.task is not None and not w.task.done() and w.task is not asyncio.current_task() and not finishing:
            w.task.cancel()
        if flush and w.pending and not w.initial and not w.sink.closing():
            self._write(w, {})
        if w.stream is not None:
            w.stream.leave(w)  # a compressed stream ends with a complete frame
        w.pending = []
        self.counters.watchers(len(self._watchers))
        if not finishing:
            w.sink.close()

    def close_all(self) -> None:
        for w in list(self._watchers):
            self.close(w)

    def expire_all(self, status: dict[str, Any]) -> None:
        """End every watch with an ERROR event carrying ``status`` (a ``410 Expired``: what the
        events were sent from is gone, and a client that watched again from the resource
        version it last saw would never learn it; client-go's reflector lists again on it). A
        watch still sending its initial events is ended as :meth:`close` ends it (its stream is
        between events only at the end of its initial body)."""
        for w in list(self._watchers):
            if not w.initial and not w.closed:
                try:
                    frame = self.frames.error(status, w.media_type)
                except Exception:
                    log.exception("an ERROR event cannot be encoded as %s", w.media_type)
                    frame = b""
                if frame:
                    w.pending.append(frame)
            self.close(w)

    # -- dispatch ---------------------------------------------------------------------------------
    def _on_events(self, events: list[CacheEvent]) -> None:
        self.counters.events_in(len(events))
        if not self._groups:
            return
        for event in events:
            if self._dispatch(event):
                self._latencies.append(event.time)
        self._schedule_flush()

    def _dispatch(self, event: CacheEvent) -> bool:
        """Queue the event's frames to every watcher it is for; whether there was one."""
        queued = False
        failed: list[Watcher] = []
        memo: dict[tuple[str, str], bytes] = {}
        moved: CachedObject | None = None  # prev at the event's rv, for a watcher it no longer matches
        obj, prev = event.obj, event.prev
        ev_rv = event.rv
        for group in self._groups.values():
            sel = group.selection
            if sel.namespace and obj.namespace != sel.namespace:
                continue
            pred = sel.predicate
            if pred is None:
                type_, out = event.type, obj
            else:
                now_matches = event.type != DELETED and pred(obj)
                was_matching = prev is not None and pred(prev)
                if now_matches:
                    type_, out = (MODIFIED if was_matching else ADDED), obj
                elif was_matching:
                    type_ = DELETED
                    if event.type == DELETED:
                        out = obj
                    else:
                        assert prev is not None
                        if moved is None:
                            moved = prev.at_rv(ev_rv)
                        out = moved
                else:
                    continue
            for media, watchers in group.by_media.items():
                frame = memo.get((type_, media))
                if frame is None:
                    frame = memo[(type_, media)] = self._event_frame(type_, out, media)
                if not frame:
                    failed.extend(w for w in watchers if ev_rv > w.after)
                    continue
                for w in watchers:
                    if ev_rv > w.after:
                        w.pending.append(frame)
                        queued = True
                        if not w.dirty:
                            w.dirty = True
                            self._dirty.append(w)
        for w in failed:
            self.close(w)
        return queued

    def _event_frame(self, type_: str, obj: CachedObject, media_type: str) -> bytes:
        """The event's frame, or b"" (never a frame) when it cannot be encoded."""
        try:
            return self.frames.event(type_, obj, media_type)
        except Exception:
            log.exception("watch event for %s cannot be encoded as %s: ending the watches that get it", obj, media_type)
            return b""

    def _deliver_one(self, w: Watcher, event: CacheEvent) -> bool:
        """One history event for one watcher (a resumed watch), with the same transitions;
        False when it cannot be encoded."""
        sel = w.selection
        obj, prev = event.obj, event.prev
        now_matches = event.type != DELETED and sel.matches(obj)
        was_matching = prev is not None and sel.matches(prev)
        if now_matches:
            type_, out = (MODIFIED if was_matching else ADDED), obj
        elif was_matching:
            type_ = DELETED
            assert prev is not None
            out = obj if event.type == DELETED else prev.at_rv(event.rv)
        else:
            return True
        frame = self._event_frame(type_, out, w.media_type)
        if frame:
            w.pending.append(frame)
        return bool(frame)

    def _mark(self, w: Watcher) -> None:
        if not w.dirty:
            w.dirty = True
            self._dirty.append(w)
        self._schedule_flush()

    async def flushed(self) -> None:
        """Return once what has been queued to the watchers so far has been written (to every
        watcher whose connection takes it): at once when no write pass is pending."""
        if self._flush_handle is None:
            return
        fut = asyncio.get_running_loop().create_future()
        self._flush_waiters.append(fut)
        await fut

    def _schedule_flush(self) -> None:
        if self._flush_handle is None and self._dirty:
            self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        """Write what every watcher got during this loop pass, one write each."""
        self._flush_handle = None
        dirty, self._dirty = self._dirty, []
        deliveries = writes = coalesced = 0
        overfull: list[Watcher] = []
        batches: dict[tuple[int, int, int], tuple[list[bytes], bytes, int]] = {}  # one join per batch
        shared: dict[SharedStream[Watcher], list[Watcher]] = {}
        # The hot loop (once per watcher per pass): a watcher whose client went away is found by
        # the tick (its writes are dropped meanwhile), not checked here.
        for w in dirty:
            w.dirty = False
            pending = w.pending
            if w.closed or not pending:
                continue
            if w.initial or not w.sink.writable():
                if len(pending) > self.buffer and w.overfull_at is None:
                    overfull.append(w)
                if not w.initial:
                    self._wait_writable(w)
                continue
            n = len(pending)
            coding = w.coding
            if coding is not None and coding.shared:
                shared.setdefault(self._stream(w, coding), []).append(w)
                if n > 1:
                    coalesced += 1
            elif n == 1 and coding is None:
                w.pending = []
                w.overfull_at = None
                w.sink.write(pending[0])
            else:
                self._write(w, batches)
                coalesced += 1
            deliveries += n
            writes += 1
        if shared:
            now = self._clock()
            for stream, ws in shared.items():
                for w in stream.send(ws, now):
                    self._write(w, batches)
        if writes:
            self.counters.delivered(deliveries, writes, coalesced)
        if self._latencies:
            now = self._clock()
            for t in self._latencies:
                self.counters.latency(now - t)
            self._latencies = []
        if overfull:
            self._give_budget(overfull)
        if self._flush_waiters:
            waiters, self._flush_waiters = self._flush_waiters, []
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def _stream(self, w: Watcher, coding: Coding) -> SharedStream[Watcher]:
        streams = self._groups[w.selection.key].streams
        stream = streams.get((w.media_type, coding))
        if stream is None:
            stream = streams[(w.media_type, coding)] = SharedStream(coding)
        return stream

    def _write(self, w: Watcher, batches: dict[tuple[int, int, int], tuple[list[bytes], bytes, int]]) -> None:
        """Write what ``w`` has queued, alone (a compressed watcher: as one complete frame)."""
        frames, w.pending = w.pending, []
        w.overfull_at = None
        coding = w.coding
        if len(frames) == 1 and coding is None:
            w.sink.write(frames[0])
            return
        if w.stream is not None:
            w.stream.leave(w)
        # Watchers that got the same frames in this pass (a group, mostly) share one joined (and
        # compressed) batch: the same bytes object goes to each of them.
        # The frames stay alive (in ``frames``) while their ids are used as the key.
        key = (id(frames[0]), len(frames), id(coding))
        hit = batches.get(key)
        if hit is not None and hit[0] == frames:  # list ==: identity first, so cheap for shared frames
            data = hit[1]
            if coding is not None:
                coding.account(hit[2], len(data), 0.0)
        else:
            data = frames[0] if len(frames) == 1 else b"".join(frames)
            size = len(data)
            if coding is not None:
                data = coding.solo(data)
            batches[key] = (frames, data, size)
        w.sink.write(data)

    def _wait_writable(self, w: Watcher) -> None:
        if not w.draining:
            w.draining = True
            self._spawn(self._drain(w))

    async def _drain(self, w: Watcher) -> None:
        try:
            await w.sink.drain()
        except (ConnectionError, RuntimeError):
            self.close(w, flush=False)
            return
        finally:
            w.draining = False
        if not w.closed and w.pending:
            self._mark(w)

    def _give_budget(self, overfull: list[Watcher]) -> None:
        """The cacher's ``dispatchEvent``: blocked watchers share what is left of the time budget;
        those still blocked when it runs out are closed."""
        now = self._clock()
        for w in overfull:
            w.overfull_at = now
        grace = self.budget.take_available()
        asyncio.get_running_loop().call_later(grace, self._expire_overfull, overfull, grace)

    def _expire_overfull(self, overfull: list[Watcher], grace: float) -> None:
        closed = 0
        for w in overfull:
            if w.closed or w.overfull_at is None:
                continue  # it caught up meanwhile
            if len(w.pending) > self.buffer:
                log.info(
                    "Forcing %s watcher close due to unresponsiveness (%d events queued)",
                    self.cache.kind.kind,
                    len(w.pending),
                )
                self.close(w, flush=False)
                self.counters.slow_closed()
                closed += 1
            else:
                w.overfull_at = None
        if not closed:
            self.budget.return_unused(grace)

    # -- initial events ---------------------------------------------------------------------------
    async def _write_initial(self, w: Watcher, objects: Sequence[CachedObject], head: bytes | None, end: bytes) -> None:
        """The initial events, in batches that each wait for the connection to take the last one
        (a large state is never copied whole into one connection's buffer); then what came in
        meanwhile."""
        sink = w.sink
        try:
            if head:
                view = memoryview(head)
                w.mid_head = True
                try:
                    for i in range(0, len(view), INITIAL_BATCH):
                        await self._send(sink, bytes(view[i : i + INITIAL_BATCH]))
                finally:
                    w.mid_head = False
                    if w.closed:  # ended meanwhile (shutdown, timeout, slow): the end after the body
                        sink.close()
                if w.closed:
                    return
            elif head is None:
                await self._send_objects(sink, w.media_type, objects, w.coding)
            if end:
                sink.write(end)
        except (ConnectionError, RuntimeError, _Unencodable):
            if w.closed:
                sink.close()
            else:
                self.close(w, flush=False)
            return
        w.initial = False
        w.task = None
        if w.pending:
            self._mark(w)

    async def _send_objects(
        self,
        sink: Sink,
        media_type: str,
        objects: Iterable[CachedObject],
        coding: Coding | None,
    ) -> None:
        batch: list[bytes] = []
        size = 0
        event = self._event_frame
        for obj in objects:
            frame = event(ADDED, obj, media_type)
            if not frame:
                if batch:
                    data = b"".join(batch)
                    sink.write(coding.solo(data) if coding is not None else data)
                raise _Unencodable
            batch.append(frame)
            size += len(frame)
            if size >= INITIAL_BATCH:
                data = b"".join(batch)
                await self._send(sink, coding.solo(data) if coding is not None else data)
                batch, size = [], 0
        if batch:
            data = b"".join(batch)
            sink.write(coding.solo(data) if coding is not None else data)

    async def _send(self, sink: Sink, data: bytes) -> None:
        if sink.closing():
            raise ConnectionError("client went away")
        sink.write(data)
        if not sink.writable():
            await sink.drain()
        else:
            await asyncio.sleep(0)  # let live events and other watchers through between batches

    # -- bookmarks and deadlines ------------------------------------------------------------------
    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK * (1 + random.random() / 4))
            try:
                self.tick()
            except Exception:  # a bug here must not stop every watch's bookmarks
                log.exception("watch bookmark tick failed")

    def tick(self) -> None:
        """Send due bookmarks; close watchers whose clients went away."""
        now = self._clock()
        rv = self.cache.rv
        memo: dict[str, bytes] = {}
        for w in list(self._watchers):
            if w.sink.closing():
                self.close(w, flush=False)
                continue
            at = w.next_bookmark
            if at is None or at > now or w.initial:
                continue
            w.next_bookmark = self._next_bookmark(w, now)
            if rv <= w.start_rv or len(w.pending) >= self.buffer:
                continue  # nothing newer than where it started; or its buffer is full: dropped
            frame = memo.get(w.media_type)
            if frame is None:
                frame = memo[w.media_type] = self.frames.bookmark(rv, w.media_type)
            w.pending.append(frame)
            self._mark(w)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
