"""Pure logic of the bounds on client connection states (kproxy/server/connections.py); the
behaviour itself is tested end to end in tests/e2e/test_connection_floods.py."""

from __future__ import annotations

import resource

from kproxy.config import ConnectionsConfig
from kproxy.server.connections import (
    IDLE,
    READING_HEAD,
    TLS_HANDSHAKE,
    Connections,
    derived_max_connections,
    raise_fd_limit,
)


class _Conn:
    def __init__(self, conns: Connections, source: str = "10.0.0.1") -> None:
        self.conns = conns
        self.source = source
        self.closed: str | None = None

    def close_for(self, reason: str) -> None:
        self.closed = reason
        self.conns.leave(self, self.source)


def _open(conns: Connections, state: str | None, source: str = "10.0.0.1") -> _Conn:
    conn = _Conn(conns, source)
    assert conns.admit(source) is None
    conns.enter(conn, state)
    return conn


def test_each_waiting_state_closes_its_oldest_past_its_bound() -> None:
    conns = Connections(ConnectionsConfig(max_tls_handshakes=2, max_idle_connections=2, max_unfinished_heads=2))
    for state, reason in ((TLS_HANDSHAKE, "max_tls_handshakes"), (IDLE, "max_idle_connections")):
        a, b, c = (_open(conns, state) for _ in range(3))
        assert (a.closed, b.closed, c.closed) == (reason, None, None)
        assert conns.count(state) == 2
    conns.enter(_open(conns, None), READING_HEAD)
    assert conns.count(READING_HEAD) == 1 and conns.active == 0


def test_a_connection_over_the_total_takes_the_place_of_the_one_waiting_longest() -> None:
    conns = Connections(ConnectionsConfig(max_connections=3))
    idle = _open(conns, IDLE)
    busy = _open(conns, None)
    handshake = _open(conns, TLS_HANDSHAKE)
    assert conns.admit("10.0.0.2") is None  # room made: the idle one, waiting longest
    assert (idle.closed, busy.closed, handshake.closed) == ("max_connections", None, None)
    conns.enter(_Conn(conns, "10.0.0.2"), None)
    assert conns.admit("10.0.0.3") is None
    assert handshake.closed == "max_connections"
    assert conns.admit("10.0.0.4") == "max_connections"  # all three are being served: refused at once
    assert conns.open == 3 and busy.closed is None


def test_per_source_bound_refuses_that_source_only() -> None:
    conns = Connections(ConnectionsConfig(max_connections_per_source=2))
    one = [_open(conns, IDLE, "10.0.0.1") for _ in range(2)]
    assert conns.admit("10.0.0.1") == "max_connections_per_source"
    assert conns.admit("10.0.0.2") is None
    one[0].close_for("idle_timeout")
    assert conns.admit("10.0.0.1") is None
    assert conns.sources == {"10.0.0.1": 2, "10.0.0.2": 1}


def test_the_bound_is_below_the_descriptor_limit_with_room_for_upstream_connections() -> None:
    assert derived_max_connections(256) == (256 - 64) // 2
    assert derived_max_connections(20000) == (20000 - 1024) // 2
    assert derived_max_connections(1 << 20) == ((1 << 20) - 1024) // 2
    conns = Connections(ConnectionsConfig(max_connections=50_000), fd_limit=20000)
    assert conns.max_connections == derived_max_connections(20000)  # never above what fds allow
    conns = Connections(ConnectionsConfig(max_connections=100), fd_limit=20000)
    assert conns.max_connections == 100


def test_soft_descriptor_limit_is_raised_to_the_hard_one_as_go_does() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))
        expected = hard if hard != resource.RLIM_INFINITY else resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert raise_fd_limit() == expected
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
