"""The fake clock: code that takes a clock sees only what the test moves, and with loop_follows the
event loop's timers wait for it too (and the loop has its own time back afterwards)."""

from __future__ import annotations

import asyncio
import time

from kproxy.testing.clock import FakeClock, loop_follows


def test_the_clock_moves_only_when_told() -> None:
    clock = FakeClock()
    assert clock() == clock() == 1000.0
    clock.advance(2.5)
    assert clock() == 1002.5


async def test_loop_timers_follow_the_fake_clock_and_the_loop_gets_its_time_back() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    began = time.monotonic()
    async with loop_follows(FakeClock()) as clock:
        loop.call_later(3600, lambda: fired.append(clock()))
        sleeper = asyncio.ensure_future(asyncio.sleep(60))
        await clock.run_for(59)
        assert not fired and not sleeper.done()
        await clock.run_for(1)
        assert sleeper.done() and not fired
        await clock.run_for(3540)
        assert len(fired) == 1
    assert time.monotonic() - began < 5  # an hour of timers, no hour of waiting
    assert "time" not in vars(loop) and abs(loop.time() - time.monotonic()) < 1
