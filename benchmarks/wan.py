"""kubectl and an informer over an emulated WAN: directly, and through a local kproxy on loopback.

    python -m benchmarks.wan [--envtest-dir DIR] [--pods 5000] [--rounds 3]
                             [--profiles loopback,50ms-20mbit,150ms-5mbit] [--compression JSON]
                             [--only LABELS] [--restart] [--restart-only]

A laptop's view of a remote cluster. toxiproxy (``tools/toxiproxy``, ``make toxiproxy-bin``) sits
in front of a private control plane (``kproxy.localcluster.envtest``) holding ``--pods`` pods (created
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

``kubectl logs``: no kubelet runs here, and the stand-in kubelet of the exec tests
(``kproxy.testing.standin_kubelet``) serves exec, attach and port-forward but not the kubelet's
``/containerLogs``. :class:`LogsKubelet` does, next to the apiserver (the kubelet is in the
cluster, on the far side of the WAN): a Node ``node-0`` points at it, so the seeded pods bound to
``node-0`` have a log (``--log-lines`` lines of about 160 bytes; ``--tail`` honoured as the kubelet
does). kubectl asks the apiserver, which fetches the log from it (``pods/log``).

``--restart`` adds a node-local restart per profile (``--restart-only``: only that): a kproxy with
the same chain and the watch cache persisted on disk (``persist``) started over the WAN,
``--rounds`` times each, alternating: ``cold`` (an empty persist directory: every cached resource
listed across the link) and ``from disk`` (the directory the cold start left, after a SIGTERM:
loaded before listening, each upstream watch resumed), next to ``direct``: a client-go informer
of pods started across the link. For each: seconds from exec (the informer's start) to the first
``resourceVersion=0`` list of pods kproxy answers from its cache (the informer's ``HasSynced``
with every pod handed to it), and the apiserver CPU and link bytes from exec until that answer
plus ``--settle`` seconds (the resumed watches and their first answers; the informer keeps
watching meanwhile).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.lib.procs import cpu_seconds
from kproxy.localcluster import certs, envtest
from kproxy.localcluster.processes import free_ports
from kproxy.testing.informer import Informer, ensure_informer
from kproxy.testing.proxyproc import TEST_HOSTS, RunningProxy, start_proxy
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


LOG_NODE = "node-0"  # pod(i) is bound to node-{i % 50}: pod(0), the one-object rows' pod, has a log


def log_line(n: int) -> bytes:
    """Line ``n`` of a container's log: about 160 bytes, as a structured application log."""
    return (
        f"2026-11-28T10:{n // 3600 % 60:02d}:{n // 60 % 60:02d}.{n % 1000:03d}Z level=info "
        f'msg="request served" method=GET path=/api/items/{n % 997} status=200 duration_ms={n % 83} '
        f"bytes={(n * 7919) % 65536} trace_id={(n * 2654435761) % 2**32:08x}{n:08x} shard={n % 16}\n"
    ).encode()


class LogsKubelet:
    """The kubelet's log endpoint, ``GET /containerLogs/{namespace}/{pod}/{container}``
    (pkg/kubelet/server/server.go, ``getContainerLogs``), over TLS on 127.0.0.1: every container's
    log is the same ``lines`` lines; ``tailLines`` and ``limitBytes`` are honoured as the kubelet
    does (pkg/kubelet/kuberuntime/logs, the last N lines, then at most N bytes). The apiserver
    verifies no kubelet certificate unless ``--kubelet-certificate-authority`` is set, so a
    self-signed one serves. Registers the Node ``name`` pointing at it (InternalIP 127.0.0.1,
    ``daemonEndpoints.kubeletEndpoint.Port``, as pkg/kubelet/nodestatus sets them) and deletes it
    on :meth:`close`."""

    def __init__(self, cp: envtest.ControlPlaneInfo, tmp: Path, lines: int, name: str = LOG_NODE) -> None:
        self.cp, self.name, self.requests = cp, name, 0
        self.lines = [log_line(n) for n in range(lines)]
        ca = certs.generate_ca("wan-kubelet-ca")
        leaf = certs.generate_serving_cert(ca, ("127.0.0.1", "localhost"), "wan-kubelet")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(
            certs.write_pem(tmp / "kubelet.crt", leaf.cert_pem, private=False),
            certs.write_pem(tmp / "kubelet.key", leaf.key_pem, private=True),
        )
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                if not re.fullmatch(r"/containerLogs/[^/]+/[^/]+/[^/]+", url.path):
                    self.send_error(404)
                    return
                owner.requests += 1
                query = urllib.parse.parse_qs(url.query)
                chosen = owner.lines
                if "tailLines" in query:
                    chosen = chosen[-int(query["tailLines"][0]) :] if int(query["tailLines"][0]) > 0 else []
                body = b"".join(chosen)
                if "limitBytes" in query:
                    body = body[: int(query["limitBytes"][0])]
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="wan-kubelet", daemon=True)
        self.thread.start()
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        code, body = cp.request("POST", "/api/v1/nodes", body=json.dumps(node).encode())
        assert code in (201, 409), body[:300]
        status = {
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                "daemonEndpoints": {"kubeletEndpoint": {"Port": self.port}},
            }
        }
        code, body = cp.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            body=json.dumps(status).encode(),
            content_type="application/merge-patch+json",
        )
        assert code == 200, body[:300]

    def close(self) -> None:
        self.cp.request("DELETE", f"/api/v1/nodes/{self.name}")
        self.server.shutdown()
        self.server.server_close()


def check_logs(cp: envtest.ControlPlaneInfo, kubelet: LogsKubelet, namespace: str, name: str) -> int:
    """``kubectl logs`` of ``name`` (bound to the log kubelet's Node) answers the whole log, by way
    of the apiserver; its size."""
    want = b"".join(kubelet.lines)
    before = kubelet.requests
    argv = [str(cp.kubectl), "--kubeconfig", str(cp.admin_kubeconfig), "logs", "-n", namespace, name, "-c", "main"]
    done = subprocess.run(argv, capture_output=True, timeout=120)
    if done.returncode != 0 or done.stdout != want or kubelet.requests != before + 1:
        raise AssertionError(
            f"kubectl logs: exit {done.returncode}, {len(done.stdout)} of {len(want)} bytes, "
            f"{kubelet.requests - before} requests at the kubelet: {done.stderr.decode()[-2000:]}"
        )
    return len(want)


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


@dataclass
class Start:
    """One start across the link: to its first cached answer (or the informer's sync), and what
    the apiserver spent and the link carried from exec until then plus the settle time."""

    seconds: float
    cpu: float
    link: float
    listening: float = 0.0
    loaded: float | None = None
    relists: float = 0.0


def _http(url: str, timeout: float = 10) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def _metric(text: str, series: str) -> float:
    found = re.search(re.escape(series) + r" ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


SERVED = 'kproxy_watchcache_reads_total{reason="any",resource="pods",served="cache",verb="list"}'
OBJECTS = 'kproxy_watchcache_objects{resource="pods"}'


def wait_cached_pods(url: str, admin_url: str, pods: int, alive: Callable[[], None]) -> None:
    """Until kproxy answers a ``resourceVersion=0`` list of pods from its cache. Asked only once
    its metrics (on loopback) say the cache holds every pod: a read before that goes across the
    link (a whole list of pods without ``limit``) and competes with the cache's own fill."""
    while True:
        alive()
        if _metric(_http(admin_url + "/metrics")[1].decode(), OBJECTS) >= pods:
            code, _ = _http(url + "/api/v1/pods?resourceVersion=0&limit=1")
            if code == 200 and _metric(_http(admin_url + "/metrics")[1].decode(), SERVED) >= 1:
                return
        time.sleep(0.05)


class NodeLocal:
    """A kproxy with the laptop's chain and the watch cache persisted in ``tmp/state``, started
    (``kproxy run``, timed from its exec) and stopped (SIGTERM: the state synced) across the link."""

    LOADED = re.compile(r"pods: \d+ objects at resource version \d+ loaded from disk in ([0-9.]+) s")

    def __init__(
        self,
        tmp: Path,
        kubeconfig: Path,
        compression: dict[str, Any],
        pods: int,
        toxi: Toxiproxy,
        apiserver_pid: int,
        settle: float,
    ) -> None:
        self.tmp, self.kubeconfig, self.compression = tmp, kubeconfig, compression
        self.pods, self.toxi, self.apiserver_pid, self.settle = pods, toxi, apiserver_pid, settle
        self.state = tmp / "state"
        self.runs = 0
        tmp.mkdir(parents=True, exist_ok=True)

    def start(self, cold: bool) -> Start:
        if cold:
            shutil.rmtree(self.state, ignore_errors=True)
        self.runs += 1
        port, admin = free_ports(2)
        filters = laptop_filters(self.compression)
        filters[1]["persist"] = {"dir": str(self.state)}
        cfg = {
            "listen": f"127.0.0.1:{port}",
            "admin_listen": f"127.0.0.1:{admin}",
            "credentials": "proxy",
            "upstream": {"kubeconfig": str(self.kubeconfig)},
            "log": {"level": "info", "format": "json", "access_log": False},
            "proxy": {"accept_hosts": TEST_HOSTS},
            "shutdown_timeout": "20s",
            "filters": filters,
        }
        cfg_path = self.tmp / f"kproxy-{self.runs}.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        log = self.tmp / f"kproxy-{self.runs}.log"
        url, admin_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin}"
        b0, c0 = self.toxi.relayed_bytes(), cpu_seconds(self.apiserver_pid)
        t0 = time.perf_counter()
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kproxy.cli", "run", "--config", str(cfg_path)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = t0 + 600

            def alive() -> None:
                if proc.poll() is not None:
                    raise AssertionError(f"kproxy exited with {proc.returncode}: {log.read_text()[-2000:]}")
                if time.perf_counter() > deadline:
                    raise AssertionError(f"kproxy: no cached list of pods in 600 s: {log.read_text()[-2000:]}")

            while not _connects(port):
                alive()
                time.sleep(0.02)
            listening = time.perf_counter() - t0
            wait_cached_pods(url, admin_url, self.pods, alive)
            first = time.perf_counter() - t0
            time.sleep(self.settle)
            cpu = cpu_seconds(self.apiserver_pid) - c0
            link = self.toxi.relayed_bytes() - b0
            text = _http(admin_url + "/metrics")[1].decode()
            relists = sum(
                float(m.group(1))
                for m in re.finditer(r"^kproxy_watchcache_relists_total\{[^}]*\} ([0-9.e+-]+)$", text, re.M)
            )
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        loaded = self.LOADED.search(log.read_text(errors="replace"))
        if not cold and loaded is None:
            raise AssertionError(f"kproxy did not load pods from disk: {log.read_text()[-2000:]}")
        return Start(first, cpu, link, listening, float(loaded.group(1)) if loaded else None, relists)


def informer_window(kubeconfig: Path, pods: int, toxi: Toxiproxy, apiserver_pid: int, settle: float) -> Start:
    """A client-go informer of pods started across the link: to ``HasSynced`` with every pod
    handed to it; CPU and bytes until then plus ``settle`` (it keeps watching meanwhile)."""
    b0, c0 = toxi.relayed_bytes(), cpu_seconds(apiserver_pid)
    t = time.perf_counter()
    inf = Informer(kubeconfig)
    try:
        inf.wait(lambda: bool(inf.of("synced")) and len(inf.of("event")) >= pods, 600, "HasSynced")
        took = time.perf_counter() - t
        time.sleep(settle)
        return Start(took, cpu_seconds(apiserver_pid) - c0, toxi.relayed_bytes() - b0)
    finally:
        inf.stop()


def node_local_restart(node: NodeLocal, kubeconfig: Path, rounds: int) -> dict[str, list[Start]]:
    """``rounds`` of: a direct informer's start, a cold kproxy, the same kproxy from disk (the
    informer first in even rounds, last in odd ones)."""
    runs: dict[str, list[Start]] = {"direct": [], "cold": [], "disk": []}
    for r in range(rounds):
        order = ["direct", "cold", "disk"] if r % 2 == 0 else ["cold", "disk", "direct"]
        for what in order:
            if what == "direct":
                got = informer_window(kubeconfig, node.pods, node.toxi, node.apiserver_pid, node.settle)
            else:
                got = node.start(cold=what == "cold")
            runs[what].append(got)
            print(f"  restart {what}: {got}", file=sys.stderr, flush=True)
    # The apiserver's own background work (leases, its controllers) over the same window.
    window = node.settle + statistics.median(s.seconds for s in runs["disk"])
    b0, c0 = node.toxi.relayed_bytes(), cpu_seconds(node.apiserver_pid)
    time.sleep(window)
    runs["idle"] = [Start(window, cpu_seconds(node.apiserver_pid) - c0, node.toxi.relayed_bytes() - b0)]
    return runs


def restart_report(profile: str, runs: dict[str, list[Start]], rounds: int, settle: float) -> str:
    def med(what: str, field: str) -> float:
        return float(statistics.median(float(getattr(s, field)) for s in runs[what]))

    cold_link = med("cold", "link")
    lines = [
        f"### node-local restart, {profile}",
        "",
        f"Median of {rounds}; apiserver CPU and link bytes from exec (the informer's start) to the first "
        f"answer plus {settle:.0f} s.",
        "",
        "| start | first answer | kproxy listening | loaded from disk | apiserver CPU | link bytes | vs cold | "
        "relists |",
        "| --- | --: | --: | --: | --: | --: | --: | --: |",
        f"| direct: client-go informer of pods (`HasSynced`) | {med('direct', 'seconds'):.2f} s | | | "
        f"{med('direct', 'cpu'):.2f} s | {_size(med('direct', 'link'))} | {med('direct', 'link') / cold_link:.0%} | |",
    ]
    for what, label in (("cold", "kproxy, cold (empty directory)"), ("disk", "kproxy, from disk")):
        loaded = [s.loaded for s in runs[what] if s.loaded is not None]
        lines.append(
            f"| {label}: first cached list of pods | {med(what, 'seconds'):.2f} s | {med(what, 'listening'):.2f} s | "
            f"{f'{statistics.median(loaded):.2f} s' if loaded else 'no'} | {med(what, 'cpu'):.2f} s | "
            f"{_size(med(what, 'link'))} | {med(what, 'link') / cold_link:.0%} | {med(what, 'relists'):.0f} |"
        )
    idle = runs["idle"][0]
    lines.append(
        f"| nothing for {idle.seconds:.1f} s (the apiserver's own work) | | | | {idle.cpu:.2f} s | "
        f"{_size(idle.link)} | | |"
    )
    lines.append("")
    lines.append(
        "Each: "
        + "; ".join(
            f"{what} " + ", ".join(f"{s.seconds:.2f} s" for s in runs[what]) for what in ("direct", "cold", "disk")
        )
    )
    return "\n".join(lines)


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
    p.add_argument("--log-lines", type=int, default=10000, help="lines in each container's log (about 160 bytes each)")
    p.add_argument("--restart", action="store_true", help="add the node-local restart (persisted watch cache)")
    p.add_argument("--restart-only", action="store_true", help="the node-local restart alone, no commands")
    p.add_argument("--settle", type=float, default=5.0, help="node-local restart: seconds measured after the answer")
    args = p.parse_args(argv)
    compression = json.loads(args.compression)
    ensure_informer()
    with tempfile.TemporaryDirectory(prefix="kproxy-bench-wan-") as tmpdir:
        tmp = Path(tmpdir)
        own = args.envtest_dir is None
        directory = tmp / "cp" if own else args.envtest_dir
        cp = envtest.up(directory) if own else envtest.load(directory)
        toxi = Toxiproxy(tmp / "toxiproxy.log")
        kubelet: LogsKubelet | None = None
        try:
            t = time.perf_counter()
            ns, name = asyncio.run(seed(cp, args.pods))
            print(f"seeded {args.pods} pods in {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
            kubelet = LogsKubelet(cp, tmp, args.log_lines)
            log_size = check_logs(cp, kubelet, ns, name)
            wan_kubeconfig = toxi.kubeconfig_through(
                "apiserver", cp.admin_kubeconfig, cp.apiserver_port, None, tmp / "wan.kubeconfig"
            )
            commands: dict[str, Callable[[Peer], float]] = {
                "`get pods -A` (Table)": kubectl_command(cp, ["get", "pods", "-A"]),
                "`get pods -A -o json`": kubectl_command(cp, ["get", "pods", "-A", "-o", "json"]),
                "`get pods -A -o name`": kubectl_command(cp, ["get", "pods", "-A", "-o", "name"]),
                "`get pod NAME` (one object, Table)": kubectl_command(cp, ["get", "pod", "-n", ns, name]),
                "`get pod NAME -o yaml`": kubectl_command(cp, ["get", "pod", "-n", ns, name, "-o", "yaml"]),
                "`describe pod NAME`": kubectl_command(cp, ["describe", "pod", "-n", ns, name]),
                "`get ns`": kubectl_command(cp, ["get", "ns"]),
                f"`logs NAME -c main` ({_size(log_size)})": kubectl_command(cp, ["logs", "-n", ns, name, "-c", "main"]),
                "`logs NAME -c main --tail 100`": kubectl_command(
                    cp, ["logs", "-n", ns, name, "-c", "main", "--tail", "100"]
                ),
                "informer start (pods, all namespaces)": informer_start(args.pods),
            }
            if args.only:
                wanted = args.only.split(",")
                commands = {k: v for k, v in commands.items() if any(w in k for w in wanted)}
            if args.restart_only:
                commands = {}
            assert cp.apiserver_pid is not None
            out = [
                f"{args.pods} pods; median of {args.rounds}; kproxy compression settings {compression or 'default'}; "
                f"{('other kproxy: ' + args.also + '; ') if args.also else ''}"
                f"load average {os.getloadavg()[0]:.1f} at start",
            ]
            for profile in args.profiles.split(","):
                link = PROFILES[profile]
                toxi.shape("apiserver", link)
                print(f"profile {profile}", file=sys.stderr, flush=True)
                if commands:
                    out.append(run_commands(args, cp, tmp, profile, wan_kubeconfig, compression, commands, toxi))
                    print(out[-1], file=sys.stderr, flush=True)
                if args.restart or args.restart_only:
                    node = NodeLocal(
                        tmp / f"node-local-{profile}",
                        wan_kubeconfig,
                        compression,
                        args.pods,
                        toxi,
                        cp.apiserver_pid,
                        args.settle,
                    )
                    runs = node_local_restart(node, wan_kubeconfig, args.rounds)
                    out.append(restart_report(profile, runs, args.rounds, args.settle))
                    print(out[-1], file=sys.stderr, flush=True)
            print("\n\n".join(out))
        finally:
            if kubelet is not None:
                kubelet.close()
            toxi.stop()
            if own:
                envtest.down(directory)
    return 0


def run_commands(
    args: argparse.Namespace,
    cp: envtest.ControlPlaneInfo,
    tmp: Path,
    profile: str,
    wan_kubeconfig: Path,
    compression: dict[str, Any],
    commands: dict[str, Callable[[Peer], float]],
    toxi: Toxiproxy,
) -> str:
    """The commands, direct and through kproxy (and ``--also``'s kproxy), over one profile."""
    assert cp.apiserver_pid is not None
    t = time.perf_counter()
    rp: RunningProxy = start_proxy(
        tmp / f"kproxy-{profile}", wan_kubeconfig, extra={"filters": laptop_filters(compression)}
    )
    alt: RunningProxy | None = None
    deadline = time.perf_counter() + 600

    def alive() -> None:
        if time.perf_counter() > deadline:
            raise AssertionError("kproxy did not cache pods in 600 s")

    try:
        wait_cached_pods(rp.url, rp.admin_url, args.pods, alive)
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
            deadline = time.perf_counter() + 600
            wait_cached_pods(alt.url, alt.admin_url, args.pods, alive)
            label = "kproxy " + ",".join(f"{k}={v}" for k, v in also.items())
            peers.append(Peer(label, alt.kubeconfig, tmp / f"cache-also-{profile}"))
        results = measure(commands, peers, args.rounds, LinkBytes(toxi), cp.apiserver_pid)
    finally:
        rp.stop()
        if alt is not None:
            alt.stop()
    return report(profile, results, cache_ready)


if __name__ == "__main__":
    raise SystemExit(main())
