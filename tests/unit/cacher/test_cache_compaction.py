"""CompactionTracker: what the upstream's answers to exact-revision probes prove, for how long, and
that concurrent askers share one probe."""

from __future__ import annotations

import asyncio

import pytest

from kproxy.cacher.compaction import CompactionTracker
from kproxy.testing.clock import FakeClock


class Upstream:
    """Answers probes as an upstream compacted up to ``compacted`` (a list at rv < compacted: 410)."""

    def __init__(self) -> None:
        self.compacted = 0
        self.asked: list[int] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None

    async def probe(self, rv: int) -> bool:
        self.asked.append(rv)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return rv >= self.compacted


def tracker(up: Upstream, clock: FakeClock, ttl: float = 5.0) -> CompactionTracker:
    return CompactionTracker(up.probe, ttl=ttl, clock=clock)


async def test_a_410_holds_forever_for_that_revision_and_every_older_one() -> None:
    up, clock = Upstream(), FakeClock()
    t = tracker(up, clock)
    up.compacted = 50
    assert await t.expired(40)
    clock.now += 3600
    assert await t.expired(40) and await t.expired(12)
    assert up.asked == [40]


async def test_a_served_revision_vouches_for_newer_ones_until_the_ttl_runs_out() -> None:
    up, clock = Upstream(), FakeClock()
    t = tracker(up, clock)
    assert not await t.expired(100)
    assert not await t.expired(100) and not await t.expired(150)
    assert up.asked == [100]
    # An older revision is not covered by what a newer one proved.
    assert not await t.expired(90)
    assert up.asked == [100, 90]
    up.compacted = 120  # etcd compacts; the cache may say "served" for up to ttl longer
    clock.now += 4.9
    assert not await t.expired(100)
    clock.now += 0.2
    assert await t.expired(100)
    assert up.asked == [100, 90, 100]
    assert not await t.expired(130)


async def test_concurrent_askers_share_one_probe_and_a_leaver_does_not_cancel_it() -> None:
    up, clock = Upstream(), FakeClock()
    up.gate = asyncio.Event()
    t = tracker(up, clock)
    first = asyncio.create_task(t.expired(7))
    others = [asyncio.create_task(t.expired(7)) for _ in range(5)]
    await asyncio.sleep(0)
    first.cancel()
    up.gate.set()
    assert await asyncio.gather(*others) == [False] * 5
    assert up.asked == [7]
    assert t.probes == 1


async def test_a_failed_probe_proves_nothing() -> None:
    up, clock = Upstream(), FakeClock()
    t = tracker(up, clock)
    up.fail = ConnectionError("down")
    with pytest.raises(ConnectionError):
        await t.expired(5)
    up.fail = None
    up.compacted = 10
    assert await t.expired(5)
    assert up.asked == [5, 5]


async def test_reset_forgets_everything() -> None:
    up, clock = Upstream(), FakeClock()
    t = tracker(up, clock)
    up.compacted = 50
    assert await t.expired(40)
    t.reset()
    up.compacted = 0  # etcd restored from a backup: its revisions start again
    assert not await t.expired(40)


async def test_close_cancels_the_probes_in_flight() -> None:
    up, clock = Upstream(), FakeClock()
    up.gate = asyncio.Event()
    t = tracker(up, clock)
    asker = asyncio.create_task(t.expired(7))
    await asyncio.sleep(0)
    await t.close()
    with pytest.raises(asyncio.CancelledError):
        await asker
    assert t.known(7) is None
