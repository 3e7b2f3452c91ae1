"""A clock a test moves forward by hand, for code that takes one (``clock=``), and the same clock
for the event loop's timers, so that timeouts and deadlines are reached without waiting.

    clock = FakeClock()
    cache = WatchCache(kind, clock=clock)
    clock.advance(5)

    async with loop_follows(FakeClock()) as clock:    # call_later and asyncio.sleep follow it too
        bc = Broadcaster(cache, frames, clock=clock)
        ...
        await clock.run_for(0.15)                     # timers due by then have run
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["FakeClock", "loop_follows"]


class FakeClock:
    """A monotonic clock that only moves when told: ``clock()`` is ``clock.now``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock does not go back"
        self.now += seconds

    async def run_for(self, seconds: float) -> None:
        """Let the running loop run what is ready now (tasks started meanwhile schedule their
        timers from the present), move the clock on, and let it run what became due (with
        :func:`loop_follows`: the timers scheduled up to then, and what they start)."""
        for _ in range(10):
            await asyncio.sleep(0)
        self.advance(seconds)
        for _ in range(10):
            await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def loop_follows(clock: FakeClock) -> AsyncIterator[FakeClock]:
    """The running loop's time is ``clock`` inside the block: ``call_later``, ``asyncio.sleep``
    and timeouts wait for :meth:`FakeClock.run_for`, not for the wall clock. The clock starts at
    the loop's current time, so timers scheduled before or left after the block keep their meaning."""
    loop = asyncio.get_running_loop()
    clock.now = loop.time()
    loop.time = clock  # type: ignore[method-assign]
    try:
        yield clock
    finally:
        del loop.time  # the class's own again
