"""The transcode filter end to end: what ``upstream: protobuf`` saves the apiserver, in one run.

    python -m benchmarks.transcode [--envtest-dir DIR] [--pods 5000] [--events 1000]
                                   [--lists 5] [--output FILE]

Peers, measured in the same run on the same objects (benchmarks.compression's realistic pods,
~3 KB of JSON each, in namespace ``bench-compress``; created here when missing):

* ``direct JSON``: the kube-apiserver answering ``Accept: application/json`` (HTTPS, admin cert);
* ``kproxy protobuf->JSON``: ``kproxy run`` with ``transcode: {upstream: protobuf}``; the client
  asks JSON, kproxy asks the apiserver for protobuf and transcodes;
* ``direct protobuf`` (LIST only): the apiserver answering protobuf, the floor of its cost.

Figures:

* LIST of all pods, ``--lists`` times per peer, one at a time: the apiserver's CPU seconds per
  request (utime+stime of its process from ``/proc/<pid>/stat``, before and after each request;
  10 ms ticks), kproxy's CPU seconds, bytes between the apiserver and its client (kproxy or the
  benchmark), bytes the benchmark client received, and end-to-end latency (request sent to last
  byte read), medians.
* WATCH of the pods while ``--events`` of them are patched (straight at the apiserver, 16 at a
  time; each patch carries its send time in an annotation): per event latency from the patch
  being sent to the event being read by the client (p50/p99), the apiserver's CPU over the
  whole window (the patches cost the same for both peers, so the difference is the watch
  encoding), and bytes on each hop.
* the transcoder alone, in this process (one core, gc on): MB/s of JSON output for the whole
  LIST body fed in 64 KiB chunks, and for the same pods as 1,000 watch frames, each with the
  wire reader (the default) and with the upb path (``wire=False``), taking turns.

Goals (docs/performance.md#transcoding): at least 2x less apiserver CPU per LIST through kproxy, and at least 60 MB/s
of JSON output per core for the transcoder.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from benchmarks.lib.cluster import control_plane
from benchmarks.lib.common import log
from benchmarks.lib.data import NAMESPACE, seed_pods
from benchmarks.lib.procs import cpu_seconds, self_cpu_seconds
from benchmarks.lib.stats import percentile
from kproxy.codec import ProtobufCodec
from kproxy.localcluster import envtest
from kproxy.testing.proxyproc import RunningProxy, start_proxy

JSON = "application/json"
PROTOBUF = "application/vnd.kubernetes.protobuf"
LIST_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods"


def metric(rp: RunningProxy, name: str) -> float:
    for line in rp.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


@dataclass
class ListRow:
    peer: str
    apiserver_cpu: list[float] = field(default_factory=list)
    kproxy_cpu: list[float] = field(default_factory=list)
    upstream_bytes: list[float] = field(default_factory=list)
    client_bytes: list[float] = field(default_factory=list)
    latency: list[float] = field(default_factory=list)


@dataclass
class WatchRow:
    peer: str
    events: int = 0
    apiserver_cpu: float = 0.0
    kproxy_cpu: float | None = None
    upstream_bytes: float = 0.0
    client_bytes: float = 0.0
    window: float = 0.0
    latencies: list[float] = field(default_factory=list)


class Bench:
    def __init__(self, cp: envtest.ControlPlaneInfo, rp: RunningProxy) -> None:
        self.cp = cp
        self.rp = rp
        assert cp.apiserver_pid is not None
        self.api_pid = cp.apiserver_pid
        self.direct = aiohttp.ClientSession(
            base_url=cp.server,
            connector=aiohttp.TCPConnector(ssl=cp.ssl_context()),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent"),
        )
        self.via = aiohttp.ClientSession(
            base_url=rp.url, auto_decompress=False, skip_auto_headers=("Accept-Encoding", "User-Agent")
        )

    async def close(self) -> None:
        await self.direct.close()
        await self.via.close()

    def _session(self, peer: str) -> aiohttp.ClientSession:
        return self.via if peer.startswith("kproxy") else self.direct

    # ------------------------------------------------------------------ LIST

    async def list_once(self, peer: str, accept: str, row: ListRow) -> bytes:
        via = peer.startswith("kproxy")
        kp_pid = self.rp.proc.pid
        up0 = metric(self.rp, "kproxy_transcode_input_bytes_total") if via else 0.0
        a0, k0 = cpu_seconds(self.api_pid), cpu_seconds(kp_pid)
        t0 = time.perf_counter()
        async with self._session(peer).get(LIST_PATH, headers={"Accept": accept}) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{peer}: LIST answered {resp.status}: {body[:300]!r}")
        row.latency.append(time.perf_counter() - t0)
        row.apiserver_cpu.append(cpu_seconds(self.api_pid) - a0)
        row.kproxy_cpu.append(cpu_seconds(kp_pid) - k0)
        row.client_bytes.append(len(body))
        row.upstream_bytes.append(metric(self.rp, "kproxy_transcode_input_bytes_total") - up0 if via else len(body))
        return body

    async def lists(self, rounds: int) -> tuple[list[ListRow], bytes, bytes]:
        peers = [("direct JSON", JSON), ("kproxy protobuf->JSON", JSON), ("direct protobuf", PROTOBUF)]
        rows = {p: ListRow(p) for p, _ in peers}
        bodies: dict[str, bytes] = {}
        for peer, accept in peers:  # warm-up: caches, connections, the codec's generated code
            bodies[peer] = await self.list_once(peer, accept, ListRow(peer))
        direct = json.loads(bodies["direct JSON"])
        proxied = json.loads(bodies["kproxy protobuf->JSON"])
        if direct["items"] != proxied["items"]:
            raise RuntimeError("kproxy's JSON list differs from the apiserver's")
        for i in range(rounds):
            order = peers[i % 3 :] + peers[: i % 3]
            for peer, accept in order:
                await self.list_once(peer, accept, rows[peer])
            log(f"LIST round {i + 1}/{rounds} done")
        return list(rows.values()), bodies["direct protobuf"], bodies["direct JSON"]

    # ------------------------------------------------------------------ WATCH

    async def watch(self, peer: str, names: list[str], events: int) -> WatchRow:
        row = WatchRow(peer)
        via = peer.startswith("kproxy")
        async with self.direct.get(LIST_PATH, params={"limit": "1"}, headers={"Accept": JSON}) as r:
            rv = (await r.json())["metadata"]["resourceVersion"]
        up0 = metric(self.rp, "kproxy_transcode_input_bytes_total") if via else 0.0
        a0, k0 = cpu_seconds(self.api_pid), cpu_seconds(self.rp.proc.pid)
        t0 = time.perf_counter()
        url = f"{LIST_PATH}?watch=1&resourceVersion={rv}"
        async with self._session(peer).get(
            url, headers={"Accept": JSON}, timeout=aiohttp.ClientTimeout(total=None, sock_read=120)
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{peer}: WATCH answered {resp.status}")
            sem = asyncio.Semaphore(16)
            tag = f"{peer[:6]}-{time.time_ns()}"

            async def patch(name: str) -> None:
                async with sem:
                    # Stamped when the patch is sent, not while it waits for a free worker.
                    body = {"metadata": {"annotations": {"bench/sent": repr(time.time()), "bench/run": tag}}}
                    async with self.direct.patch(
                        f"{LIST_PATH}/{name}",
                        data=json.dumps(body),
                        headers={"Content-Type": "application/merge-patch+json", "Accept": JSON},
                    ) as r:
                        await r.read()
                        if r.status != 200:
                            raise RuntimeError(f"patch {name}: {r.status}")

            patches = asyncio.gather(*(patch(n) for n in names[:events]))
            while row.events < events:
                line = await resp.content.readline()
                if not line:
                    raise RuntimeError(f"{peer}: the watch ended after {row.events} events")
                now = time.time()
                row.client_bytes += len(line)
                ev = json.loads(line)
                ann = ev["object"]["metadata"].get("annotations") or {}
                if ev["type"] == "MODIFIED" and ann.get("bench/run") == tag:
                    row.events += 1
                    row.latencies.append(now - float(ann["bench/sent"]))
            await patches
        row.window = time.perf_counter() - t0
        row.apiserver_cpu = cpu_seconds(self.api_pid) - a0
        if via:
            row.kproxy_cpu = cpu_seconds(self.rp.proc.pid) - k0
            row.upstream_bytes = metric(self.rp, "kproxy_transcode_input_bytes_total") - up0
        else:
            row.upstream_bytes = row.client_bytes
        return row


def _speeds(fns: dict[str, Callable[[], int]], repeat: int = 7) -> dict[str, float]:
    """MB/s of JSON output per core of each fn (which returns its output's size), the median of
    `repeat` rounds in which they take turns after one warm-up each (the same load for all)."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            c0 = self_cpu_seconds()
            out = fn()
            samples[name].append(out / (self_cpu_seconds() - c0) / 1e6)
    return {name: statistics.median(v) for name, v in samples.items()}


def transcoder_speeds(pb_list: bytes, json_list: bytes, events: int) -> dict[str, tuple[float, int]]:
    """The list transcoder fed 64 KiB chunks and the watch transcoder over ``events`` pod
    frames, with the wire reader (kproxy's default) and with the upb path (``wire=False``)."""
    wire = ProtobufCodec()
    upb = ProtobufCodec(wire.schema, wire=False)
    items = json.loads(json_list)["items"][:events]
    for it in items:
        it.setdefault("kind", "Pod")
        it.setdefault("apiVersion", "v1")
    frames = b"".join(wire.encode_watch_event("MODIFIED", it) for it in items)

    def listed(codec: ProtobufCodec) -> Callable[[], int]:
        def go() -> int:
            t = codec.list_transcoder()
            out = sum(len(t.feed(pb_list[i : i + 65536])) for i in range(0, len(pb_list), 65536))
            return out + len(t.finish())

        return go

    def watched(codec: ProtobufCodec) -> Callable[[], int]:
        def go() -> int:
            w = codec.watch_transcoder()
            out = sum(len(w.feed(frames[i : i + 65536])) for i in range(0, len(frames), 65536))
            return out + len(w.finish())

        return go

    list_size, watch_size = listed(wire)(), watched(wire)()
    speeds = _speeds({"list": listed(wire), "list upb": listed(upb), "watch": watched(wire), "watch upb": watched(upb)})
    body = f"LIST body ({_mb(len(pb_list))} MB protobuf), 64 KiB chunks"
    return {
        body: (speeds["list"], list_size),
        "same, upb path (wire reader off)": (speeds["list upb"], list_size),
        f"{events} watch frames (one pod each)": (speeds["watch"], watch_size),
        "same frames, upb path (wire reader off)": (speeds["watch upb"], watch_size),
    }


def _ms(x: float) -> str:
    return f"{x * 1000:.0f}"


def _mb(x: float) -> str:
    return f"{x / 1e6:.2f}"


def report(
    args: argparse.Namespace,
    lists: list[ListRow],
    watches: list[WatchRow],
    speeds: dict[str, tuple[float, int]],
    k8s: str,
) -> str:
    med = statistics.median
    lines = [
        f"# transcode benchmark ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
        "",
        f"kube-apiserver {k8s}, Python {platform.python_version()}, {os.cpu_count()} CPUs (shared), "
        f"{args.pods} pods in `{NAMESPACE}`, {args.lists} LISTs per peer (medians), {args.events} watch events.",
        "",
        f"## LIST of {args.pods} pods",
        "",
        "| peer | apiserver CPU s / LIST | kproxy CPU s / LIST | MB apiserver -> its client "
        "| MB to the benchmark | latency ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in lists:
        kp = f"{med(r.kproxy_cpu):.3f}" if r.peer.startswith("kproxy") else "-"
        lines.append(
            f"| {r.peer} | {med(r.apiserver_cpu):.3f} | {kp} | {_mb(med(r.upstream_bytes))} | "
            f"{_mb(med(r.client_bytes))} | {_ms(med(r.latency))} |"
        )
    by = {r.peer: r for r in lists}
    d, k = med(by["direct JSON"].apiserver_cpu), med(by["kproxy protobuf->JSON"].apiserver_cpu)
    ratio = d / k if k else float("inf")
    lines += ["", f"apiserver CPU per LIST, direct JSON / through kproxy: **{ratio:.2f}x** (goal: >= 2x)", ""]
    lines += [
        f"## WATCH: {args.events} pod events (each pod patched straight at the apiserver)",
        "",
        "| peer | events | apiserver CPU s (window) | kproxy CPU s | MB apiserver -> its client | "
        "MB to the benchmark | event latency p50 ms | p99 ms | window s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for w in watches:
        lat = w.latencies
        p99 = percentile(lat, 99)
        kp = f"{w.kproxy_cpu:.2f}" if w.kproxy_cpu is not None else "-"
        lines.append(
            f"| {w.peer} | {w.events} | {w.apiserver_cpu:.2f} | {kp} | {_mb(w.upstream_bytes)} | "
            f"{_mb(w.client_bytes)} | {_ms(percentile(lat, 50))} | {_ms(p99)} | {w.window:.1f} |"
        )
    lines += [
        "",
        "## Transcoder alone (this process, one core, gc on; rows taking turns, median of 7)",
        "",
        "| input | JSON out MB | MB/s of JSON per core |",
        "| --- | ---: | ---: |",
    ]
    for name, (speed, size) in speeds.items():
        lines.append(f"| {name} | {_mb(size)} | {speed:.0f} |")
    lines += ["", "Goal: >= 60 MB/s of JSON output per core.", ""]
    return "\n".join(lines)


@contextlib.contextmanager
def proxy(cp: envtest.ControlPlaneInfo) -> Iterator[RunningProxy]:
    with tempfile.TemporaryDirectory(prefix="kproxy-bench-transcode-") as tmp:
        rp = start_proxy(
            Path(tmp),
            cp.admin_kubeconfig,
            extra={"filters": [{"name": "transcode", "upstream": "protobuf"}], "log": {"level": "warning"}},
        )
        try:
            yield rp
        finally:
            rp.stop()


async def amain(args: argparse.Namespace, cp: envtest.ControlPlaneInfo, rp: RunningProxy) -> str:
    await seed_pods(cp, args.pods)
    b = Bench(cp, rp)
    try:
        async with b.direct.get("/version") as r:
            k8s = (await r.json())["gitVersion"]
        lists, pb_list, json_list = await b.lists(args.lists)
        async with b.direct.get(LIST_PATH, headers={"Accept": JSON}) as r:
            names = [it["metadata"]["name"] for it in (await r.json())["items"]]
        watches = []
        for peer in ("direct JSON", "kproxy protobuf->JSON"):
            # Warm-up (not reported): the patchers' connections, the watch cache, the codec.
            await b.watch(peer, names[-100:], min(100, len(names)))
        for peer in ("direct JSON", "kproxy protobuf->JSON"):
            watches.append(await b.watch(peer, names, args.events))
            log(f"WATCH {peer} done")
    finally:
        await b.close()
    return report(args, lists, watches, transcoder_speeds(pb_list, json_list, args.events), k8s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--envtest-dir", type=Path, default=os.environ.get(envtest.DIR_ENV) or None)
    p.add_argument("--pods", type=int, default=5000)
    p.add_argument("--events", type=int, default=1000)
    p.add_argument("--lists", type=int, default=5)
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    with control_plane(args.envtest_dir) as cp, proxy(cp) as rp:
        text = asyncio.run(amain(args, cp, rp))
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
