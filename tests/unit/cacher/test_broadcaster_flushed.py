"""Broadcaster.flushed: a write's answer waits for the write pass that carries its event.

Pure logic with fake sinks (end to end: tests/e2e/test_watchcache_write_order.py).
"""

from __future__ import annotations

import asyncio

from test_cache_broadcaster import POD, Frames, Sink, obj

from kproxy.cacher import MODIFIED, WatchCache
from kproxy.cacher.broadcaster import Broadcaster, Selection


async def test_flushed_returns_at_once_when_nothing_is_queued() -> None:
    cache = WatchCache(POD)
    cache.replace([obj("ns/a", 3)], 10)
    bc = Broadcaster(cache, Frames())
    await asyncio.wait_for(bc.flushed(), 0.1)


async def test_a_waiter_woken_by_the_event_resumes_after_the_event_is_written() -> None:
    cache = WatchCache(POD)
    cache.replace([obj("ns/a", 3)], 10)
    bc = Broadcaster(cache, Frames())
    sink = Sink()
    bc.watch_since(sink, Selection(), "json", bookmarks=False, timeout=60, rv=10)
    seen: list[list[str]] = []

    async def answer() -> None:
        assert await cache.wait_until(11, 1.0)
        await bc.flushed()
        seen.append(sink.events)  # what the watcher had when the answer would be written

    task = asyncio.create_task(answer())
    await asyncio.sleep(0)
    cache.apply(MODIFIED, obj("ns/a", 11))
    await asyncio.wait_for(task, 1.0)
    assert seen == [["MODIFIED ns/a 11"]]
