"""The watcher side of ``benchmarks.watchfanout``: one process holding many raw watch connections.

The machine has two cores shared by the apiserver, kproxy, the writer and these clients, so a
watcher must cost as little as possible per event: an ``asyncio.Protocol`` per connection (no
stream reader, no task per watcher) on uvloop, HTTP/1.1 written by hand, the chunked framing left
in place (no per-chunk Python work), each event found by the writer's timestamp annotation with
one ``bytes.find`` (so it is counted and timed at once) -- never a JSON parse.
Latencies go into a fixed histogram (0.1 ms buckets), so recording one is an index and an add.

The parent talks to each process over a ``multiprocessing`` pipe:

1. the process connects its watchers (a bounded number of handshakes at a time: a listener's
   backlog is finite) and answers ``Connected`` once each has its response headers or failed;
2. it gets the measured window (wall-clock ``start_at``/``end_at``), counts what arrives inside it,
   and answers ``ClientResult`` once the window has ended;
3. on the next message it closes every connection and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import cast

#: the annotation the writer sets; its value is ``time.time()`` with 6 decimals (17 characters
#: until the year 2286), so the client reads a fixed-width slice after the key
TS_ANNOTATION = "fanout.kproxy.dev/ts"
TS_MARKER = b'"' + TS_ANNOTATION.encode() + b'":"'
TS_WIDTH = 17
#: latency histogram: bucket i holds latencies in [i, i+1) x BUCKET seconds; the last, all above
BUCKET = 1e-4
BUCKETS = 300_000  # 30 s
_CONNECT_TIMEOUT = 60.0


@dataclass
class ClientSpec:
    host: str
    port: int
    #: request target, e.g. ``/api/v1/namespaces/x/pods?watch=1&resourceVersion=5``
    target: str
    watchers: int
    #: TLS: CA file, client certificate and key (the direct peer); None = plain HTTP
    ca: str | None = None
    cert: str | None = None
    key: str | None = None
    #: handshakes in flight at once
    connect_concurrency: int = 50


@dataclass
class Connected:
    ok: int
    #: failures by kind (``HTTP 410``, ``ConnectionRefusedError``, ``timeout`` ...)
    failed: dict[str, int]
    seconds: float


@dataclass
class ClientResult:
    #: events received inside the window (all watchers)
    events: int = 0
    #: events whose timestamp could not be read (not latency samples)
    unreadable: int = 0
    #: bytes of watch payload (chunk framing removed) received inside the window
    payload_bytes: int = 0
    #: sparse latency histogram: bucket index -> count
    histogram: dict[int, int] = field(default_factory=dict)
    #: watchers whose stream ended (or broke) before the window's end, by how
    closed_early: dict[str, int] = field(default_factory=dict)
    #: events inside the window per watcher: the smallest and the largest
    min_per_watcher: int = 0
    max_per_watcher: int = 0
    #: socket reads inside the window that completed at least one event (events / this = the
    #: events one read brought: the server's write coalescing as the client sees it)
    reads_with_events: int = 0


class Stats:
    """Counters shared by every watcher of the process (one event loop: no locks)."""

    def __init__(self) -> None:
        self.start_at = float("inf")
        self.end_at = float("inf")
        self.events = 0
        self.payload_bytes = 0
        self.reads = 0
        self.hist = [0] * BUCKETS
        self.closed_early: Counter[str] = Counter()
        self.unreadable = 0


_HEAD, _BODY, _DONE = 0, 1, 2
#: the chunked encoding's last chunk (after a newline)
_LAST_CHUNK = b"0\r\n\r\n"


class Watcher(asyncio.Protocol):
    """One watch connection: sends the request, checks the head, counts events."""

    def __init__(self, stats: Stats, request: bytes, ready: asyncio.Future[str | None]) -> None:
        self.stats = stats
        self.request = request
        self.ready = ready
        self.transport: asyncio.WriteTransport | None = None
        self.state = _HEAD
        self.head = b""
        #: the bytes after the last newline seen (an incomplete event or chunk-size line)
        self.carry = b""
        self.events = 0
        self.failed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's TLS transport is no asyncio.Transport subclass, but it writes and aborts
        self.transport = cast(asyncio.WriteTransport, transport)
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        if self.state == _BODY:
            self.body(data)
        elif self.state == _HEAD:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, rest = self.head[:end], self.head[end + 4 :]
            self.head = b""
            status = head[9:12]
            if status != b"200":
                self.fail(f"HTTP {status.decode(errors='replace')}")
                return
            if b"transfer-encoding: chunked" not in head.lower():
                self.fail("not chunked")
                return
            self.state = _BODY
            if not self.ready.done():
                self.ready.set_result(None)
            if rest:
                self.body(rest)

    def fail(self, why: str) -> None:
        self.state = _DONE
        self.failed = True
        if not self.ready.done():
            self.ready.set_result(why)
        if self.transport is not None:
            self.transport.close()

    def body(self, data: bytes) -> None:
        """Count the events of the bytes that arrived and read their timestamps.

        The chunked framing is left in place: chunk-size lines sit between events (each server
        here writes an event, or several whole events, per chunk). Every event of the benchmark
        is a pod carrying the writer's annotation once, so the events are counted as their
        timestamps are found (one ``bytes.find`` each; a ``bytes.count`` of a multi-byte needle
        would scan the bytes once more, slower). Bytes after the last newline (a chunk-size line
        or an event line not yet complete) wait for the next read.
        """
        buf = self.carry + data if self.carry else data
        last = buf.rfind(b"\n")
        if last < 0:
            self.carry = buf
            return
        self.carry = buf[last + 1 :]
        if buf.endswith(_LAST_CHUNK) and (len(buf) == len(_LAST_CHUNK) or buf[-len(_LAST_CHUNK) - 1] == 10):
            self.ended()  # the server ended the watch (a slow watcher closed, a timeout)
        now = time.time()
        st = self.stats
        if not st.start_at <= now < st.end_at:
            return
        hist, marker, width = st.hist, TS_MARKER, TS_WIDTH
        skip = len(marker)
        events = 0
        i = buf.find(marker, 0, last)
        while i >= 0:
            events += 1
            i += skip
            try:
                b = int((now - float(buf[i : i + width])) / BUCKET)
            except ValueError:  # a chunk boundary inside the value: not a sample
                st.unreadable += 1
            else:
                hist[b if 0 <= b < BUCKETS else (0 if b < 0 else BUCKETS - 1)] += 1
            i = buf.find(marker, i + width, last)
        if events:
            self.events += events
            st.events += events
            st.payload_bytes += last + 1
            st.reads += 1

    def ended(self) -> None:
        if not self.failed and self.state == _BODY and time.time() < self.stats.end_at:
            self.stats.closed_early["stream ended (last chunk)"] += 1
        self.state = _DONE
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_result(type(exc).__name__ if exc else "closed before the response head")
        if self.state == _BODY and time.time() < self.stats.end_at:
            self.stats.closed_early[type(exc).__name__ if exc else "connection closed"] += 1
        self.state = _DONE


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def recv(conn: Connection) -> object:
    """The parent's next message, without blocking the event loop."""
    loop = asyncio.get_running_loop()
    ready = asyncio.Event()
    loop.add_reader(conn.fileno(), ready.set)
    try:
        while not conn.poll():
            ready.clear()
            await ready.wait()
    finally:
        loop.remove_reader(conn.fileno())
        os.set_blocking(conn.fileno(), True)  # add_reader made it non-blocking; send() must not fail
    return conn.recv()


async def run(spec: ClientSpec, conn: Connection) -> None:
    loop = asyncio.get_running_loop()
    ctx: ssl.SSLContext | None = None
    if spec.ca:
        ctx = ssl.create_default_context(cafile=spec.ca)
        if spec.cert:
            ctx.load_cert_chain(spec.cert, spec.key)
    request = (
        f"GET {spec.target} HTTP/1.1\r\nHost: {spec.host}:{spec.port}\r\nAccept: application/json\r\n"
        "Accept-Encoding: identity\r\nUser-Agent: kproxy-watchfanout-bench\r\n\r\n"
    ).encode()
    stats = Stats()
    watchers: list[Watcher] = []
    failed: Counter[str] = Counter()
    sem = asyncio.Semaphore(spec.connect_concurrency)

    async def connect() -> None:
        async with sem:
            ready: asyncio.Future[str | None] = loop.create_future()
            w = Watcher(stats, request, ready)
            try:
                async with asyncio.timeout(_CONNECT_TIMEOUT):
                    await loop.create_connection(lambda: w, spec.host, spec.port, ssl=ctx)
                    why = await ready
            except (OSError, TimeoutError, ssl.SSLError) as e:
                why = "timeout" if isinstance(e, TimeoutError) else type(e).__name__
                if w.transport is not None:
                    w.transport.close()
            if why is None:
                watchers.append(w)
            else:
                failed[why] += 1

    t0 = time.monotonic()
    await asyncio.gather(*(connect() for _ in range(spec.watchers)))
    conn.send(Connected(len(watchers), dict(failed), time.monotonic() - t0))

    window = await recv(conn)
    assert isinstance(window, tuple)
    stats.start_at, stats.end_at = window
    await asyncio.sleep(max(0.0, stats.end_at - time.time()) + 0.05)
    per = sorted(w.events for w in watchers) or [0]
    res = ClientResult(
        events=stats.events,
        unreadable=stats.unreadable,
        payload_bytes=stats.payload_bytes,
        histogram={i: c for i, c in enumerate(stats.hist) if c},
        closed_early=dict(stats.closed_early),
        min_per_watcher=per[0],
        max_per_watcher=per[-1],
        reads_with_events=stats.reads,
    )
    conn.send(res)
    await recv(conn)  # "close"
    for w in watchers:
        if w.transport is not None:
            w.transport.abort()
    await asyncio.sleep(0)


def client_main(spec: ClientSpec, conn: Connection) -> None:
    """Entry point of one watcher process (``multiprocessing`` spawn target)."""
    import uvloop

    raise_nofile()
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(run(spec, conn))
