"""The upstream round-trip estimate: the smallest sample of the current and the previous window."""

from __future__ import annotations

from kproxy.core.upstreamlink import WINDOW, UpstreamLink


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_unknown_until_observed_then_the_smallest() -> None:
    clock = Clock()
    link = UpstreamLink(clock)
    assert link.rtt is None
    link.observe(0.080)
    link.observe(0.051)
    link.observe(0.300)  # a list that took the apiserver long: not the link
    assert link.rtt == 0.051


def test_follows_a_changed_link_within_two_windows() -> None:
    clock = Clock()
    link = UpstreamLink(clock)
    link.observe(0.001)  # near the apiserver
    clock.now += WINDOW + 1
    link.observe(0.050)  # then far: the previous window still holds the old minimum
    assert link.rtt == 0.001
    clock.now += WINDOW + 1
    link.observe(0.052)
    assert link.rtt == 0.050
    clock.now += 2 * WINDOW + 1  # nothing seen for two windows: unknown again
    assert link.rtt is None
