"""The cacher's time budget (``time_budget.go``): how long the dispatcher may wait for watchers
that are not keeping up before it closes them, shared by all of them and refilled over time."""

from __future__ import annotations

from collections.abc import Callable


class TimeBudget:
    """``time_budget.go``: time the dispatcher may give blocked watchers; refills ``refresh``
    seconds per second up to ``maximum``."""

    def __init__(self, clock: Callable[[], float], refresh: float = 0.05, maximum: float = 0.1) -> None:
        self._clock = clock
        self.refresh = refresh
        self.maximum = maximum
        self.budget = maximum
        self._last = clock()

    def take_available(self) -> float:
        now = self._clock()
        self.budget = min(self.budget + (now - self._last) * self.refresh, self.maximum)
        self._last = now
        taken, self.budget = self.budget, 0.0
        return taken

    def return_unused(self, unused: float) -> None:
        if unused > 0:
            self.budget = min(self.budget + unused, self.maximum)
