"""HTTP/2 against HTTP/1.1 through kproxy, and against the apiserver's own h2, in one run.

    python -m benchmarks.http2 [--envtest-dir DIR] [--duration 5] [--watchers 1000] [--clients 10]
                               [--rate 10] [--parts requests,fanout,memory] [--h2-per-connection]
                               [--output FILE]

Every kproxy here is ``kproxy run`` on its TLS listener (ALPN ``h2``, ``http/1.1``), ``credentials:
proxy``, with ``upstream.http2`` true (h2 to the apiserver, multiplexed) or false (the HTTP/1.1 pool).

1. **Requests** (``h2load``, nghttp2's C load generator, one process per measurement; ``--h1`` for
   HTTP/1.1): a small GET and a LIST of 500 ConfigMaps (``benchmarks.proxies``' data, namespace
   ``bench``), closed loop. Over h2 the client holds one connection with ``--concurrency-*``
   streams (as client-go multiplexes), over HTTP/1.1 ``--concurrency-*`` connections; with
   ``--h2-per-connection`` also over h2 as many connections of one stream each. Peers: kproxy
   (both upstream settings) and the kube-apiserver itself (Go's h2; bearer token). req/s, mean
   latency, and CPU ms per request of kproxy, the apiserver, etcd and h2load over the window.
2. **Watch fan-out from the watch cache** (``filters: [{name: watchcache, resources: [pods]}]``):
   ``--watchers`` pod watches, over HTTP/1.1 one TLS connection each
   (``benchmarks.lib.watch_client``), over h2 ``--clients`` connections of watchers/clients
   streams each (``benchmarks.lib.h2_watch_client``); ``benchmarks.lib.watch_writer`` patches the pods
   at ``--rate`` patches/s. kproxy CPU µs per delivery. A fresh kproxy per protocol, whose RSS
   growth with the watches open (before the writer starts) is the memory of an idle cached watch.
3. **Memory and connections**: on a fresh kproxy each (empty chain), its RSS growth (``VmRSS``)
   with ``--watchers`` idle pod watches passed through to the apiserver, per client protocol and
   upstream setting; the TCP connections it holds from clients and to the apiserver then (its
   sockets in ``/proc/<pid>/fd`` matched in ``/proc/<pid>/net/tcp``); and over h2, the RSS of
   ``--watchers`` idle connections (no stream) and of ``--watchers`` streams whose request body is
   still arriving (``--clients`` connections).

The control plane is started in a temporary directory and stopped at the end unless
``--envtest-dir`` names one of ``kproxy envtest up``. Exit 0 when everything ran cleanly, 1 when a
measurement had errors, 2 when the benchmark could not be set up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.lib.cluster import control_plane
from benchmarks.lib.common import BenchError, k8s_server_version, log, machine_line, work_dir
from benchmarks.lib.data import CONFIGMAP_NAMESPACE as NAMESPACE
from benchmarks.lib.data import CONFIGMAPS, GET_NAME, seed_configmaps
from benchmarks.lib.fanout import NAMESPACE as FANOUT_NAMESPACE
from benchmarks.lib.fanout import PODS_PATH, SPAWN, Bench, recv_timeout
from benchmarks.lib.h2_watch_client import H2ClientSpec
from benchmarks.lib.h2_watch_client import client_main as h2_client_main
from benchmarks.lib.h2load import argv as h2load_argv
from benchmarks.lib.h2load import parse as parse_h2load
from benchmarks.lib.procs import Process, cpu_seconds, cpu_seconds_or, machine_busy_seconds, rss_bytes
from benchmarks.lib.report import ratio as _ratio
from benchmarks.lib.watch_client import ClientResult, ClientSpec, Connected
from benchmarks.lib.watch_client import client_main as h1_client_main
from benchmarks.lib.watch_writer import WriterResult, WriterSpec, writer_main
from kproxy.localcluster import envtest
from kproxy.testing.proxyproc import RunningProxy, start_proxy
from kproxy.testing.sockets import tcp_connections

H1, H2 = "HTTP/1.1", "h2"
_T = TypeVar("_T")
_CACHE_FILTERS = [{"name": "watchcache", "resources": ["pods"]}]
_LOG = {"level": "warning", "access_log": False}
_CONNECT_TIMEOUT = 300.0
#: the goals: kproxy's CPU per request over h2 at most 1.15x its CPU over HTTP/1.1; an idle h2 watch at most 45 KiB
GOAL_CPU_RATIO = 1.15
GOAL_WATCH_KIB = 45.0


# --------------------------------------------------------------------------- processes and sockets


def kproxy(
    work: Path, cp: envtest.ControlPlaneInfo, name: str, upstream_h2: bool, filters: Sequence[Any] = ()
) -> RunningProxy:
    """``kproxy run`` on TLS (h2 and HTTP/1.1 by ALPN), proxy credentials, the given upstream protocol."""
    return start_proxy(
        work / name,
        cp.admin_kubeconfig,
        tls=True,
        extra={"log": _LOG, "upstream": {"http2": upstream_h2}, "filters": list(filters)},
    )


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def h2load(url: str, proto: str, connections: int, streams: int, extra: Sequence[str] = ()) -> list[str]:
    headers = ["Accept: application/json", "Accept-Encoding: identity", "User-Agent: kproxy-http2-bench"]
    return h2load_argv(url, proto == H1, connections, streams, extra, headers)


async def warm(url: str, token: str | None = None) -> None:
    """A few requests of each protocol (the state kproxy keeps after its first requests)."""
    auth = ["-H", f"Authorization: Bearer {token}"] if token else []
    for proto in (H1, H2):
        proc = await asyncio.create_subprocess_exec(
            *h2load(url, proto, 1, 1, ["-n", "10", *auth]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        await proc.wait()


# --------------------------------------------------------------------------- 1. requests


@dataclass
class LoadRow:
    scenario: str
    peer: str
    proto: str
    upstream: str
    connections: int
    streams: int
    ok: int = 0
    failed: int = 0
    statuses: str = ""
    rps: float = 0.0
    mean_ms: float = float("nan")
    bytes_per_response: float = 0.0
    #: CPU seconds over the sampled part of the window, and its length
    cpu: dict[str, float] = field(default_factory=dict)
    sampled: float = 0.0
    #: requests completed in the sampled part (estimated from req/s)
    sampled_requests: float = 0.0
    error: str = ""
    rounds: int = 0

    def cpu_ms(self, who: str) -> float:
        n = self.sampled_requests
        return self.cpu.get(who, float("nan")) * 1000 / n if n else float("nan")

    def pool(self, r: LoadRow) -> None:
        """Add another round's measurement of the same row."""
        n = self.rounds
        self.rounds += 1
        self.ok += r.ok
        self.failed += r.failed
        self.statuses = "; ".join(x for x in (self.statuses, r.statuses) if x)
        self.error = self.error or r.error
        self.rps = (self.rps * n + r.rps) / (n + 1)
        if r.mean_ms == r.mean_ms:
            self.mean_ms = r.mean_ms if n == 0 else (self.mean_ms * n + r.mean_ms) / (n + 1)
        self.bytes_per_response = r.bytes_per_response or self.bytes_per_response
        for k, v in r.cpu.items():
            self.cpu[k] = self.cpu.get(k, 0.0) + v
        self.sampled += r.sampled
        self.sampled_requests += r.sampled_requests

    @property
    def others(self) -> float:
        ours = sum(v for k, v in self.cpu.items() if k != "machine")
        return max(0.0, self.cpu.get("machine", 0.0) - ours) / self.sampled if self.sampled else float("nan")


async def measure_load(
    row: LoadRow, url: str, pids: dict[str, int], duration: float, warmup: float, token: str | None
) -> LoadRow:
    extra = ["-D", f"{duration:g}", "--warm-up-time", f"{warmup:g}"]
    if token:
        extra += ["-H", f"Authorization: Bearer {token}"]
    argv = h2load(url, row.proto, row.connections, row.streams, extra)
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(*argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pids = {**pids, "h2load": proc.pid}
    # h2load connects, then warms up, then measures ``duration``: sample inside its window.
    await asyncio.sleep(max(0.0, t0 + warmup + 0.2 - time.monotonic()))
    c0 = {k: cpu_seconds(p) for k, p in pids.items()}
    m0 = machine_busy_seconds()
    s0 = time.monotonic()
    await asyncio.sleep(max(0.0, t0 + warmup + duration - 0.1 - time.monotonic()))
    c1 = {k: cpu_seconds(p) for k, p in pids.items() if k != "h2load"}
    c1["h2load"] = cpu_seconds_or(pids["h2load"], c0["h2load"])
    m1 = machine_busy_seconds()
    row.sampled = time.monotonic() - s0
    out, err = await proc.communicate()
    text = out.decode(errors="replace")
    row.cpu = {k: c1[k] - c0[k] for k in c1} | {"machine": m1 - m0}
    summary = parse_h2load(text)
    if proc.returncode != 0 or summary is None:
        row.error = f"h2load exit {proc.returncode}: {(text + err.decode(errors='replace'))[-400:]}"
        return row
    row.ok = summary.status_2xx
    row.failed = summary.failed + summary.errored + summary.status_other
    if row.failed:
        row.statuses = summary.lines
    row.rps = row.ok / duration
    row.sampled_requests = row.rps * row.sampled
    if summary.data_bytes is not None and summary.done:
        row.bytes_per_response = summary.data_bytes / summary.done
    row.mean_ms = summary.mean_ms
    return row


async def requests_part(
    args: argparse.Namespace, cp: envtest.ControlPlaneInfo, proxies: dict[str, RunningProxy]
) -> list[LoadRow]:
    ns = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    scenarios = [
        ("GET 1 ConfigMap", f"{ns}/{GET_NAME}", args.concurrency_get),
        (f"LIST {CONFIGMAPS}", ns, args.concurrency_list),
    ]
    cp_pids = {"apiserver": cp.apiserver_pid or 0, "etcd": cp.etcd_pid or 0}
    pooled: dict[tuple[str, str, str, str, int, int], LoadRow] = {}
    for scenario, path, c in scenarios:
        plan: list[tuple[str, str, str, int, int, str, dict[str, int], str | None]] = []
        for upstream, rp in proxies.items():
            pids = {**cp_pids, "kproxy": rp.proc.pid}
            plan.append(("kproxy", H2, upstream, 1, c, rp.url, pids, None))
            plan.append(("kproxy", H1, upstream, c, 1, rp.url, pids, None))
            if args.h2_per_connection:
                plan.append(("kproxy", H2, upstream, c, 1, rp.url, pids, None))
        plan.append(("apiserver", H2, "-", 1, c, cp.server, dict(cp_pids), cp.admin_token))
        plan.append(("apiserver", H1, "-", c, 1, cp.server, dict(cp_pids), cp.admin_token))
        for rnd, (peer, proto, upstream, conns, streams, base, pids, token) in rounds(plan, args.rounds):
            row = LoadRow(scenario, peer, proto, upstream, conns, streams)
            await measure_load(row, base + path, pids, args.duration, args.warmup, token)
            key = (scenario, peer, proto, upstream, conns, streams)
            pooled.setdefault(key, LoadRow(*key)).pool(row)
            log(
                f"{scenario:<16} {peer:<9} {proto:<8} up {upstream:<8} {conns}x{streams}: {row.rps:7.0f} req/s, "
                f"kproxy {row.cpu_ms('kproxy'):.3f} ms/req, apiserver {row.cpu_ms('apiserver'):.3f} ms/req"
                + (f"  ERRORS {row.statuses or row.error}" if row.failed or row.error else "")
                + f"  [round {rnd + 1}]"
            )
    return list(pooled.values())


def rounds(plan: Sequence[_T], n: int) -> Iterator[tuple[int, _T]]:
    """The plan ``n`` times, rotated by one each round (so no peer always runs first)."""
    for rnd in range(n):
        k = rnd % len(plan)
        for item in [*plan[k:], *plan[:k]]:
            yield rnd, item


def ensure_configmaps(cp: envtest.ControlPlaneInfo) -> None:
    """``benchmarks.proxies``' namespace and ConfigMaps, created only when not already all there."""
    status, body = cp.request("GET", f"/api/v1/namespaces/{NAMESPACE}/configmaps", timeout=60)
    if status == 200 and len(json.loads(body).get("items") or []) == CONFIGMAPS:
        return
    log(f"creating {CONFIGMAPS} ConfigMaps in namespace {NAMESPACE} ...")
    seed_configmaps(cp)


# --------------------------------------------------------------------------- watches: fan-out, memory, connections


@dataclass
class WatchRow:
    what: str
    proto: str
    upstream: str
    watchers: int
    connections_asked: int
    connected: int = 0
    connect_failed: dict[str, int] = field(default_factory=dict)
    connect_s: float = 0.0
    rss_before: int = 0
    rss_open: int = 0
    client_conns: int = 0
    upstream_conns: int = 0
    upstream_conns_before: int = 0
    #: False when the kproxy's heap had grown and shrunk before (filling a watch cache): RSS then
    #: hides what the watches take from memory the heap already holds
    rss_comparable: bool = True
    # fan-out (writer running)
    window: float = 0.0
    events: int = 0
    writes: int = 0
    closed_early: dict[str, int] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    served: float = 0.0

    @property
    def kib_per_watch(self) -> float:
        n = self.connected or self.watchers
        return (self.rss_open - self.rss_before) / 1024 / n if n else float("nan")

    @property
    def us_per_delivery(self) -> float:
        return self.cpu.get("kproxy", float("nan")) * 1e6 / self.events if self.events else float("nan")

    @property
    def others(self) -> float:
        ours = sum(v for k, v in self.cpu.items() if k != "machine")
        return max(0.0, self.cpu.get("machine", 0.0) - ours) / self.window if self.window else float("nan")


def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total)) if total else 1
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class Clients:
    """Watcher (or stream) processes on one kproxy; closed on exit."""

    def __init__(self) -> None:
        self.procs: list[tuple[BaseProcess, Connection]] = []
        self.windowed = False

    def start(self, target: Any, spec: Any) -> None:
        parent, child = SPAWN.Pipe()
        proc = SPAWN.Process(target=target, args=(spec, child), daemon=True)
        proc.start()
        child.close()
        self.procs.append((proc, parent))

    async def connected(self, row: WatchRow) -> None:
        t0 = time.monotonic()
        failed: Counter[str] = Counter()
        for _, conn in self.procs:
            msg = await recv_timeout(conn, _CONNECT_TIMEOUT)
            assert isinstance(msg, Connected)
            row.connected += msg.ok
            failed.update(msg.failed)
        row.connect_failed = dict(failed)
        row.connect_s = time.monotonic() - t0

    def send(self, msg: object) -> None:
        self.windowed = self.windowed or isinstance(msg, tuple)
        for _, conn in self.procs:
            with contextlib.suppress(OSError):
                conn.send(msg)

    async def results(self) -> list[ClientResult]:
        out = []
        for _, conn in self.procs:
            res = await recv_timeout(conn, 60)
            assert isinstance(res, ClientResult)
            out.append(res)
        return out

    async def close(self) -> None:
        if not self.windowed:  # the processes answer a window before they take the stop
            self.send((0.0, 0.0))
            for _, conn in self.procs:
                with contextlib.suppress(BenchError):
                    await recv_timeout(conn, 30)
        self.send("stop")
        for proc, _ in self.procs:
            await asyncio.to_thread(proc.join, 30)
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join)
        self.procs = []


def start_clients(
    clients: Clients,
    rp: RunningProxy,
    proto: str,
    target: str,
    watchers: int,
    connections: int,
    procs: int,
    mode: str = "watch",
) -> None:
    host, port = "127.0.0.1", _port(rp.url)
    ca = str(rp.ca_file)
    if proto == H1:
        for n in _split(watchers, procs):
            clients.start(h1_client_main, ClientSpec(host, port, target, n, ca))
        return
    per_conn = watchers // connections if watchers else 0
    for n in _split(connections, procs):
        clients.start(h2_client_main, H2ClientSpec(host, port, target, n, per_conn, ca, mode=mode))


async def settle_rss(pid: int, timeout: float = 20.0) -> int:
    """RSS once it has stopped growing (two samples 0.5 s apart within 64 KiB), or after ``timeout``."""
    deadline = time.monotonic() + timeout
    last = rss_bytes(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = rss_bytes(pid)
        if abs(now - last) < 64 << 10:
            return now
        last = now
    return last


async def open_and_measure(
    rp: RunningProxy, cp: envtest.ControlPlaneInfo, row: WatchRow, target: str, procs: int, mode: str = "watch"
) -> Clients:
    """Open the row's watches (or connections, or streams) on a kproxy that has served a few
    requests; fill in its RSS growth and the connections it holds. The caller closes the clients."""
    await warm(rp.url + f"/api/v1/namespaces/{NAMESPACE}/configmaps/{GET_NAME}")
    pid = rp.proc.pid
    row.rss_before = await settle_rss(pid)
    row.upstream_conns_before = tcp_connections(pid, _port(rp.url), cp.apiserver_port)[1]
    clients = Clients()
    start_clients(clients, rp, row.proto, target, row.watchers, row.connections_asked, procs, mode)
    await clients.connected(row)
    row.rss_open = await settle_rss(pid)
    row.client_conns, row.upstream_conns = tcp_connections(pid, _port(rp.url), cp.apiserver_port)
    log(
        f"{row.what} {row.proto} (upstream {row.upstream}): {row.connected}/{row.watchers or row.connections_asked} "
        f"open in {row.connect_s:.1f} s, RSS {row.rss_before / 2**20:.1f} -> {row.rss_open / 2**20:.1f} MiB "
        f"({row.kib_per_watch:.1f} KiB each), connections: {row.client_conns} from clients, "
        f"{row.upstream_conns} to the apiserver" + (f"; FAILED {row.connect_failed}" if row.connect_failed else "")
    )
    return clients


async def fanout_part(args: argparse.Namespace, cp: envtest.ControlPlaneInfo, work: Path) -> list[WatchRow]:
    rows = []
    for proto in (H1, H2):
        rp = kproxy(work, cp, f"cache-{proto.replace('/', '')}", True, _CACHE_FILTERS)
        bench = Bench(args, cp, Process("kproxy", rp.proc, rp.log), rp.admin_url)
        clients: Clients | None = None
        writer = Clients()
        try:
            await bench.seed(args.pods)
            await bench.wait_cache_ready()
            target = f"{PODS_PATH}?watch=1&resourceVersion={await bench.resource_version()}"
            row = WatchRow("cached watch", proto, H2, args.watchers, args.clients, rss_comparable=False)
            served0 = (await bench.watch_reads())[0]
            clients = await open_and_measure(rp, cp, row, target, args.procs)
            served = (await bench.watch_reads())[0] - served0
            if served < row.connected:
                raise BenchError(f"kproxy served {served:.0f} of {row.connected} watches from its cache")
            wspec = WriterSpec(
                cp.server, str(cp.ca_file), str(cp.admin_cert), str(cp.admin_key), FANOUT_NAMESPACE,
                bench.pod_names, args.rate, 4,
            )  # fmt: skip
            writer.start(writer_main, wspec)
            await recv_timeout(writer.procs[0][1], 60)
            start_at = time.time() + args.fanout_warmup
            end_at = start_at + args.fanout_duration
            clients.send((start_at, end_at))
            writer.send((start_at, end_at))
            pids = {
                "kproxy": rp.proc.pid,
                "apiserver": cp.apiserver_pid or 0,
                "etcd": cp.etcd_pid or 0,
                "writer": writer.procs[0][0].pid or 0,
                **{f"client{i}": p.pid or 0 for i, (p, _) in enumerate(clients.procs)},
            }
            await asyncio.sleep(max(0.0, start_at - time.time()))
            c0 = {k: cpu_seconds(p) for k, p in pids.items()}
            m0 = machine_busy_seconds()
            d0 = (await bench.metric_totals()).get("kproxy_watchcache_deliveries_total", 0.0)
            await asyncio.sleep(max(0.0, end_at - time.time()))
            c1 = {k: cpu_seconds(p) for k, p in pids.items()}
            m1 = machine_busy_seconds()
            d1 = (await bench.metric_totals()).get("kproxy_watchcache_deliveries_total", 0.0)
            cpu = {k: c1[k] - c0[k] for k in pids}
            row.cpu = {
                "kproxy": cpu["kproxy"],
                "apiserver": cpu["apiserver"],
                "etcd": cpu["etcd"],
                "writer": cpu["writer"],
                "clients": sum(v for k, v in cpu.items() if k.startswith("client")),
                "machine": m1 - m0,
            }
            row.window = args.fanout_duration
            row.served = d1 - d0
            closed: Counter[str] = Counter()
            for res in await clients.results():
                row.events += res.events
                closed.update(res.closed_early)
            row.closed_early = dict(closed)
            wr = await recv_timeout(writer.procs[0][1], 60)
            assert isinstance(wr, WriterResult)
            row.writes = wr.patches
            log(
                f"fan-out {proto}: {row.writes / row.window:.0f} writes/s, "
                f"{row.events / row.window:,.0f} deliveries/s, "
                f"kproxy {row.cpu['kproxy'] / row.window:.2f} cores = {row.us_per_delivery:.1f} us/delivery"
                + (f"; closed early {row.closed_early}" if row.closed_early else "")
            )
            rows.append(row)
        finally:
            await writer.close()
            if clients is not None:
                await clients.close()
            await bench.close()
            rp.stop()
    return rows


async def memory_part(args: argparse.Namespace, cp: envtest.ControlPlaneInfo, work: Path) -> list[WatchRow]:
    rows = []
    status, body = cp.request("GET", f"{PODS_PATH}?limit=1")
    if status != 200:
        raise BenchError(f"LIST {PODS_PATH}: {status}")
    rv = json.loads(body)["metadata"]["resourceVersion"]
    watch = f"{PODS_PATH}?watch=1&resourceVersion={rv}"
    post = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    runs = [
        ("passed-through watch", H1, H1, args.watchers, args.clients, watch, "watch"),
        ("passed-through watch", H2, H1, args.watchers, args.clients, watch, "watch"),
        ("passed-through watch", H1, H2, args.watchers, args.clients, watch, "watch"),
        ("passed-through watch", H2, H2, args.watchers, args.clients, watch, "watch"),
        ("idle connection", H2, H2, 0, args.watchers, watch, "idle"),
        ("stream, body arriving", H2, H2, args.watchers, args.clients, post, "unfinished"),
    ]
    for i, (what, proto, upstream, watchers, conns, target, mode) in enumerate(runs):
        rp = kproxy(work, cp, f"mem-{i}", upstream == H2)
        clients: Clients | None = None
        try:
            row = WatchRow(what, proto, upstream, watchers, conns)
            clients = await open_and_measure(rp, cp, row, target, args.procs, mode)
            if mode == "idle":
                row.connected = row.client_conns
            rows.append(row)
        finally:
            if clients is not None:
                await clients.close()
            rp.stop()
    return rows


# --------------------------------------------------------------------------- report


def _f(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}" if x == x else "-"


def report(
    args: argparse.Namespace, context: list[str], load: list[LoadRow], fan: list[WatchRow], mem: list[WatchRow]
) -> tuple[str, bool]:
    clean = True
    lines = ["## HTTP/2 benchmark", "", *context, ""]
    if load:
        lines += [
            "### Requests (h2load, closed loop)",
            "",
            "Over h2 one connection carries every stream (`1x16`: 1 connection, 16 streams); over HTTP/1.1 one "
            "connection per concurrent request. CPU is ms per request over the window (all threads).",
            "",
            "| scenario | peer | client | upstream | conns x streams | req/s | mean ms | KiB/resp | kproxy CPU | "
            "apiserver CPU | etcd CPU | h2load CPU | others (cores) |",
            "|---|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for r in load:
            if r.error or r.failed:
                clean = False
            err = f" **errors: {r.statuses or r.error}**" if r.error or r.failed else ""
            lines.append(
                f"| {r.scenario} | {r.peer} | {r.proto} | {r.upstream} | {r.connections}x{r.streams} | "
                f"{r.rps:,.0f}{err} | "
                f"{_f(r.mean_ms)} | {_f(r.bytes_per_response / 1024, 1)} | {_f(r.cpu_ms('kproxy'), 3)} | "
                f"{_f(r.cpu_ms('apiserver'), 3)} | {_f(r.cpu_ms('etcd'), 3)} | {_f(r.cpu_ms('h2load'), 3)} | "
                f"{_f(r.others)} |"
            )
        lines += [
            "",
            f"kproxy CPU per request over h2 / over HTTP/1.1 (goal: at most {GOAL_CPU_RATIO}x); the same for the "
            "apiserver's own server:",
            "",
            "| scenario | upstream | kproxy h2 ms | kproxy HTTP/1.1 ms | ratio | goal met | "
            "apiserver h2 / HTTP/1.1 (direct) |",
            "|---|---|--:|--:|--:|---|--:|",
        ]

        def find(scen: str, peer: str, proto: str, up: str, single: bool = True) -> LoadRow | None:
            for r in load:
                same = (r.scenario, r.peer, r.proto, r.upstream) == (scen, peer, proto, up)
                if same and (proto == H1 or (r.connections == 1) == single):
                    return r
            return None

        for scen in dict.fromkeys(r.scenario for r in load):
            d2, d1 = find(scen, "apiserver", H2, "-"), find(scen, "apiserver", H1, "-")
            direct = _ratio(d2.cpu_ms("apiserver"), d1.cpu_ms("apiserver")) if d2 and d1 else "-"
            pairs = [(H2, H2, H2), (H1, H1, H1), (H2, H1, "client h2 + upstream h2 vs HTTP/1.1 + HTTP/1.1")]
            per_connection = [(up2, up1, f"{label}, h2 one stream per connection") for up2, up1, label in pairs]
            for (up2, up1, label), single in [*((x, True) for x in pairs), *((x, False) for x in per_connection)]:
                a, b = find(scen, "kproxy", H2, up2, single), find(scen, "kproxy", H1, up1)
                if a is None or b is None:
                    continue
                ka, kb = a.cpu_ms("kproxy"), b.cpu_ms("kproxy")
                met = ka <= GOAL_CPU_RATIO * kb
                clean = clean and met
                lines.append(
                    f"| {scen} | {label} | {_f(ka, 3)} | {_f(kb, 3)} | {_ratio(ka, kb)} | "
                    f"{'yes' if met else '**no**'} | {direct} |"
                )
    if fan:
        lines += [
            "",
            "### Watch fan-out from the watch cache",
            "",
            f"{args.watchers} pod watches; HTTP/1.1: one TLS connection each; h2: {args.clients} connections of "
            f"{args.watchers // args.clients} streams. Writer at {args.rate:g} patches/s straight at the apiserver; "
            f"{args.fanout_duration:g} s measured after {args.fanout_warmup:g} s.",
            "",
            "| client | writes/s | deliveries/s | kproxy cores | kproxy µs / delivery | watcher processes (cores) | "
            "apiserver (cores) | others (cores) | closed early |",
            "|---|--:|--:|--:|--:|--:|--:|--:|---|",
        ]
        for w in fan:
            win = w.window
            if w.closed_early or w.connected < w.watchers:
                clean = False
            lines.append(
                f"| {w.proto} | {_f(w.writes / win, 1)} | {_f(w.events / win, 0)} | {_f(w.cpu['kproxy'] / win)} | "
                f"{_f(w.us_per_delivery, 1)} | {_f(w.cpu['clients'] / win)} | {_f(w.cpu['apiserver'] / win)} | "
                f"{_f(w.others)} | {w.closed_early or '-'} |"
            )
        if len(fan) == 2:
            lines += [
                "",
                f"h2 / HTTP/1.1 kproxy CPU per delivery: {_ratio(fan[1].us_per_delivery, fan[0].us_per_delivery)}.",
            ]
    rows = fan + mem
    if rows:
        lines += [
            "",
            "### Memory and connections",
            "",
            "kproxy's RSS growth (`VmRSS`, settled) with the watches (connections, streams) open, over the RSS after a "
            f"few warm-up requests; a fresh kproxy per row. Watches: {args.watchers} from {args.clients} clients "
            "(over HTTP/1.1 a client needs one connection per watch). Connections: established TCP "
            "connections kproxy holds then. Cached watches: connections only (filling the watch cache grew and "
            "shrank kproxy's heap first, so RSS hides what the watches take).",
            "",
            "| state | client | upstream | open | RSS before MiB | RSS open MiB | KiB each | "
            "connections from clients | connections to the apiserver (before) |",
            "|---|---|---|--:|--:|--:|--:|--:|--:|",
        ]
        for w in rows:
            if w.connect_failed:
                clean = False
            failed = f" (failed: {w.connect_failed})" if w.connect_failed else ""
            rss = (
                f"{_f(w.rss_before / 2**20, 1)} | {_f(w.rss_open / 2**20, 1)} | {_f(w.kib_per_watch, 1)}"
                if w.rss_comparable
                else "- | - | -"
            )
            lines.append(
                f"| {w.what} | {w.proto} | {w.upstream} | {w.connected}{failed} | {rss} | {w.client_conns} | "
                f"{w.upstream_conns} ({w.upstream_conns_before}) |"
            )
        watch_h2 = [w for w in rows if w.proto == w.upstream == H2 and "watch" in w.what and w.rss_comparable]
        if watch_h2:
            worst = max(w.kib_per_watch for w in watch_h2)
            lines += [
                "",
                f"Goal: an idle watch over h2 at most {GOAL_WATCH_KIB:g} KiB (half of the 90 KiB of an HTTP/1.1 watch "
                f"before h2), over h2 to kproxy and to the apiserver: {worst:.1f} KiB, "
                + ("**met**." if worst <= GOAL_WATCH_KIB else "**not met**."),
            ]
    return "\n".join(lines) + "\n", clean


def context_lines(cp: envtest.ControlPlaneInfo, load_before: tuple[float, float, float]) -> list[str]:
    import aiohttp
    import h2

    from kproxy import __version__

    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "kproxy"], capture_output=True, text=True, check=False
    ).stdout
    h2load_v = subprocess.run(["h2load", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    return [
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; kproxy {__version__} at commit {commit or '?'}"
        + (" (with uncommitted changes under kproxy/)" if dirty else ""),
        machine_line(load_before),
        f"- software: Python {platform.python_version()}, aiohttp {aiohttp.__version__}, h2 {h2.__version__}, "
        f"{h2load_v}, Kubernetes {k8s_server_version(cp)} (kube-apiserver and etcd from envtest)",
        "- kproxy: `kproxy run`, TLS listener, `credentials: proxy`, no filters "
        "(the fan-out: the watch cache of pods), "
        "access log off; the apiserver reached directly with the envtest admin's bearer token",
    ]


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.http2", description=__doc__.split("\n\n")[0])
    p.add_argument("--envtest-dir", type=Path, help="reuse the control plane of `kproxy envtest up --dir DIR`")
    p.add_argument("--parts", default="requests,fanout,memory", help="subset of requests,fanout,memory")
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per request measurement (5)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before each (1)")
    p.add_argument("--rounds", type=int, default=2, help="request measurements N times, rotated, pooled (2)")
    p.add_argument("--concurrency-get", type=int, default=16)
    p.add_argument("--concurrency-list", type=int, default=4)
    p.add_argument(
        "--h2-per-connection", action="store_true", help="also h2 with one stream per connection (both upstreams)"
    )
    p.add_argument("--watchers", type=int, default=1000, help="watches (and idle connections, streams) (1000)")
    p.add_argument("--clients", type=int, default=10, help="h2 connections carrying the watches (10)")
    p.add_argument("--rate", type=float, default=10.0, help="patches/s during the fan-out (10)")
    p.add_argument("--pods", type=int, default=100)
    p.add_argument("--fanout-duration", type=float, default=10.0)
    p.add_argument("--fanout-warmup", type=float, default=3.0)
    p.add_argument("--procs", type=int, default=2, help="client processes (2)")
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    args.part_set = {x.strip() for x in args.parts.split(",") if x.strip()}
    if not args.part_set <= {"requests", "fanout", "memory"}:
        p.error("--parts takes a subset of requests,fanout,memory")
    if args.watchers % args.clients:
        p.error("--watchers must be a multiple of --clients")
    if not shutil.which("h2load") and "requests" in args.part_set:
        p.error("h2load not found (Debian: apt-get install nghttp2-client)")
    return args


async def amain(args: argparse.Namespace, cp: envtest.ControlPlaneInfo, work: Path) -> tuple[str, bool]:
    load_before = os.getloadavg()
    context = context_lines(cp, load_before)
    load: list[LoadRow] = []
    fan: list[WatchRow] = []
    mem: list[WatchRow] = []
    if "requests" in args.part_set:
        ensure_configmaps(cp)
        proxies = {}
        try:
            for upstream in (H2, H1):
                proxies[upstream] = kproxy(work, cp, f"load-{upstream.replace('/', '')}", upstream == H2)
                await warm(proxies[upstream].url + f"/api/v1/namespaces/{NAMESPACE}/configmaps/{GET_NAME}")
            load = await requests_part(args, cp, proxies)
        finally:
            for rp in proxies.values():
                rp.stop()
    if "fanout" in args.part_set or "memory" in args.part_set:
        ensure_configmaps(cp)
    if "fanout" in args.part_set:
        fan = await fanout_part(args, cp, work)
    if "memory" in args.part_set:
        mem = await memory_part(args, cp, work)
    return report(args, context, load, fan, mem)


def _on_sigterm(signum: int, frame: object) -> None:
    log("terminated; stopping what this run started")
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with control_plane(args.envtest_dir) as cp, work_dir() as work:
            text, clean = asyncio.run(amain(args, cp, work))
    except (BenchError, envtest.EnvtestError, envtest.KubectlError) as e:
        log(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    print(text)
    if args.output:
        args.output.write_text(text)
        log(f"wrote {args.output}")
    return 0 if clean else 1


if __name__ == "__main__":
    sys.exit(main())
