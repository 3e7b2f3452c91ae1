"""EventHistory: the bounded ring of recent events that older snapshots are rebuilt from.

The clock is injected, so the time window is tested without waiting.
"""

from __future__ import annotations

import pytest

from kproxy.cacher import ADDED, DELETED, MODIFIED, CachedObject, CacheEvent, EventHistory
from kproxy.testing.clock import FakeClock


def obj(name: str, rv: int) -> CachedObject:
    return CachedObject(f"ns/{name}", "ns", name, rv, {}, {}, json=b'{"n":"' + name.encode() + b'"}')


def event(rv: int, t: float, type_: str = MODIFIED) -> CacheEvent:
    return CacheEvent(type_, obj(f"o{rv}", rv), None, rv, t)


def rvs(h: EventHistory, after: int) -> list[int]:
    return [e.rv for e in h.since(after)]


def test_a_fresh_history_covers_everything_from_its_start() -> None:
    h = EventHistory(clock=FakeClock())
    h.reset(100)
    assert len(h) == 0
    assert h.covers(100)
    assert h.covers(250)
    assert not h.covers(99)
    assert h.oldest_rv == 0
    assert rvs(h, 0) == []


def test_since_returns_only_newer_events_oldest_first() -> None:
    h = EventHistory(clock=FakeClock())
    h.reset(10)
    for rv in (11, 13, 17, 20, 21):
        h.add(event(rv, 1000.0))
    assert rvs(h, 10) == [11, 13, 17, 20, 21]
    assert rvs(h, 0) == [11, 13, 17, 20, 21]
    assert rvs(h, 11) == [13, 17, 20, 21]
    assert rvs(h, 12) == [13, 17, 20, 21]  # between two events
    assert rvs(h, 17) == [20, 21]
    assert rvs(h, 20) == [21]
    assert rvs(h, 21) == []
    assert rvs(h, 500) == []
    assert h.oldest_rv == 11


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 65])
def test_since_binary_search_agrees_with_a_linear_scan(n: int) -> None:
    h = EventHistory(clock=FakeClock())
    all_rvs = [3 * i + 5 for i in range(n)]
    for rv in all_rvs:
        h.add(event(rv, 1000.0))
    for after in range(0, all_rvs[-1] + 3):
        assert rvs(h, after) == [rv for rv in all_rvs if rv > after], after


def test_the_count_bound_evicts_the_oldest_and_moves_the_covered_horizon() -> None:
    h = EventHistory(max_events=3, clock=FakeClock())
    h.reset(1)
    for rv in (2, 3, 4):
        h.add(event(rv, 1000.0))
    assert len(h) == 3 and h.evicted == 0
    assert h.covers(1)
    h.add(event(5, 1000.0))
    assert len(h) == 3 and h.evicted == 1
    assert rvs(h, 0) == [3, 4, 5]
    # Every event after 2 is still here; the one at 2 is gone, so 1 can no longer be rebuilt.
    assert h.covers(2)
    assert not h.covers(1)
    h.add(event(6, 1000.0))
    h.add(event(7, 1000.0))
    assert rvs(h, 0) == [5, 6, 7]
    assert h.evicted == 3
    assert h.covers(4) and not h.covers(3)


def test_the_time_window_evicts_events_older_than_the_window_on_add() -> None:
    clock = FakeClock(1000.0)
    h = EventHistory(window=75.0, clock=clock)
    h.reset(1)
    h.add(event(2, 1000.0))
    h.add(event(3, 1030.0))
    h.add(event(4, 1075.0))  # the event at 1000 is exactly 75 s old: kept
    assert rvs(h, 0) == [2, 3, 4]
    h.add(event(5, 1075.5))  # now it is older than the window
    assert rvs(h, 0) == [3, 4, 5]
    assert h.covers(2) and not h.covers(1)


def test_expire_shrinks_an_idle_history_by_the_clock() -> None:
    clock = FakeClock(1000.0)
    h = EventHistory(window=10.0, clock=clock)
    h.reset(1)
    h.add(event(2, 1000.0))
    h.add(event(3, 1005.0))
    clock.now = 1009.0
    h.expire()
    assert rvs(h, 0) == [2, 3]
    clock.now = 1012.0
    h.expire()
    assert rvs(h, 0) == [3]
    assert h.covers(2) and not h.covers(1)
    clock.now = 2000.0
    h.expire()
    assert len(h) == 0
    assert h.evicted == 2
    # Everything after the last evicted event is (trivially) still here.
    assert h.covers(3) and not h.covers(2)


def test_reset_forgets_events_and_starts_covering_from_the_relist() -> None:
    h = EventHistory(max_events=2, clock=FakeClock())
    h.reset(1)
    for rv in (2, 3, 4):
        h.add(event(rv, 1000.0))
    h.reset(50)
    assert len(h) == 0
    assert rvs(h, 0) == []
    assert h.covers(50) and not h.covers(49)
    h.add(event(51, 1000.0, ADDED))
    h.add(event(52, 1000.0, DELETED))
    assert [(e.type, e.rv) for e in h.since(50)] == [(ADDED, 51), (DELETED, 52)]
