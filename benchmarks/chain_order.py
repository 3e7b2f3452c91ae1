"""Every built-in filter in one chain, in two orders: what cached watches and Strict writes cost.

    python -m benchmarks.chain_order [--envtest-dir DIR] [--watchers 20] [--events 200] [--rounds 3]
                                     [--writes 200]

Peers, measured in the same run (``kproxy run``, `credentials: proxy`, plain HTTP, all five
filters with the same settings as tests/e2e/test_full_chain_kubectl.py):

* ``sections order``: compression, transcode, dryrun, validation, watchcache (the order of the
  sections in config.example.yaml);
* ``README order``: compression, watchcache, dryrun, validation, transcode (the order that works,
  docs/using/configuration.md#the-order-that-works);
* ``apiserver``: the same watches and writes straight on the kube-apiserver (its watch is not
  compressed: it gzips no watch but a watch-list's).

Watches: ``--watchers`` JSON watches of one namespace's configmaps asking ``Accept-Encoding:
gzip``, then ``--events`` updates of a ConfigMap with 4 KB of data, written straight to the
apiserver one at a time (each waits until every watcher decoded its event). Reported: kproxy's
CPU (utime+stime of the process, 10 ms ticks) per event for all watchers, and the mean time from
the write's answer to the last watcher decoding the event.

Strict writes: ``--writes`` POSTs of a ConfigMap with an unknown field to a ``strict-*``
namespace (the validation rule makes them Strict), one at a time; reported: latency p50 and
kproxy's CPU per write, and how many kproxy answered itself (``outcome="rejected"``).
Rounds alternate the peers; the table gives the median round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.lib.procs import cpu_seconds
from benchmarks.lib.stats import percentile
from kproxy.localcluster import envtest
from kproxy.testing.proxyproc import RunningProxy, start_proxy

SECTIONS_ORDER = ("compression", "transcode", "dryrun", "validation", "watchcache")
README_ORDER = ("compression", "watchcache", "dryrun", "validation", "transcode")
SETTINGS: dict[str, dict[str, Any]] = {
    "compression": {"watch": True},
    "transcode": {"upstream": "protobuf"},
    "dryrun": {"rules": [{"name": "dry", "match": {"namespaces": ["dry-*"]}, "action": "enforce"}]},
    "validation": {
        "rules": [
            {"name": "strict", "match": {"namespaces": ["strict-*"]}, "level": "Strict"},
            {"name": "warn", "level": "Warn"},
        ]
    },
    "watchcache": {"resources": ["pods", "configmaps", "deployments.apps"]},
}


class Watcher:
    """One gzip JSON watch; counts the events it decoded."""

    def __init__(self) -> None:
        self.events = 0
        self.changed = asyncio.Event()

    async def run(self, session: aiohttp.ClientSession, url: str, ssl: Any, opened: asyncio.Event) -> None:
        headers = {"Accept": "application/json", "Accept-Encoding": "gzip"}
        async with session.get(url, headers=headers, ssl=ssl, auto_decompress=False) as resp:
            assert resp.status == 200, await resp.text()
            gz = resp.headers.get("Content-Encoding") == "gzip"
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            opened.set()
            buf = b""
            async for chunk in resp.content.iter_any():
                data = chunk
                while gz and data:  # a stream may be several gzip members in a row
                    out = inflate.decompress(data)
                    buf += out
                    data = inflate.unused_data
                    if inflate.eof:
                        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    else:
                        data = b""
                if not gz:
                    buf += chunk
                end = buf.rfind(b"\n") + 1
                if end:
                    for line in buf[:end].splitlines():
                        if not line.startswith(b'{"type":"MODIFIED"'):
                            raise AssertionError(f"unexpected watch event: {line[:300]!r}")
                        self.events += 1
                    buf = buf[end:]
                    self.changed.set()


async def watch_round(
    cp: envtest.ControlPlaneInfo, base: str, ssl: Any, ns: str, watchers: int, events: int, pid: int | None
) -> tuple[float, float]:
    """(kproxy CPU ms per event, mean ms from write to the last watcher's decode)."""
    direct_ssl = cp.ssl_context()
    path = f"/api/v1/namespaces/{ns}/configmaps/w"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        # The peer's own list: a cache that started after the object was written cannot serve a
        # watch from the object's resource version (a 410, as the apiserver's cacher).
        async with s.get(f"{base}/api/v1/namespaces/{ns}/configmaps", ssl=ssl) as r:
            rv = (await r.json())["metadata"]["resourceVersion"]
        ws = [Watcher() for _ in range(watchers)]
        url = f"{base}/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion={rv}"
        opened = [asyncio.Event() for _ in ws]
        tasks = [asyncio.create_task(w.run(s, url, ssl, o)) for w, o in zip(ws, opened, strict=True)]
        await asyncio.wait_for(asyncio.gather(*(o.wait() for o in opened)), 30)
        await asyncio.sleep(0.5)
        cpu0 = cpu_seconds(pid) if pid else 0.0
        delays: list[float] = []
        for i in range(events):
            patch = {"data": {"v": f"{i:06d}" + "x" * 4000}}
            async with s.patch(
                cp.server + path,
                data=json.dumps(patch),
                headers={"Content-Type": "application/merge-patch+json"},
                ssl=direct_ssl,
            ) as r:
                assert r.status == 200, await r.text()
            t = time.perf_counter()
            for w in ws:
                while w.events < i + 1:
                    w.changed.clear()
                    try:
                        await asyncio.wait_for(w.changed.wait(), 10)
                    except TimeoutError:
                        counts = [x.events for x in ws]
                        errors = [t.exception() for t in tasks if t.done() and not t.cancelled()]
                        msg = f"{base}: event {i + 1} not decoded in 10 s; per watcher: {counts}; {errors[:1]}"
                        raise AssertionError(msg) from None
            delays.append(time.perf_counter() - t)
        cpu = (cpu_seconds(pid) - cpu0) if pid else 0.0
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return cpu * 1000 / events, statistics.mean(delays) * 1000


async def write_round(
    cp: envtest.ControlPlaneInfo, base: str, ssl: Any, ns: str, writes: int, pid: int | None
) -> tuple[float, float]:
    """(p50 ms of a Strict POST with an unknown field, kproxy CPU ms per write)."""
    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "bogus": 1}).encode()
    query = "" if pid else "?fieldValidation=Strict"
    lat: list[float] = []
    async with aiohttp.ClientSession() as s:
        cpu0 = cpu_seconds(pid) if pid else 0.0
        for _ in range(writes):
            t = time.perf_counter()
            async with s.post(
                f"{base}/api/v1/namespaces/{ns}/configmaps{query}",
                data=body,
                headers={"Content-Type": "application/json", "Accept": "application/json"},
                ssl=ssl,
            ) as r:
                await r.read()
                assert r.status == 400, r.status
            lat.append(time.perf_counter() - t)
        cpu = (cpu_seconds(pid) - cpu0) if pid else 0.0
    return percentile(lat, 50) * 1000, cpu * 1000 / writes


def metric(rp: RunningProxy, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in rp.metrics().splitlines() if line.startswith(prefix))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envtest-dir", default=os.environ.get("KPROXY_ENVTEST_DIR"))
    ap.add_argument("--watchers", type=int, default=20)
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--writes", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--no-local-strict",
        action="store_true",
        help="validation local_strict: false (what every Strict POST cost in the sections order "
        "before validation answered protobuf requests itself)",
    )
    args = ap.parse_args()
    if not args.envtest_dir:
        print("--envtest-dir (or KPROXY_ENVTEST_DIR) must name a running `kproxy envtest up`", file=sys.stderr)
        return 2
    cp = envtest.load(Path(args.envtest_dir))
    suffix = secrets.token_hex(3)
    ns, strict_ns = f"bench-order-{suffix}", f"strict-bench-{suffix}"
    for name in (ns, strict_ns):
        code, data = cp.request("POST", "/api/v1/namespaces", body=json.dumps({"metadata": {"name": name}}).encode())
        assert code == 201, data
    cm = {"metadata": {"name": "w"}, "data": {"v": "start"}}
    assert cp.request("POST", f"/api/v1/namespaces/{ns}/configmaps", body=json.dumps(cm).encode())[0] == 201

    tmp = Path(tempfile.mkdtemp(prefix="bench-chain-order-"))
    peers: dict[str, RunningProxy | None] = {}
    for label, order in (("sections order", SECTIONS_ORDER), ("README order", README_ORDER)):
        filters = [{"name": n, **SETTINGS[n]} for n in order]
        if args.no_local_strict:
            next(f for f in filters if f["name"] == "validation")["local_strict"] = False
        peers[label] = start_proxy(tmp / label.replace(" ", "-"), cp.admin_kubeconfig, extra={"filters": filters})
    peers["apiserver"] = None
    results: dict[str, dict[str, list[float]]] = {p: {} for p in peers}
    try:
        for _ in range(args.rounds):
            for label, rp in peers.items():
                base = rp.url if rp else cp.server
                ssl = None if rp else cp.ssl_context()
                pid = rp.proc.pid if rp else None
                before = metric(rp, 'kproxy_validation_requests_total{level="Strict",outcome="rejected"}') if rp else 0
                cpu, delay = asyncio.run(watch_round(cp, base, ssl, ns, args.watchers, args.events, pid))
                p50, wcpu = asyncio.run(write_round(cp, base, ssl, strict_ns, args.writes, pid))
                local = (
                    metric(rp, 'kproxy_validation_requests_total{level="Strict",outcome="rejected"}') - before
                    if rp
                    else 0
                )
                for key, value in (("cpu", cpu), ("delay", delay), ("p50", p50), ("wcpu", wcpu), ("local", local)):
                    results[label].setdefault(key, []).append(value)
    finally:
        for rp in peers.values():
            if rp:
                rp.stop()
        for name in (ns, strict_ns):
            cp.request("DELETE", f"/api/v1/namespaces/{name}")

    print(f"\n{args.watchers} gzip JSON watches, {args.events} events of 4 KB; {args.writes} Strict POSTs; "
          f"median of {args.rounds} rounds (load average {os.getloadavg()[0]:.1f})\n")  # fmt: skip
    print("| peer | kproxy CPU ms per event (all watchers) | write to last decode, ms | "
          "Strict POST p50 ms | kproxy CPU ms per POST | answered by kproxy |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- |")
    for label, r in results.items():
        med = {k: statistics.median(v) for k, v in r.items()}
        own = peers[label] is not None
        cpu_cell = f"{med['cpu']:.2f}" if own else "-"
        wcpu_cell = f"{med['wcpu']:.2f}" if own else "-"
        local_cell = f"{med['local']:.0f} of {args.writes}" if own else "-"
        print(f"| {label} | {cpu_cell} | {med['delay']:.2f} | {med['p50']:.2f} | {wcpu_cell} | {local_cell} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
