"""Client connections of the main listener: the deadlines and bounds on every state they can be in.

The apiserver's ``http.Server`` (``SecureServingInfo.Serve``, staging/src/k8s.io/apiserver/pkg/
server/secure_serving.go) sets ``ReadHeaderTimeout: 32s`` and ``IdleTimeout: 90s``, and Go's
``conn.serve`` (net/http/server.go) applies them so:

- a TLS connection has ``tlsHandshakeTimeout()`` (the least of ReadHeaderTimeout, ReadTimeout and
  WriteTimeout that is set: 32 s there) to finish its handshake;
- a new connection then has the read-header deadline to send its first request's whole head;
- while a request is served, nothing: a watch, an exec session, a body streamed slowly run as
  long as they run (the apiserver sets no ``ReadTimeout``);
- after a response, the connection waits up to the idle timeout for the next request's first
  four bytes (``bufr.Peek(4)``), then has the read-header deadline from there for its head;
- a deadline that passes closes the connection without writing anything (a timeout is one of
  ``isCommonNetReadError``'s errors: "don't reply").

Go bounds none of these states by number: a goroutine in a handshake or between requests costs a
few KiB. In Python a connection costs more (docs/capacity.md measures each state), and every one
holds a file descriptor that kproxy also needs for its upstream connections. So kproxy bounds:

- connections in a TLS handshake (``max_tls_handshakes``), reading a head
  (``max_unfinished_heads``), and idle between requests (``max_idle_connections``): past a
  bound, the connection that has been in that state longest is closed. A client that is not
  stalling leaves the first two states within a round trip, so it is almost never the oldest;
  an idle client loses only a connection it was not using;
- the memory of heads received and not yet served (``max_unfinished_head_bytes``), closing the
  connection reading its head longest (Go holds a head in a goroutine's buffer; aiohttp's parser
  holds about 150 bytes per header line besides the bytes);
- all connections together (``max_connections``, by default derived from the process's file-
  descriptor limit) and, when set, those from one source address: a connection over the total
  takes the place of the connection that has waited longest on its client (in a handshake,
  reading a head, or idle); when every connection is being served, or over the per-source
  bound, the new connection is closed at once. Accepting never stops, so a flood does not hold
  the listener's queue: each new client either displaces a stalled connection or is told at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from kproxy.config import ConnectionsConfig

#: What one header line held by aiohttp's parser costs besides its bytes (its name and value
#: objects and their list entry; measured on kproxy's parser: 60,000 lines of ``a:b`` held
#: 8.3 MiB for 300 KB received).
HEADER_LINE_COST = 150

#: The reasons kproxy closes a client connection itself (the ``reason`` label of
#: ``kproxy_connections_closed_total``).
CLOSE_REASONS = (
    "tls_handshake_timeout",
    "read_header_timeout",
    "idle_timeout",
    "max_tls_handshakes",
    "max_unfinished_heads",
    "max_unfinished_head_bytes",
    "max_idle_connections",
    "max_connections",
    "max_connections_per_source",
)

#: The states a connection waits on its client in (the ``state`` label of
#: ``kproxy_client_connections``, with ``active`` for connections being served).
TLS_HANDSHAKE, READING_HEAD, IDLE = "tls_handshake", "reading_head", "idle"
WAITING_STATES = (TLS_HANDSHAKE, READING_HEAD, IDLE)


def reserved_fds(limit: int) -> int:
    """File descriptors kept out of the derived ``max_connections`` for kproxy's own use (the
    admin listener and its scrapers, the watch cache's and filters' upstream connections, idle
    pooled upstream connections (128 at most, kproxy/server/pool.py), files and logs): an eighth
    of the limit, at least 64 and at most 1024."""
    return max(64, min(1024, limit // 8))


def derived_max_connections(fd_limit: int) -> int:
    """Client connections the file-descriptor limit leaves room for: each one being served may
    hold an upstream connection of its own (a watch, an exec session, a request in flight), so
    half of what the reserve leaves."""
    return max(1, (fd_limit - reserved_fds(fd_limit)) // 2)


def raise_fd_limit() -> int:
    """Raise the soft file-descriptor limit to the hard one, as every Go program does at start
    (os/rlimit.go: the apiserver runs with its hard limit); return the limit now in force (0 where
    there is none to read)."""
    try:
        import resource  # lazy: POSIX only
    except ImportError:
        return 0
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 0
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError):
            pass  # a hard limit of RLIM_INFINITY cannot be a soft one on Linux: keep the soft one
    return soft if soft != resource.RLIM_INFINITY else 0


def admin_limits(main: ConnectionsConfig, fd_limit: int) -> ConnectionsConfig:
    """The admin listener's bounds: the main listener's deadlines, and a few connections (probes
    and scrapes are short), taken from the descriptors ``reserved_fds`` keeps, a quarter of them."""
    share = max(8, reserved_fds(fd_limit) // 4) if fd_limit else 256
    return main.model_copy(
        update={
            "max_tls_handshakes": min(16, share),
            "max_unfinished_heads": min(16, share),
            "max_idle_connections": min(16, share),
            "max_connections": share,
            "max_connections_per_source": 0,
        }
    )


class Closable(Protocol):
    def close_for(self, reason: str) -> None: ...


class Connections:
    """Bookkeeping shared by every connection of one listener (the event loop's thread only)."""

    def __init__(self, limits: ConnectionsConfig | None = None, fd_limit: int = 0) -> None:
        #: The ``connections:`` settings (a config reload replaces them).
        self.limits = limits or ConnectionsConfig()
        #: The process's file-descriptor limit (RLIMIT_NOFILE), read at start; 0: not known.
        self.fd_limit = fd_limit
        #: Called with the reason whenever a bound or deadline closes a connection.
        self.on_close: Callable[[str], None] = lambda reason: None
        #: Connections accepted and not yet closed, all states.
        self.open = 0
        #: Open connections by source address.
        self.sources: dict[str, int] = {}
        #: The connections waiting on their client, by state, each oldest first (with the time
        #: it entered the state).
        self.waiting: dict[str, dict[Closable, float]] = {state: {} for state in WAITING_STATES}
        #: Connections reading a head (a new connection, or a kept-alive one whose next request
        #: has begun), oldest first.
        self.reading = self.waiting[READING_HEAD]
        #: Estimated memory of heads received and not yet served, all connections together.
        self.held = 0

    # -- the bounds in force ------------------------------------------------------------------

    @property
    def max_connections(self) -> int:
        """The bound on all connections: the configured one, never above what the file-descriptor
        limit leaves room for (0: unbounded, only when neither is known)."""
        derived = derived_max_connections(self.fd_limit) if self.fd_limit else 0
        configured = self.limits.max_connections
        if configured and derived:
            return min(configured, derived)
        return configured or derived

    def count(self, state: str) -> int:
        return len(self.waiting[state])

    @property
    def active(self) -> int:
        """Connections being served (a request, a watch, an upgraded session)."""
        return self.open - sum(len(w) for w in self.waiting.values())

    # -- admission ----------------------------------------------------------------------------

    def admit(self, source: str) -> str | None:
        """A connection from ``source`` was accepted: None if it may stay (it is counted from
        now on), else the reason it must be closed at once. Over ``max_connections``, the
        connection that has waited longest on its client is closed to make room."""
        per_source = self.limits.max_connections_per_source
        if per_source and self.sources.get(source, 0) >= per_source:
            self.on_close("max_connections_per_source")
            return "max_connections_per_source"
        limit = self.max_connections
        if limit and self.open >= limit:
            victim = self._longest_waiting()
            if victim is None:
                self.on_close("max_connections")
                return "max_connections"
            victim.close_for("max_connections")
        self.open += 1
        self.sources[source] = self.sources.get(source, 0) + 1
        return None

    def leave(self, conn: Closable, source: str) -> None:
        """An admitted connection is closed."""
        self.enter(conn, None)
        self.open -= 1
        left = self.sources.get(source, 0) - 1
        if left > 0:
            self.sources[source] = left
        else:
            self.sources.pop(source, None)

    def _longest_waiting(self) -> Closable | None:
        oldest: tuple[float, Closable] | None = None
        for waiting in self.waiting.values():
            for conn, since in waiting.items():
                if oldest is None or since < oldest[0]:
                    oldest = (since, conn)
                break
        return oldest[1] if oldest else None

    # -- states -------------------------------------------------------------------------------

    def enter(self, conn: Closable, state: str | None) -> None:
        """``conn`` waits on its client in ``state`` from now on (None: it is being served, or
        closed). Beyond that state's bound, the connection in it longest is closed (``conn``
        itself only if the bound is 1)."""
        for waiting in self.waiting.values():
            waiting.pop(conn, None)
        if state is None:
            return
        waiting = self.waiting[state]
        waiting[conn] = time.monotonic()
        limit = self._bound(state)
        while limit and len(waiting) > limit:
            victim = next(iter(waiting))
            del waiting[victim]  # out of the state whatever close_for does
            victim.close_for(_BOUND_REASON[state])

    def _bound(self, state: str) -> int:
        if state == TLS_HANDSHAKE:
            return self.limits.max_tls_handshakes
        if state == READING_HEAD:
            return self.limits.max_unfinished_heads
        return self.limits.max_idle_connections

    def start_head(self, conn: Closable) -> None:
        """``conn`` is reading a head from now on (``max_unfinished_heads``)."""
        self.enter(conn, READING_HEAD)

    def end_head(self, conn: Closable) -> None:
        self.reading.pop(conn, None)

    def hold(self, conn: Closable, delta: int) -> None:
        """``conn`` holds ``delta`` more (or fewer) bytes of heads. Beyond
        ``max_unfinished_head_bytes``: if ``conn`` is reading a head, connections reading one are
        closed oldest first, until the total fits or ``conn`` was closed; a connection that is
        being served (heads pipelined behind its request, which Go would not even read) is
        closed itself."""
        self.held += delta
        limit = self.limits.max_unfinished_head_bytes
        if delta <= 0 or not limit:
            return
        while self.held > limit:
            victim = next(iter(self.reading)) if conn in self.reading else conn
            self.reading.pop(victim, None)
            victim.close_for("max_unfinished_head_bytes")
            if victim is conn:
                return


_BOUND_REASON = {
    TLS_HANDSHAKE: "max_tls_handshakes",
    READING_HEAD: "max_unfinished_heads",
    IDLE: "max_idle_connections",
}
