"""Forward mode's HTTP/2 connections by caller credential (kproxy.server.http2.callers)."""

from __future__ import annotations

from typing import Any, cast

from kproxy.server.http2 import callers
from kproxy.server.http2.callers import CallerPools
from kproxy.server.http2.client import H2Pool
from kproxy.testing.clock import FakeClock


class FakePool:
    def __init__(self) -> None:
        self.conns: list[Any] = []
        self.dialing = False
        self.closed = False

    def close(self) -> None:
        self.closed = True


def pools(clock: FakeClock | None = None) -> CallerPools:
    return CallerPools(lambda: cast(H2Pool, FakePool()), clock or FakeClock(100.0))


def test_a_caller_without_credentials_goes_on_http11() -> None:
    assert pools().pool(None)[0] is None
    assert pools().pool("")[0] is None


def test_each_credential_has_its_own_pool() -> None:
    p = pools()
    a1, ka = p.pool("Bearer a")
    a2, _ = p.pool("Bearer a")
    b, kb = p.pool("Bearer b")
    assert a1 is not None and a1 is a2 and b is not a1 and ka != kb


def test_a_refused_credential_goes_on_http11_for_a_while() -> None:
    clock = FakeClock(100.0)
    p = pools(clock)
    pool, key = p.pool("Bearer garbage")
    p.refused(key)
    assert cast(FakePool, pool).closed
    assert p.pool("Bearer garbage")[0] is None
    clock.now += callers.REFUSED_FOR + 1
    assert p.pool("Bearer garbage")[0] is not None


def test_new_credentials_get_pools_at_a_bounded_rate() -> None:
    clock = FakeClock(100.0)
    p = pools(clock)
    got = [p.pool(f"Bearer t{i}")[0] for i in range(int(callers.NEW_BURST) + 10)]
    assert sum(x is not None for x in got) == int(callers.NEW_BURST)
    clock.now += 1.0
    got = [p.pool(f"Bearer u{i}")[0] for i in range(int(callers.NEW_PER_SECOND) + 5)]
    assert sum(x is not None for x in got) == int(callers.NEW_PER_SECOND)


def test_the_oldest_closed_pool_makes_room() -> None:
    clock = FakeClock(100.0)
    p = pools(clock)
    first = None
    for i in range(callers.MAX_CALLERS):
        clock.now += 1.0  # the rate never binds here
        pool, _ = p.pool(f"Bearer c{i}")
        assert pool is not None
        cast(FakePool, pool).conns.append(object())  # each has a connection open
        first = first or pool
    clock.now += 1.0
    assert p.pool("Bearer new")[0] is None  # every pool is in use: HTTP/1.1
    cast(FakePool, first).conns.clear()  # the least recently used one's connections closed
    assert p.pool("Bearer new")[0] is not None
    assert cast(FakePool, first).closed and len(p) == callers.MAX_CALLERS


def test_a_client_h2_connection_keeps_every_credential_on_its_own_pool() -> None:
    p = pools()
    a, key = p.pool("Bearer controller-a", connection=7)
    b, _ = p.pool("Bearer controller-b", connection=7)
    anonymous, _ = p.pool(None, connection=7)
    other, _ = p.pool("Bearer controller-a", connection=8)
    assert a is not None and a is b is anonymous and other is not a
    p.refused(key)  # its connection ends (kproxy ends the client's too); nothing is refused
    assert cast(FakePool, a).closed
    again, _ = p.pool("Bearer controller-a", connection=9)
    assert again is not None


def test_a_closed_client_connection_lets_its_upstream_connections_go() -> None:
    p = pools()
    pool, _ = p.pool("Bearer kubectl", connection=11)
    closing: list[bool] = []
    cast(Any, pool).close_when_idle = lambda: closing.append(True)
    p.connection_closed(11)
    assert closing == [True] and len(p) == 0
    p.connection_closed(12)  # one that never had a pool
