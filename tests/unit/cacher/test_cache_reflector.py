"""Reflector against a scripted ListerWatcher: streaming and paged lists, live events, resuming,
relisting on Expired, backoff after errors, and progress probes.

Each ``watch`` call takes the next scripted ``Stream``; the test feeds it events, ends it, or
makes it fail, and waits until the reflector has consumed everything fed so far (``drained``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kproxy.cacher import (
    ADDED,
    BOOKMARK,
    DELETED,
    MODIFIED,
    CachedObject,
    CacheEvent,
    Expired,
    Kind,
    ListPage,
    NotResumed,
    Reflector,
    StreamingListUnsupported,
    UpstreamEvent,
    WatchCache,
)
from kproxy.testing.eventually import eventually_async

POD = Kind("v1", "Pod", "PodList", protobuf=True)
END = object()
_real_sleep = asyncio.sleep


def obj(key: str, rv: int) -> CachedObject:
    namespace, _, name = key.rpartition("/")
    return CachedObject(key, namespace, name, rv, {}, {}, json=b"{}")


def ev(type_: str, key: str, rv: int) -> UpstreamEvent:
    return UpstreamEvent(type_, rv, obj(key, rv))


def bookmark(rv: int, end: bool = False) -> UpstreamEvent:
    return UpstreamEvent(BOOKMARK, rv, None, end)


class Stream:
    """One scripted watch: items are UpstreamEvents, exceptions (raised) or END."""

    def __init__(self, *items: object) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.idle = asyncio.Event()
        self.closed = asyncio.Event()
        self.send(*items)

    def send(self, *items: object) -> None:
        for item in items:
            self.idle.clear()
            self.queue.put_nowait(item)

    async def drained(self) -> None:
        """Everything sent so far has been handed to the reflector and processed by it (the
        generator is only resumed for the next item once the previous one is dealt with)."""
        await asyncio.wait_for(self.idle.wait(), 5)


class FakeLW:
    def __init__(self) -> None:
        self.streams: asyncio.Queue[Stream] = asyncio.Queue()
        self.watch_calls: list[tuple[str, bool]] = []
        self.pages: asyncio.Queue[ListPage | BaseException] = asyncio.Queue()
        self.list_calls: list[tuple[int, str]] = []
        self.progress_calls = 0
        self.progress_answers: asyncio.Queue[int | BaseException] = asyncio.Queue()
        self.progress_cancelled = 0
        self.current = 0

    def stream(self, *items: object) -> Stream:
        s = Stream(*items)
        self.streams.put_nowait(s)
        return s

    async def list(self, *, limit: int, continue_token: str) -> ListPage:
        self.list_calls.append((limit, continue_token))
        page = await self.pages.get()
        if isinstance(page, BaseException):
            raise page
        return page

    async def watch(self, *, resource_version: str, send_initial_events: bool) -> AsyncIterator[UpstreamEvent]:
        self.watch_calls.append((resource_version, send_initial_events))
        stream = await self.streams.get()
        try:
            while True:
                if stream.queue.empty():
                    stream.idle.set()
                item = await stream.queue.get()
                if item is END:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, UpstreamEvent)
                yield item
        finally:
            stream.idle.set()
            stream.closed.set()

    async def current_rv(self) -> int:
        return self.current

    async def progress_rv(self) -> int:
        self.progress_calls += 1
        try:
            answer = await self.progress_answers.get()
        except asyncio.CancelledError:
            self.progress_cancelled += 1
            raise
        if isinstance(answer, BaseException):
            raise answer
        return answer


class Harness:
    def __init__(self, **kwargs: Any) -> None:
        self.lw = FakeLW()
        self.cache = WatchCache(POD)
        self.relists: list[str] = []
        self.upstream: list[int] = []
        self.events: list[CacheEvent] = []
        self.cache.add_listener(self.events.extend)
        kwargs.setdefault("backoff", (0.001, 0.004))
        self.reflector = Reflector(
            "pods",
            self.lw,
            self.cache,
            on_relist=self.relists.append,
            on_upstream_rv=self.upstream.append,
            **kwargs,
        )

    def state(self) -> dict[str, int]:
        return {k: o.rv for k, o in self.cache.store.items()}

    async def listed(self, *objects: tuple[str, int], rv: int) -> Stream:
        """Run a streaming list of ``objects`` at ``rv`` and wait until the cache has it."""
        s = self.lw.stream(*(ev(ADDED, k, r) for k, r in objects), bookmark(rv, end=True))
        await s.drained()
        assert self.cache.ready and self.cache.rv >= rv
        return s


@contextlib.asynccontextmanager
async def running(**kwargs: Any) -> AsyncIterator[Harness]:
    h = Harness(**kwargs)
    h.reflector.start()
    try:
        yield h
    finally:
        await h.reflector.stop()
        assert not h.reflector.running


# -- listing -----------------------------------------------------------------------------------------
async def test_a_streaming_list_fills_the_cache_at_its_end_bookmark() -> None:
    async with running() as h:
        s = h.lw.stream(ev(ADDED, "ns/a", 3), ev(ADDED, "ns/b", 5), bookmark(7))  # a periodic bookmark
        await s.drained()
        assert h.lw.watch_calls == [("", True)]
        assert not h.cache.ready and len(h.cache) == 0
        s.send(ev(ADDED, "other/c", 6), bookmark(9, end=True))
        await s.drained()
        assert h.cache.ready and h.cache.rv == 9
        assert h.state() == {"ns/a": 3, "ns/b": 5, "other/c": 6}
        assert h.events == [] and h.relists == []
        assert h.upstream == [9]
        assert h.reflector.upstream_rv == 9


async def test_live_events_on_the_same_stream_follow_the_list() -> None:
    async with running() as h:
        s = await h.listed(("ns/a", 3), rv=10)
        s.send(ev(ADDED, "ns/b", 11), ev(MODIFIED, "ns/a", 12), bookmark(15), ev(DELETED, "ns/b", 16))
        await s.drained()
        assert h.state() == {"ns/a": 12}
        assert h.cache.rv == 16
        assert [(e.type, e.rv) for e in h.events] == [(ADDED, 11), (MODIFIED, 12), (DELETED, 16)]
        assert [e.rv for e in h.cache.history.since(0)] == [11, 12, 16]
        assert h.reflector.upstream_rv == 16
        assert h.upstream == [10, 11, 12, 15, 16]
        assert h.lw.watch_calls == [("", True)]


async def test_a_streaming_list_cut_short_is_retried_from_scratch() -> None:
    async with running() as h:
        h.lw.stream(ev(ADDED, "ns/a", 3), END)
        s = h.lw.stream(ev(ADDED, "ns/a", 3), ev(ADDED, "ns/b", 4), bookmark(8, end=True))
        await s.drained()
        assert h.lw.watch_calls == [("", True), ("", True)]
        assert h.state() == {"ns/a": 3, "ns/b": 4} and h.cache.rv == 8
        assert "initial events" in h.reflector.last_error
        assert h.relists == []


# -- resuming ------------------------------------------------------------------------------------------
async def test_a_watch_that_ends_is_resumed_from_the_caches_resource_version() -> None:
    async with running() as h:
        s = await h.listed(("ns/a", 3), rv=10)
        s.send(ev(MODIFIED, "ns/a", 12), bookmark(14), END)
        s2 = h.lw.stream(ev(ADDED, "ns/b", 15))
        await s2.drained()
        assert h.lw.watch_calls == [("", True), ("14", False)]
        assert h.state() == {"ns/a": 12, "ns/b": 15}
        s2.send(END)
        s3 = h.lw.stream(ev(MODIFIED, "ns/b", 15), ev(MODIFIED, "ns/b", 20))  # a repeat, then news
        await s3.drained()
        assert h.lw.watch_calls[-1] == ("15", False)
        assert [(e.type, e.rv) for e in h.events] == [(MODIFIED, 12), (ADDED, 15), (MODIFIED, 20)]
        assert h.relists == [] and h.reflector.last_error == ""


async def test_a_watch_that_breaks_after_the_streaming_list_is_resumed_not_relisted() -> None:
    async with running() as h:
        s = await h.listed(("ns/a", 3), rv=10)
        s.send(ev(ADDED, "ns/b", 11), ConnectionResetError("upstream went away"))
        s2 = h.lw.stream(ev(ADDED, "ns/c", 12))
        await s2.drained()
        assert h.lw.watch_calls == [("", True), ("11", False)]
        assert h.relists == [] and h.cache.relists == 0
        assert h.state() == {"ns/a": 3, "ns/b": 11, "ns/c": 12}
        assert "ConnectionResetError" in h.reflector.last_error


# -- Expired ---------------------------------------------------------------------------------------------
async def test_expired_lists_again_and_brings_the_cache_to_the_new_state_by_difference() -> None:
    async with running() as h:
        s = await h.listed(("ns/keep", 3), ("ns/change", 4), ("ns/gone", 5), rv=10)
        s.send(END)
        h.lw.stream(Expired("too old resource version: 10 (50)"))
        relist = h.lw.stream(ev(ADDED, "ns/keep", 3), ev(ADDED, "ns/change", 60), ev(ADDED, "ns/new", 61))
        await relist.drained()
        assert h.cache.rv == 10  # nothing applied before the end of the initial events
        relist.send(bookmark(70, end=True))
        await relist.drained()
        assert h.lw.watch_calls == [("", True), ("10", False), ("", True)]
        assert h.relists == ["expired"] and h.cache.relists == 1
        assert h.state() == {"ns/keep": 3, "ns/change": 60, "ns/new": 61}
        assert h.cache.rv == 70
        assert sorted((e.type, e.obj.key) for e in h.events) == [
            (ADDED, "ns/new"),
            (DELETED, "ns/gone"),
            (MODIFIED, "ns/change"),
        ]
        # The relist's stream goes on with live events.
        relist.send(ev(MODIFIED, "ns/new", 71))
        await relist.drained()
        assert h.state()["ns/new"] == 71


async def test_what_is_known_of_compaction_is_forgotten_when_the_upstream_goes_back_in_time() -> None:
    async with running() as h:
        s = await h.listed(("ns/a", 3), rv=50)
        h.reflector.compaction.saw_expired(40)
        assert h.reflector.compaction.known(30) is True
        s.send(END)
        h.lw.stream(Expired("too old resource version: 50 (60)"))
        relist = h.lw.stream(ev(ADDED, "ns/a", 70), bookmark(80, end=True))  # later: still true
        await relist.drained()
        assert h.reflector.compaction.known(30) is True
        relist.send(END)
        h.lw.stream(Expired("too old resource version: 80 (90)"))
        restored = h.lw.stream(ev(ADDED, "ns/a", 3), bookmark(20, end=True))  # etcd restored
        await restored.drained()
        assert h.cache.rv == 20
        assert h.reflector.compaction.known(30) is None


async def test_expired_as_an_error_on_a_live_stream_also_relists() -> None:
    async with running() as h:
        s = await h.listed(("ns/a", 3), rv=10)
        s.send(ev(MODIFIED, "ns/a", 11), Expired("The resourceVersion for the provided watch is too old."))
        relist = h.lw.stream(ev(ADDED, "ns/a", 40), bookmark(41, end=True))
        await relist.drained()
        assert h.lw.watch_calls == [("", True), ("", True)]
        assert h.relists == ["expired"]
        assert h.state() == {"ns/a": 40}


@pytest.mark.parametrize("reason", ["discarded", "ahead"])
async def test_a_state_not_resumed_is_listed_and_counted_with_its_reason(
    reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A state the watch refuses to resume (dropped, or ahead of the apiserver: the cache made
    unready first) is listed, counted as a relist with that reason, and logged as what it is,
    not as an expired resource version."""
    async with running() as h:
        s = await h.listed(("ns/a", 3), rv=10)
        h.cache.unready()
        s.send(NotResumed("the persisted state is not resumed (test); listing", reason))
        relist = h.lw.stream(ev(ADDED, "ns/b", 20), bookmark(21, end=True))
        with caplog.at_level("INFO", logger="kproxy.cache"):
            await relist.drained()
        assert h.relists == [reason]
        assert h.state() == {"ns/b": 20}
        assert "is not resumed (test)" in caplog.text and "expired upstream" not in caplog.text
        # A later expiry is counted as one.
        relist.send(Expired("gone"))
        again = h.lw.stream(ev(ADDED, "ns/b", 20), bookmark(30, end=True))
        await again.drained()
        assert h.relists == [reason, "expired"]


async def test_an_expired_before_the_first_list_is_no_relist() -> None:
    async with running() as h:
        h.lw.stream(Expired("too old"))  # (a streaming list answered 410)
        s = h.lw.stream(ev(ADDED, "ns/a", 3), bookmark(10, end=True))
        await s.drained()
        assert h.cache.ready and h.relists == []


async def test_a_relist_that_fails_on_the_way_keeps_expired_as_its_reason() -> None:
    async with running() as h:
        s = await h.listed(("ns/a", 3), rv=10)
        s.send(Expired("gone"))
        h.lw.stream(ev(ADDED, "ns/a", 3), ConnectionResetError("reset"))
        h.lw.stream(ConnectionRefusedError("refused"))
        relist = h.lw.stream(ev(ADDED, "ns/a", 50), bookmark(50, end=True))
        await relist.drained()
        assert h.lw.watch_calls == [("", True), ("", True), ("", True), ("", True)]
        assert h.relists == ["expired"]
        assert h.state() == {"ns/a": 50}
        # Served all along: the old state stayed ready while the relist was failing.
        assert h.cache.ready


# -- paged lists ------------------------------------------------------------------------------------------
async def test_without_streaming_lists_the_reflector_lists_by_pages_then_watches() -> None:
    async with running(page_size=2) as h:
        h.lw.stream(StreamingListUnsupported("sendInitialEvents is forbidden"))
        h.lw.pages.put_nowait(ListPage([obj("ns/a", 3), obj("ns/b", 4)], 20, "tok1"))
        h.lw.pages.put_nowait(ListPage([obj("ns/c", 5), obj("ns/d", 6)], 20, "tok2"))
        h.lw.pages.put_nowait(ListPage([obj("ns/e", 7)], 20, ""))
        s = h.lw.stream(ev(ADDED, "ns/f", 21))
        await s.drained()
        assert h.lw.list_calls == [(2, ""), (2, "tok1"), (2, "tok2")]
        assert h.lw.watch_calls == [("", True), ("20", False)]
        assert not h.reflector.streaming_list
        assert h.state() == {"ns/a": 3, "ns/b": 4, "ns/c": 5, "ns/d": 6, "ns/e": 7, "ns/f": 21}
        assert h.events and [e.rv for e in h.events] == [21]
        # A later Expired lists by pages again (never a streaming list).
        s.send(Expired("gone"))
        h.lw.pages.put_nowait(ListPage([obj("ns/a", 30)], 31, ""))
        s2 = h.lw.stream()
        await s2.drained()
        assert h.lw.list_calls[-1] == (2, "")
        assert h.lw.watch_calls[-1] == ("31", False)
        assert h.relists == ["expired"]
        assert h.state() == {"ns/a": 30}


async def test_a_paged_list_that_fails_midway_starts_over() -> None:
    async with running(page_size=1) as h:
        h.lw.stream(StreamingListUnsupported("no"))
        h.lw.pages.put_nowait(ListPage([obj("ns/a", 3)], 20, "tok1"))
        h.lw.pages.put_nowait(ConnectionResetError("reset"))
        h.lw.pages.put_nowait(ListPage([obj("ns/a", 3)], 25, "tokA"))
        h.lw.pages.put_nowait(ListPage([obj("ns/b", 4)], 25, ""))
        s = h.lw.stream()
        await s.drained()
        assert h.lw.list_calls == [(1, ""), (1, "tok1"), (1, ""), (1, "tokA")]
        assert h.lw.watch_calls == [("", True), ("25", False)]
        assert h.state() == {"ns/a": 3, "ns/b": 4} and h.cache.rv == 25
        assert h.relists == []


# -- backoff ------------------------------------------------------------------------------------------------
async def test_errors_back_off_exponentially_up_to_the_cap_and_a_working_stream_resets_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    delays: list[float] = []

    async def fake_sleep(delay: float, result: Any = None) -> Any:
        delays.append(delay)
        await _real_sleep(0)
        return result

    monkeypatch.setattr(random, "random", lambda: 0.0)  # the reflector's jitter
    monkeypatch.setattr(asyncio, "sleep", fake_sleep)  # the reflector's backoff wait
    async with running(backoff=(0.1, 30.0)) as h:
        s = await h.listed(("ns/a", 3), rv=10)
        s.send(ConnectionResetError("1"))
        for _ in range(10):
            h.lw.stream(ConnectionRefusedError("down"))
        # Back up: one event, then it breaks again.
        h.lw.stream(ev(ADDED, "ns/b", 11), ConnectionResetError("2"))
        last = h.lw.stream()
        await last.drained()
        assert [round(d, 6) for d in delays] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 0.1]
        assert all(rv == "10" for rv, _ in h.lw.watch_calls[1:12])
        assert h.lw.watch_calls[-1] == ("11", False)
        assert h.state() == {"ns/a": 3, "ns/b": 11}


def test_the_default_backoff_is_a_tenth_of_a_second_doubling_to_thirty() -> None:
    assert Reflector("x", FakeLW(), WatchCache(POD)).backoff == (0.1, 30.0)


# -- progress probes -------------------------------------------------------------------------------------------
async def test_progress_requests_are_coalesced_into_one_probe() -> None:
    async with running() as h:
        await h.listed(("ns/a", 3), rv=10)
        waiters = [asyncio.create_task(h.reflector.request_progress()) for _ in range(5)]
        await eventually_async(lambda: h.lw.progress_calls == 1, 5, "h.lw.progress_calls == 1", 0.001)
        for _ in range(20):  # every waiter has had its turn: still one probe
            await _real_sleep(0)
        assert h.lw.progress_calls == 1 and not any(w.done() for w in waiters)
        h.lw.progress_answers.put_nowait(25)
        await asyncio.wait_for(asyncio.gather(*waiters), 5)
        assert h.cache.rv == 25 and h.reflector.upstream_rv == 25
        # The next request is a new probe.
        h.lw.progress_answers.put_nowait(30)
        await asyncio.wait_for(h.reflector.request_progress(), 5)
        assert h.lw.progress_calls == 2 and h.cache.rv == 30


async def test_a_failed_probe_fails_every_waiter_and_the_next_request_probes_again() -> None:
    async with running() as h:
        await h.listed(("ns/a", 3), rv=10)
        waiters = [asyncio.create_task(h.reflector.request_progress()) for _ in range(3)]
        await eventually_async(lambda: h.lw.progress_calls == 1, 5, "h.lw.progress_calls == 1", 0.001)
        h.lw.progress_answers.put_nowait(ConnectionResetError("probe failed"))
        results = await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), 5)
        assert all(isinstance(r, ConnectionResetError) for r in results)
        assert h.cache.rv == 10
        h.lw.progress_answers.put_nowait(12)
        await asyncio.wait_for(h.reflector.request_progress(), 5)
        assert h.lw.progress_calls == 2 and h.cache.rv == 12


async def test_a_waiter_going_away_does_not_cancel_the_shared_probe() -> None:
    async with running() as h:
        await h.listed(("ns/a", 3), rv=10)
        first = asyncio.create_task(h.reflector.request_progress())
        second = asyncio.create_task(h.reflector.request_progress())
        await eventually_async(lambda: h.lw.progress_calls == 1, 5, "h.lw.progress_calls == 1", 0.001)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        h.lw.progress_answers.put_nowait(20)
        await asyncio.wait_for(second, 5)
        assert h.cache.rv == 20 and h.lw.progress_cancelled == 0


async def test_an_event_arriving_after_the_probe_that_covered_it_is_not_lost() -> None:
    """The probe answers on its own stream; the main watch's event at 15 can be read after the
    probe moved the cache to 20. It must still be applied, and a resumed watch must start from
    what the main stream delivered, not from the probe's resource version."""
    async with running() as h:
        s = await h.listed(("ns/a", 3), rv=10)
        h.lw.progress_answers.put_nowait(20)
        await asyncio.wait_for(h.reflector.request_progress(), 5)
        assert h.cache.rv == 20
        s.send(ev(ADDED, "ns/late", 15), END)
        s2 = h.lw.stream(ev(MODIFIED, "ns/late", 18), ev(MODIFIED, "ns/late", 22))
        await s2.drained()
        assert h.lw.watch_calls == [("", True), ("15", False)]
        assert h.state() == {"ns/a": 3, "ns/late": 22}
        assert [e.rv for e in h.events] == [15, 18, 22]
        assert h.cache.rv == 22
        # 15 and 18 came after the probe's wait: counted, and later probes wait longer (bounded).
        assert h.cache.late_events == 2
        assert 0.01 < h.reflector.probe_wait() <= 0.25


async def test_no_probe_while_the_watch_is_down() -> None:
    """Between a broken watch and its retry nothing carries events to the cache: a probe's
    answer would move the cache's resource version past events it never got."""
    async with running(backoff=(30.0, 30.0)) as h:
        s = await h.listed(("ns/a", 3), rv=10)
        assert h.reflector.live
        s.send(ConnectionResetError("reset"))
        await s.closed.wait()
        await eventually_async(lambda: not h.reflector.live, 5, "not h.reflector.live", 0.001)
        with pytest.raises(ConnectionError, match="not running"):
            await asyncio.wait_for(h.reflector.request_progress(), 5)
        assert h.lw.progress_calls == 0 and h.cache.rv == 10


async def test_no_probe_while_relisting() -> None:
    async with running() as h:
        s = await h.listed(("ns/a", 3), rv=10)
        s.send(Expired("gone"))
        relist = h.lw.stream(ev(ADDED, "ns/a", 3))
        await relist.drained()
        assert not h.reflector.live and h.cache.ready
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(h.reflector.request_progress(), 5)
        assert h.cache.rv == 10
        relist.send(bookmark(50, end=True))
        await relist.drained()
        assert h.reflector.live
        h.lw.progress_answers.put_nowait(55)
        await asyncio.wait_for(h.reflector.request_progress(), 5)
        assert h.cache.rv == 55


async def test_a_probe_answer_is_not_used_when_the_watch_restarted_meanwhile() -> None:
    async with running() as h:
        s = await h.listed(("ns/a", 3), rv=10)
        waiter = asyncio.create_task(h.reflector.request_progress())
        await eventually_async(lambda: h.lw.progress_calls == 1, 5, "h.lw.progress_calls == 1", 0.001)
        s.send(END)
        s2 = h.lw.stream()
        await s2.drained()
        assert h.reflector.live
        h.lw.progress_answers.put_nowait(30)
        with pytest.raises(ConnectionError, match="restarted"):
            await asyncio.wait_for(waiter, 5)
        assert h.cache.rv == 10
        assert h.reflector.upstream_rv == 30  # what the upstream said is still known


async def test_stop_cancels_a_probe_in_flight() -> None:
    h = Harness()
    h.reflector.start()
    await h.listed(("ns/a", 3), rv=10)
    waiter = asyncio.create_task(h.reflector.request_progress())
    await eventually_async(lambda: h.lw.progress_calls == 1, 5, "h.lw.progress_calls == 1", 0.001)
    await h.reflector.stop()
    assert not h.reflector.running
    assert h.lw.progress_cancelled == 1
    with pytest.raises((asyncio.CancelledError, RuntimeError)):
        await asyncio.wait_for(waiter, 5)
    assert h.cache.rv == 10


async def test_current_rv_asks_the_upstream_and_reports_it_once_it_is_news() -> None:
    h = Harness()
    h.lw.current = 40
    assert await h.reflector.current_rv() == 40
    h.lw.current = 35
    assert await h.reflector.current_rv() == 35
    assert h.upstream == [40] and h.reflector.upstream_rv == 40


async def test_start_twice_runs_one_loop_and_stop_twice_is_harmless() -> None:
    h = Harness()
    h.reflector.start()
    task = h.reflector._task
    h.reflector.start()
    assert h.reflector._task is task
    await eventually_async(lambda: len(h.lw.watch_calls) == 1, 5, "len(h.lw.watch_calls) == 1", 0.001)
    await h.reflector.stop()
    await h.reflector.stop()
    assert len(h.lw.watch_calls) == 1 and task is not None and task.cancelled()


async def test_a_consistent_read_never_joins_a_probe_sent_before_it() -> None:
    async with running() as h:
        await h.listed(("ns/a", 3), rv=10)
        first = asyncio.create_task(h.reflector.consistent_rv())
        await eventually_async(lambda: h.lw.progress_calls == 1, 5, "h.lw.progress_calls == 1", 0.001)
        # Arriving while that probe is in flight: it may have read the upstream before them.
        later = [asyncio.create_task(h.reflector.consistent_rv()) for _ in range(5)]
        for _ in range(20):
            await _real_sleep(0)
        assert h.lw.progress_calls == 1 and not any(w.done() for w in later)
        h.lw.progress_answers.put_nowait(25)
        assert await asyncio.wait_for(first, 5) == 25
        # ...they share the next one, sent once the first ended.
        await eventually_async(lambda: h.lw.progress_calls == 2, 5, "h.lw.progress_calls == 2", 0.001)
        assert not any(w.done() for w in later)
        h.lw.progress_answers.put_nowait(31)
        assert await asyncio.wait_for(asyncio.gather(*later), 5) == [31] * 5
        assert h.lw.progress_calls == 2 and h.cache.rv == 31


async def test_a_consistent_read_arriving_during_a_request_progress_waits_for_the_next_probe() -> None:
    async with running() as h:
        await h.listed(("ns/a", 3), rv=10)
        asked = asyncio.create_task(h.reflector.request_progress())
        await eventually_async(lambda: h.lw.progress_calls == 1, 5, "h.lw.progress_calls == 1", 0.001)
        reader = asyncio.create_task(h.reflector.consistent_rv())
        h.lw.progress_answers.put_nowait(20)
        await asyncio.wait_for(asked, 5)
        await eventually_async(lambda: h.lw.progress_calls == 2, 5, "h.lw.progress_calls == 2", 0.001)
        h.lw.progress_answers.put_nowait(22)
        assert await asyncio.wait_for(reader, 5) == 22


async def test_a_consistent_probe_answer_vouches_for_continue_tokens_at_it() -> None:
    async with running() as h:
        await h.listed(("ns/a", 3), rv=10)
        reader = asyncio.create_task(h.reflector.consistent_rv())
        await eventually_async(lambda: h.lw.progress_calls == 1, 5, "h.lw.progress_calls == 1", 0.001)
        h.lw.progress_answers.put_nowait(25)
        assert await asyncio.wait_for(reader, 5) == 25
        assert h.reflector.compaction.known(25) is False  # served upstream: no probe of its own
        assert h.reflector.compaction.known(24) is None


async def test_stop_fails_the_readers_waiting_for_the_next_probe() -> None:
    h = Harness()
    h.reflector.start()
    await h.listed(("ns/a", 3), rv=10)
    first = asyncio.create_task(h.reflector.consistent_rv())
    await eventually_async(lambda: h.lw.progress_calls == 1, 5, "h.lw.progress_calls == 1", 0.001)
    later = asyncio.create_task(h.reflector.consistent_rv())
    await _real_sleep(0)
    await h.reflector.stop()
    for waiter in (first, later):
        with pytest.raises((asyncio.CancelledError, RuntimeError, ConnectionError)):
            await asyncio.wait_for(waiter, 5)
    assert h.lw.progress_calls == 1
