"""kubectl and an informer over an emulated WAN: directly, and through a local kproxy on loopback.

    python -m benchmarks.wan [--envtest-dir DIR] [--pods 5000] [--rounds 3]
                             [--profiles loopback,50ms-20mbit,150ms-5mbit] [--compression JSON]

A laptop's view of a remote cluster. toxiproxy (``tools/toxiproxy``, ``make toxiproxy-bin``) sits
in front of a private control plane (``kproxy.testing.envtest``) holding ``--pods`` pods (created
directly, 100 per namespace; no scheduler) and shapes the link: each profile adds half its round
trip to each direction and caps each direction at its rate (``kproxy.testing.toxiproxy``). Peers,
measured in the same run, alternating:

* ``direct``: kubectl -> toxiproxy -> kube-apiserver (TLS, the admin's client certificate);
* ``kproxy``: kubectl -> kproxy on 127.0.0.1 (plain HTTP, ``credentials: proxy``) -> toxiproxy ->
  kube-apiserver, kproxy configured as a laptop user would: compression (``watch: true``),
  watchcache of pods, configmaps and namespaces, transcode (``upstream: protobuf``) - the
  recommended order. ``--compression '{"upstream_gzip": false}'`` adds settings to its compression
  entry (to compare a setting in one run).

kproxy is started after the link is shaped, so its watch cache fills over the WAN (reported).
Each command runs once per peer unmeasured (kubectl's discovery cache, one directory per peer,
is then warm), then ``--rounds`` times per peer; the tables give the median wall time of the
kubectl process (or, for the informer, from its start to ``HasSynced`` with every pod
handed to its event handler), the bytes the
link carried, both ways (toxiproxy's writes), and the apiserver's CPU time (utime + stime).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from kproxy.testing import envtest
from kproxy.testing.informer import Informer, ensure_informer
from kproxy.testing.proxyproc import RunningProxy, start_proxy
from kproxy.testing.toxiproxy import Link, Toxiproxy

PROFILES = {
    "loopback": None,
    "50ms-20mbit": Link("50ms-20mbit", 50, 20),
    "150ms-5mbit": Link("150ms-5mbit", 150, 5),
}
PER_NAMESPACE = 100


def laptop_filters(compression: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": "compression", "watch": True, **compression},
        {"name": "watchcache", "resources": ["pods", "configmaps", "namespaces"]},
        {"name": "transcode", "upstream": "protobuf"},
    ]


def pod(i: int) -> dict[str, Any]:
    """A pod of about 3 KB of JSON (a Deployment's pod, with the fields controllers set)."""
    app = f"app-{i % 37}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-{i:05d}-x7k2p",
            "labels": {"app": app, "pod-template-hash": "5d8f9c7b6", "tier": ["web", "api", "worker"][i % 3]},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-28T10:00:00Z", "team": "platform"},
        },
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": f"registry.example.com/{app}:v1.{i % 9}.3",
                    "args": ["--port=8080", "--log-level=info", f"--shard={i % 16}"],
                    "ports": [{"containerPort": 8080, "name": "http"}, {"containerPort": 9090, "name": "metrics"}],
                    "env": [{"name": f"SETTING_{k}", "value": f"value-{k}-{i % 11}"} for k in range(8)],
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}],
                },
                {
                    "name": "sidecar",
                    "image": "registry.example.com/proxy:v2.4.1",
                    "args": ["--upstream=127.0.0.1:8080"],
                },
            ],
            "volumes": [{"name": "config", "configMap": {"name": f"{app}-config"}}],
            "nodeName": f"node-{i % 50}",
        },
    }


async def seed(cp: envtest.ControlPlaneInfo, pods: int) -> tuple[str, str]:
    """``pods`` pods in ``wan-<n>`` namespaces (kept when already there); one pod's (namespace, name)."""
    ssl = cp.ssl_context()
    namespaces = [f"wan-{n}" for n in range((pods + PER_NAMESPACE - 1) // PER_NAMESPACE)]
    first = (namespaces[0], pod(0)["metadata"]["name"])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as s:
        async with s.get(f"{cp.server}/api/v1/pods?limit=1", ssl=ssl) as r:
            have = (await r.json())["metadata"].get("remainingItemCount", -1) + 1
        if have >= pods:  # a reused control plane seeded before
            return first
        for ns in namespaces:
            async with s.post(f"{cp.server}/api/v1/namespaces", json={"metadata": {"name": ns}}, ssl=ssl) as r:
                assert r.status in (201, 409), await r.text()

        async def create(i: int) -> None:
            ns = namespaces[i // PER_NAMESPACE]
            async with s.post(f"{cp.server}/api/v1/namespaces/{ns}/pods", json=pod(i), ssl=ssl) as r:
                assert r.status in (201, 409), await r.text()

        queue = list(range(pods))

        async def worker() -> None:
            while queue:
                await create(queue.pop())

        await asyncio.gather(*(worker() for _ in range(16)))
    return first


def rewrite_kubeconfig(src: Path, dst: Path, server: str) -> Path:
    kc = yaml.safe_load(src.read_text())
    for cluster in kc["clusters"]:
        cluster["cluster"]["server"] = server
    dst.write_text(yaml.safe_dump(kc))
    dst.chmod(0o600)
    return dst


@dataclass
class Peer:
    name: str
    kubeconfig: Path
    cache_dir: Path


def kubectl_command(cp: envtest.ControlPlaneInfo, args: list[str]) -> Callable[[Peer], float]:
    def run(peer: Peer) -> float:
        argv = [str(cp.kubectl), "--kubeconfig", str(peer.kubeconfig), "--cache-dir", str(peer.cache_dir), *args]
        t = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
        took = time.perf_counter() - t
        if done.returncode != 0:
            raise AssertionError(f"{peer.name}: kubectl {' '.join(args)} failed: {done.stderr.decode()[-2000:]}")
        return took

    return run


def informer_start(pods: int) -> Callable[[Peer], float]:
    def run(peer: Peer) -> float:
        t = time.perf_counter()
        inf = Informer(peer.kubeconfig)
        try:
            # HasSynced, and every pod handed to the event handler (which may come just after).
            inf.wait(lambda: bool(inf.of("synced")) and len(inf.of("event")) >= pods, 600, "HasSynced")
            took = time.perf_counter() - t
        finally:
            inf.stop()
        return took

    return run


class LinkBytes:
    """Bytes toxiproxy relayed (both ways; what the apiserver sends dominates)."""

    def __init__(self, toxi: Toxiproxy) -> None:
        self.toxi = toxi

    def downstream(self) -> float:
        return float(self.toxi.relayed_bytes())


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def measure(
    commands: dict[str, Callable[[Peer], float]],
    peers: list[Peer],
    rounds: int,
    link_bytes: LinkBytes,
    apiserver_pid: int,
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """command -> peer -> (median seconds, median link bytes, median apiserver CPU seconds)."""
    out: dict[str, dict[str, tuple[float, float, float]]] = {}
    for label, cmd in commands.items():
        for peer in peers:
            cmd(peer)  # warm-up: discovery cache, connections
        times: dict[str, list[float]] = {p.name: [] for p in peers}
        sent: dict[str, list[float]] = {p.name: [] for p in peers}
        cpu: dict[str, list[float]] = {p.name: [] for p in peers}
        for r in range(rounds):
            for peer in peers if r % 2 == 0 else list(reversed(peers)):
                b0, c0 = link_bytes.downstream(), cpu_seconds(apiserver_pid)
                times[peer.name].append(cmd(peer))
                sent[peer.name].append(link_bytes.downstream() - b0)
                cpu[peer.name].append(cpu_seconds(apiserver_pid) - c0)
        out[label] = {
            p: (statistics.median(times[p]), statistics.median(sent[p]), statistics.median(cpu[p])) for p in times
        }
        cells = ", ".join(f"{p} {out[label][p][0]:.2f}s" for p in out[label])
        print(f"  {label}: {cells}", file=sys.stderr, flush=True)
    return out


def _size(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.0f} kB"


def report(profile: str, results: dict[str, dict[str, tuple[float, float, float]]], cache_ready: float) -> str:
    """One table: each kproxy peer's time and its ratio to direct (above 1: kproxy is faster)."""
    names = list(next(iter(results.values())))
    others = [n for n in names if n != "direct"]
    head = "| command | direct | " + " | ".join(f"{n} | ratio" for n in others) + " | link bytes: "
    head += ", ".join(names) + " | apiserver CPU |"
    lines = [
        f"### {profile}",
        "",
        f"kproxy's watch cache (pods, configmaps, namespaces) filled over this link in {cache_ready:.1f} s.",
        "",
        head,
        "| --- | --: | " + "--: | --: | " * len(others) + "--: | --: |",
    ]
    for label, peers in results.items():
        d = peers["direct"][0]
        cells = " | ".join(f"{peers[n][0]:.2f} s | {d / peers[n][0]:.2f}" for n in others)
        sizes = ", ".join(_size(peers[n][1]) for n in names)
        cpu = ", ".join(f"{peers[n][2]:.2f} s" for n in names)
        lines.append(f"| {label} | {d:.2f} s | {cells} | {sizes} | {cpu} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--envtest-dir", type=Path, help="reuse a control plane started with `kproxy envtest up`")
    p.add_argument("--pods", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profiles", default="loopback,50ms-20mbit,150ms-5mbit")
    p.add_argument("--compression", default="{}", help="settings added to kproxy's compression entry (JSON)")
    p.add_argument(
        "--also",
        default="",
        help="another kproxy peer in the same run: compression settings (JSON) for it, e.g. "
        "'{\"upstream_gzip\": false}' to compare a setting with the default",
    )
    p.add_argument("--only", default="", help="comma-separated command labels to run (default: all)")
    args = p.parse_args(argv)
    compression = json.loads(args.compression)
    ensure_informer()
    with tempfile.TemporaryDirectory(prefix="kproxy-bench-wan-") as tmpdir:
        tmp = Path(tmpdir)
        own = args.envtest_dir is None
        directory = tmp / "cp" if own else args.envtest_dir
        cp = envtest.up(directory) if own else envtest.load(directory)
        toxi = Toxiproxy(tmp / "toxiproxy.log")
        try:
            t = time.perf_counter()
            ns, name = asyncio.run(seed(cp, args.pods))
            print(f"seeded {args.pods} pods in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
            listen = toxi.proxy("apiserver", f"127.0.0.1:{cp.apiserver_port}")
            wan_kubeconfig = rewrite_kubeconfig(cp.admin_kubeconfig, tmp / "wan.kubeconfig", f"https://{listen}")
            commands: dict[str, Callable[[Peer], float]] = {
                "`get pods -A` (Table)": kubectl_command(cp, ["get", "pods", "-A"]),
                "`get pods -A -o json`": kubectl_command(cp, ["get", "pods", "-A", "-o", "json"]),
                "`get pods -A -o name`": kubectl_command(cp, ["get", "pods", "-A", "-o", "name"]),
                "`get pod NAME` (one object, Table)": kubectl_command(cp, ["get", "pod", "-n", ns, name]),
                "`get pod NAME -o yaml`": kubectl_command(cp, ["get", "pod", "-n", ns, name, "-o", "yaml"]),
                "`describe pod NAME`": kubectl_command(cp, ["describe", "pod", "-n", ns, name]),
                "`get ns`": kubectl_command(cp, ["get", "ns"]),
                "informer start (pods, all namespaces)": informer_start(args.pods),
            }
            if args.only:
                wanted = args.only.split(",")
                commands = {k: v for k, v in commands.items() if any(w in k for w in wanted)}
            out = [
                f"{args.pods} pods; median of {args.rounds}; kproxy compression settings {compression or 'default'}; "
                f"{('other kproxy: ' + args.also + '; ') if args.also else ''}"
                f"load average {os.getloadavg()[0]:.1f} at start",
            ]
            for profile in args.profiles.split(","):
                link = PROFILES[profile]
                toxi.shape("apiserver", link)
                print(f"profile {profile}", file=sys.stderr, flush=True)
                t = time.perf_counter()
                rp: RunningProxy = start_proxy(
                    tmp / f"kproxy-{profile}", wan_kubeconfig, extra={"filters": laptop_filters(compression)}
                )
                alt: RunningProxy | None = None
                try:
                    rp.wait_cached("/api/v1/pods", "pods", timeout=600)
                    cache_ready = time.perf_counter() - t
                    peers = [
                        Peer("direct", wan_kubeconfig, tmp / f"cache-direct-{profile}"),
                        Peer("kproxy", rp.kubeconfig, tmp / f"cache-kproxy-{profile}"),
                    ]
                    if args.also:
                        also = json.loads(args.also)
                        alt = start_proxy(
                            tmp / f"kproxy-also-{profile}",
                            wan_kubeconfig,
                            extra={"filters": laptop_filters({**compression, **also})},
                        )
                        alt.wait_cached("/api/v1/pods", "pods", timeout=600)
                        label = "kproxy " + ",".join(f"{k}={v}" for k, v in also.items())
                        peers.append(Peer(label, alt.kubeconfig, tmp / f"cache-also-{profile}"))
                    assert cp.apiserver_pid is not None
                    results = measure(commands, peers, args.rounds, LinkBytes(toxi), cp.apiserver_pid)
                finally:
                    rp.stop()
                    if alt is not None:
                        alt.stop()
                out.append(report(profile, results, cache_ready))
                print(out[-1], file=sys.stderr, flush=True)
            print("\n\n".join(out))
        finally:
            toxi.stop()
            if own:
                envtest.down(directory)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
