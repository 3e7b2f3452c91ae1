"""The upstream round-trip estimate: the smallest sample of the current and the previous window,
once there are enough of them."""

from __future__ import annotations

from kproxy.core.upstreamlink import MIN_SAMPLES, WINDOW, UpstreamLink
from kproxy.testing.clock import FakeClock


def test_unknown_until_enough_samples_then_the_smallest() -> None:
    link = UpstreamLink(FakeClock())
    assert link.rtt is None
    link.observe(0.080)  # the first request: dialling included
    link.observe(0.051)
    assert MIN_SAMPLES == 3 and link.rtt is None
    link.observe(0.300)  # a list that took the apiserver long: not the link
    assert link.rtt == 0.051


def test_follows_a_changed_link_within_two_windows() -> None:
    clock = FakeClock()
    link = UpstreamLink(clock)
    for _ in range(MIN_SAMPLES):
        link.observe(0.001)  # near the apiserver
    clock.now += WINDOW + 1
    link.observe(0.050)  # then far: the previous window still holds the old minimum
    assert link.rtt == 0.001
    clock.now += WINDOW + 1
    for _ in range(MIN_SAMPLES):
        link.observe(0.052)
    assert link.rtt == 0.050
    clock.now += 2 * WINDOW + 1  # nothing seen for two windows: unknown again
    assert link.rtt is None
