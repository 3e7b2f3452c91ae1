"""kproxy.gctuning: pauses of automatic collection (nested, bounded, never turning on a collector
that was off), the start-up freeze and thaw, and the pause histogram."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from kproxy import gctuning
from kproxy.server.metrics import Metrics


@pytest.fixture(autouse=True)
def _collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    gctuning.observe_pauses(None)
    gc.unfreeze()
    if not was:
        gc.disable()


def test_paused_nests_and_restores() -> None:
    with gctuning.paused():
        assert not gc.isenabled()
        with gctuning.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_paused_restores_after_an_error() -> None:
    with pytest.raises(RuntimeError), gctuning.paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_paused_leaves_a_disabled_collector_off() -> None:
    gc.disable()
    with gctuning.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


async def test_pauses_overlapping_across_tasks() -> None:
    started, release = asyncio.Event(), asyncio.Event()

    async def lister() -> None:
        with gctuning.paused():
            started.set()
            await release.wait()

    task = asyncio.create_task(lister())
    await started.wait()
    with gctuning.paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other task's pause is not over
    release.set()
    await task
    assert gc.isenabled()


async def test_a_pause_ends_by_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gctuning, "MAX_PAUSE", 0.05)
    expired = asyncio.Event()
    orig = gctuning._expire

    def spy() -> None:
        orig()
        expired.set()

    monkeypatch.setattr(gctuning, "_expire", spy)
    with gctuning.paused():
        await asyncio.wait_for(expired.wait(), 5)
        assert gc.isenabled()  # collection runs again while the block goes on
        with gctuning.paused():  # a pause nested in an expired one does not stop it again
            assert gc.isenabled()
    assert gc.isenabled()


def test_freeze_started_and_thaw() -> None:
    gc.unfreeze()
    kept = [[i] for i in range(1000)]  # lists: always tracked by the collector

    def walked() -> set[int]:
        return {id(o) for o in gc.get_objects()}

    assert id(kept[0]) in walked()
    gc.disable()  # as `kproxy run` holds collection off while it builds the server
    gctuning.freeze_started()
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)
    assert not {id(x) for x in kept} & walked()  # no collection walks them any more
    gctuning.thaw()
    assert gc.get_freeze_count() == 0
    assert id(kept[0]) in walked()


def test_pause_histogram_and_frozen_gauge() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    gctuning.observe_pauses(metrics.gc_pause)
    gctuning.observe_pauses(metrics.gc_pause)  # once, however often it is called

    def count(generation: str) -> float:
        value = registry.get_sample_value("kproxy_gc_pause_seconds_count", {"generation": generation})
        assert value is not None
        return value

    before = count("2")
    gc.collect()
    assert count("2") == before + 1
    gctuning.observe_pauses(None)
    gc.collect()
    assert count("2") == before + 1
    gc.freeze()
    assert registry.get_sample_value("kproxy_gc_frozen_objects") == gc.get_freeze_count() > 0
