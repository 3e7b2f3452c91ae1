"""WatchCache: the store, its history, its resource version, waiting for one, and snapshots.

Pure logic (no apiserver): objects are CachedObjects made here, the clock is injected.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from kproxy.cacher import ADDED, DELETED, MODIFIED, CachedObject, CacheEvent, Kind, Snapshot, WatchCache
from kproxy.testing.clock import FakeClock

POD = Kind("v1", "Pod", "PodList", protobuf=True)


def obj(key: str, rv: int, **labels: str) -> CachedObject:
    namespace, _, name = key.rpartition("/")
    body = b'{"metadata":{"name":"' + name.encode() + b'","resourceVersion":"' + str(rv).encode() + b'"}}'
    return CachedObject(key, namespace, name, rv, labels, {"metadata.name": name}, json=body)


def state(snap: Snapshot | None) -> dict[str, int]:
    assert snap is not None
    return {o.key: o.rv for o in snap.objects}


def listed(cache: WatchCache) -> list[CacheEvent]:
    seen: list[CacheEvent] = []
    cache.add_listener(seen.extend)
    return seen


# -- replace ------------------------------------------------------------------------------------
def test_the_first_list_fills_the_cache_without_events() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    seen = listed(cache)
    assert not cache.ready and cache.rv == 0
    events = cache.replace([obj("b/x", 5), obj("a/y", 7)], 10)
    assert events == [] and seen == []
    assert cache.ready and cache.rv == 10 and cache.applied_rv == 10
    assert len(cache) == 2 and cache.relists == 0
    assert cache.get("a/y") is not None and cache.get("a/z") is None
    snap = cache.snapshot()
    assert snap is not None and snap.rv == 10
    assert snap.keys == ("a/y", "b/x")  # key order, whatever order the list came in
    assert cache.history.covers(10) and not cache.history.covers(9)


def test_a_relist_diffs_old_and_new_state_into_events() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/keep", 3), obj("ns/change", 4), obj("ns/gone", 5)], 10)
    cache.apply(MODIFIED, obj("ns/keep", 11))
    seen = listed(cache)
    new_change = obj("ns/change", 30)
    events = cache.replace([obj("ns/keep", 11), new_change, obj("ns/new", 35)], 40)
    # Deletions first, at the first version after what was delivered (11); then by resource version.
    assert [(e.type, e.obj.key, e.rv) for e in events] == [
        (DELETED, "ns/gone", 12),
        (MODIFIED, "ns/change", 30),
        (ADDED, "ns/new", 35),
    ]
    by_key = {e.obj.key: e for e in events}
    assert by_key["ns/change"].obj is new_change and by_key["ns/change"].prev is not None
    assert by_key["ns/change"].prev.rv == 4
    gone = by_key["ns/gone"]
    assert gone.prev is not None and gone.prev.rv == 5
    # The DELETED object is the last state at the deletion's resource version, as the apiserver sends it.
    assert gone.obj.rv == 12 and b'"resourceVersion":"12"' in gone.obj.item_json
    assert by_key["ns/new"].prev is None
    assert seen == events
    assert cache.relists == 1
    assert cache.rv == 40 and cache.applied_rv == 40
    assert state(cache.snapshot()) == {"ns/change": 30, "ns/keep": 11, "ns/new": 35}
    # The history goes on through the relist: a watcher resuming from any version before it gets
    # the differences, and snapshots before the relist can still be rebuilt.
    assert [e.rv for e in cache.history.since(10)] == [11, 12, 30, 35]
    assert state(cache.snapshot(11)) == {"ns/keep": 11, "ns/change": 4, "ns/gone": 5}
    assert state(cache.snapshot(40)) == state(cache.snapshot())


def test_a_relist_that_goes_back_in_time_starts_the_history_again() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 30)], 50)
    resets: list[int] = []
    cache.add_reset_listener(lambda: resets.append(cache.rv))
    assert cache.replace([obj("ns/a", 3)], 20) == []
    assert len(cache.history) == 0 and not cache.history.covers(19)
    assert resets == [20] and cache.rv == 20


def test_a_relist_with_nothing_changed_gives_no_events() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3)], 10)
    seen = listed(cache)
    assert cache.replace([obj("ns/a", 3)], 20) == []
    assert seen == []
    assert cache.relists == 1 and cache.rv == 20


# -- apply ---------------------------------------------------------------------------------------
def test_apply_keeps_the_store_history_and_resource_version_in_step() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3)], 10)
    seen = listed(cache)
    e1 = cache.apply(ADDED, obj("ns/b", 11))
    e2 = cache.apply(MODIFIED, obj("ns/a", 12))
    e3 = cache.apply(DELETED, obj("ns/b", 13))
    assert e1 is not None and (e1.type, e1.rv, e1.prev) == (ADDED, 11, None)
    assert e2 is not None and e2.type == MODIFIED and e2.prev is not None and e2.prev.rv == 3
    assert e3 is not None and e3.type == DELETED and e3.prev is not None and e3.prev.rv == 11
    assert seen == [e1, e2, e3]
    assert [e.rv for e in cache.history.since(10)] == [11, 12, 13]
    assert cache.rv == 13
    assert state(cache.snapshot()) == {"ns/a": 12}


def test_events_at_or_below_the_cache_resource_version_are_repeats_and_ignored() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3)], 10)
    assert cache.apply(MODIFIED, obj("ns/a", 10)) is None
    assert cache.apply(ADDED, obj("ns/z", 7)) is None
    assert cache.apply(MODIFIED, obj("ns/a", 12)) is not None
    assert cache.apply(MODIFIED, obj("ns/a", 12)) is None
    assert cache.apply(DELETED, obj("ns/a", 11)) is None
    assert state(cache.snapshot()) == {"ns/a": 12}
    assert len(cache.history) == 1 and cache.rv == 12


def test_added_of_an_existing_key_is_a_modification_and_modified_of_a_new_key_an_addition() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3)], 10)
    again = cache.apply(ADDED, obj("ns/a", 11))
    fresh = cache.apply(MODIFIED, obj("ns/b", 12))
    assert again is not None and again.type == MODIFIED and again.prev is not None
    assert fresh is not None and fresh.type == ADDED and fresh.prev is None
    # Undoing them restores the list state exactly.
    assert state(cache.snapshot(10)) == {"ns/a": 3}


def test_deleting_an_unknown_key_only_moves_the_resource_version() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3)], 10)
    seen = listed(cache)
    assert cache.apply(DELETED, obj("ns/never", 15)) is None
    assert seen == [] and len(cache.history) == 0
    assert cache.rv == 15 and cache.applied_rv == 15
    assert state(cache.snapshot()) == {"ns/a": 3}
    snap = cache.snapshot()
    assert snap is not None and snap.rv == 15


# -- progress ---------------------------------------------------------------------------------------
def test_progress_moves_the_resource_version_only_forwards() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3)], 10)
    before = cache.snapshot()
    cache.bodies[("json",)] = b"items"
    generation = cache.generation
    cache.progress(20)
    assert cache.rv == 20 and cache.applied_rv == 20
    # Only the resource version moved: what was encoded from the objects stays good.
    assert cache.bodies == {("json",): b"items"} and cache.generation == generation
    after = cache.snapshot()
    assert before is not None and after is not None
    assert after.rv == 20 and after.objects == before.objects
    cache.progress(15)
    assert cache.rv == 20 and cache.bodies == {("json",): b"items"}
    # Events the bookmark covered are repeats.
    assert cache.apply(ADDED, obj("ns/b", 18)) is None


def test_out_of_order_progress_does_not_swallow_events_still_in_flight() -> None:
    """A progress probe answers on another stream than the main watch: an event it covers can
    still arrive afterwards and must be applied, not taken for a repeat."""
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3)], 10)
    cache.progress(20, in_order=False)
    assert cache.rv == 20 and cache.applied_rv == 10
    late = cache.apply(ADDED, obj("ns/late", 15))
    assert late is not None and late.rv == 15
    assert cache.rv == 20
    assert state(cache.snapshot()) == {"ns/a": 3, "ns/late": 15}
    assert state(cache.snapshot(12)) == {"ns/a": 3}
    # The main watch's own repeat of it is still ignored.
    assert cache.apply(ADDED, obj("ns/late", 15)) is None
    cache.progress(25)
    assert cache.applied_rv == 25
    assert cache.apply(MODIFIED, obj("ns/a", 22)) is None


# -- bodies ---------------------------------------------------------------------------------------------
def test_cached_list_bodies_are_dropped_on_every_change() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3)], 10)
    for change in (
        lambda: cache.apply(ADDED, obj("ns/b", 11)),
        lambda: cache.apply(MODIFIED, obj("ns/b", 12)),
        lambda: cache.apply(DELETED, obj("ns/b", 13)),
        lambda: cache.replace([obj("ns/a", 3)], 20),
    ):
        cache.bodies[("k",)] = b"old"
        generation = cache.generation
        change()
        assert cache.bodies == {} and cache.generation == generation + 1
    cache.bodies[("k",)] = b"kept"
    cache.apply(MODIFIED, obj("ns/a", 19))  # a repeat changes nothing
    cache.progress(5)
    assert cache.bodies == {("k",): b"kept"}


# -- waiting ---------------------------------------------------------------------------------------------
async def test_wait_until_returns_at_once_when_already_there() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([], 10)
    assert await cache.wait_until(10, 0)
    assert await cache.wait_until(3, 0)


async def test_wait_until_wakes_on_apply() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([], 10)
    waiter = asyncio.create_task(cache.wait_until(12, 30))
    await asyncio.sleep(0)
    cache.apply(ADDED, obj("ns/a", 11))
    await asyncio.sleep(0)
    assert not waiter.done()
    cache.apply(ADDED, obj("ns/b", 12))
    assert await asyncio.wait_for(waiter, 5)
    assert cache._waiters == []


async def test_wait_until_wakes_on_progress_and_on_a_delete_of_an_unknown_key() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([], 10)
    by_progress = asyncio.create_task(cache.wait_until(20, 30))
    by_delete = asyncio.create_task(cache.wait_until(25, 30))
    await asyncio.sleep(0)
    cache.progress(20, in_order=False)
    assert await asyncio.wait_for(by_progress, 5)
    assert not by_delete.done()
    cache.apply(DELETED, obj("ns/unknown", 25))
    assert await asyncio.wait_for(by_delete, 5)


async def test_wait_until_waits_for_the_first_list_even_at_resource_version_zero() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    early = asyncio.create_task(cache.wait_until(0, 30))
    later = asyncio.create_task(cache.wait_until(50, 30))
    await asyncio.sleep(0.01)
    assert not early.done()
    cache.replace([obj("ns/a", 3)], 40)
    assert await asyncio.wait_for(early, 5)
    await asyncio.sleep(0)
    assert not later.done()
    cache.replace([obj("ns/a", 3)], 60)  # a relist past it wakes it too
    assert await asyncio.wait_for(later, 5)


async def test_wait_until_times_out_and_forgets_the_waiter() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([], 10)
    assert not await cache.wait_until(11, 0.02)
    assert cache._waiters == []
    assert not await cache.wait_until(11, 0)
    not_ready = WatchCache(POD, clock=FakeClock())
    assert not await not_ready.wait_until(0, 0.02)
    assert not_ready._waiters == []


async def test_a_cancelled_wait_forgets_the_waiter() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([], 10)
    waiter = asyncio.create_task(cache.wait_until(100, 30))
    await asyncio.sleep(0)
    assert len(cache._waiters) == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert cache._waiters == []
    cache.apply(ADDED, obj("ns/a", 100))  # waking a cancelled waiter is harmless


# -- snapshots --------------------------------------------------------------------------------------------
def test_snapshots_at_older_resource_versions_undo_the_newer_events() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3), obj("ns/b", 4)], 10)
    cache.apply(ADDED, obj("ns/c", 11))
    cache.apply(MODIFIED, obj("ns/a", 12))
    cache.apply(DELETED, obj("ns/b", 13))
    cache.apply(MODIFIED, obj("ns/c", 14))
    cache.progress(16)
    assert state(cache.snapshot(10)) == {"ns/a": 3, "ns/b": 4}
    assert state(cache.snapshot(11)) == {"ns/a": 3, "ns/b": 4, "ns/c": 11}
    assert state(cache.snapshot(12)) == {"ns/a": 12, "ns/b": 4, "ns/c": 11}
    assert state(cache.snapshot(13)) == {"ns/a": 12, "ns/c": 11}
    assert state(cache.snapshot(15)) == {"ns/a": 12, "ns/c": 14}
    assert state(cache.snapshot(16)) == state(cache.snapshot())
    old = cache.snapshot(12)
    assert old is not None and old.rv == 12 and old.keys == ("ns/a", "ns/b", "ns/c")
    assert all(o.key == k for o, k in zip(old.objects, old.keys, strict=True))
    # The current state is untouched by rebuilding an old one.
    assert state(cache.snapshot()) == {"ns/a": 12, "ns/c": 14}


def test_no_snapshot_in_the_future_or_before_the_history() -> None:
    cache = WatchCache(POD, max_events=2, clock=FakeClock())
    cache.replace([obj("ns/a", 3)], 10)
    assert cache.snapshot(11) is None
    assert cache.snapshot(9) is None
    for rv in (11, 12, 13):
        cache.apply(MODIFIED, obj("ns/a", rv))
    # The event at 11 was evicted: 10 cannot be rebuilt, 11 and later can.
    assert cache.snapshot(10) is None
    assert state(cache.snapshot(11)) == {"ns/a": 11}
    assert state(cache.snapshot(12)) == {"ns/a": 12}


def test_the_time_window_limits_how_far_back_snapshots_go() -> None:
    clock = FakeClock(1000.0)
    cache = WatchCache(POD, window=75.0, clock=clock)
    cache.replace([obj("ns/a", 3)], 10)
    cache.apply(MODIFIED, obj("ns/a", 11))
    clock.now = 1050.0
    cache.apply(MODIFIED, obj("ns/a", 12))
    assert state(cache.snapshot(10)) == {"ns/a": 3}
    clock.now = 1080.0
    cache.history.expire()
    assert cache.snapshot(10) is None
    assert state(cache.snapshot(11)) == {"ns/a": 11}


def test_the_current_snapshot_is_shared_until_something_changes() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3)], 10)
    first = cache.snapshot()
    assert cache.snapshot() is first and cache.snapshot(10) is first
    cache.apply(MODIFIED, obj("ns/a", 11))
    second = cache.snapshot()
    assert second is not first
    assert first is not None and state(first) == {"ns/a": 3}  # a snapshot taken never changes


def test_a_cleared_cache_keeps_no_snapshot_or_body_of_what_it_held() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("ns/a", 3), obj("ns/b", 4)], 10)
    held = cache.snapshot()
    assert held is not None and len(held.objects) == 2
    cache.bodies[("list",)] = b"cached"
    generation = cache.generation
    cache.clear()
    now = cache.snapshot()
    assert now is not None and now.objects == () and len(cache) == 0
    assert not cache.bodies and cache.generation > generation
    cache.replace([obj("ns/c", 12)], 12)
    again = cache.snapshot()
    assert again is not None and state(again) == {"ns/c": 12}


def test_random_histories_rebuild_every_intermediate_state() -> None:
    rng = random.Random(4)
    cache = WatchCache(POD, clock=FakeClock())
    names = [f"n{i}/o{j}" for i in range(3) for j in range(4)]
    current = {k: 1 for k in names[:5]}
    cache.replace([obj(k, rv) for k, rv in current.items()], 5)
    states = {5: dict(current)}
    rv = 5
    for _ in range(200):
        rv += rng.randint(1, 3)
        key = rng.choice(names)
        if key in current and rng.random() < 0.4:
            cache.apply(DELETED, obj(key, rv))
            del current[key]
        else:
            cache.apply(ADDED if key not in current else MODIFIED, obj(key, rv))
            current[key] = rv
        states[rv] = dict(current)
    for at, expected in states.items():
        assert state(cache.snapshot(at)) == expected, at


# -- Snapshot.namespace_range -------------------------------------------------------------------------------
def test_namespace_range_is_exact_for_namespaces_that_prefix_others() -> None:
    keys = ["a-b/p", "a.b/p", "a/p1", "a/p2", "a0/p", "ab/p", "b/p", "default/x"]
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj(k, 1) for k in keys], 10)
    snap = cache.snapshot()
    assert snap is not None
    assert list(snap.keys) == sorted(keys)

    def in_ns(ns: str) -> list[str]:
        lo, hi = snap.namespace_range(ns)
        return list(snap.keys[lo:hi])

    assert in_ns("a") == ["a/p1", "a/p2"]
    assert in_ns("a-b") == ["a-b/p"]
    assert in_ns("a.b") == ["a.b/p"]
    assert in_ns("ab") == ["ab/p"]
    assert in_ns("a0") == ["a0/p"]
    assert in_ns("b") == ["b/p"]
    assert in_ns("c") == []
    assert in_ns("") == sorted(keys)
    for ns in {k.split("/")[0] for k in keys}:
        assert in_ns(ns) == [k for k in sorted(keys) if k.split("/")[0] == ns]


def test_snapshot_get_finds_exact_keys_only() -> None:
    cache = WatchCache(POD, clock=FakeClock())
    cache.replace([obj("a/x", 1), obj("a/xy", 2), obj("b/x", 3)], 10)
    snap = cache.snapshot()
    assert snap is not None
    got = snap.get("a/xy")
    assert got is not None and got.rv == 2
    assert snap.get("a/x") is not None
    assert snap.get("a/") is None and snap.get("a/xz") is None and snap.get("c/x") is None


def test_cluster_scoped_keys_sort_and_list() -> None:
    cache = WatchCache(Kind("v1", "Namespace", "NamespaceList", protobuf=True), clock=FakeClock())
    cache.replace([obj("kube-system", 2), obj("default", 1), obj("a", 3)], 10)
    snap = cache.snapshot()
    assert snap is not None
    assert snap.keys == ("a", "default", "kube-system")
    assert snap.namespace_range("") == (0, 3)


# -- CachedObject ----------------------------------------------------------------------------------------
def test_an_objects_json_is_made_once_on_first_use_and_shared() -> None:
    calls: list[bytes] = []

    def encode(raw: bytes) -> bytes:
        calls.append(raw)
        return b'{"metadata":{"name":"p"}}'

    o = CachedObject("ns/p", "ns", "p", 5, {}, {}, proto=b"\x0a\x01p", encode=encode)
    assert not o.has_json and calls == []
    assert o.item_json == b'{"metadata":{"name":"p"}}'
    assert o.item_json is o.item_json
    assert calls == [b"\x0a\x01p"] and o.has_json
    assert o.proto == b"\x0a\x01p"  # the protobuf form is kept as it came


def test_object_json_of_a_built_in_kind_carries_kind_and_api_version() -> None:
    o = CachedObject("ns/p", "ns", "p", 5, {}, {}, json=b'{"metadata":{"name":"p"}}')
    assert o.object_json(POD) == b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p"}}'
    empty = CachedObject("ns/q", "ns", "q", 5, {}, {}, json=b"{}")
    assert empty.object_json(POD) == b'{"kind":"Pod","apiVersion":"v1"}'


def test_object_json_of_a_custom_resource_is_its_own_bytes() -> None:
    crd = Kind("example.com/v1", "Widget", "WidgetList", protobuf=False)
    raw = b'{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}'
    o = CachedObject("ns/w", "ns", "w", 5, {}, {}, json=raw)
    assert o.object_json(crd) is raw


def test_a_cached_object_needs_one_of_its_forms() -> None:
    with pytest.raises(ValueError):
        CachedObject("ns/p", "ns", "p", 5, {}, {})


def test_an_event_later_than_the_confirmation_covering_it_is_counted_and_its_lateness_kept() -> None:
    """A progress probe (another stream) said "at 20"; the main watch's event at 15 arrives 30 ms
    later: it was late. Applied all the same; its lateness decides the next probes' wait, and it
    fades (halved every minute). An event above every confirmation, or a list, is not late."""
    clock = FakeClock()
    cache = WatchCache(POD, clock=clock)
    late: list[int] = []
    cache.on_late = lambda: late.append(1)
    cache.replace([obj("ns/a", 5)], 10)
    cache.progress(20, in_order=False)
    clock.now += 0.03
    cache.apply(MODIFIED, obj("ns/a", 15))
    assert cache.get("ns/a").rv == 15 and cache.late_events == 1 and late == [1]  # type: ignore[union-attr]
    assert cache.lateness() == pytest.approx(0.03)
    cache.apply(MODIFIED, obj("ns/a", 25))  # above the confirmation: in time
    assert cache.late_events == 1
    clock.now += 60
    assert cache.lateness() == pytest.approx(0.015)
    cache.progress(30, in_order=True)  # a bookmark on the main stream: ordered, nothing can be late
    cache.apply(MODIFIED, obj("ns/a", 28))  # a repeat: ignored
    assert cache.late_events == 1
    cache.progress(40, in_order=False)
    cache.replace([obj("ns/a", 35)], 36)  # a list: the confirmations before it are done with
    cache.apply(MODIFIED, obj("ns/a", 38))
    assert cache.late_events == 1
    # The watch broke after a confirmation and resumed 5 s later: the event it replays was late
    # (counted), but the reconnect's 5 s are not how late a live watch runs.
    cache.progress(50, in_order=False)
    clock.now += 5
    cache.stream_live()
    cache.apply(MODIFIED, obj("ns/a", 45))
    assert cache.late_events == 2 and cache.lateness() < 0.02
