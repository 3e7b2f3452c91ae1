"""kproxy to the apiserver over HTTP/2 (``upstream.http2: true``) against the HTTP/1.1 pool.

    python -m benchmarks.http2_upstream [--envtest-dir DIR] [--duration 5] [--rounds 3]
                                        [--concurrency 16] [--request get|list]

A small GET (one ConfigMap), or a LIST of the 500 ConfigMaps of ``benchmarks.lib.data``
(``--request list``), through ``kproxy run`` (empty chain, ``credentials: proxy``, plain HTTP
listener), closed loop with ``h2load --h1`` (nghttp2's C load generator: ``--concurrency``
connections to kproxy), each round measuring both upstream settings in turn on a kproxy of its own.
Per setting: req/s, CPU ms per request of kproxy (``/proc/<pid>/stat``) and of the apiserver over
the measured window, and the TCP connections kproxy held to the apiserver at its end. Then the
ratio of kproxy's CPU per request, HTTP/2 over HTTP/1.1, of each round (the two measured back to
back): its median and range say more than the medians of either, on a machine whose other work
moves both.

The control plane is started in a temporary directory and stopped at the end unless
``--envtest-dir`` names one of ``kproxy envtest up``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.lib import h2load
from benchmarks.lib.data import CONFIGMAP_NAMESPACE, CONFIGMAPS, seed_configmaps
from benchmarks.lib.procs import cpu_seconds
from kproxy.localcluster import envtest
from kproxy.localcluster.controlplane import ControlPlaneInfo
from kproxy.testing.proxyproc import start_proxy
from kproxy.testing.sockets import connections_to

NAMESPACE = "bench-h2-upstream"
NAME = "cm-small"


def seed(cp: ControlPlaneInfo) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    cp.request("POST", "/api/v1/namespaces", body=json.dumps(ns).encode())
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": NAME}, "data": {"k": "v" * 200}}
    cp.request("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps", body=json.dumps(cm).encode())


def measure(
    cp: ControlPlaneInfo, tmp: Path, http2: bool, duration: float, concurrency: int, path: str
) -> dict[str, float]:
    rp = start_proxy(tmp, cp.admin_kubeconfig, extra={"upstream": {"http2": http2}})
    try:
        url = rp.url + path
        subprocess.run(h2load.argv(url, True, concurrency, 1, ["-D", "1"]), capture_output=True, check=True)  # warm up
        pid, api = rp.proc.pid, cp.apiserver_pid or 0
        k0, a0 = cpu_seconds(pid), cpu_seconds(api) if api else 0.0
        load = h2load.argv(url, True, concurrency, 1, ["-D", f"{duration:g}"])
        out = subprocess.run(load, capture_output=True, text=True, check=True).stdout
        k1, a1 = cpu_seconds(pid), cpu_seconds(api) if api else 0.0
        summary = h2load.parse(out)
        if summary is None:
            raise RuntimeError(f"h2load printed no summary:\n{out[-400:]}")
        done = summary.succeeded
        return {
            "req/s": done / duration,
            "kproxy ms/req": (k1 - k0) * 1000 / max(done, 1),
            "apiserver ms/req": (a1 - a0) * 1000 / max(done, 1),
            "upstream connections": connections_to(pid, cp.apiserver_port),
        }
    finally:
        rp.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envtest-dir", type=Path)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--request", choices=("get", "list"), default="get")
    args = p.parse_args()
    if args.request == "get":
        path, what = f"/api/v1/namespaces/{NAMESPACE}/configmaps/{NAME}", "small GET"
    else:
        path, what = f"/api/v1/namespaces/{CONFIGMAP_NAMESPACE}/configmaps", f"LIST of {CONFIGMAPS} ConfigMaps"
    with tempfile.TemporaryDirectory(prefix="kproxy-bench-h2up-") as tmpdir:
        tmp = Path(tmpdir)
        own = args.envtest_dir is None
        directory = tmp / "cp" if own else args.envtest_dir
        cp = envtest.up(directory) if own else envtest.load(directory)
        try:
            if args.request == "get":
                seed(cp)
            else:
                seed_configmaps(cp)
            samples: dict[bool, list[dict[str, float]]] = {True: [], False: []}
            for r in range(args.rounds):
                for http2 in (True, False) if r % 2 == 0 else (False, True):
                    run = measure(cp, tmp / f"r{r}-{http2}", http2, args.duration, args.concurrency, path)
                    samples[http2].append(run)
                    time.sleep(0.5)
            print(f"{what}, h2load --h1 -c {args.concurrency}, {args.duration:g}s x {args.rounds} rounds (medians)")
            print("| upstream | req/s | kproxy CPU ms/req | apiserver CPU ms/req | connections to the apiserver |")
            print("| --- | --: | --: | --: | --: |")
            for http2, label in ((True, "HTTP/2"), (False, "HTTP/1.1")):
                med = {k: statistics.median(s[k] for s in samples[http2]) for k in samples[http2][0]}
                print(
                    f"| {label} | {med['req/s']:.0f} | {med['kproxy ms/req']:.3f} | "
                    f"{med['apiserver ms/req']:.3f} | {med['upstream connections']:.0f} |"
                )
            ratios = sorted(
                h2["kproxy ms/req"] / h1["kproxy ms/req"] for h2, h1 in zip(samples[True], samples[False], strict=True)
            )
            print(
                f"kproxy CPU per request, HTTP/2 / HTTP/1.1 in each round: median {statistics.median(ratios):.2f}x"
                f" (range {ratios[0]:.2f}-{ratios[-1]:.2f}x)"
            )
        finally:
            if own:
                envtest.down(directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
