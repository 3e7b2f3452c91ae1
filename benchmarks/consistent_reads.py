"""Consistent reads from kproxy's watch cache over an emulated WAN: what a first page, the pages
after it and many readers at once cost, and the cache's own fill.

    python -m benchmarks.consistent_reads [--rtt-ms 50] [--mbit 20] [--configmaps 1500] [--rounds 5]

A private control plane (``kproxy.localcluster.envtest``) with ``--configmaps`` ConfigMaps (1 kB each)
in one namespace; kproxy caches configmaps and reaches the apiserver through toxiproxy shaped
as ``--rtt-ms`` / ``--mbit`` (``kproxy.testing.toxiproxy``). Reported: the time kproxy's cache took
to fill and the bytes that crossed the link meanwhile; the median time of each page of a
consistent list in pages of 500 (no resourceVersion, then continue tokens); 20 consistent lists
of a small namespace sent at once (the slowest one's time); and the requests the apiserver
finished for configmaps during each (``apiserver_request_total``, by verb).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster import envtest
from kproxy.testing.proxyproc import RunningProxy, start_proxy
from kproxy.testing.toxiproxy import Link, Toxiproxy

NS = "bench-consistent"
SMALL = "bench-small"
READERS = 20


def seed(cp: envtest.ControlPlaneInfo, n: int) -> None:
    for ns in (NS, SMALL):
        cp.json("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    def create(i: int) -> None:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i:05d}"}, "data": {"v": "x" * 1000}}
        cp.json("POST", f"/api/v1/namespaces/{NS}/configmaps", body)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(n)))
    cp.json(
        "POST",
        f"/api/v1/namespaces/{SMALL}/configmaps",
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one"}},
    )


def churn(cp: envtest.ControlPlaneInfo, rate: float, stop: threading.Event) -> None:
    body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "churn"}, "stringData": {"n": "0"}}
    cp.json("POST", f"/api/v1/namespaces/{SMALL}/secrets", body)
    n = 0
    while not stop.wait(1 / rate):
        n += 1
        body["stringData"] = {"n": str(n)}
        cp.json("PUT", f"/api/v1/namespaces/{SMALL}/secrets/churn", body)


def counts(cp: envtest.ControlPlaneInfo) -> dict[str, float]:
    code, body = cp.request("GET", "/metrics", accept="text/plain")
    assert code == 200
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == "apiserver_request_total" and s.labels.get("resource") == "configmaps":
                out[s.labels["verb"]] = out.get(s.labels["verb"], 0.0) + s.value
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> str:
    d = {k: int(v - before.get(k, 0.0)) for k, v in after.items() if v != before.get(k, 0.0)}
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def pages(rp: RunningProxy) -> list[float]:
    took = []
    token = ""
    while True:
        t = time.perf_counter()
        out = get(f"{rp.url}/api/v1/namespaces/{NS}/configmaps?limit=500" + (f"&continue={token}" if token else ""))
        took.append(time.perf_counter() - t)
        token = out["metadata"].get("continue", "")
        if not token:
            return took


def together(rp: RunningProxy) -> float:
    barrier = threading.Barrier(READERS)
    took = [0.0] * READERS

    def read(i: int) -> None:
        barrier.wait()
        t = time.perf_counter()
        get(f"{rp.url}/api/v1/namespaces/{SMALL}/configmaps")
        took[i] = time.perf_counter() - t

    threads = [threading.Thread(target=read, args=(i,)) for i in range(READERS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return max(took)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rtt-ms", type=int, default=50)
    p.add_argument("--mbit", type=float, default=20)
    p.add_argument("--configmaps", type=int, default=1500)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--churn",
        type=float,
        default=0.0,
        help="write another resource (a Secret) this many times a second meanwhile, as a live cluster's "
        "leases and events move etcd's revision past the cached resource's",
    )
    args = p.parse_args(argv)
    link = Link("bench", args.rtt_ms, args.mbit or None)
    with tempfile.TemporaryDirectory(prefix="kproxy-bench-consistent-") as tmpdir:
        tmp = Path(tmpdir)
        cp = envtest.up(tmp / "cp")
        toxi = Toxiproxy(tmp / "toxiproxy.log")
        rp: RunningProxy | None = None
        try:
            seed(cp, args.configmaps)
            listen = toxi.proxy("apiserver", f"127.0.0.1:{cp.apiserver_port}")
            toxi.shape("apiserver", link)
            kc = yaml.safe_load(cp.admin_kubeconfig.read_text())
            for cluster in kc["clusters"]:
                cluster["cluster"]["server"] = f"https://{listen}"
            kubeconfig = tmp / "wan.kubeconfig"
            kubeconfig.write_text(yaml.safe_dump(kc))
            kubeconfig.chmod(0o600)
            sent = toxi.relayed_bytes()
            t = time.perf_counter()
            chain = {"filters": [{"name": "watchcache", "resources": ["configmaps"]}]}
            rp = start_proxy(tmp / "kproxy", kubeconfig, extra=chain, token="ignored-in-proxy-mode")
            rp.wait_cached("/api/v1/namespaces/bench-empty/configmaps", "configmaps", timeout=300)
            fill = time.perf_counter() - t
            fill_bytes = toxi.relayed_bytes() - sent
            print(f"cache filled in {fill:.2f} s, {fill_bytes / 1e6:.2f} MB over the link", file=sys.stderr)
            stop = threading.Event()
            churner = None
            if args.churn:
                churner = threading.Thread(target=churn, args=(cp, args.churn, stop), daemon=True)
                churner.start()
            rows: list[list[float]] = []
            before = counts(cp)
            for _ in range(args.rounds):
                rows.append(pages(rp))
            paged = delta(counts(cp), before)
            medians = [statistics.median(r[i] for r in rows) for i in range(len(rows[0]))]
            before = counts(cp)
            slowest = [together(rp) for _ in range(args.rounds)]
            burst = delta(counts(cp), before)
            stop.set()
            if churner is not None:
                churner.join()
            print(
                f"{args.rtt_ms} ms round trip, {args.mbit} Mbit/s; {args.configmaps} configmaps; "
                f"median of {args.rounds}"
            )
            if args.churn:
                print(f"- another resource written {args.churn:g} times a second meanwhile")
            print(f"- the cache's fill: {fill:.2f} s, {fill_bytes / 1e6:.2f} MB across the link")
            print(
                "- a consistent list in pages of 500: "
                + ", ".join(f"page {i + 1} {m * 1000:.0f} ms" for i, m in enumerate(medians))
            )
            print(f"  apiserver requests for configmaps over the {args.rounds} lists: {paged}")
            print(f"- {READERS} consistent lists at once, the slowest: {statistics.median(slowest) * 1000:.0f} ms")
            print(f"  apiserver requests for configmaps over the {args.rounds} bursts: {burst}")
        finally:
            if rp is not None:
                rp.stop()
            toxi.stop()
            envtest.down(tmp / "cp")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
