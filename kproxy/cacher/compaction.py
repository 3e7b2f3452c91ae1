"""How far the upstream has compacted: whether a list at an old resource version would still be
served there, or answered ``410 Expired``.

The cache can rebuild old snapshots from its own history long after etcd has compacted their
revision, and a continue token it served would then keep working where the apiserver says 410
(with its "inconsistent continue" token). The apiserver decides a continue exactly as it decides
an exact-revision list of the same revision (``Cacher.ShouldDelegateContinue`` calls
``shouldDelegateExactRV``: its own snapshot while it has one, else etcd, which fails once the
revision is compacted), and it drops its snapshots only when its compactor notices a compaction
(``cacher/compactor.go``, every 15 s, from the apiserver's own compaction every 5 min). So the
upstream's answer to ``resourceVersion=R&resourceVersionMatch=Exact&limit=1`` is its answer to a
continue at R, and costs it one item.

What an answer proves lasts differently. A 410 at R stays true (compaction only moves forward),
for R and everything older. A 200 at R holds for R and everything newer, but only until the next
compaction: it is reused for ``ttl`` seconds, less than the apiserver's own 15 s compactor poll,
so the cache flips to 410 no later after a compaction than an apiserver replica polling a little
later would; each probe's result counts from the moment it was asked.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

Probe = Callable[[int], Awaitable[bool]]
"""``probe(rv)``: True when the upstream still serves a list at ``rv``, False for its 410;
raises when it gives neither answer."""

DEFAULT_TTL = 5.0


class CompactionTracker:
    def __init__(self, probe: Probe, *, ttl: float = DEFAULT_TTL, clock: Callable[[], float] = time.monotonic) -> None:
        self._probe = probe
        self.ttl = ttl
        self._clock = clock
        self.expired_through = 0  # every resource version up to this one is compacted upstream
        self._served_from = 0  # the upstream served this resource version (and so every later one)...
        self._served_at = float("-inf")  # ...when asked at this time
        self._inflight: dict[int, asyncio.Task[bool]] = {}
        self.probes = 0

    def known(self, rv: int) -> bool | None:
        """True: ``rv`` is compacted upstream; False: the upstream still serves it; None: ask."""
        if rv <= self.expired_through:
            return True
        if self._served_from and rv >= self._served_from and self._clock() - self._served_at < self.ttl:
            return False
        return None

    async def expired(self, rv: int) -> bool:
        """Whether the upstream answers 410 for a list at ``rv``; asks it when nothing known
        tells (one probe per resource version at a time, shared by every caller). Raises the
        probe's error."""
        known = self.known(rv)
        if known is not None:
            return known
        task = self._inflight.get(rv)
        if task is None:
            task = self._inflight[rv] = asyncio.create_task(self._ask(rv))
        # A caller that goes away does not cancel the probe the others wait for.
        return not await asyncio.shield(task)

    async def _ask(self, rv: int) -> bool:
        asked = self._clock()
        self.probes += 1
        try:
            served = await self._probe(rv)
        finally:
            self._inflight.pop(rv, None)
        if served:
            self.saw_served(rv, asked)
        else:
            self.saw_expired(rv)
        return served

    def saw_expired(self, rv: int) -> None:
        """The upstream answered 410 for ``rv``: it and everything before it are gone."""
        if rv > self.expired_through:
            self.expired_through = rv

    def saw_served(self, rv: int, at: float) -> None:
        """The upstream served ``rv`` at time ``at``."""
        if rv <= self.expired_through:
            return
        stale = self._clock() - self._served_at >= self.ttl
        # Kept: the answer that covers more (the older revision), unless the kept one is stale.
        if stale or rv < self._served_from or (rv == self._served_from and at > self._served_at):
            self._served_from, self._served_at = rv, at

    async def close(self) -> None:
        """Cancel the probes still in flight (their askers get CancelledError)."""
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def reset(self) -> None:
        """The upstream went back in time (etcd restored): nothing known holds any more."""
        self.expired_through = 0
        self._served_from, self._served_at = 0, float("-inf")
