"""WatchCache: the current state of one resource, its history, and its resource version.

Fed by a Reflector (``replace`` after a list, ``apply`` per watch event, ``progress`` per
bookmark), read by the filter through ``snapshot`` and ``wait_until``. Single-threaded (one
asyncio loop): no locks, and a snapshot taken is never changed afterwards.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .history import ADDED, DELETED, MODIFIED, CacheEvent, EventHistory
from .objects import CachedObject, Kind

Listener = Callable[[list[CacheEvent]], None]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The objects at one resource version, in key order (the apiserver's etcd key order)."""

    rv: int
    objects: tuple[CachedObject, ...]
    keys: tuple[str, ...]

    def namespace_range(self, namespace: str) -> tuple[int, int]:
        """Index range of the objects in ``namespace`` ("" = all)."""
        if not namespace:
            return 0, len(self.keys)
        prefix = namespace + "/"
        lo = bisect.bisect_left(self.keys, prefix)
        hi = bisect.bisect_left(self.keys, namespace + "0")  # "0" is the byte after "/"
        return lo, hi

    def get(self, key: str) -> CachedObject | None:
        i = bisect.bisect_left(self.keys, key)
        if i < len(self.keys) and self.keys[i] == key:
            return self.objects[i]
        return None


class WatchCache:
    def __init__(
        self,
        kind: Kind,
        *,
        window: float = 75.0,
        max_events: int = 102400,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kind = kind
        self._clock = clock
        self.store: dict[str, CachedObject] = {}
        self.history = EventHistory(window=window, max_events=max_events, clock=clock)
        self.rv = 0
        # How far the upstream's own stream (the list, its events, its bookmarks) has brought the
        # cache. ``rv`` can be ahead of it after an out-of-band progress confirmation; events
        # above ``applied_rv`` that arrive after such a confirmation are still applied (not
        # taken for repeats), and a resumed watch starts from here so none is skipped.
        self.applied_rv = 0
        self.ready = False
        self.relists = 0
        # Out-of-band confirmations (resource version, when), newest last: an event at or below
        # one of them that arrives afterwards was late, and a read served in between missed it.
        self._claims: deque[tuple[int, float]] = deque(maxlen=64)
        #: Events that arrived after a progress confirmation had covered their resource version.
        self.late_events = 0
        self._lateness = (0.0, 0.0)  # (seconds, when): the largest lateness, decaying
        self._live_since = 0.0  # when the upstream stream now feeding the cache went live
        self.on_late: Callable[[], None] | None = None
        self._snapshot: Snapshot | None = None
        self._sorted_keys: list[str] | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._listeners: list[Listener] = []
        self._reset_listeners: list[Callable[[], None]] = []
        self._replace_listeners: list[Callable[[], None]] = []
        # True while a list's differences go to the listeners (they are not upstream events).
        self.replacing = False
        # What readers encoded from the current objects (whole-list item parts), dropped when an
        # object changes (not when only the resource version moves). ``generation`` counts changes.
        self.bodies: dict[tuple[object, ...], object] = {}
        self.generation = 0

    # -- feeding ----------------------------------------------------------------------------------
    def replace(self, objects: Iterable[CachedObject], rv: int) -> list[CacheEvent]:
        """A (re)list at ``rv``: the new state replaces the old one. Returns the differences as
        events (nothing on the first list); they go into the history and to the listeners like
        any other events, so open watches are brought to the new state instead of being ended.

        Their resource versions keep every watcher's next resume valid: deletions (whose real
        resource versions the list does not tell) come first, at the first version after
        everything delivered so far; then additions and changes in the order of the objects'
        own resource versions. A watcher that resumes from any of them gets the rest."""
        now = self._clock()
        new = {o.key: o for o in objects}
        events: list[CacheEvent] = []
        relist = self.ready or bool(self.store)
        if relist:
            base = max(self.applied_rv, self.rv) + 1
            changed: list[CacheEvent] = []
            for key, old in self.store.items():
                cur = new.get(key)
                if cur is None:
                    events.append(CacheEvent(DELETED, old.at_rv(base), old, base, now))
                elif cur.rv != old.rv:
                    changed.append(CacheEvent(MODIFIED, cur, old, max(cur.rv, base), now))
            for key, cur in new.items():
                if key not in self.store:
                    changed.append(CacheEvent(ADDED, cur, None, max(cur.rv, base), now))
            changed.sort(key=lambda e: e.rv)
            events.extend(changed)
            self.relists += 1
        self.store = new
        back_in_time = relist and rv < self.applied_rv
        if not relist or back_in_time:
            # The first list, or the upstream went back in time (etcd restored from a backup):
            # no history before this list is valid any more, nor is any open watch.
            self.history.reset(rv)
            events = []
        else:
            for event in events:
                self.history.add(event)
        self._changed(sort=True)
        self.rv = max(rv, self.rv) if self.ready and not back_in_time else rv
        self.applied_rv = rv
        self._claims.clear()  # the list holds whatever the claims' events were
        self.ready = True
        self._wake()
        if back_in_time:
            self._reset()
        self.replacing = True
        try:
            if events:
                self._notify(events)
        finally:
            self.replacing = False
        for listener in list(self._replace_listeners):
            listener()
        return events

    def apply(self, type_: str, obj: CachedObject) -> CacheEvent | None:
        """One watch event from the upstream. Events at or below the resource version the stream
        has already brought the cache to (a resumed watch repeating itself) are ignored."""
        if obj.rv <= self.applied_rv:
            return None
        if obj.rv <= self.rv and self._claims:
            self._late(obj.rv)
        self.applied_rv = obj.rv
        prev = self.store.get(obj.key)
        if type_ == DELETED:
            if prev is None:
                self._advance(obj.rv)
                return None
            del self.store[obj.key]
            self._changed(sort=True)
        else:
            if prev is None:
                type_ = ADDED
            elif type_ == ADDED:
                type_ = MODIFIED
            self.store[obj.key] = obj
            self._changed(sort=prev is None)
        event = CacheEvent(type_, obj, prev, obj.rv, self._clock())
        self.history.add(event)
        self._advance(obj.rv)
        self._notify([event])
        return event

    def progress(self, rv: int, *, in_order: bool = True) -> None:
        """A bookmark: nothing changed up to ``rv``. ``in_order`` False: the confirmation came
        from another stream than the one events arrive on (the reflector's progress probe), so
        events up to ``rv`` still in flight on the main watch must still be applied."""
        if in_order and rv > self.applied_rv:
            self.applied_rv = rv
        if rv > self.rv:
            if not in_order:
                self._claims.append((rv, self._clock()))
            self._snapshot = None
            self._advance(rv)

    def _late(self, rv: int) -> None:
        now = self._clock()
        for claimed, at in self._claims:
            if claimed >= rv:
                self.late_events += 1
                if self.on_late is not None:
                    self.on_late()
                # A confirmation older than the stream (the watch broke and resumed since) says
                # how long the reconnect took, not how far behind a live watch runs.
                if at >= self._live_since and now - at > self.lateness():
                    self._lateness = (now - at, now)
                return

    def stream_live(self) -> None:
        """A new upstream stream (a resumed watch, a list's) feeds the cache from now on."""
        self._live_since = self._clock()

    def lateness(self) -> float:
        """How late events arrived after a confirmation covering them, at most, lately: the
        largest lateness seen, halved for every minute since."""
        seconds, when = self._lateness
        if not seconds:
            return 0.0
        return float(seconds * 0.5 ** ((self._clock() - when) / 60.0))

    def clear(self) -> None:
        """Forget every object (a state dropped as another cluster's): no snapshot, body or
        order kept from it. The resource version and history stay until the next ``replace``."""
        self.store.clear()
        self._changed(sort=True)

    def unready(self) -> None:
        """The upstream no longer serves the resource: readers go to it, open watches end."""
        self.ready = False
        self._reset()

    def add_listener(self, listener: Listener) -> None:
        """``listener(events)`` after every change, with the events it made (in order)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def add_reset_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` when the history no longer leads to the current state (the upstream went
        back in time, or stopped serving the resource): watches must start again."""
        self._reset_listeners.append(listener)

    def remove_reset_listener(self, listener: Callable[[], None]) -> None:
        self._reset_listeners.remove(listener)

    def add_replace_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` after every ``replace`` (a list), once its differences were notified."""
        self._replace_listeners.append(listener)

    def remove_replace_listener(self, listener: Callable[[], None]) -> None:
        self._replace_listeners.remove(listener)

    def _reset(self) -> None:
        for listener in list(self._reset_listeners):
            listener()

    def _notify(self, events: list[CacheEvent]) -> None:
        for listener in self._listeners:
            listener(events)

    def _changed(self, *, sort: bool) -> None:
        self._snapshot = None
        self.bodies.clear()
        self.generation += 1
        if sort:
            self._sorted_keys = None

    def _advance(self, rv: int) -> None:
        if rv > self.rv:
            self.rv = rv
            self._wake()

    # -- waiting ----------------------------------------------------------------------------------
    def _wake(self) -> None:
        if not self._waiters:
            return
        keep = []
        for want, fut in self._waiters:
            if self.ready and self.rv >= want:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((want, fut))
        self._waiters = keep

    async def wait_until(self, rv: int, timeout: float) -> bool:
        """Wait until the cache is ready and has reached ``rv``; False after ``timeout`` seconds."""
        if self.ready and self.rv >= rv:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (rv, fut)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    # -- reading ----------------------------------------------------------------------------------
    def snapshot(self, rv: int | None = None) -> Snapshot | None:
        """The state at ``rv`` (the current one when None or equal); None when the history no
        longer reaches back that far, or ``rv`` is in the future."""
        if rv is None or rv == self.rv:
            return self._current()
        if not self.reaches(rv):
            return None
        state = dict(self.store)
        for event in reversed(list(self.history.since(rv))):
            if event.prev is None:
                state.pop(event.obj.key, None)
            else:
                state[event.prev.key] = event.prev
        keys = sorted(state)
        return Snapshot(rv, tuple(state[k] for k in keys), tuple(keys))

    def reaches(self, rv: int) -> bool:
        """Whether ``snapshot(rv)`` can rebuild the state at ``rv`` (cheap: builds nothing)."""
        return rv == self.rv or (rv < self.rv and self.history.covers(rv))

    def _current(self) -> Snapshot:
        snap = self._snapshot
        if snap is None:
            if self._sorted_keys is None:
                self._sorted_keys = sorted(self.store)
            keys = self._sorted_keys
            store = self.store
            snap = self._snapshot = Snapshot(self.rv, tuple(store[k] for k in keys), tuple(keys))
        return snap

    def get(self, key: str) -> CachedObject | None:
        return self.store.get(key)

    def __len__(self) -> int:
        return len(self.store)
