"""Watch fan-out: thousands of pod watches on the apiserver itself vs served from kproxy's cache.

    python -m benchmarks.watchfanout [--envtest-dir DIR] [--watchers 100,1000,5000]
                                     [--capacity-watchers 1000,5000] [--rate 100] [--writers 8]
                                     [--procs 4] [--duration 20] [--warmup 5] [--quick] [--output FILE]

Peers, measured in the same run:

* ``direct``: every watcher on the kube-apiserver, HTTPS with the admin client certificate;
* ``kproxy``: every watcher on ``kproxy run`` with ``filters: [{name: watchcache, resources:
  [pods]}]``, ``credentials: proxy``, plain HTTP (one upstream watch of pods, whatever the number
  of clients). kproxy's ``kproxy_watchcache_reads_total{verb="watch",served="cache"}`` must count
  every watcher, else the run is not a measurement of the cache.

Load: ``--pods`` (100) small pods in namespace ``bench-fanout``; a writer process (own CPU,
``benchmarks.lib.watch_writer``) patching them round robin at ``--rate`` (100) patches/s straight
at the apiserver, each patch writing the wall clock into an annotation. ``N`` watchers
(``benchmarks.lib.watch_client``: ``--procs`` processes, each one uvloop loop of raw HTTP/1.1
connections) all watch that namespace's pods, JSON, ``watch=1&resourceVersion=<current>`` (the
resourceVersion of a LIST taken just before, so no initial events). Once every watcher has its
response head the writer starts; after ``--warmup`` s, ``--duration`` s are measured.

Per (watchers, peer): apiserver and kproxy CPU in cores (``/proc/PID/stat``, all threads, over
the window), kproxy RSS (highest ``VmRSS`` of samples every 0.5 s), deliveries/s (events all
watchers received inside the window / window), delivery latency p50/p99 (the annotation's
timestamp to the client's ``time.time()`` when the read that completed the event returned; 0.1 ms
buckets), the CPU of the watcher processes and the writer, and how much of the machine other
processes used.

A second table, kproxy's fan-out capacity: ``--capacity-watchers`` watchers through kproxy with
``--writers`` writer connections patching back to back (as fast as the apiserver allows):
deliveries per kproxy CPU-second, and ``kproxy_watchcache_coalesced_writes_total /
kproxy_watchcache_watch_writes_total`` over the window.

Goals: at 1,000 watchers the apiserver's CPU at least 10x lower through kproxy; kproxy
at least 500,000 deliveries per CPU-second; p99 delivery latency through kproxy no worse than
direct. Exit status 0 when every measurement ran cleanly and the goals are met (``--quick``:
ran cleanly), 1 when not, 2 when the benchmark could not be set up.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import sys
import time
from pathlib import Path

from benchmarks.lib.cluster import control_plane
from benchmarks.lib.common import BenchError, log, work_dir
from benchmarks.lib.fanout import BASELINE, DIRECT, KPROXY, NAMESPACE, PODS_PATH, Bench, Row, kproxy_with_cache
from benchmarks.lib.report import met as _met
from benchmarks.lib.report import ms as _ms
from benchmarks.lib.report import pct as _pct
from benchmarks.lib.stats import percentile
from kproxy.localcluster import envtest

#: the goals this benchmark checks
GOAL_API_RATIO = 10.0
GOAL_DELIVERIES_PER_CPU_S = 500_000.0


# --------------------------------------------------------------------------- report


def _mib(x: float) -> str:
    return f"{x / 2**20:.0f}"


def _who(r: Row, rate: float | None = None) -> str:
    """A row's watchers, with its writes/s asked when it is not the table's (``--also``)."""
    return f"{r.watchers:,}" if r.rate == rate else f"{r.watchers:,} @ {r.rate or 0:g}/s"


def _num(x: float, digits: int = 2) -> str:
    return f"{x:,.{digits}f}" if x == x else "-"


def _ratio(a: float, b: float) -> str:
    """``a / b`` as ``N.Nx``; a denominator within measuring noise of zero gives a lower bound."""
    return f"{a / b:.1f}x" if b >= 0.01 else f"> {a / 0.01:.0f}x (the second is within noise of 0)"


def _div(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _closed(r: Row) -> str:
    """Streams the watchers saw end early; for kproxy also how many it closed as slow in the window
    (a closed watcher's end reaches a lagging client only after its backlog, often after the window)."""
    n = sum(r.closed_early.values())
    out = str(n) if n == 0 else f"{n} ({', '.join(f'{k}: {v}' for k, v in r.closed_early.items())})"
    slow = r.metrics.get("kproxy_watchcache_slow_watchers_closed_total", 0.0)
    return out + (f"; kproxy closed {slow:.0f} as slow" if r.peer == KPROXY and slow else "")


def report(
    args: argparse.Namespace, k8s: str, rows: list[Row], capacity: list[Row], load_before: tuple[float, ...]
) -> tuple[str, bool]:
    ncpu = os.cpu_count() or 1
    event_bytes = [r.payload_bytes / r.events for r in rows + capacity if r.events]
    lines = [
        f"# Watch fan-out benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"kube-apiserver {k8s}, Python {platform.python_version()}, {ncpu} CPUs shared with other work "
        f"(load average {load_before[0]:.2f} / {load_before[1]:.2f} / {load_before[2]:.2f} at the start; "
        "`others` below is the CPU the rest of the machine used during each window). "
        f"{len(args.pod_names)} pods in `{NAMESPACE}`, patched round robin straight at the apiserver by a writer "
        "process (one annotation set to its wall clock per patch; one field manager, so each event's pod carries one "
        f"`managedFields` entry); a JSON event is ~{(sum(event_bytes) / len(event_bytes)) if event_bytes else 0:.0f} "
        "bytes. Watchers: `--procs` "
        f"({args.procs}) processes, each one uvloop loop of raw HTTP/1.1 connections (each event found by its "
        "timestamp annotation with `bytes.find`, no JSON parsing), all watching "
        f"`{PODS_PATH}?watch=1&resourceVersion=<current>`, JSON. `direct`: the apiserver over HTTPS, admin client "
        "certificate. `kproxy`: `kproxy run`, `filters: [{name: watchcache, resources: [pods]}]`, `credentials: "
        f"proxy`, plain HTTP. {args.warmup:g} s of writes, then {args.duration:g} s measured.",
        "",
        f"## 1. {args.rate:g} writes/s, N watchers",
        "",
        "Rows `N @ R/s` (`--also`) ask R writes/s instead. "
        "deliveries/s = events all watchers received in the window / window; `of expected` = deliveries / "
        "(writes/s x watchers). `patch p99 ms`: the writer's patch round trips (how responsive the apiserver "
        "stayed). Latency: writer's timestamp in the event to the client's receipt (includes the "
        "patch's own trip through the apiserver and etcd), 0.1 ms buckets. CPU in cores = CPU seconds over the "
        "window / window; for `direct`, kproxy's CPU (idle but for its one upstream watch) is in parentheses. "
        "`closed early` = watch streams the watchers saw end before the window did (a server dropping a slow "
        "watcher; for kproxy also its count of watchers it closed as slow in the window: a lagging watcher sees the "
        "end only after its backlog).",
        "",
        "| watchers | peer | writes/s | patch p99 ms | deliveries/s | of expected | p50 ms | p99 ms | apiserver CPU | "
        "apiserver CPU ms / write | etcd CPU | kproxy CPU | kproxy RSS MiB | clients CPU | writer CPU | others | "
        "events per read | closed early |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | --- |",
    ]
    for r in rows:
        kp = f"{r.cores('kproxy'):.2f}" if r.peer == KPROXY else f"({r.cores('kproxy'):.2f})"
        lines.append(
            f"| {_who(r, args.rate)} | {r.peer} | {r.writes:.0f} | {_ms(percentile(r.writer.latencies, 99))} | "
            f"{r.deliveries:,.0f} | "
            f"{_pct(_div(r.deliveries, r.writes * r.watchers))} | {_ms(r.latency(50))} | {_ms(r.latency(99))} | "
            f"{r.cores('apiserver'):.2f} | {r.api_ms_per_write:.1f} | {r.cores('etcd'):.2f} | {kp} | "
            f"{_mib(r.kproxy_rss_max)} | {r.cores('clients'):.2f} | {r.cores('writer'):.2f} | {r.others:.2f} | "
            f"{_num(_div(r.events, r.reads), 1)} | {_closed(r)} |"
        )
    ok = True
    problems = [f"{r.peer} {r.watchers}: {p}" for r in rows + capacity for p in r.problems()]
    if problems:
        ok = False
        lines += ["", "**Measurements that do not count:** " + "; ".join(problems) + "."]

    goals: list[str] = []
    goals_ok = True
    by = {(r.peer, r.watchers, r.rate): r for r in rows}
    base = by.get((BASELINE, 0, args.rate))

    def for_watches(r: Row) -> float:
        """The apiserver's cores beyond what the writer-only run spent on the same writes/s."""
        return r.cores("apiserver") - (base.api_ms_per_write * r.writes / 1000 if base else float("nan"))

    for n, rate in sorted({(r.watchers, r.rate or 0.0) for r in rows}):
        d, k = by.get((DIRECT, n, rate)), by.get((KPROXY, n, rate))
        if d is None or k is None:
            continue
        ratio = _div(d.cores("apiserver"), k.cores("apiserver"))
        p99_ok = k.latency(99) <= d.latency(99)
        if n == 1000 and rate == args.rate:
            goals_ok &= ratio >= GOAL_API_RATIO and p99_ok
            goals.append(
                f"* apiserver CPU at {n:,} watchers, direct / through kproxy: {d.cores('apiserver'):.2f} / "
                f"{k.cores('apiserver'):.2f} cores = **{ratio:.1f}x** (goal >= {GOAL_API_RATIO:g}x): "
                f"{_met(ratio >= GOAL_API_RATIO)}"
            )
            dw, kw = for_watches(d), for_watches(k)
            goals.append(
                f"  * (for reading, not the goal's definition) beyond the writer-only run's "
                f"{base.api_ms_per_write if base else float('nan'):.1f} ms per write: direct {dw:.2f} cores, "
                f"kproxy {kw:.2f} cores = {_ratio(dw, kw)}; per write {d.api_ms_per_write:.1f} vs "
                f"{k.api_ms_per_write:.1f} ms = "
                f"{_div(d.api_ms_per_write, k.api_ms_per_write):.1f}x"
            )
            goals.append(
                f"* p99 delivery latency at {n:,} watchers, kproxy {_ms(k.latency(99))} ms vs direct "
                f"{_ms(d.latency(99))} ms (goal: no worse): {_met(p99_ok)}"
            )
        else:
            goals.append(
                f"* (at {_who(d, args.rate)}) apiserver CPU direct / kproxy {ratio:.1f}x; p99 kproxy "
                f"{_ms(k.latency(99))} ms vs direct {_ms(d.latency(99))} ms ({'no worse' if p99_ok else 'worse'})"
            )
    if capacity:
        lines += [
            "",
            "## 2. kproxy's fan-out capacity: writers patching as fast as the apiserver answers",
            "",
            "deliveries per kproxy CPU-second = kproxy-counted deliveries/s / kproxy cores. `coalesced / writes` = "
            "`kproxy_watchcache_coalesced_writes_total / kproxy_watchcache_watch_writes_total` over the window "
            "(transport writes that carried more than one event); `events / write` = "
            "`kproxy_watchcache_deliveries_total / kproxy_watchcache_watch_writes_total`; kproxy-counted "
            "deliveries/s = `kproxy_watchcache_deliveries_total` over the window (events handed to sockets, "
            "some still in flight at the window's end); `events per read` = events per client socket read that "
            "brought at least one; `closed early`: streams the watchers saw end inside the window, and "
            "`kproxy_watchcache_slow_watchers_closed_total` over it.",
            "",
            "| watchers | writer connections | writes/s | deliveries/s | kproxy-counted deliveries/s | of expected | "
            "kproxy CPU | "
            "deliveries per kproxy CPU-s | coalesced / writes | events / write | p50 ms | p99 ms | apiserver CPU | "
            "kproxy RSS MiB | clients CPU | writer CPU | others | events per read | closed early |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
            "---: | ---: | ---: | ---: | --- |",
        ]
        for r in capacity:
            m = r.metrics
            writes = m.get("kproxy_watchcache_watch_writes_total", float("nan"))
            coalesced = m.get("kproxy_watchcache_coalesced_writes_total", float("nan"))
            delivered = m.get("kproxy_watchcache_deliveries_total", float("nan"))
            slow = m.get("kproxy_watchcache_slow_watchers_closed_total", float("nan"))
            # kproxy's own count of what it wrote inside the window: the clients' count also holds events
            # written before it and read late (a backlog), which is not kproxy's work in the window.
            per_cpu = _div(delivered if delivered == delivered else r.deliveries, r.window * r.cores("kproxy"))
            lines.append(
                f"| {r.watchers:,} | {r.writers} | {r.writes:.0f} | {r.deliveries:,.0f} | "
                f"{_num(delivered / r.window, 0)} | "
                f"{_pct(_div(r.deliveries, r.writes * r.watchers))} | {r.cores('kproxy'):.2f} | "
                f"**{per_cpu:,.0f}** | {_div(coalesced, writes):.2f} | {_div(delivered, writes):.1f} | "
                f"{_ms(r.latency(50))} | {_ms(r.latency(99))} | {r.cores('apiserver'):.2f} | "
                f"{_mib(r.kproxy_rss_max)} | {r.cores('clients'):.2f} | {r.cores('writer'):.2f} | {r.others:.2f} | "
                f"{_num(_div(r.events, r.reads), 1)} | {_closed(r)} |"
            )
            good = per_cpu >= GOAL_DELIVERIES_PER_CPU_S
            closed = max(sum(r.closed_early.values()), 0 if slow != slow else int(slow))
            if closed:
                goals.append(
                    f"* (not judged: {closed} of {r.watchers:,} watchers were closed as slow during the window, no "
                    f"steady state) kproxy deliveries per CPU-second at {r.watchers:,} watchers: {per_cpu:,.0f}"
                )
                continue
            goals_ok &= good
            goals.append(
                f"* kproxy deliveries per CPU-second at {r.watchers:,} watchers: {per_cpu:,.0f} (goal >= "
                f"{GOAL_DELIVERIES_PER_CPU_S:,.0f}): {_met(good)}"
            )
    lines += ["", "## Goals", "", *goals, "", *reading_notes(rows + capacity, base, args.rate), ""]
    if args.quick:
        lines.append("`--quick`: a smoke run; the goals are shown but not judged.")
    else:
        ok &= goals_ok
        lines.append("All goals " + ("met." if goals_ok else "**not all met** (see above)."))
    lines.append("")
    return "\n".join(lines), ok


def reading_notes(rows: list[Row], base: Row | None, rate: float) -> list[str]:
    """What bounds the figures on the machine that ran them, with this run's numbers."""
    measured = [r for r in rows if r.window]
    others = sum(r.others for r in measured) / len(measured) if measured else float("nan")
    out = [
        "## Reading the numbers",
        "",
        f"* Other work used on average {others:.2f} of the {os.cpu_count()} cores during the windows (`others`); "
        "the apiserver, kproxy, the watchers and the writer shared the rest, so a CPU-bound peer gets less than it "
        "would alone.",
    ]
    if base is not None and base.writes:
        out.append(
            f"* With no watcher at all the apiserver spent {base.api_ms_per_write:.1f} ms of CPU per patch "
            f"({base.cores('apiserver'):.2f} cores at {base.writes:.0f} writes/s): through kproxy that is nearly all "
            "it does, so the total-CPU ratio is bounded by the direct peer's CPU over the writes' own cost, which "
            "on two shared cores the direct peer cannot exceed by much; `apiserver CPU ms / write` and the "
            "beyond-the-writes figures above separate the watches' share."
        )
    by = {(r.peer, r.watchers, r.rate): r for r in rows}
    keys = sorted({(r.watchers, r.rate or 0.0) for r in rows})
    pairs = [(by[(DIRECT, *key)], by[(KPROXY, *key)]) for key in keys if (DIRECT, *key) in by and (KPROXY, *key) in by]
    pairs = [(d, k) for d, k in pairs if d.events and k.events]
    if base is not None and pairs:
        out += [
            "* CPU per delivery, microseconds (the serving process: for direct the apiserver's CPU beyond the "
            "writer-only run's cost of the same writes, for kproxy its own CPU over the deliveries it counted; the "
            "watcher processes: direct they "
            "decrypt TLS, through kproxy they read plain HTTP, so on this shared machine direct watchers also take "
            "more CPU away from the apiserver):",
            "",
            "| watchers | apiserver, direct | kproxy | watchers, direct | watchers, through kproxy |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
        for d, k in pairs:
            beyond = d.cores("apiserver") - base.api_ms_per_write * d.writes / 1000
            out.append(
                f"| {_who(d, rate)} | {beyond / d.deliveries * 1e6:.1f} | {k.cores('kproxy') / k.served * 1e6:.1f} "
                f"| {d.cores('clients') / d.deliveries * 1e6:.1f} | {k.cores('clients') / k.deliveries * 1e6:.1f} |"
            )
        out.append("")
    out += [
        "* `of expected` below 100% means the watchers read fewer events than were written: the Python watcher "
        "processes (a find and a float per event, ~1.6 KB per event) and the peer share the machine, and at 5,000 "
        "watchers x 100 writes/s (500,000 events/s, ~0.8 GB/s) they cannot keep up with any server; the latency "
        "then measures the backlog, and servers close watchers that stay behind (`closed early`). Rows `5,000 @ "
        "20/s` (`--also`) compare both peers at 5,000 watchers with a load the watchers can read.",
        "* Where kproxy's CPU goes (a py-spy profile of kproxy during the 1,000-watcher, 100 writes/s run, taken "
        "while writing this benchmark, not in this run): ~72% of its samples in `TransportSink.write`, i.e. the "
        "send syscall (on loopback the sender's syscall also does the receiving side's TCP work), ~10% in the "
        "broadcaster's dispatch and flush, ~11% in the upstream watch (protobuf decode, cache, JSON encoding once "
        "per event). At 100 writes/s each event is its own write to each watcher; deliveries per CPU-second grow "
        "with the events each write carries (`events / write`).",
    ]
    return out


# --------------------------------------------------------------------------- main


async def amain(args: argparse.Namespace, cp: envtest.ControlPlaneInfo, work: Path) -> tuple[str, bool]:
    load_before = os.getloadavg()
    with kproxy_with_cache(work, cp) as (proc, url, admin):
        bench = Bench(args, cp, proc, admin)
        bench.kproxy_url = url
        try:
            async with bench.session.get("/version") as r:
                k8s = (await r.json())["gitVersion"]
            await bench.seed(args.pods)
            args.pod_names = bench.pod_names
            await bench.wait_cache_ready()
            # The writes alone: what the apiserver spends whatever serves the watches.
            rows: list[Row] = [await bench.measure(BASELINE, 0, args.rate, args.rate_writers)]
            for n, rate in [(n, args.rate) for n in args.watchers] + args.also:
                for peer in args.peers:
                    rows.append(await bench.measure(peer, n, rate, args.rate_writers))
            capacity = []
            if KPROXY in args.peers:
                for n in args.capacity_watchers:
                    capacity.append(await bench.measure(KPROXY, n, None, args.writers))
        finally:
            await bench.close()
    return report(args, k8s, rows, capacity, load_before)


def _pairs(text: str) -> list[tuple[int, float]]:
    """``5000@20,1000@50`` -> [(5000, 20.0), (1000, 50.0)]."""
    out = []
    for part in text.split(","):
        if part.strip():
            n, _, rate = part.partition("@")
            out.append((int(n), float(rate)))
    return out


def _counts(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.watchfanout", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--envtest-dir", type=Path, default=os.environ.get(envtest.DIR_ENV) or None)
    p.add_argument("--watchers", type=_counts, default=[100, 1000, 5000], help="watcher counts (100,1000,5000)")
    p.add_argument("--capacity-watchers", type=_counts, default=[1000, 5000], help="capacity table (1000,5000)")
    p.add_argument("--rate", type=float, default=100.0, help="patches/s in table 1 (100)")
    p.add_argument(
        "--also",
        type=_pairs,
        default=[(5000, 20.0)],
        help="more table-1 rows, WATCHERS@RATE,... (5000@20: a load the watchers on two cores can read)",
    )
    p.add_argument("--rate-writers", type=int, default=8, help="writer connections sharing --rate (8)")
    p.add_argument("--writers", type=int, default=8, help="writer connections patching back to back, table 2 (8)")
    p.add_argument("--pods", type=int, default=100)
    p.add_argument("--procs", type=int, default=4, help="watcher processes (4)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds measured (20)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of writes before the window (5)")
    p.add_argument("--peers", type=lambda s: s.split(","), default=[DIRECT, KPROXY], help="direct,kproxy")
    p.add_argument("--quick", action="store_true", help="smoke run: 50 watchers, 5 s, one watcher process")
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    if args.quick:
        args.watchers, args.capacity_watchers, args.duration, args.warmup, args.procs = [50], [50], 5.0, 2.0, 1
        args.also = []
    if not set(args.peers) <= {DIRECT, KPROXY} or args.procs < 1 or args.pods < 1:
        p.error("--peers is a subset of direct,kproxy; --procs and --pods are >= 1")
    return args


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        with control_plane(args.envtest_dir) as cp, work_dir() as work:
            text, ok = asyncio.run(amain(args, cp, work))
    except (BenchError, envtest.EnvtestError) as e:
        log(f"error: {e}")
        return 2
    print(text)
    if args.output:
        args.output.write_text(text)
        log(f"wrote {args.output}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
