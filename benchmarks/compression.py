"""The compression filter measured against the kube-apiserver's own gzip, in one run.

    python -m benchmarks.compression [--envtest-dir DIR] [--pods 5000] [--updates 1000]
        [--watchers 10] [--cached-watchers 10,100] [--ab-pairs 3] [--only-watch] [--output FILE]

On the local control plane, in namespace ``bench-compress``, with realistic pods (~3 KB of JSON
each as the apiserver returns them, managedFields included; they stay Pending, there is no
scheduler):

* LIST of every pod (a) straight from the apiserver with ``Accept-Encoding: gzip`` (its own gzip,
  level 1), (b) through kproxy with gzip, (c) through kproxy with zstd, (d) through kproxy with
  no compression: bytes on the wire, client-side latency, kproxy CPU per response; each body is
  decoded and checked against the uncompressed list (same items).
* a watch on the namespace while ``--updates`` pod updates are written, through kproxy without
  and with watch compression (``Accept-Encoding: gzip`` and ``zstd``): bytes per event and
  kproxy CPU per event per watcher (``--watchers`` watchers at once); then zstd watches through
  kproxy with its default watch state and through a second kproxy with a smaller one (16 KiB
  window, 2^10 hash), ``--ab-pairs`` rounds each, alternating (medians and ranges).
* the same watch rounds served from the watch cache: a third kproxy whose chain is
  ``compression`` (``watch: true``) in front of ``watchcache`` (pods), once its cache has listed,
  with each count of ``--cached-watchers`` watchers; every watch is checked to be served from
  the cache (its metrics), none passed on; then gzip and zstd again with the largest count,
  ``--cached-late`` of its watchers (half by default) opened half way through the updates at the
  same resource version, so that they replay what they missed on their own and then catch up
  (with a shared compressor: their own frames, then joining the shared one).
* In every watch round, bytes per event are the compressed bytes each watcher received, and
  each watcher's stream is decoded as it comes (several zstd frames / gzip members in a row
  allowed, counted) and its events checked: each patched pod once, with the round's update,
  nothing else; a broken or incomplete stream fails the benchmark. "Of which compressing" is
  ``kproxy_compression_cpu_seconds_total{operation="compress"}``, read once kproxy has closed
  the round's watches (a stream adds to it every 64 codec calls and when it ends).
* the codecs themselves on the list body (MB/s of input, ratio), which is how the default
  levels and threshold were chosen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.lib.cluster import control_plane, start_kproxy
from benchmarks.lib.common import BenchError, log, work_dir
from benchmarks.lib.data import NAMESPACE, seed_pods
from benchmarks.lib.procs import Process, cpu_seconds_or
from kproxy.localcluster import envtest

NAN = float("nan")

# --------------------------------------------------------------------------- peers


def start_kproxy_compression(work: Path, info: envtest.ControlPlaneInfo) -> tuple[Process, str]:
    """``kproxy run`` with the compression filter (watch compression on), plain HTTP."""
    proc, peer = start_kproxy(work, info, [{"name": "compression", "watch": True}])
    return proc, peer.base_url


def decode_body(body: bytes, coding: str) -> bytes:
    from backports import zstd

    from kproxy.compress.backends import gzip_decoder

    if coding == "gzip":
        dec = gzip_decoder()
        return dec.decompress(body) + dec.finish()
    if coding == "zstd":
        return bytes(zstd.decompress(body))
    return body


# --------------------------------------------------------------------------- LIST


async def measure_list(
    info: envtest.ControlPlaneInfo, kproxy_url: str, admin_url: str, kproxy_pid: int, fetches: int
) -> tuple[list[dict[str, Any]], bytes]:
    """Every case fetched ``fetches`` times in turn (after one warm-up each)."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    cases = [
        ("direct, identity", info.server, "identity"),
        ("direct, gzip (apiserver)", info.server, "gzip"),
        ("kproxy, identity", kproxy_url, "identity"),
        ("kproxy, gzip", kproxy_url, "gzip"),
        ("kproxy, zstd", kproxy_url, "zstd"),
    ]
    ssl_ctx = info.ssl_context()
    rows: list[dict[str, Any]] = []
    reference: bytes | None = None
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        auto_decompress=False, connector=aiohttp.TCPConnector(ssl=ssl_ctx), timeout=timeout
    ) as s:
        for name, base, coding in cases:
            headers = {"Accept": "application/json", "Accept-Encoding": coding}
            lat: list[float] = []
            wire = 0
            got = ""
            body = b""
            codec_cpu = 0.0
            for i in range(fetches + 1):
                c0 = await _metric(s, admin_url, "kproxy_compression_cpu_seconds_total")
                cpu0 = (cpu_seconds_or(kproxy_pid, NAN), cpu_seconds_or(info.apiserver_pid, NAN))
                t = time.perf_counter()
                async with s.get(base + path, headers=headers) as r:
                    body = await r.read()
                    got = r.headers.get("Content-Encoding", "identity")
                dt = time.perf_counter() - t
                cpu1 = (cpu_seconds_or(kproxy_pid, NAN), cpu_seconds_or(info.apiserver_pid, NAN))
                c1 = await _metric(s, admin_url, "kproxy_compression_cpu_seconds_total")
                if i == 0:
                    kp_cpu = 0.0
                    api_cpu = 0.0
                    continue  # warm-up
                lat.append(dt)
                kp_cpu += cpu1[0] - cpu0[0]
                codec_cpu += c1 - c0
                api_cpu += cpu1[1] - cpu0[1]
                wire = len(body)
            plain = decode_body(body, got)
            items = json.loads(plain)["items"]
            if reference is None:
                reference = plain
            same = [i["metadata"]["name"] for i in items] == [
                i["metadata"]["name"] for i in json.loads(reference)["items"]
            ]
            lat.sort()
            rows.append(
                {
                    "case": name,
                    "encoding": got,
                    "items": len(items),
                    "same_items": same,
                    "wire_bytes": wire,
                    "plain_bytes": len(plain),
                    "latency_ms_median": lat[len(lat) // 2] * 1000,
                    "latency_ms_min": lat[0] * 1000,
                    "kproxy_cpu_ms": kp_cpu / fetches * 1000 if base == kproxy_url else None,
                    "codec_cpu_ms": codec_cpu / fetches * 1000 if base == kproxy_url else None,
                    "apiserver_cpu_ms": api_cpu / fetches * 1000,
                }
            )
            log(f"LIST {name}: {wire} bytes ({got}), {lat[len(lat) // 2] * 1000:.0f} ms")
    assert reference is not None
    return rows, reference


# --------------------------------------------------------------------------- WATCH

#: kproxy's compression CPU, the codec's thread time (one call in 8 timed, scaled by bytes); the
#: same series whichever way the watch is served, passed through or from the cache.
COMPRESSION_CPU = "kproxy_compression_cpu_seconds_total"
CACHED_CHAIN: list[dict[str, Any]] = [
    {"name": "compression", "watch": True},
    {"name": "watchcache", "resources": ["pods"]},
]


async def _metric(s: aiohttp.ClientSession, admin_url: str, series: str, **labels: str) -> float:
    """The sum of ``series`` samples on kproxy's admin ``/metrics`` whose labels include ``labels``."""
    from prometheus_client.parser import text_string_to_metric_families

    async with s.get(admin_url + "/metrics") as r:
        text = await r.text()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == series and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _px_session() -> aiohttp.ClientSession:
    """The watchers' session: no decoding (the wire bytes are counted) and no connection limit
    (aiohttp's default of 100 would leave a metrics scrape waiting behind 100 open watches)."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=120)
    return aiohttp.ClientSession(auto_decompress=False, timeout=timeout, connector=aiohttp.TCPConnector(limit=0))


async def _names(api: aiohttp.ClientSession, path: str, updates: int) -> list[str]:
    async with api.get(path, params={"limit": str(updates)}) as r:
        names = [p["metadata"]["name"] for p in (await r.json())["items"]]
    if len(names) < updates:
        raise BenchError(f"{NAMESPACE} holds {len(names)} pods, fewer than --updates {updates}")
    return names


async def measure_watch(
    info: envtest.ControlPlaneInfo,
    kproxy_url: str,
    admin_url: str,
    kproxy_pid: int,
    updates: int,
    watchers: int,
) -> list[dict[str, Any]]:
    """For each coding: ``watchers`` watches open through kproxy while ``updates`` pods are patched."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    ssl_ctx = info.ssl_context()
    rows: list[dict[str, Any]] = []
    async with (
        _px_session() as px,
        aiohttp.ClientSession(base_url=info.server, connector=aiohttp.TCPConnector(ssl=ssl_ctx)) as api,
    ):
        names = await _names(api, path, updates)
        for round_no, coding in enumerate(("identity", "gzip", "zstd")):
            w = _WatchRound(px, api, kproxy_url + path, coding, updates, watchers)
            rows.append(await w.run(admin_url, kproxy_pid, names, round_no))
            log(f"WATCH {coding}: {rows[-1]['bytes_per_event']:.0f} bytes/event")
    return rows


async def wait_cache_listed(admin_url: str, kproxy_url: str, timeout: float = 120.0) -> None:
    """Until kproxy's pods cache has made its first list and answers lists itself: before
    that the watch cache passes requests on, and the rows would measure the passthrough."""
    deadline = time.monotonic() + timeout
    async with _px_session() as s:
        while True:
            async with s.get(kproxy_url + "/api/v1/pods", params={"resourceVersion": "0", "limit": "1"}) as r:
                await r.read()
            if await _metric(
                s, admin_url, "kproxy_watchcache_reads_total", resource="pods", verb="list", served="cache"
            ):
                return
            if time.monotonic() > deadline:
                raise BenchError(f"kproxy's pods cache answered no list from the cache within {timeout:.0f}s")
            await asyncio.sleep(0.2)


async def measure_cached_watch(
    info: envtest.ControlPlaneInfo,
    kproxy_url: str,
    admin_url: str,
    kproxy_pid: int,
    updates: int,
    watcher_counts: Sequence[int],
    late: int = 0,
) -> list[dict[str, Any]]:
    """As :func:`measure_watch`, through a kproxy whose ``watchcache`` serves the watches, for
    each of ``watcher_counts``; every watch is checked to be served from the cache. With
    ``late``, gzip and zstd again with the largest count, ``late`` of its watchers opened half
    way through the updates: they replay what they missed on their own (their own frames) and
    then catch up with the others."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    ssl_ctx = info.ssl_context()
    rows: list[dict[str, Any]] = []
    await wait_cache_listed(admin_url, kproxy_url)
    async with (
        _px_session() as px,
        aiohttp.ClientSession(base_url=info.server, connector=aiohttp.TCPConnector(ssl=ssl_ctx)) as api,
    ):
        names = await _names(api, path, updates)
        round_no = 30
        rounds = [(w, c, 0) for w in watcher_counts for c in ("identity", "gzip", "zstd")]
        if late and watcher_counts:
            rounds += [(max(watcher_counts), c, late) for c in ("gzip", "zstd")]
        for watchers, coding, n_late in rounds:
            round_no += 1
            w = _WatchRound(px, api, kproxy_url + path, coding, updates, watchers, cached=True, late=n_late)
            rows.append(await w.run(admin_url, kproxy_pid, names, round_no))
            r = rows[-1]
            log(
                f"WATCH from the cache, {watchers} watchers ({n_late} late), {coding}: "
                f"{r['bytes_per_event']:.0f} bytes/event, "
                f"{r['kproxy_cpu_us_per_event_per_watcher']:.1f} us/event/watcher, "
                f"{r['frames_per_watcher']:.1f} frames/watcher"
            )
    return rows


#: A smaller zstd watch state (``watch_zstd_window_log``/``hash_log``), measured against the
#: default in the same run.
SMALLER_WATCH_STATE = {"watch_zstd_window_log": 14, "watch_zstd_hash_log": 10}


async def measure_watch_ab(
    info: envtest.ControlPlaneInfo,
    sides: dict[str, tuple[str, str, int]],
    updates: int,
    watchers: int,
    pairs: int,
) -> dict[str, list[dict[str, Any]]]:
    """zstd watch rounds through each of ``sides`` (name -> kproxy url, admin url, pid), taking
    turns ``pairs`` times (the order flips every pair): the same load lands on both."""
    path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    ssl_ctx = info.ssl_context()
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    async with (
        _px_session() as px,
        aiohttp.ClientSession(base_url=info.server, connector=aiohttp.TCPConnector(ssl=ssl_ctx)) as api,
    ):
        names = await _names(api, path, updates)
        round_no = 10
        for pair in range(pairs):
            for name in list(sides) if pair % 2 == 0 else list(reversed(sides)):
                url, admin_url, pid = sides[name]
                round_no += 1
                w = _WatchRound(px, api, url + path, "zstd", updates, watchers)
                rows[name].append(await w.run(admin_url, pid, names, round_no))
                log(f"WATCH zstd, {name}: {rows[name][-1]['compression_cpu_us_per_event_per_watcher']:.1f} us/event")
    return rows


class StreamDecoder:
    """One watcher's body decoded as it comes: a gzip stream of one or more members, a zstd
    stream of one or more frames (RFC 1952 and RFC 8878 both allow several in a row; a cached
    watch whose compressor is shared is cut into several), or identity. ``frames`` counts the
    members/frames begun, ``ended`` those that ended (their checksum verified by the codec)."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self.frames = 0
        self.ended = 0
        self._obj: Any = None

    def _new(self) -> Any:
        import zlib

        from backports import zstd

        self.frames += 1
        if self.coding == "gzip":
            return zlib.decompressobj(wbits=31)
        return zstd.ZstdDecompressor()

    def decompress(self, data: bytes) -> bytes:
        if self.coding == "identity":
            return data
        out: list[bytes] = []
        while data:
            if self._obj is None or self._obj.eof:
                self._obj = self._new()
            out.append(bytes(self._obj.decompress(data)))
            # What follows the end of a member/frame is the next one's start.
            data = b""
            if self._obj.eof:
                self.ended += 1
                data = bytes(self._obj.unused_data)
        return b"".join(out)


class _WatchRound:
    """``watchers`` watches with one Accept-Encoding, counting wire bytes, decoding each
    watcher's stream and checking its events: every patched pod once, with this round's
    annotation, nothing else (a broken or incomplete stream fails the benchmark)."""

    def __init__(
        self,
        px: aiohttp.ClientSession,
        api: aiohttp.ClientSession,
        url: str,
        coding: str,
        updates: int,
        watchers: int,
        *,
        cached: bool = False,
        late: int = 0,
    ) -> None:
        self.px, self.api, self.url, self.coding = px, api, url, coding
        self.updates, self.watchers, self.cached = updates, watchers, cached
        #: watchers opened (at the same resource version) once half the updates are written:
        #: they replay what they missed, then catch up with the others
        self.late = late
        self.counts = [0] * watchers
        self.wire = [0] * watchers
        self.decoders = [StreamDecoder(coding) for _ in range(watchers)]
        self.seen: list[set[bytes]] = [set() for _ in range(watchers)]
        self.left = [b""] * watchers
        self.opened = 0
        self.all_open = asyncio.Event()
        self.done = asyncio.Event()
        self.error: str | None = None
        self.expected: dict[bytes, bytes] = {}

    def fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
        self.done.set()

    def check(self, k: int, line: bytes) -> None:
        """One event line of watcher ``k``: a MODIFIED pod this round patched, seen once. The
        first watcher's events are parsed as JSON in full; the others' are checked on their
        bytes (the watch cache and the apiserver write ``type``, ``kind`` and ``metadata.name``
        first), which the client can afford at 100 watchers."""
        head = b'{"type":"MODIFIED","object":{"kind":"Pod","apiVersion":"v1","metadata":{"name":"'
        if not line.startswith(head):
            raise BenchError(f"watcher {k}: not a MODIFIED pod event: {line[:200]!r}")
        name = line[len(head) : line.index(b'"', len(head))]
        marker = self.expected.get(name)
        if marker is None or marker not in line:
            raise BenchError(f"watcher {k}: an event for {name!r} without this round's annotation")
        if name in self.seen[k]:
            raise BenchError(f"watcher {k}: {name!r} twice")
        self.seen[k].add(name)
        if k == 0:
            event = json.loads(line)
            annotations = event["object"]["metadata"]["annotations"]
            if annotations.get("bench/update") != marker.split(b'"')[-2].decode():
                raise BenchError(f"watcher 0: {name!r} decoded with annotations {annotations}")

    async def watcher(self, k: int, rv: str) -> None:
        dec = self.decoders[k]
        params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "false"}
        headers = {"Accept": "application/json", "Accept-Encoding": self.coding}
        try:
            async with self.px.get(self.url, params=params, headers=headers) as r:
                if r.status != 200:
                    raise BenchError(f"watch: {r.status} {await r.text()}")
                got = r.headers.get("Content-Encoding", "identity")
                if got != self.coding:
                    raise BenchError(f"watch asked for {self.coding} came back with Content-Encoding {got}")
                self.opened += 1
                if self.opened >= self.watchers - self.late:
                    self.all_open.set()
                buf = b""
                async for chunk in r.content.iter_any():
                    self.wire[k] += len(chunk)
                    buf += dec.decompress(chunk)
                    lines = buf.split(b"\n")
                    buf = lines.pop()
                    for line in lines:
                        self.check(k, line)
                    self.counts[k] += len(lines)
                    self.left[k] = buf
                    if all(c >= self.updates for c in self.counts):
                        self.done.set()
                    if self.done.is_set():
                        return
            self.fail(f"watcher {k}: the stream ended after {self.counts[k]} of {self.updates} events")
        except BenchError as err:
            self.fail(str(err))
        except Exception as err:  # a broken stream (bad gzip/zstd data, a reset connection)
            self.fail(f"watcher {k}: {type(err).__name__}: {err}")

    async def patch(self, sem: asyncio.Semaphore, name: str, round_no: int) -> None:
        body = {"metadata": {"annotations": {"bench/update": f"{round_no}-{name}"}}}
        headers = {"Content-Type": "application/merge-patch+json"}
        path = self.url.split("://", 1)[1].split("/", 1)[1]
        async with sem, self.api.patch(f"/{path}/{name}", json=body, headers=headers) as r:
            if r.status != 200:
                raise BenchError(f"patch {name}: {r.status} {await r.text()}")

    async def _cache_reads(self, admin_url: str, served: str) -> float:
        return await _metric(
            self.px, admin_url, "kproxy_watchcache_reads_total", resource="pods", verb="watch", served=served
        )

    async def _wait_open(self, admin_url: str, cache0: float, upstream0: float) -> None:
        """Until every watch (but the late ones) has its response head; through the cache,
        until the cache counts them all as its own (none passed through)."""
        early = self.watchers - self.late
        try:
            await asyncio.wait_for(self.all_open.wait(), 60)
        except TimeoutError:
            raise BenchError(f"{self.opened} of {early} watches opened ({self.error})") from None
        if self.error:
            raise BenchError(self.error)
        if not self.cached:
            await asyncio.sleep(1.0)  # every watch open upstream before the first update
            return
        await self._served_from_cache(admin_url, cache0, upstream0, early)

    async def _served_from_cache(self, admin_url: str, cache0: float, upstream0: float, count: int) -> None:
        deadline = time.monotonic() + 30
        while (served := await self._cache_reads(admin_url, "cache") - cache0) < count:
            if time.monotonic() > deadline:
                raise BenchError(f"{served:.0f} of {count} watches served from the cache")
            await asyncio.sleep(0.1)
        passed = await self._cache_reads(admin_url, "upstream") - upstream0
        if served != count or passed:
            raise BenchError(f"{served:.0f} watches served from the cache, {passed:.0f} passed on")

    async def _settle(self, admin_url: str, open0: float, timeout: float = 30.0) -> None:
        """Until kproxy has closed this round's watches and its compression metric has stopped
        moving: a compressed stream adds its CPU to the metric every 64 codec calls and when it
        ends, so read before the streams end, the tail of every watch (all of it when a watcher
        got fewer than 64 writes, as cached watches coalescing events do) would be missing, and
        would land in the next round's figures instead."""
        deadline = time.monotonic() + timeout
        while await _metric(self.px, admin_url, "kproxy_open_watches") > open0:
            if time.monotonic() > deadline:
                raise BenchError(f"kproxy still holds this round's watches open {timeout:.0f}s after they closed")
            await asyncio.sleep(0.1)
        last = await _metric(self.px, admin_url, COMPRESSION_CPU, operation="compress")
        while True:
            await asyncio.sleep(0.3)
            now = await _metric(self.px, admin_url, COMPRESSION_CPU, operation="compress")
            if now == last or time.monotonic() > deadline:
                return
            last = now

    async def run(self, admin_url: str, kproxy_pid: int, names: list[str], round_no: int) -> dict[str, Any]:
        path = "/" + self.url.split("://", 1)[1].split("/", 1)[1]
        self.expected = {n.encode(): f'"bench/update":"{round_no}-{n}"'.encode() for n in names}
        async with self.api.get(path, params={"limit": "1"}) as r:
            rv = (await r.json())["metadata"]["resourceVersion"]
        cache0 = upstream0 = 0.0
        if self.cached:
            cache0, upstream0 = (
                await self._cache_reads(admin_url, "cache"),
                await self._cache_reads(admin_url, "upstream"),
            )
        open0 = await _metric(self.px, admin_url, "kproxy_open_watches")
        early = self.watchers - self.late
        tasks = [asyncio.create_task(self.watcher(k, rv)) for k in range(early)]
        patched = 0

        async def patch(name: str) -> None:
            nonlocal patched
            await self.patch(sem, name, round_no)
            patched += 1
            if self.late and patched == len(names) // 2:
                tasks.extend(asyncio.create_task(self.watcher(k, rv)) for k in range(early, self.watchers))

        try:
            await self._wait_open(admin_url, cache0, upstream0)
            s_cpu0 = await _metric(self.px, admin_url, COMPRESSION_CPU, operation="compress")
            cpu0 = cpu_seconds_or(kproxy_pid, NAN)
            t = time.monotonic()
            sem = asyncio.Semaphore(16)
            await asyncio.gather(*(patch(n) for n in names))
            try:
                await asyncio.wait_for(self.done.wait(), 120)
            except TimeoutError:
                raise BenchError(f"watchers saw {self.counts} of {self.updates} events") from None
            cpu1 = cpu_seconds_or(kproxy_pid, NAN)
            seconds = time.monotonic() - t
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        await self._settle(admin_url, open0)
        s_cpu1 = await _metric(self.px, admin_url, COMPRESSION_CPU, operation="compress")
        if self.error:
            raise BenchError(f"{self.coding}, {self.watchers} watchers: {self.error}")
        if self.cached and self.late:
            await self._served_from_cache(admin_url, cache0, upstream0, self.watchers)
        for k in range(self.watchers):
            if self.counts[k] != self.updates or len(self.seen[k]) != self.updates or self.left[k]:
                raise BenchError(
                    f"watcher {k}: {self.counts[k]} events, {len(self.seen[k])} pods of {self.updates}, "
                    f"{len(self.left[k])} bytes of a partial event"
                )
        events = self.updates * self.watchers
        return {
            "encoding": self.coding,
            "watchers": self.watchers,
            "late": self.late,
            "events_per_watcher": self.updates,
            "bytes_per_event": sum(self.wire) / events,
            "kproxy_cpu_us_per_event_per_watcher": (cpu1 - cpu0) / events * 1e6,
            "compression_cpu_us_per_event_per_watcher": (s_cpu1 - s_cpu0) / events * 1e6,
            "frames_per_watcher": sum(d.frames for d in self.decoders) / self.watchers,
            "seconds": seconds,
        }


# --------------------------------------------------------------------------- codecs


def measure_codecs(body: bytes) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The codecs on the real list body (one core, in this process), per-event costs on its
    items as watch events, and the cost and gain on small bodies (the threshold)."""
    import zlib

    import brotli  # type: ignore[import-untyped]
    from zlib_ng import zlib_ng

    from kproxy.compress.backends import gzip_codec, zstd_codec

    def best_of(fn: Any, data: bytes, n: int = 3) -> tuple[float, bytes]:
        best, out = float("inf"), b""
        for _ in range(n):
            t = time.thread_time()
            out = fn(data)
            best = min(best, time.thread_time() - t)
        return best, out

    def streamed(c: Any) -> Any:
        def run(data: bytes) -> bytes:
            e = c.new_encoder()
            step = 256 * 1024
            parts = [e.compress(data[i : i + step]) for i in range(0, len(data), step)]
            return bytes(b"".join(parts) + e.finish())

        return run

    codecs: list[tuple[str, Any]] = [
        ("gzip isal L0", gzip_codec(0).compress),
        ("gzip isal L1 (kproxy default)", gzip_codec(1).compress),
        ("gzip isal L2", gzip_codec(2).compress),
        ("gzip isal L1, streamed 256 KiB (kproxy lists)", streamed(gzip_codec(1))),
        ("gzip zlib L1 (as the apiserver)", lambda d: zlib.compress(d, 1, 31)),
        ("gzip zlib-ng L1", lambda d: zlib_ng.compress(d, 1, 31)),
        ("zstd -1", zstd_codec(-1).compress),
        ("zstd 1 (kproxy default)", zstd_codec(1).compress),
        ("zstd 1, streamed 256 KiB (kproxy lists)", streamed(zstd_codec(1))),
        ("zstd 3", zstd_codec(3).compress),
        ("br q1", lambda d: brotli.compress(d, quality=1)),
    ]
    table = []
    for name, fn in codecs:
        secs, out = best_of(fn, body)
        table.append({"codec": name, "mb_per_s": len(body) / secs / 1e6, "ratio": len(body) / len(out)})

    items = json.loads(body)["items"][:1000]
    events = [json.dumps({"type": "MODIFIED", "object": it}, separators=(",", ":")).encode() + b"\n" for it in items]
    plain = sum(map(len, events))
    per_event = []
    watchers = 10  # encoders used in turn, one per watcher, as kproxy does
    for name, c in (
        ("gzip isal L0 (kproxy watch default)", gzip_codec(0)),
        ("gzip isal L1", gzip_codec(1)),
        ("zstd 1, 64 KiB window, hash 2^12", zstd_codec(1, 16, 12)),
        ("zstd -1, 64 KiB window, hash 2^11 (kproxy watch)", zstd_codec(-1, 16, 11)),
        ("zstd -1, 16 KiB window, hash 2^10", zstd_codec(-1, 14, 10)),
        ("zstd -1, 32 KiB window, hash 2^10", zstd_codec(-1, 15, 10)),
        ("zstd 1, level's own state", zstd_codec(1)),
    ):
        encs = [c.new_encoder() for _ in range(watchers)]
        out_bytes = 0
        t = time.thread_time()
        for ev in events:
            for e in encs:
                out_bytes += len(e.compress_flush(ev))
        secs = time.thread_time() - t
        n = len(events) * watchers
        per_event.append(
            {
                "codec": name,
                "us_per_event": secs / n * 1e6,
                "bytes_per_event": out_bytes / n,
                "cool_us": _cold(c, events, other_mb=1),
                "cold_us": _cold(c, events),
            }
        )
    per_event.insert(
        0,
        {"codec": "none", "us_per_event": 0.0, "bytes_per_event": plain / len(events), "cool_us": 0.0, "cold_us": 0.0},
    )

    small = []
    for size in (256, 512, 1024, 2048, 4096):
        data = body[:size]
        row: dict[str, Any] = {"size": size}
        for name, fn in (("gzip", gzip_codec(1).compress), ("zstd", zstd_codec(1).compress)):
            n = 2000
            t = time.thread_time()
            for _ in range(n):
                out_b = fn(data)
            row[f"{name}_us"] = (time.thread_time() - t) / n * 1e6
            row[f"{name}_bytes"] = len(out_b)
        small.append(row)
    return table, per_event, small


def _cold(c: Any, events: list[bytes], watchers: int = 10, count: int = 300, other_mb: int = 8) -> float:
    """us per event with the caches cold: 8 MB (``other_mb``) read before each codec call (the codec alone is
    timed). In a proxy serving many watches every call starts with the watcher's compressor
    state evicted by everything else that ran since its last event; this is harsher than what
    kproxy sees in the watch benchmark (where the codec costs between the two columns) and
    ranks the settings by their cold cost, which warm figures do not."""
    other = bytes(other_mb << 20)
    encs = [c.new_encoder() for _ in range(watchers)]
    secs = 0.0
    for ev in events[:count]:
        for e in encs:
            other.count(b"\x01")  # reads 8 MB (no allocation): evicts L1, L2 and much of L3
            t = time.thread_time()
            e.compress_flush(ev)
            secs += time.thread_time() - t
    return secs / (min(count, len(events)) * watchers) * 1e6


# --------------------------------------------------------------------------- report


def report(
    lists: list[dict[str, Any]],
    watches: list[dict[str, Any]],
    codecs: list[dict[str, Any]],
    per_event: list[dict[str, Any]],
    small: list[dict[str, Any]],
    pods: int,
    ab: dict[str, list[dict[str, Any]]] | None = None,
    cached: list[dict[str, Any]] | None = None,
) -> str:
    """The tables; the LIST and codec ones only when measured (``lists`` and ``codecs`` empty
    with ``--only-watch``)."""
    out: list[str] = []
    if lists:
        out += _list_table(lists, pods)
    out += _watch_tables(watches, cached or [])
    if ab:
        out += _ab_table(ab)
    if codecs:
        out += _codec_tables(codecs, per_event, small)
    return "\n".join(out) + "\n"


def _list_table(lists: list[dict[str, Any]], pods: int) -> list[str]:
    out: list[str] = []
    plain = lists[0]["plain_bytes"]
    out.append(f"LIST of {pods} pods ({plain / 1e6:.1f} MB of JSON, {plain // pods} B per pod), same run:\n")
    out.append(
        "| case | wire bytes | vs apiserver gzip | latency median (min) | kproxy CPU / response "
        "| of which compressing (input rate) | apiserver CPU / response | same items |"
    )
    out.append("|---|---|---|---|---|---|---|---|")
    ref = next(r["wire_bytes"] for r in lists if r["case"].startswith("direct, gzip"))
    for r in lists:
        kp = "-" if r["kproxy_cpu_ms"] is None else f"{r['kproxy_cpu_ms']:.0f} ms"
        codec_ms = r["codec_cpu_ms"]
        codec = "-"
        if codec_ms:
            codec = f"{codec_ms:.1f} ms ({r['plain_bytes'] / codec_ms / 1e6:.2f} GB/s)"
        out.append(
            f"| {r['case']} | {r['wire_bytes']:,} | {r['wire_bytes'] / ref * 100:.0f}% "
            f"| {r['latency_ms_median']:.0f} ms ({r['latency_ms_min']:.0f}) | {kp} | {codec} "
            f"| {r['apiserver_cpu_ms']:.0f} ms | {'yes' if r['same_items'] else 'NO'} |"
        )
    return out


def _watch_tables(watches: list[dict[str, Any]], cached: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    w0 = watches[0]
    out.append(
        f"\nWatch: {w0['watchers']} watchers through kproxy, {w0['events_per_watcher']} pod updates each "
        "(one MODIFIED event per update):\n"
    )
    out.append("| watch encoding | bytes / event | fewer bytes | kproxy CPU / event / watcher | of which compressing |")
    out.append("|---|---|---|---|---|")
    base = watches[0]["bytes_per_event"]
    for r in watches:
        out.append(
            f"| {r['encoding']} | {r['bytes_per_event']:.0f} | {base / r['bytes_per_event']:.1f}x "
            f"| {r['kproxy_cpu_us_per_event_per_watcher']:.1f} us "
            f"| {r['compression_cpu_us_per_event_per_watcher']:.1f} us |"
        )
    if cached:
        out.append(
            f"\nWatch served from the watch cache: kproxy with `compression` (`watch: true`) in front of "
            f"`watchcache` (`resources: [pods]`), {cached[0]['events_per_watcher']} pod updates each; every "
            "watcher's stream decoded (zstd frames / gzip members in a row) and its events checked; "
            "late watchers open at the same resource version half way through the updates, replay what "
            "they missed and catch up:\n"
        )
        out.append(
            "| watchers | watch encoding | bytes / event | fewer bytes | kproxy CPU / event / watcher "
            "| of which compressing | frames / members per watcher |"
        )
        out.append("|---|---|---|---|---|---|---|")
        for r in cached:
            base = next(
                c["bytes_per_event"]
                for c in cached
                if c["watchers"] == r["watchers"] and c["encoding"] == "identity" and not c["late"]
            )
            who = f"{r['watchers']}, {r['late']} of them late" if r["late"] else str(r["watchers"])
            frames = "-" if r["encoding"] == "identity" else f"{r['frames_per_watcher']:.1f}"
            out.append(
                f"| {who} | {r['encoding']} | {r['bytes_per_event']:.0f} "
                f"| {base / r['bytes_per_event']:.1f}x "
                f"| {r['kproxy_cpu_us_per_event_per_watcher']:.1f} us "
                f"| {r['compression_cpu_us_per_event_per_watcher']:.1f} us | {frames} |"
            )
    return out


def _ab_table(ab: dict[str, list[dict[str, Any]]]) -> list[str]:
    out: list[str] = []
    if ab:
        pairs = len(next(iter(ab.values())))
        out.append(
            f"\nzstd watch state, {pairs} rounds each through two kproxy processes taking turns (median, range):\n"
        )
        out.append("| zstd watch state | bytes / event | kproxy CPU / event / watcher | of which compressing |")
        out.append("|---|---|---|---|")
        for state, state_rows in ab.items():
            in_codec: list[float] = [r["compression_cpu_us_per_event_per_watcher"] for r in state_rows]
            whole: list[float] = [r["kproxy_cpu_us_per_event_per_watcher"] for r in state_rows]
            size = statistics.median(float(r["bytes_per_event"]) for r in state_rows)
            out.append(
                f"| {state} | {size:.0f} | {statistics.median(whole):.1f} us ({min(whole):.0f}-{max(whole):.0f}) "
                f"| {statistics.median(in_codec):.1f} us ({min(in_codec):.1f}-{max(in_codec):.1f}) |"
            )
    return out


def _codec_tables(
    codecs: list[dict[str, Any]], per_event: list[dict[str, Any]], small: list[dict[str, Any]]
) -> list[str]:
    out: list[str] = []
    out.append("\nCodecs on the same list body (one core, best of 3):\n")
    out.append("| codec | MB/s of input | ratio |")
    out.append("|---|---|---|")
    for r in codecs:
        out.append(f"| {r['codec']} | {r['mb_per_s']:.0f} | {r['ratio']:.1f} |")
    out.append(
        "\nPer watch event, flushed after each (the list's items as MODIFIED events), "
        "ten encoders used in turn (one per watcher); 1 MB or 8 MB read before each call:\n"
    )
    out.append("| codec | us / event | us / event, 1 MB between | us / event, caches cold (8 MB) | bytes / event |")
    out.append("|---|---|---|---|---|")
    for r in per_event:
        out.append(
            f"| {r['codec']} | {r['us_per_event']:.1f} | {r['cool_us']:.1f} | {r['cold_us']:.1f} "
            f"| {r['bytes_per_event']:.0f} |"
        )
    out.append("\nSmall bodies (the threshold): cost and size, one-shot:\n")
    out.append("| body | gzip us | gzip bytes | zstd us | zstd bytes |")
    out.append("|---|---|---|---|---|")
    for r in small:
        out.append(f"| {r['size']} | {r['gzip_us']:.1f} | {r['gzip_bytes']} | {r['zstd_us']:.1f} | {r['zstd_bytes']} |")
    return out


async def run(args: argparse.Namespace, info: envtest.ControlPlaneInfo, work: Path) -> str:
    await seed_pods(info, args.updates if args.only_watch else max(args.pods, args.updates))
    proc, url = start_kproxy_compression(work, info)
    small_work = work / "smaller-watch-state"
    small_work.mkdir()
    small_proc, small_peer = start_kproxy(
        small_work, info, [{"name": "compression", "watch": True, **SMALLER_WATCH_STATE}]
    )
    lists: list[dict[str, Any]] = []
    body = b""
    try:
        cfg = yaml.safe_load((work / "kproxy.yaml").read_text())
        admin_url = "http://" + cfg["admin_listen"]
        small_admin = "http://" + yaml.safe_load((small_work / "kproxy.yaml").read_text())["admin_listen"]
        if not args.only_watch:
            lists, body = await measure_list(info, url, admin_url, proc.proc.pid, args.fetches)
        watches = await measure_watch(info, url, admin_url, proc.proc.pid, args.updates, args.watchers)
        sides = {
            "default (64 KiB window, hash 2^11)": (url, admin_url, proc.proc.pid),
            "smaller (16 KiB window, hash 2^10)": (small_peer.base_url, small_admin, small_proc.proc.pid),
        }
        ab = await measure_watch_ab(info, sides, args.updates, args.watchers, args.ab_pairs) if args.ab_pairs else None
    finally:
        proc.stop()
        small_proc.stop()
    cached = await run_cached(args, info, work) if args.cached_watchers else None
    codecs, per_event, small = measure_codecs(body) if body else ([], [], [])
    return report(lists, watches, codecs, per_event, small, args.pods, ab, cached)


async def run_cached(args: argparse.Namespace, info: envtest.ControlPlaneInfo, work: Path) -> list[dict[str, Any]]:
    """The cached watch rounds through their own kproxy, started for them alone (its cache
    follows every pod update, which would otherwise load the machine during the other parts)."""
    cached_work = work / "watchcache"
    cached_work.mkdir()
    proc, peer = start_kproxy(cached_work, info, CACHED_CHAIN)
    try:
        admin_url = "http://" + yaml.safe_load((cached_work / "kproxy.yaml").read_text())["admin_listen"]
        counts = args.cached_watchers
        late = (max(counts) // 2 if counts else 0) if args.cached_late is None else args.cached_late
        return await measure_cached_watch(info, peer.base_url, admin_url, proc.proc.pid, args.updates, counts, late)
    finally:
        proc.stop()


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of watcher counts: {text!r}") from None
    if any(c < 1 for c in counts):
        raise argparse.ArgumentTypeError(f"watcher counts must be at least 1: {text!r}")
    return counts


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envtest-dir", type=Path, help="reuse a control plane started with `kproxy envtest up`")
    p.add_argument("--pods", type=int, default=5000)
    p.add_argument("--fetches", type=int, default=5, help="LIST fetches per case (after one warm-up)")
    p.add_argument("--updates", type=int, default=1000)
    p.add_argument("--watchers", type=int, default=10)
    p.add_argument("--ab-pairs", type=int, default=3, help="zstd watch rounds per watch state, alternating (0: none)")
    p.add_argument(
        "--cached-watchers",
        type=_counts,
        default=[10, 100],
        help="watcher counts of the watches served from the watch cache, comma-separated ('' skips them)",
    )
    p.add_argument(
        "--cached-late",
        type=int,
        help="watchers opened half way through the updates in extra gzip and zstd rounds with the largest "
        "--cached-watchers count (default: half of them; 0: no such rounds)",
    )
    p.add_argument(
        "--only-watch", action="store_true", help="skip the LIST and codec parts (and seed only --updates pods)"
    )
    p.add_argument("--output", type=Path)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with control_plane(args.envtest_dir) as info, work_dir() as work:
            text = asyncio.run(run(args, info, work))
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
