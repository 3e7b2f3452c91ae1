"""The event history: what changed, in resource-version order, for a bounded window.

The apiserver's cacher keeps a cyclic buffer of recent events (75 s by default) so that a watch
can start from a recent resource version and a paginated list can be continued from its snapshot.
kproxy's history serves the same two purposes: snapshots at an older resource version are rebuilt
from the current state by undoing the newer events, and (part 2) watches resume from it.

Bounded twice, as the cacher is: by age (``window`` seconds; an event is kept at least that long
unless the count bound bites) and by count (``max_events``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .objects import CachedObject

ADDED = "ADDED"
MODIFIED = "MODIFIED"
DELETED = "DELETED"


@dataclass(slots=True)
class CacheEvent:
    """One change. ``obj`` is the new state (for DELETED: the last state, at the deletion's
    resource version, as the apiserver sends it); ``prev`` the state before, if there was one."""

    type: str
    obj: CachedObject
    prev: CachedObject | None
    rv: int
    time: float


class EventHistory:
    def __init__(
        self,
        *,
        window: float = 75.0,
        max_events: int = 102400,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self.max_events = max_events
        self._clock = clock
        self._events: deque[CacheEvent] = deque()
        # Everything after this resource version is in the buffer (the relist RV until the first
        # eviction, then the RV of the last evicted event).
        self.complete_after = 0
        self.evicted = 0
        self._evicted_at_reset = 0

    def __len__(self) -> int:
        return len(self._events)

    def reset(self, rv: int) -> None:
        """A relist at ``rv``: the history starts again (older snapshots are gone)."""
        self._events.clear()
        self.complete_after = rv
        self._evicted_at_reset = self.evicted

    def add(self, event: CacheEvent) -> None:
        self._events.append(event)
        self._evict(event.time)

    def _evict(self, now: float) -> None:
        events = self._events
        horizon = now - self.window
        while events and (len(events) > self.max_events or events[0].time < horizon):
            gone = events.popleft()
            self.complete_after = gone.rv
            self.evicted += 1

    def expire(self) -> None:
        """Drop events older than the window (called now and then, so an idle cache shrinks too)."""
        self._evict(self._clock())

    def covers(self, rv: int) -> bool:
        """Whether every event after ``rv`` is still here."""
        return rv >= self.complete_after

    def since(self, rv: int) -> Iterator[CacheEvent]:
        """The events with a resource version above ``rv``, oldest first."""
        events = self._events
        # Binary search over the deque's resource versions (monotonic).
        lo, hi = 0, len(events)
        while lo < hi:
            mid = (lo + hi) // 2
            if events[mid].rv <= rv:
                lo = mid + 1
            else:
                hi = mid
        for i in range(lo, len(events)):
            yield events[i]

    def too_old_bound(self) -> int:
        """The M of the apiserver's ``too old resource version: N (M)``: the oldest resource
        version a watch can start after minus one (``watch_cache_history.go`` ``GetIntervalLocked``:
        the list's resource version until something is evicted, then the oldest buffered event's)."""
        if self.evicted > self._evicted_at_reset and self._events:
            return self._events[0].rv - 1
        return self.complete_after

    @property
    def oldest_rv(self) -> int:
        return self._events[0].rv if self._events else 0
