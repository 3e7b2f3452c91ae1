"""Client connections of the main listener: the deadlines and bounds on what they may hold.

The apiserver's ``http.Server`` (``SecureServingInfo.Serve``, staging/src/k8s.io/apiserver/pkg/
server/secure_serving.go) sets ``ReadHeaderTimeout: 32s`` and ``IdleTimeout: 90s``, and Go's
``conn.serve`` (net/http/server.go) applies them so:

- a new connection has the read-header deadline from its start (after the TLS handshake) to
  send its first request's whole head;
- while a request is served, nothing: a watch, an exec session, a body streamed slowly run as
  long as they run (the apiserver sets no ``ReadTimeout``);
- after a response, the connection waits up to the idle timeout for the next request's first
  four bytes (``bufr.Peek(4)``), then has the read-header deadline from there for its head;
- a deadline that passes closes the connection without writing anything (a timeout is one of
  ``isCommonNetReadError``'s errors: "don't reply").

Go holds an unfinished head in a goroutine's buffers; kproxy holds it in aiohttp's parser, where
it costs more (measured: about 140 bytes per header line besides the bytes). So kproxy also bounds
what all connections hold together: the connections still reading a head, and the memory of
heads received but not yet served. Over either bound, the connection that has been reading its
head the longest is closed first: a client that sends its head at once is in that state for one
round trip, a client that trickles it is the one holding the bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kproxy.config import ConnectionsConfig

#: What one header line held by aiohttp's parser costs besides its bytes (its name and value
#: objects and their list entry; measured on kproxy's parser: 60,000 lines of ``a:b`` held
#: 8.3 MiB for 300 KB received).
HEADER_LINE_COST = 150

#: The reasons kproxy closes a client connection itself (the ``reason`` label of
#: ``kproxy_connections_closed_total``).
CLOSE_REASONS = ("read_header_timeout", "idle_timeout", "max_unfinished_heads", "max_unfinished_head_bytes")


class Closable(Protocol):
    def close_for(self, reason: str) -> None: ...


class Connections:
    """Bookkeeping shared by every connection of one listener (the event loop's thread only)."""

    def __init__(self, limits: ConnectionsConfig | None = None) -> None:
        #: The ``connections:`` settings (a config reload replaces them).
        self.limits = limits or ConnectionsConfig()
        #: Called with the reason whenever a bound or deadline closes a connection.
        self.on_close: Callable[[str], None] = lambda reason: None
        self.open = 0
        #: Connections reading a head (a new connection, or a kept-alive one whose next request
        #: has begun), oldest first.
        self.reading: dict[Closable, None] = {}
        #: Estimated memory of heads received and not yet served, all connections together.
        self.held = 0

    def start_head(self, conn: Closable) -> None:
        """``conn`` is reading a head from now on; beyond ``max_unfinished_heads``, the oldest
        such connection (``conn`` itself only if the bound is 1) is closed."""
        self.reading[conn] = None
        limit = self.limits.max_unfinished_heads
        while limit and len(self.reading) > limit:
            next(iter(self.reading)).close_for("max_unfinished_heads")

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
            victim.close_for("max_unfinished_head_bytes")
            if victim is conn:
                return
