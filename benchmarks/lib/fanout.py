"""The watch fan-out harness: watcher processes, a writer process, and the CPU, memory and
kproxy metrics of one measurement window. ``benchmarks.watchfanout`` (HTTP/1.1 watchers) and
``benchmarks.http2`` (h2 watchers) drive it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path

import aiohttp
import orjson

from benchmarks.lib.cluster import metric_samples, start_kproxy
from benchmarks.lib.common import BenchError, log
from benchmarks.lib.procs import Process, cpu_seconds, machine_busy_seconds, rss_bytes
from benchmarks.lib.report import ms as _ms
from benchmarks.lib.stats import bucket_percentile
from benchmarks.lib.watch_client import BUCKET, TS_ANNOTATION, ClientResult, ClientSpec, Connected, client_main
from benchmarks.lib.watch_writer import FIELD_MANAGER, WriterResult, WriterSpec, writer_main
from kproxy.localcluster import envtest

NAMESPACE = "bench-fanout"
PODS_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"
DIRECT, KPROXY, BASELINE = "direct", "kproxy", "writer only"
_FILTERS = [{"name": "watchcache", "resources": ["pods"]}]
_CONNECT_TIMEOUT = 300.0
SPAWN = multiprocessing.get_context("spawn")


def _pods(labels: dict[str, str]) -> bool:
    return labels.get("resource") == "pods"


# --------------------------------------------------------------------------- one measurement


@dataclass
class Row:
    """One (watchers, peer, writer mode) measurement."""

    peer: str
    watchers: int
    #: patches/s asked (None: as fast as possible) and writer connections
    rate: float | None
    writers: int
    window: float = 0.0
    connected: int = 0
    connect_failed: Counter[str] = field(default_factory=Counter)
    connect_s: float = 0.0
    writer: WriterResult = field(default_factory=WriterResult)
    events: int = 0
    unreadable: int = 0
    payload_bytes: int = 0
    reads: int = 0
    hist: Counter[int] = field(default_factory=Counter)
    closed_early: Counter[str] = field(default_factory=Counter)
    min_per_watcher: int = 0
    max_per_watcher: int = 0
    #: CPU seconds over the window: apiserver, etcd, kproxy, clients, writer, runner, machine
    cpu: dict[str, float] = field(default_factory=dict)
    kproxy_rss_before: int = 0
    kproxy_rss_max: int = 0
    apiserver_rss_max: int = 0
    #: kproxy metric deltas over the window (name -> value), pods only
    metrics: dict[str, float] = field(default_factory=dict)
    #: kproxy watches of pods counted as served from the cache / passed upstream, from connect to end
    served_cache: float = 0.0
    served_upstream: float = 0.0
    #: the load average when the measurement started
    load: float = 0.0

    def cores(self, who: str) -> float:
        return self.cpu.get(who, float("nan")) / self.window if self.window else float("nan")

    @property
    def deliveries(self) -> float:
        return self.events / self.window if self.window else 0.0

    @property
    def served(self) -> float:
        """Deliveries/s by kproxy's own count (events it wrote in the window), else the watchers' count."""
        n = self.metrics.get("kproxy_watchcache_deliveries_total")
        return n / self.window if n is not None and self.window else self.deliveries

    @property
    def writes(self) -> float:
        return self.writer.patches / self.window if self.window else 0.0

    @property
    def api_ms_per_write(self) -> float:
        """The apiserver's CPU per patch: the writes' own cost plus every watcher's share of each."""
        return (
            self.cpu.get("apiserver", float("nan")) * 1000 / self.writer.patches
            if self.writer.patches
            else float("nan")
        )

    def latency(self, q: float) -> float:
        """Nearest-rank percentile of the delivery latencies, upper edge of its bucket, seconds."""
        return bucket_percentile(self.hist, q, BUCKET)

    @property
    def others(self) -> float:
        """Cores the rest of the machine (other helpers' work) used during the window."""
        ours = sum(v for k, v in self.cpu.items() if k != "machine")
        return max(0.0, self.cpu.get("machine", 0.0) - ours) / self.window if self.window else float("nan")

    def problems(self) -> list[str]:
        out = []
        if self.connected < self.watchers:
            out.append(f"{self.watchers - self.connected} watchers did not connect ({dict(self.connect_failed)})")
        if self.peer == KPROXY and self.served_cache < self.connected:
            out.append(
                f"kproxy served {self.served_cache:.0f} of {self.connected} watches from its cache "
                f"({self.served_upstream:.0f} passed to the apiserver)"
            )
        if self.watchers and not self.events:
            out.append("no events received")
        if self.unreadable:
            out.append(f"{self.unreadable} of {self.events} events with an unreadable timestamp")
        if self.writer.errors:
            out.append(f"writer errors {self.writer.errors}")
        return out


class Bench:
    def __init__(self, args: argparse.Namespace, cp: envtest.ControlPlaneInfo, kproxy: Process, admin: str) -> None:
        assert cp.apiserver_pid is not None
        self.args = args
        self.cp = cp
        self.kproxy = kproxy
        self.kproxy_pid = kproxy.proc.pid
        self.kproxy_url = ""
        self.admin = admin
        self.session = aiohttp.ClientSession(
            base_url=cp.server,
            connector=aiohttp.TCPConnector(ssl=cp.ssl_context()),
            timeout=aiohttp.ClientTimeout(total=120),
        )
        self.plain = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
        self.pod_names: list[str] = []

    async def close(self) -> None:
        await self.session.close()
        await self.plain.close()

    async def metrics(self) -> list[tuple[str, dict[str, str], float]]:
        return await metric_samples(self.plain, self.admin)

    async def pod_metric(self, name: str, **want: str) -> float:
        return sum(
            v
            for n, labels, v in await self.metrics()
            if n == name and _pods(labels) and all(labels.get(k) == x for k, x in want.items())
        )

    async def resource_version(self) -> str:
        async with self.session.get(PODS_PATH, params={"limit": "1"}) as r:
            if r.status != 200:
                raise BenchError(f"LIST {PODS_PATH}: {r.status} {await r.text()}")
            return str((await r.json())["metadata"]["resourceVersion"])

    # ------------------------------------------------------------------ seeding

    async def seed(self, count: int) -> None:
        """Namespace ``bench-fanout`` with exactly ``count`` small pods ``fanout-NNN`` (kept between runs)."""
        s = self.session
        async with s.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}}) as r:
            if r.status not in (201, 409):
                raise BenchError(f"creating namespace {NAMESPACE}: {r.status} {await r.text()}")
        async with s.get(PODS_PATH) as r:
            have = {item["metadata"]["name"] for item in (await r.json())["items"]}
        self.pod_names = [f"fanout-{i:04d}" for i in range(count)]
        sem = asyncio.Semaphore(16)

        async def create(name: str) -> None:
            manifest = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "labels": {"app": "fanout"}, "annotations": {TS_ANNOTATION: "0"}},
                "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
            }
            async with (
                sem,
                s.post(
                    PODS_PATH,
                    params={"fieldManager": FIELD_MANAGER},
                    data=orjson.dumps(manifest),
                    headers={"Content-Type": "application/json"},
                ) as r,
            ):
                if r.status != 201:
                    raise BenchError(f"creating pod {name}: {r.status} {await r.text()}")

        missing = [n for n in self.pod_names if n not in have]
        if missing:
            log(f"creating {len(missing)} pods in {NAMESPACE} ...")
            await asyncio.gather(*(create(n) for n in missing))

    async def wait_cache_ready(self) -> None:
        """Until kproxy's pod cache holds the bench pods."""
        deadline = time.monotonic() + 120
        while True:
            samples = await self.metrics()
            objects = sum(v for n, lb, v in samples if n == "kproxy_watchcache_objects" and _pods(lb))
            if objects >= len(self.pod_names):
                return
            if time.monotonic() > deadline:
                raise BenchError(f"kproxy's pod cache not ready (objects={objects})")
            await asyncio.sleep(0.2)

    # ------------------------------------------------------------------ measuring

    def client_specs(self, peer: str, watchers: int, target: str) -> list[ClientSpec]:
        procs = min(self.args.procs, watchers)
        specs = []
        for i in range(procs):
            n = watchers // procs + (1 if i < watchers % procs else 0)
            if peer == DIRECT:
                cp = self.cp
                spec = ClientSpec("127.0.0.1", cp.apiserver_port, target, n, str(cp.ca_file))
                spec.cert, spec.key = str(cp.admin_cert), str(cp.admin_key)
            else:
                host, port = self.kproxy_url.removeprefix("http://").rsplit(":", 1)
                spec = ClientSpec(host, int(port), target, n)
            specs.append(spec)
        return specs

    async def measure(self, peer: str, watchers: int, rate: float | None, writers: int) -> Row:
        args = self.args
        row = Row(peer, watchers, rate, writers, load=os.getloadavg()[0])
        rv = await self.resource_version()
        target = f"{PODS_PATH}?watch=1&resourceVersion={rv}"
        served0 = await self.watch_reads() if peer == KPROXY else (0.0, 0.0)
        row.kproxy_rss_before = rss_bytes(self.kproxy_pid)
        clients: list[tuple[BaseProcess, Connection]] = []
        writer: tuple[BaseProcess, Connection] | None = None
        try:
            for spec in self.client_specs(peer, watchers, target):
                parent, child = SPAWN.Pipe()
                cproc = SPAWN.Process(target=client_main, args=(spec, child), daemon=True)
                cproc.start()
                child.close()  # so that the child's death reads as EOF here
                clients.append((cproc, parent))
            t0 = time.monotonic()
            for _, conn in clients:
                msg = await recv_timeout(conn, _CONNECT_TIMEOUT)
                assert isinstance(msg, Connected)
                row.connected += msg.ok
                row.connect_failed.update(msg.failed)
            row.connect_s = time.monotonic() - t0
            if peer == KPROXY:
                cache, upstream = await self.watch_reads()
                row.served_cache, row.served_upstream = cache - served0[0], upstream - served0[1]
            log(
                f"{peer}: {row.connected}/{watchers} watchers connected in {row.connect_s:.1f} s"
                + (f" ({dict(row.connect_failed)})" if row.connect_failed else "")
                + (f"; served from the cache: {row.served_cache:.0f}" if peer == KPROXY else "")
            )

            wspec = WriterSpec(
                self.cp.server,
                str(self.cp.ca_file),
                str(self.cp.admin_cert),
                str(self.cp.admin_key),
                NAMESPACE,
                self.pod_names,
                rate,
                writers,
            )
            parent, child = SPAWN.Pipe()
            wproc = SPAWN.Process(target=writer_main, args=(wspec, child), daemon=True)
            wproc.start()
            child.close()
            writer = (wproc, parent)
            await recv_timeout(parent, 60)
            start_at = time.time() + args.warmup
            end_at = start_at + args.duration
            for _, conn in [*clients, writer]:
                conn.send((start_at, end_at))

            pids = {
                "apiserver": self.cp.apiserver_pid or 0,
                "etcd": self.cp.etcd_pid or 0,
                "kproxy": self.kproxy_pid,
                "writer": wproc.pid or 0,
                "runner": os.getpid(),
                **{f"client{i}": p.pid or 0 for i, (p, _) in enumerate(clients)},
            }
            await asyncio.sleep(max(0.0, start_at - time.time()))
            c0 = {k: cpu_seconds(p) for k, p in pids.items()}
            m0 = machine_busy_seconds()
            t_start = time.monotonic()
            metrics0 = await self.metric_totals()
            while time.time() < end_at:
                row.kproxy_rss_max = max(row.kproxy_rss_max, rss_bytes(self.kproxy_pid))
                row.apiserver_rss_max = max(row.apiserver_rss_max, rss_bytes(self.cp.apiserver_pid or 0))
                await asyncio.sleep(min(0.5, max(0.0, end_at - time.time())))
            c1 = {k: cpu_seconds(p) for k, p in pids.items()}
            m1 = machine_busy_seconds()
            row.window = time.monotonic() - t_start
            metrics1 = await self.metric_totals()
            row.metrics = {k: metrics1[k] - metrics0.get(k, 0.0) for k in metrics1}
            cpu = {k: c1[k] - c0[k] for k in pids}
            row.cpu = {
                "apiserver": cpu["apiserver"],
                "etcd": cpu["etcd"],
                "kproxy": cpu["kproxy"],
                "writer": cpu["writer"],
                "runner": cpu["runner"],
                "clients": sum(v for k, v in cpu.items() if k.startswith("client")),
                "machine": m1 - m0,
            }
            row.window = args.duration  # the clients count exactly [start_at, end_at)

            mins, maxs = [], []
            for _, conn in clients:
                res = await recv_timeout(conn, 60)
                assert isinstance(res, ClientResult)
                row.events += res.events
                row.unreadable += res.unreadable
                row.payload_bytes += res.payload_bytes
                row.reads += res.reads_with_events
                row.hist.update(res.histogram)
                row.closed_early.update(res.closed_early)
                mins.append(res.min_per_watcher)
                maxs.append(res.max_per_watcher)
            row.min_per_watcher, row.max_per_watcher = min(mins, default=0), max(maxs, default=0)
            wres = await recv_timeout(writer[1], 60)
            assert isinstance(wres, WriterResult)
            row.writer = wres
        finally:
            children = [*clients, *([writer] if writer else [])]
            for _, conn in children:
                with contextlib.suppress(OSError):
                    conn.send("stop")
            for child_proc, _ in children:
                await asyncio.to_thread(child_proc.join, 30)
                if child_proc.is_alive():
                    child_proc.kill()
                    await asyncio.to_thread(child_proc.join)
        if peer == KPROXY:
            await self.wait_watches_closed()
        log(
            f"{peer} {watchers} watchers: {row.writes:.0f} writes/s, {row.deliveries:,.0f} deliveries/s, "
            f"p50 {_ms(row.latency(50))} ms, p99 {_ms(row.latency(99))} ms, apiserver {row.cores('apiserver'):.2f} "
            f"cores, kproxy {row.cores('kproxy'):.2f} cores, clients {row.cores('clients'):.2f} cores"
            + (f"; closed early {dict(row.closed_early)}" if row.closed_early else "")
        )
        return row

    async def watch_reads(self) -> tuple[float, float]:
        """kproxy's pod watches so far: (served from the cache, passed to the apiserver)."""
        cache = upstream = 0.0
        for n, labels, v in await self.metrics():
            if n == "kproxy_watchcache_reads_total" and _pods(labels) and labels.get("verb") == "watch":
                if labels.get("served") == "cache":
                    cache += v
                else:
                    upstream += v
        return cache, upstream

    async def metric_totals(self) -> dict[str, float]:
        """kproxy's watch fan-out counters for pods (sums over other labels)."""
        out: dict[str, float] = {}
        for n, labels, v in await self.metrics():
            if n.startswith("kproxy_watchcache_") and n.endswith("_total") and _pods(labels):
                out[n] = out.get(n, 0.0) + v
        return out

    async def wait_watches_closed(self) -> None:
        """Until kproxy counts no open pod watch (its gauge), so the next measurement starts clean."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            samples = await self.metrics()
            open_ = [v for n, lb, v in samples if n == "kproxy_watchcache_watches" and _pods(lb)]
            if not open_ or sum(open_) == 0:
                return
            await asyncio.sleep(0.2)
        log("kproxy still counts open pod watches after 60 s")


async def recv_timeout(conn: Connection, timeout: float) -> object:
    from benchmarks.lib.watch_client import recv

    try:
        async with asyncio.timeout(timeout):
            return await recv(conn)
    except TimeoutError:
        raise BenchError(f"a child process did not answer within {timeout:.0f} s") from None
    except EOFError:
        raise BenchError("a child process exited before answering (its traceback is above)") from None


@contextlib.contextmanager
def kproxy_with_cache(work: Path, cp: envtest.ControlPlaneInfo) -> Iterator[tuple[Process, str, str]]:
    proc, peer = start_kproxy(work, cp, _FILTERS)
    try:
        yield proc, peer.base_url, peer.admin_url
    finally:
        proc.stop()
