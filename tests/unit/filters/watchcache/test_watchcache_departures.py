"""When a cached resource that discovery stopped listing is taken for gone (``Departures``)."""

from __future__ import annotations

from kproxy.filters.watchcache.resources import CONFIRMATION_SPACING, CONFIRMATIONS, Departures

PODS = ("", "v1", "pods")
DEPLOYMENTS = ("apps", "v1", "deployments")
WIDGETS = ("example.com", "v1", "widgets")
CACHED = [PODS, DEPLOYMENTS, WIDGETS]


def test_defaults_three_reads_over_ten_seconds() -> None:
    d = Departures()
    assert (d.confirmations, d.span) == (CONFIRMATIONS, (CONFIRMATIONS - 1) * CONFIRMATION_SPACING) == (3, 10.0)


def test_gone_after_consecutive_ready_reads_spanning_the_span() -> None:
    d = Departures(confirmations=3, span=10.0)
    assert d.observe(CACHED, [PODS, WIDGETS], ready=True, now=0.0) == []
    assert d.pending == [DEPLOYMENTS]
    assert d.observe(CACHED, [PODS, WIDGETS], ready=True, now=5.0) == []
    assert d.observe(CACHED, [PODS, WIDGETS], ready=True, now=10.0) == [DEPLOYMENTS]
    assert d.pending == []


def test_enough_reads_too_close_together_are_not_enough() -> None:
    d = Departures(confirmations=3, span=10.0)
    for t in (0.0, 0.2, 0.4, 0.6, 9.9):
        assert d.observe(CACHED, [PODS], ready=True, now=t) == []
    assert sorted(d.observe(CACHED, [PODS], ready=True, now=10.0)) == sorted([DEPLOYMENTS, WIDGETS])


def test_a_read_while_not_ready_drops_nothing_and_starts_the_count_again() -> None:
    """A restarting apiserver's partial discovery (/readyz failing) says nothing."""
    d = Departures(confirmations=3, span=10.0)
    assert d.observe(CACHED, [PODS], ready=False, now=0.0) == []
    assert d.pending == []
    d.observe(CACHED, [PODS], ready=True, now=1.0)
    d.observe(CACHED, [PODS], ready=True, now=6.0)
    assert d.observe(CACHED, [PODS], ready=False, now=11.0) == []
    assert d.observe(CACHED, [PODS], ready=True, now=12.0) == []
    assert d.observe(CACHED, [PODS], ready=True, now=17.0) == []
    assert d.observe(CACHED, [PODS], ready=True, now=22.0) == [DEPLOYMENTS, WIDGETS]


def test_listed_again_starts_the_count_again() -> None:
    d = Departures(confirmations=3, span=10.0)
    d.observe(CACHED, [PODS, WIDGETS], ready=True, now=0.0)
    d.observe(CACHED, [PODS, WIDGETS], ready=True, now=5.0)
    assert d.observe(CACHED, CACHED, ready=True, now=10.0) == []
    assert d.pending == []
    assert d.observe(CACHED, [PODS, WIDGETS], ready=True, now=15.0) == []


def test_forget_and_resources_no_longer_cached() -> None:
    d = Departures(confirmations=2, span=0.0)
    d.observe(CACHED, [PODS], ready=True, now=0.0)
    d.forget(WIDGETS)  # dropped meanwhile (its definition deleted)
    assert d.pending == [DEPLOYMENTS]
    assert d.observe([PODS, DEPLOYMENTS], [PODS], ready=True, now=1.0) == [DEPLOYMENTS]
