"""kproxy's watch fan-out on one core, with the upstream replaced by events injected at a set rate.

    python -m benchmarks.fanout_engine [--watchers 1000] [--rate 500] [--batches 1,5,10]
                                       [--sizes 300,1600] [--duration 8] [--procs 2] [--output FILE]

The goal "kproxy sustains at least 500,000 deliveries/s on one core" (docs/performance.md#watch-fan-out), measured as
perf-notes measured its 1.4M/s for raw coalesced writes: one server process (uvloop, aiohttp's
low-level server), ``--watchers`` HTTP/1.1 watch connections on loopback from ``--procs`` client
processes that only count the bytes they receive, and events arriving ``--batch`` at a time
(``--rate`` events/s in all). Two peers, measured in the same run on the same connections:

* ``kproxy``: the real path of a cached watch: ``WatchCache.apply`` -> ``Broadcaster`` (one
  group, frames made once per event by ``FrameEncoder``, queued, one write per watcher per loop
  pass) -> ``TransportSink`` (HTTP chunked framing) -> the transport, served by ``serve_events``;
* ``raw``: perf-notes' method: each batch framed once and the same bytes written to every
  connection with ``transport.write``, nothing else.

Reported: deliveries/s (kproxy's own count: events handed to transports), the server process's
CPU (``benchmarks.lib.procs.self_cpu_seconds``, so the loopback TCP work its send calls do is included), deliveries per
CPU-second, and what the clients received (so nothing is counted that was not delivered).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import uvloop
from aiohttp import web

from benchmarks.lib.procs import self_cpu_seconds
from kproxy.cacher import MODIFIED, CachedObject, Kind, WatchCache
from kproxy.cacher.broadcaster import Broadcaster, NoCounters, Selection
from kproxy.codec import ProtobufCodec
from kproxy.core.eventstream import EventStreamBody, serve_events
from kproxy.core.negotiation import JSON
from kproxy.filters.watchcache.frames import FrameEncoder

KIND = Kind("example.com/v1", "Widget", "WidgetList", protobuf=False)


def _object(rv: int, size: int) -> CachedObject:
    head = b'{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w","namespace":"ns",'
    head += b'"resourceVersion":"' + str(rv).encode() + b'"},"spec":{"pad":"'
    pad = b"x" * max(size - len(head) - 4 - 35, 0)  # the event frame around it is ~35 bytes
    return CachedObject("ns/w", "ns", "w", rv, {}, {}, json=head + pad + b'"}}')


class _Counts(NoCounters):
    def __init__(self) -> None:
        self.deliveries = 0
        self.writes = 0

    def delivered(self, deliveries: int, writes: int, coalesced: int) -> None:
        self.deliveries += deliveries
        self.writes += writes


# ------------------------------------------------------------------------------------ clients
class _Drain(asyncio.BufferedProtocol):
    def __init__(self, counter: list[int]) -> None:
        self.buf = bytearray(1 << 18)
        self.counter = counter

    def get_buffer(self, sizehint: int) -> bytearray:
        return self.buf

    def buffer_updated(self, nbytes: int) -> None:
        self.counter[0] += nbytes


def _client(port: int, count: int, conn: Connection) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))

    async def run() -> None:
        loop = asyncio.get_running_loop()
        received = [0]
        transports = []
        for _ in range(count):
            t, _ = await loop.create_connection(lambda: _Drain(received), "127.0.0.1", port)
            t.write(b"GET /watch HTTP/1.1\r\nHost: x\r\n\r\n")
            transports.append(t)
        conn.send("connected")
        while True:
            msg = await loop.run_in_executor(None, conn.recv)
            if msg == "count":
                conn.send(received[0])
            elif msg == "stop":
                for t in transports:
                    t.close()
                return

    uvloop.run(run())


# ------------------------------------------------------------------------------------ server
@dataclass
class Result:
    peer: str
    batch: int
    size: int
    deliveries_per_s: float
    cpu: float
    received_mb_s: float
    events_per_write: float

    @property
    def per_cpu_second(self) -> float:
        return self.deliveries_per_s / self.cpu if self.cpu else 0.0


class Server:
    def __init__(self, watchers: int) -> None:
        self.watchers = watchers
        self.cache = WatchCache(KIND)
        self.cache.replace([_object(1, 300)], 1)
        self.counts = _Counts()
        self.frames = FrameEncoder(KIND, ProtobufCodec())
        self.broadcaster = Broadcaster(self.cache, self.frames, buffer=1000, counters=self.counts)
        self.raw: list[Any] = []
        self.connected = asyncio.Event()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        body = EventStreamBody(JSON, self._start)
        await serve_events(request, resp, body)
        return resp

    def _start(self, sink: Any, coding: Any) -> Callable[[], None]:
        w = self.broadcaster.watch_since(
            sink, Selection(), JSON, bookmarks=False, timeout=3600, rv=self.cache.rv, coding=coding
        )
        self.raw.append(sink)
        if len(self.raw) == self.watchers:
            self.connected.set()
        return lambda: self.broadcaster.close(w)

    async def measure(self, peer: str, rate: float, batch: int, size: int, duration: float) -> tuple[int, float]:
        """Inject ``rate`` events/s, ``batch`` per loop pass, for ``duration`` s; deliveries and CPU."""
        interval = batch / rate
        loop = asyncio.get_running_loop()
        rv = self.cache.rv
        start_deliveries = self.counts.deliveries
        raw_deliveries = 0
        cpu0 = self_cpu_seconds()
        t0 = loop.time()
        nxt = t0
        while True:
            now = loop.time()
            if now - t0 >= duration:
                break
            if now < nxt:
                await asyncio.sleep(nxt - now)
                continue
            nxt += interval
            if peer == "kproxy":
                for _ in range(batch):
                    rv += 1
                    self.cache.apply(MODIFIED, _object(rv, size))
            else:
                frames = []
                for _ in range(batch):
                    rv += 1
                    frames.append(b'{"type":"MODIFIED","object":' + _object(rv, size).item_json + b"}\n")
                data = b"".join(frames)
                for sink in self.raw:
                    sink.write(data)
                raw_deliveries += batch * len(self.raw)
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)  # the last flush
        cpu = self_cpu_seconds() - cpu0
        self.cache.history.expire()
        if peer == "kproxy":
            return self.counts.deliveries - start_deliveries, cpu
        return raw_deliveries, cpu


async def _server_main(args: argparse.Namespace) -> list[Result]:
    resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
    server = Server(args.watchers)
    # The watches never end by themselves: cleanup waits 1 s for them, not the default 60.
    runner = web.ServerRunner(web.Server(server.handle), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    ctx = multiprocessing.get_context("spawn")
    clients = []
    per = -(-args.watchers // args.procs)
    left = args.watchers
    for _ in range(args.procs):
        n = min(per, left)
        left -= n
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_client, args=(port, n, child), daemon=True)
        p.start()
        clients.append((p, parent))
    loop = asyncio.get_running_loop()
    for _, c in clients:
        await loop.run_in_executor(None, c.recv)
    await asyncio.wait_for(server.connected.wait(), 60)

    async def received() -> int:
        total = 0
        for _, c in clients:
            c.send("count")
            total += await loop.run_in_executor(None, c.recv)
        return total

    results = []
    for size in args.sizes:
        for batch in args.batches:
            for peer in ("raw", "kproxy"):
                writes0 = server.counts.writes
                deliveries0 = server.counts.deliveries
                before = await received()
                deliveries, cpu = await server.measure(peer, args.rate * 1.0, batch, size, args.duration)
                after = await received()
                writes = server.counts.writes - writes0
                per_write = (server.counts.deliveries - deliveries0) / writes if writes else float(batch)
                results.append(
                    Result(
                        peer,
                        batch,
                        size,
                        deliveries / args.duration,
                        cpu / args.duration,
                        (after - before) / args.duration / 1e6,
                        per_write,
                    )
                )
    for _, c in clients:
        c.send("stop")
    for p, _ in clients:
        p.join(10)
    await runner.cleanup()
    return results


def report(args: argparse.Namespace, results: list[Result]) -> str:
    lines = [
        f"# kproxy watch fan-out engine ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"{args.watchers} watchers on loopback ({args.procs} client processes counting bytes), events injected "
        f"at {args.rate}/s in all (offered: {args.rate * args.watchers:,} deliveries/s), {args.duration} s per row; "
        f"2 CPUs, load average {os.getloadavg()[0]:.2f} at the end. `raw` = each batch framed once and written "
        "to every connection (perf-notes' method); `kproxy` = WatchCache -> Broadcaster -> TransportSink.",
        "",
        "| event bytes | events per pass | peer | deliveries/s | server CPU (cores) | deliveries per CPU-s "
        "| received MB/s | events per write |",
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r.size} | {r.batch} | {r.peer} | {r.deliveries_per_s:,.0f} | {r.cpu:.2f} | "
            f"**{r.per_cpu_second:,.0f}** | {r.received_mb_s:,.1f} | {r.events_per_write:.1f} |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--watchers", type=int, default=1000)
    p.add_argument("--rate", type=int, default=500, help="events/s injected (each to every watcher)")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 5, 10])
    p.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], default=[300, 1600])
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--output", type=Path)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = uvloop.run(_server_main(args))
    text = report(args, results)
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
