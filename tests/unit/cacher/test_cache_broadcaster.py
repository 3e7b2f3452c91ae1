"""Broadcaster: fan-out, selector transitions, coalescing, slow watchers, bookmarks, relists.

Pure logic: the sinks and frames are fakes (the end-to-end behaviour against the apiserver is in
tests/e2e/test_watchcache_watch*.py and test_watchcache_outage.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kproxy.cacher import ADDED, DELETED, MODIFIED, CachedObject, Kind, WatchCache
from kproxy.cacher.broadcaster import Broadcaster, NoCounters, Selection
from kproxy.cacher.time_budget import TimeBudget
from kproxy.testing.clock import FakeClock, loop_follows

POD = Kind("v1", "Pod", "PodList", protobuf=False)


def obj(key: str, rv: int, **labels: str) -> CachedObject:
    namespace, _, name = key.rpartition("/")
    body = b'{"metadata":{"name":"' + name.encode() + b'","resourceVersion":"' + str(rv).encode() + b'"}}'
    return CachedObject(key, namespace, name, rv, labels, {"metadata.name": name}, json=body)


class Frames:
    """Frames that say what they are: ``TYPE key rv;``."""

    def __init__(self) -> None:
        self.encoded = 0

    def event(self, type_: str, o: CachedObject, media_type: str) -> bytes:
        self.encoded += 1
        return f"{type_} {o.key} {o.rv};".encode()

    def bookmark(self, rv: int, media_type: str, *, initial_events_end: bool = False) -> bytes:
        return f"BOOKMARK {rv}{' end' if initial_events_end else ''};".encode()

    def error(self, status: dict[str, Any], media_type: str) -> bytes:
        return f"ERROR {status['code']} {status['reason']};".encode()


class Sink:
    def __init__(self, *, writable: bool = True) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self._writable = writable
        self.resumed = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def writable(self) -> bool:
        return self._writable

    async def drain(self) -> None:
        await self.resumed.wait()

    def closing(self) -> bool:
        return False

    def close(self) -> None:
        self.closed = True

    def resume(self) -> None:
        self._writable = True
        self.resumed.set()

    @property
    def events(self) -> list[str]:
        return [e for e in b"".join(self.writes).decode().split(";") if e]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def labelled(value: str) -> Selection:
    def pred(o: CachedObject) -> bool:
        return o.labels.get("app") == value

    return Selection("", pred, ("", f"app={value}", ""))


@pytest.fixture
def cache() -> WatchCache:
    c = WatchCache(POD)
    c.replace([obj("ns/a", 3, app="x"), obj("other/b", 4, app="y")], 10)
    return c


async def test_initial_events_then_the_end_bookmark_then_live_events(cache: WatchCache) -> None:
    bc = Broadcaster(cache, Frames())
    sink = Sink()
    bc.watch_initial(sink, Selection(), "json", bookmarks=True, initial_events_end=True, timeout=60)
    cache.apply(MODIFIED, obj("ns/a", 11, app="x"))  # before the initial events are out: queued
    await settle()
    assert sink.events == ["ADDED ns/a 3", "ADDED other/b 4", "BOOKMARK 10 end", "MODIFIED ns/a 11"]


async def test_one_encoding_per_event_and_one_write_per_watcher_per_loop_pass(cache: WatchCache) -> None:
    frames = Frames()
    bc = Broadcaster(cache, frames)
    sinks = [Sink() for _ in range(50)]
    for s in sinks:
        bc.watch_since(s, Selection(), "json", bookmarks=False, timeout=60, rv=10)
    cache.apply(MODIFIED, obj("ns/a", 11))
    cache.apply(MODIFIED, obj("ns/a", 12))
    cache.apply(ADDED, obj("ns/c", 13))
    await settle()
    assert frames.encoded == 3
    for s in sinks:
        assert s.writes == [b"MODIFIED ns/a 11;MODIFIED ns/a 12;ADDED ns/c 13;"]


async def test_selector_transitions_per_watcher(cache: WatchCache) -> None:
    bc = Broadcaster(cache, Frames())
    x, y, every = Sink(), Sink(), Sink()
    bc.watch_since(x, labelled("x"), "json", bookmarks=False, timeout=60, rv=10)
    bc.watch_since(y, labelled("y"), "json", bookmarks=False, timeout=60, rv=10)
    bc.watch_since(every, Selection(), "json", bookmarks=False, timeout=60, rv=10)
    cache.apply(MODIFIED, obj("ns/a", 11, app="y"))  # leaves x, joins y
    cache.apply(MODIFIED, obj("ns/a", 12, app="y"))
    cache.apply(DELETED, obj("ns/a", 13, app="y"))
    await settle()
    # Leaving: DELETED with the last matching content at the event's resource version.
    assert x.events == ["DELETED ns/a 11"]
    assert y.events == ["ADDED ns/a 11", "MODIFIED ns/a 12", "DELETED ns/a 13"]
    assert every.events == ["MODIFIED ns/a 11", "MODIFIED ns/a 12", "DELETED ns/a 13"]


async def test_namespace_selection(cache: WatchCache) -> None:
    bc = Broadcaster(cache, Frames())
    ns = Sink()
    bc.watch_initial(
        ns, Selection("ns", None, ("ns", "", "")), "json", bookmarks=False, initial_events_end=False, timeout=60
    )
    cache.apply(MODIFIED, obj("other/b", 11))
    cache.apply(MODIFIED, obj("ns/a", 12))
    await settle()
    assert ns.events == ["ADDED ns/a 3", "MODIFIED ns/a 12"]


async def test_resume_from_the_history_with_transitions(cache: WatchCache) -> None:
    bc = Broadcaster(cache, Frames())
    cache.apply(MODIFIED, obj("ns/a", 11, app="y"))
    cache.apply(ADDED, obj("ns/c", 12, app="x"))
    late = Sink()
    bc.watch_since(late, labelled("x"), "json", bookmarks=False, timeout=60, rv=10)
    await settle()
    assert late.events == ["DELETED ns/a 11", "ADDED ns/c 12"]


async def test_a_watch_from_a_future_resource_version_waits_for_events_after_it(cache: WatchCache) -> None:
    bc = Broadcaster(cache, Frames())
    sink = Sink()
    bc.watch_since(sink, Selection(), "json", bookmarks=False, timeout=60, rv=12)
    cache.apply(MODIFIED, obj("ns/a", 11))
    cache.apply(MODIFIED, obj("ns/a", 12))
    cache.apply(MODIFIED, obj("ns/a", 13))
    await settle()
    assert sink.events == ["MODIFIED ns/a 13"]


async def test_a_relist_sends_the_differences_to_open_watches(cache: WatchCache) -> None:
    bc = Broadcaster(cache, Frames())
    sink = Sink()
    bc.watch_since(sink, Selection(), "json", bookmarks=False, timeout=60, rv=10)
    cache.replace([obj("ns/a", 20), obj("ns/new", 25), obj("ns/new2", 26)], 30)
    await settle()
    assert sink.events == ["DELETED other/b 11", "MODIFIED ns/a 20", "ADDED ns/new 25", "ADDED ns/new2 26"]
    assert not sink.closed


async def test_a_slow_watcher_is_closed_after_the_budget_and_the_others_go_on(cache: WatchCache) -> None:
    closed: list[int] = []

    class Counters(NoCounters):
        def slow_closed(self) -> None:
            closed.append(1)

    async with loop_follows(FakeClock()) as clock:
        bc = Broadcaster(cache, Frames(), buffer=3, counters=Counters(), clock=clock)
        slow, fast = Sink(writable=False), Sink()
        bc.watch_since(slow, Selection(), "json", bookmarks=False, timeout=60, rv=10)
        bc.watch_since(fast, Selection(), "json", bookmarks=False, timeout=60, rv=10)
        for rv in range(11, 16):
            cache.apply(MODIFIED, obj("ns/a", rv))
            await settle()
        assert len(fast.events) == 5
        assert not slow.closed and slow.writes == []
        await clock.run_for(0.09)  # within the budget (100 ms)
        assert not slow.closed
        await clock.run_for(0.02)  # past it
        assert slow.closed and closed == [1]
        cache.apply(MODIFIED, obj("ns/a", 16))
        await settle()
        assert len(fast.events) == 6 and not fast.closed
        await bc.stop()  # the slow sink's drain never returns: no task left pending for a later test's loop


async def test_a_watcher_that_catches_up_in_time_stays(cache: WatchCache) -> None:
    async with loop_follows(FakeClock()) as clock:
        bc = Broadcaster(cache, Frames(), buffer=2, clock=clock)
        lagging = Sink(writable=False)
        bc.watch_since(lagging, Selection(), "json", bookmarks=False, timeout=60, rv=10)
        for rv in range(11, 15):
            cache.apply(MODIFIED, obj("ns/a", rv))
        await settle()
        lagging.resume()
        await settle()
        assert [e.split()[-1] for e in lagging.events] == ["11", "12", "13", "14"]
        await clock.run_for(0.15)  # past the budget it was given
        assert not lagging.closed


async def test_timeout_ends_the_watch_after_what_was_queued(cache: WatchCache) -> None:
    async with loop_follows(FakeClock()) as clock:
        bc = Broadcaster(cache, Frames(), clock=clock)
        sink = Sink()
        bc.watch_since(sink, Selection(), "json", bookmarks=False, timeout=30, rv=10)
        cache.apply(MODIFIED, obj("ns/a", 11))
        await clock.run_for(29.9)
        assert not sink.closed
        await clock.run_for(0.2)
        assert sink.closed and sink.events == ["MODIFIED ns/a 11"]
        assert len(bc) == 0


async def test_bookmarks_periodically_and_before_the_deadline(cache: WatchCache) -> None:
    clock = FakeClock(100.0)
    bc = Broadcaster(cache, Frames(), bookmark_interval=60, clock=clock)
    sink, quiet = Sink(), Sink()
    bc.watch_since(sink, Selection(), "json", bookmarks=True, timeout=90, rv=5)
    bc.watch_since(quiet, Selection(), "json", bookmarks=False, timeout=90, rv=5)
    clock.now = 130.0
    bc.tick()
    await settle()
    assert sink.events == []  # not due yet
    clock.now = 160.5
    bc.tick()
    await settle()
    assert sink.events == ["BOOKMARK 10"]
    clock.now = 188.5  # 2 s before the 90 s deadline
    bc.tick()
    await settle()
    assert sink.events == ["BOOKMARK 10", "BOOKMARK 10"] and quiet.events == []
    await bc.stop()


async def test_expiring_ends_every_watch_with_the_error_after_what_was_queued(cache: WatchCache) -> None:
    bc = Broadcaster(cache, Frames())
    live, starting = Sink(), Sink(writable=False)
    bc.watch_since(live, Selection(), "json", bookmarks=False, timeout=60, rv=10)
    bc.watch_initial(starting, Selection(), "json", bookmarks=True, initial_events_end=True, timeout=60)
    cache.apply(MODIFIED, obj("ns/a", 11, app="x"))
    bc.expire_all({"code": 410, "reason": "Expired"})
    assert live.events == ["MODIFIED ns/a 11", "ERROR 410 Expired"] and live.closed
    # still sending its initial events: ended between events, no ERROR in the middle of them
    assert starting.closed and not any(e.startswith("ERROR") for e in starting.events)
    assert len(bc) == 0


async def test_a_reset_ends_every_watch(cache: WatchCache) -> None:
    bc = Broadcaster(cache, Frames())
    sink = Sink()
    bc.watch_since(sink, Selection(), "json", bookmarks=False, timeout=60, rv=10)
    cache.unready()
    assert sink.closed and len(bc) == 0


def test_time_budget_refills_up_to_its_maximum() -> None:
    clock = FakeClock(0.0)
    budget = TimeBudget(clock)
    assert budget.take_available() == pytest.approx(0.1)
    assert budget.take_available() == 0
    clock.now = 1.0
    assert budget.take_available() == pytest.approx(0.05)
    clock.now = 10.0
    assert budget.take_available() == pytest.approx(0.1)
    budget.return_unused(0.5)
    assert budget.take_available() == pytest.approx(0.1)


async def test_compressed_watchers_get_one_member_per_write_compressed_once_per_batch(cache: WatchCache) -> None:
    import gzip

    calls: list[bytes] = []

    class Members:
        """The watch-list gzip's kind of coding: every write one complete member, never shared."""

        name, shared = "gzip", False

        def account(self, n_in: int, n_out: int, seconds: float) -> None:
            pass

        def solo(self, data: bytes) -> bytes:
            calls.append(data)
            return gzip.compress(data)

        def new_frame(self) -> Any:
            raise AssertionError("never shared")

    bc = Broadcaster(cache, Frames())
    sinks = [Sink() for _ in range(3)]
    coding = Members()
    for s in sinks:
        bc.watch_initial(s, Selection(), "json", bookmarks=True, initial_events_end=True, timeout=60, coding=coding)
    await settle()
    cache.apply(MODIFIED, obj("ns/a", 11))
    cache.apply(MODIFIED, obj("ns/a", 12))
    await settle()
    for s in sinks:
        # Initial events, the end bookmark, then the two live events in one member.
        members = [gzip.decompress(w) for w in s.writes]
        assert b"".join(members).decode().split(";")[:-1] == [
            "ADDED ns/a 3",
            "ADDED other/b 4",
            "BOOKMARK 10 end",
            "MODIFIED ns/a 11",
            "MODIFIED ns/a 12",
        ]
        assert members[-1] == b"MODIFIED ns/a 11;MODIFIED ns/a 12;"
    assert calls.count(b"MODIFIED ns/a 11;MODIFIED ns/a 12;") == 1


class FramesFailingOn(Frames):
    """Frames that cannot encode one object (as an encoder that fails on it would)."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    def event(self, type_: str, o: CachedObject, media_type: str) -> bytes:
        if o.key == self.key and media_type == "json":
            raise TypeError("cannot encode")
        return super().event(type_, o, media_type)


async def test_an_event_that_cannot_be_encoded_ends_only_the_watches_that_get_it(cache: WatchCache) -> None:
    """As the apiserver's watch handler: what the watcher got before, then the end of its stream;
    watchers that do not get the event, or get it in another format, go on."""
    bc = Broadcaster(cache, FramesFailingOn("ns/bad"))
    gets_it, other_ns, other_format = Sink(), Sink(), Sink()
    bc.watch_since(gets_it, Selection(), "json", bookmarks=False, timeout=60, rv=10)
    bc.watch_since(other_ns, Selection("other", None, ("other", "", "")), "json", bookmarks=False, timeout=60, rv=10)
    bc.watch_since(other_format, Selection(), "protobuf", bookmarks=False, timeout=60, rv=10)
    cache.apply(MODIFIED, obj("other/b", 11))
    cache.apply(ADDED, obj("ns/bad", 12))
    cache.apply(MODIFIED, obj("other/b", 13))
    await settle()
    assert gets_it.events == ["MODIFIED other/b 11"] and gets_it.closed
    assert other_ns.events == ["MODIFIED other/b 11", "MODIFIED other/b 13"] and not other_ns.closed
    assert other_format.events == ["MODIFIED other/b 11", "ADDED ns/bad 12", "MODIFIED other/b 13"]
    assert not other_format.closed
    # A watch that starts where the history holds the event, or with it among its initial
    # events, gets what comes before it and ends there.
    resumed, initial = Sink(), Sink()
    bc.watch_since(resumed, Selection(), "json", bookmarks=False, timeout=60, rv=10)
    bc.watch_initial(initial, Selection(), "json", bookmarks=False, initial_events_end=False, timeout=60)
    await settle()
    assert resumed.events == ["MODIFIED other/b 11"] and resumed.closed
    assert initial.closed and "ADDED ns/bad 12" not in initial.events
    assert len(bc) == 2
