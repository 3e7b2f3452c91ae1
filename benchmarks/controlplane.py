"""Control-plane load: the real controllers and simulated nodes, direct vs through kproxy's recommended chain.

    python -m benchmarks.controlplane [--nodes 100] [--deployments 20] [--replicas 50] [--low 5]
                                      [--envtest-dir DIR] [--quick] [--output FILE]

What a gateway in front of an apiserver is for: its clients are controllers. Each side of this run
starts a control plane (etcd + kube-apiserver), then the living cluster of
:mod:`kproxy.localcluster.cluster` on it: kube-controller-manager, kube-scheduler and KWOK with ``--nodes``
simulated nodes, either ``direct`` (the components talk to the apiserver) or ``proxied`` (they talk to a
``kproxy run`` with ``config.recommended.yaml``'s chain: compression, watchcache, dryrun, validation,
transcode; access log off). The driver (this process, as the admin, a client like kubectl) reaches the
apiserver the same way as the components: itself, or through kproxy.

The churn: ``--deployments`` Deployments, started ``--stagger`` s apart, each going through the same steps
one after the other -- create at ``replicas/2``, scale to ``--replicas``, scale to ``--low``, a rolling
update (a new pod template) at ``--low``, scale to 0. A step's rollout time runs from just before the
driver's write to the watch event (from the driver's own watch of the Deployments) that shows the
Deployment complete: ``observedGeneration`` caught up and ``replicas``, ``updatedReplicas``,
``readyReplicas``, ``availableReplicas`` all equal to the wanted count, no terminating replica. Both sides
do exactly the same work, so CPU seconds compare directly.

Measured over the churn window, per side: CPU seconds (``/proc/PID/stat``, all threads) of the apiserver,
etcd, kproxy and the three components, and of the rest of the machine; kproxy's highest RSS (``VmRSS``
sampled every second); the apiserver's open watches (``apiserver_longrunning_requests{verb="WATCH"}``,
sampled every ``--sample`` s, minus the same gauge before the components started, i.e. the apiserver's own
loopback informers), by resource; the bytes the apiserver sent to readers (``apiserver_response_sizes``,
which v1.37 records for GET and LIST only, plus ``apiserver_watch_events_sizes``, the framed bytes of
every watch event to every watcher; both before any gzip of a watch, after it for lists); rollout times
p50/p99.

Goals: through kproxy, the apiserver holds at most one watch per resource in the watchcache's list
whatever the number of clients watching it; rollouts complete no slower than 1.2x direct at p99. Exit
status 0 when both sides ran cleanly and the goals are met (``--quick``: ran cleanly; goals shown, not
judged), 1 when not, 2 when the benchmark could not be set up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.lib.common import BenchError, log, ncpu
from benchmarks.lib.procs import cpu_seconds_or, machine_busy_seconds, rss_bytes
from benchmarks.lib.stats import percentile
from kproxy.localcluster import envtest
from kproxy.localcluster.cluster import proxy_kubeconfig, recommended_config, running_components
from kproxy.localcluster.controlplane import client_ssl_context

REPO_ROOT = Path(__file__).resolve().parents[1]
DIRECT, PROXIED = "direct", "proxied"
#: goal: p99 rollout time through kproxy at most this times direct's
GOAL_P99_RATIO = 1.2
#: processes whose CPU is reported, in table order
PROCESSES = ("apiserver", "etcd", "kproxy", "kube-controller-manager", "kube-scheduler", "kwok")
_METRIC_PREFIXES = (
    "apiserver_longrunning_requests{",
    "apiserver_response_sizes_sum{",
    "apiserver_watch_events_sizes_sum{",
    "kproxy_watchcache_reads_total{",
    "kproxy_watchcache_objects{",
)
_REQUEST_TIMEOUT = 60.0


# --------------------------------------------------------------------------- results


@dataclass
class Rollout:
    deployment: str
    step: str
    seconds: float


@dataclass
class Side:
    mode: str
    rollouts: list[Rollout] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    window_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    others_cpu: float = 0.0
    kproxy_rss_max: int = 0
    #: the apiserver's open WATCH requests from clients (above the baseline), highest sample, by (group, resource)
    watches: dict[tuple[str, str], int] = field(default_factory=dict)
    #: the highest sum over resources in one sample
    watches_total: int = 0
    list_get_bytes: float = 0.0
    watch_bytes: float = 0.0
    peak_pods: int = 0
    #: the unmeasured warm-up Deployment's rollout: the first after the components started (informers syncing)
    warm_up_s: float = float("nan")
    #: kproxy's watch reads of cached resources by who served them (cache / upstream), since it started
    kproxy_watch_reads: dict[str, float] = field(default_factory=dict)
    #: resources whose kproxy watches were passed to the apiserver, with the reasons kproxy gave
    kproxy_passed: dict[str, float] = field(default_factory=dict)
    #: (group, resource) of every cache kproxy held at the end
    kproxy_cached: set[tuple[str, str]] = field(default_factory=set)

    def seconds(self, step: str | None = None) -> list[float]:
        return sorted(r.seconds for r in self.rollouts if step is None or r.step == step)

    def p(self, q: float, step: str | None = None) -> float:
        return percentile(self.seconds(step), q)


# --------------------------------------------------------------------------- metrics


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of the few families this benchmark reads (the apiserver's /metrics is ~2.5 MB)."""
    lines = "\n".join(line for line in text.splitlines() if line.startswith(_METRIC_PREFIXES))
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(lines) for s in fam.samples]


def watch_gauges(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for name, labels, value in samples:
        if name == "apiserver_longrunning_requests" and labels.get("verb") == "WATCH":
            key = (labels.get("group", ""), labels.get("resource", ""))
            out[key] = out.get(key, 0) + int(value)
    return out


def bytes_sent(samples: Sequence[tuple[str, dict[str, str], float]]) -> tuple[float, float]:
    """(GET and LIST response bytes, watch event bytes) the apiserver has counted since it started."""
    reads = sum(v for n, _, v in samples if n == "apiserver_response_sizes_sum")
    watches = sum(v for n, _, v in samples if n == "apiserver_watch_events_sizes_sum")
    return reads, watches


def cached_resources(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(group, resource) of every resource the config's watchcache holds (``pods``, ``apps/v1/deployments``)."""
    out = []
    for f in config.get("filters") or []:
        if isinstance(f, Mapping) and f.get("name") == "watchcache":
            for r in f.get("resources") or []:
                parts = str(r).split("/")
                out.append(("", parts[0]) if len(parts) == 1 else (parts[0], parts[-1]))
    return out


def proxy_config(access_log: bool, cache_all: bool = False) -> dict[str, Any]:
    """config.recommended.yaml on a free port; the access log off unless asked (its cost is not the chain's);
    with ``cache_all`` the watch cache holds every resource (``resources: ["*"]``)."""
    cfg = recommended_config()
    cfg["log"] = {**(cfg.get("log") or {}), "level": "warning", "access_log": access_log}
    if cache_all:
        for f in cfg.get("filters") or []:
            if isinstance(f, dict) and f.get("name") == "watchcache":
                f["resources"] = ["*"]
    return cfg


# --------------------------------------------------------------------------- the churn


#: KWOK's pod stages wait 1 s plus up to 5 s of jitter each (create, ready, delete), to look like container
#: start-up; these annotations on the pod template take that away, so a rollout's time is the control plane's.
NO_KWOK_DELAYS = {
    f"pod-{stage}.stage.kwok.x-k8s.io/{key}": "0s"
    for stage in ("create", "ready", "delete")
    for key in ("delay", "jitter-delay")
}


def deployment(name: str, replicas: int, rev: int, kwok_delays: bool = False) -> dict[str, Any]:
    labels = {"app": name}
    annotations = {"bench.kproxy.dev/rev": str(rev), **({} if kwok_delays else NO_KWOK_DELAYS)}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.invalid/app:1",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        }
                    ],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }


def complete(obj: Mapping[str, Any], generation: int, replicas: int) -> bool:
    """Whether a Deployment's status shows a finished rollout of ``generation`` at ``replicas``."""
    st = obj.get("status") or {}
    return (
        int(st.get("observedGeneration") or 0) >= generation
        and all(int(st.get(k) or 0) == replicas for k in ("replicas", "updatedReplicas", "readyReplicas"))
        and int(st.get("availableReplicas") or 0) == replicas
        and not int(st.get("terminatingReplicas") or 0)
    )


class Driver:
    """The admin's client (like kubectl): writes the Deployments and watches them to time each rollout."""

    def __init__(self, args: argparse.Namespace, info: envtest.ControlPlaneInfo, server: str, proxied: bool) -> None:
        self.args = args
        self.info = info
        self.ns = f"bench-cp-{'kproxy' if proxied else 'direct'}-{secrets.token_hex(3)}"
        if proxied:
            ctx = client_ssl_context(info.ca_file)
            headers = {"Authorization": f"Bearer {info.admin_token}"}
        else:
            ctx, headers = info.ssl_context(), {}
        self.api = aiohttp.ClientSession(
            base_url=server,
            headers={**headers, "Accept": "application/json", "User-Agent": "kproxy-bench-controlplane"},
            connector=aiohttp.TCPConnector(ssl=ctx, limit=64),
            timeout=aiohttp.ClientTimeout(total=_REQUEST_TIMEOUT),
        )
        #: the apiserver itself, for its /metrics (the instrument, the same on both sides)
        self.admin = aiohttp.ClientSession(
            base_url=info.server,
            connector=aiohttp.TCPConnector(ssl=info.ssl_context()),
            timeout=aiohttp.ClientTimeout(total=_REQUEST_TIMEOUT),
        )
        self.state: dict[str, dict[str, Any]] = {}
        self.changed = asyncio.Condition()
        self.peak_pods = 0
        self.watch_error: str | None = None

    async def close(self) -> None:
        await self.api.close()
        await self.admin.close()

    async def apiserver_metrics(self) -> list[tuple[str, dict[str, str], float]]:
        async with self.admin.get("/metrics") as r:
            if r.status != 200:
                raise BenchError(f"apiserver /metrics: HTTP {r.status}")
            return parse_metrics(await r.text())

    async def call(self, method: str, path: str, body: Any = None, ctype: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": ctype} if data is not None else {}
        async with self.api.request(method, path, data=data, headers=hdrs) as r:
            text = await r.text()
            if r.status >= 300:
                raise BenchError(f"{method} {path}: HTTP {r.status}: {text[:300]}")
            return json.loads(text)

    async def create_namespace(self) -> None:
        await self.call("POST", "/api/v1/namespaces", {"metadata": {"name": self.ns}})

    async def delete_namespace(self) -> None:
        with contextlib.suppress(BenchError, aiohttp.ClientError, asyncio.TimeoutError):
            await self.call("DELETE", f"/api/v1/namespaces/{self.ns}")

    # ------------------------------------------------------------------ the Deployments' watch

    def _seen(self, obj: dict[str, Any]) -> None:
        self.state[obj["metadata"]["name"]] = obj
        pods = sum(int((o.get("status") or {}).get("replicas") or 0) for o in self.state.values())
        self.peak_pods = max(self.peak_pods, pods)

    async def watch(self, ready: asyncio.Event) -> None:
        """List then watch the namespace's Deployments, for as long as the churn runs (re-watching on close)."""
        path = f"/apis/apps/v1/namespaces/{self.ns}/deployments"
        rv = ""
        while True:
            if not rv:
                listed = await self.call("GET", path)
                for obj in listed["items"]:
                    self._seen(obj)
                rv = listed["metadata"]["resourceVersion"]
                ready.set()
            params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true"}
            timeout = aiohttp.ClientTimeout(total=None, sock_read=None)
            async with self.api.get(path, params=params, timeout=timeout) as r:
                if r.status != 200:
                    self.watch_error = f"watch: HTTP {r.status}"
                    rv = ""
                    await asyncio.sleep(0.5)
                    continue
                async for line in r.content:
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        rv = ""  # expired: list again
                        break
                    rv = obj["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._seen(obj)
                        async with self.changed:
                            self.changed.notify_all()

    async def wait_complete(self, name: str, generation: int, replicas: int, timeout: float) -> float:
        loop = asyncio.get_running_loop()

        def done() -> bool:
            obj = self.state.get(name)
            return obj is not None and complete(obj, generation, replicas)

        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(done), timeout)
        return loop.time()

    async def warm_up(self) -> None:
        """One Deployment of one pod, not measured: the controller-manager starts its controllers only once its
        informers have synced, so the first rollout after start-up waits seconds for that."""
        path = f"/apis/apps/v1/namespaces/{self.ns}/deployments"
        obj = await self.call("POST", path, deployment("warm-up", 1, 1, self.args.kwok_delays))
        try:
            await self.wait_complete("warm-up", int(obj["metadata"]["generation"]), 1, self.args.step_timeout)
        except TimeoutError as e:
            raise BenchError(f"the warm-up Deployment did not complete in {self.args.step_timeout:.0f} s") from e
        await self.call("DELETE", f"{path}/warm-up")
        self.state.pop("warm-up", None)

    # ------------------------------------------------------------------ one Deployment's steps

    async def steps(self, index: int, side: Side) -> None:
        a = self.args
        name = f"churn-{index:03d}"
        path = f"/apis/apps/v1/namespaces/{self.ns}/deployments"
        await asyncio.sleep(index * a.stagger)
        plan: list[tuple[str, int, int]] = [  # (step, replicas, template revision)
            ("create", a.replicas // 2, 1),
            ("scale up", a.replicas, 1),
            ("scale down", a.low, 1),
            ("rolling update", a.low, 2),
            ("scale to 0", 0, 2),
        ]
        loop = asyncio.get_running_loop()
        for step, replicas, rev in plan:
            t0 = loop.time()
            try:
                if step == "create":
                    obj = await self.call("POST", path, deployment(name, replicas, rev, a.kwok_delays))
                else:
                    spec: dict[str, Any] = {"replicas": replicas}
                    if step == "rolling update":
                        spec["template"] = {"metadata": {"annotations": {"bench.kproxy.dev/rev": str(rev)}}}
                    patch = {"spec": spec}
                    obj = await self.call("PATCH", f"{path}/{name}", patch, "application/merge-patch+json")
                t1 = await self.wait_complete(name, int(obj["metadata"]["generation"]), replicas, a.step_timeout)
            except TimeoutError:
                st = (self.state.get(name) or {}).get("status")
                side.failures.append(f"{name} {step}: not complete after {a.step_timeout:.0f} s (status {st})")
                return
            except (BenchError, aiohttp.ClientError) as e:
                side.failures.append(f"{name} {step}: {e}")
                return
            side.rollouts.append(Rollout(name, step, t1 - t0))


# --------------------------------------------------------------------------- one side


def _pids(info: envtest.ControlPlaneInfo) -> dict[str, int]:
    state = json.loads((info.dir / "state.json").read_text())
    pids = {"apiserver": state["apiserver"]["pid"], "etcd": state["etcd"]["pid"]}
    for name, proc in (state.get("extras") or {}).items():
        if proc.get("pid"):
            pids[name] = int(proc["pid"])
    return pids


def _cpu(pids: Mapping[str, int]) -> dict[str, float]:
    return {name: cpu_seconds_or(pid, 0.0) for name, pid in pids.items()}


async def _kproxy_metrics(info: envtest.ControlPlaneInfo) -> list[tuple[str, dict[str, str], float]]:
    cfg = yaml.safe_load((info.dir / "kproxy.yaml").read_text())
    async with aiohttp.ClientSession() as s, s.get(f"http://{cfg['admin_listen']}/metrics") as r:
        return parse_metrics(await r.text())


def _cached_labels(samples: Sequence[tuple[str, dict[str, str], float]]) -> set[tuple[str, str]]:
    """(group, resource) of kproxy's caches (``kproxy_watchcache_objects{resource="deployments.apps"}``)."""
    out = set()
    for name, labels, _ in samples:
        if name == "kproxy_watchcache_objects":
            resource, _, group = labels.get("resource", "").partition(".")
            out.add((group, resource))
    return out


def _watch_reads(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[tuple[str, str, str], float]:
    out: dict[tuple[str, str, str], float] = {}
    for name, labels, value in samples:
        if name == "kproxy_watchcache_reads_total" and labels.get("verb") == "watch":
            key = (labels.get("resource", ""), labels.get("served", ""), labels.get("reason", ""))
            out[key] = out.get(key, 0.0) + value
    return out


async def churn(
    args: argparse.Namespace,
    info: envtest.ControlPlaneInfo,
    server: str,
    mode: str,
    baseline: Mapping[tuple[str, str], int],
) -> Side:
    side = Side(mode)
    proxied = mode == PROXIED
    pids = _pids(info)
    driver = Driver(args, info, server, proxied)
    stop = asyncio.Event()

    async def sample_watches() -> None:
        while True:
            gauges = watch_gauges(await driver.apiserver_metrics())
            clients = {k: max(0, v - baseline.get(k, 0)) for k, v in gauges.items()}
            for k, v in clients.items():
                side.watches[k] = max(side.watches.get(k, 0), v)
            side.watches_total = max(side.watches_total, sum(clients.values()))
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(stop.wait(), args.sample)
            if stop.is_set():
                return

    async def sample_rss() -> None:
        while not stop.is_set() and "kproxy" in pids:
            with contextlib.suppress(OSError, BenchError):
                side.kproxy_rss_max = max(side.kproxy_rss_max, rss_bytes(pids["kproxy"]))
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    try:
        await driver.create_namespace()
        ready = asyncio.Event()
        watcher = asyncio.create_task(driver.watch(ready))
        await asyncio.wait_for(ready.wait(), _REQUEST_TIMEOUT)
        t = time.monotonic()
        await driver.warm_up()
        side.warm_up_s = time.monotonic() - t
        log(f"{mode}: warm-up Deployment complete in {side.warm_up_s:.1f} s; measuring")
        m0 = bytes_sent(await driver.apiserver_metrics())
        cpu0, busy0, t0 = _cpu(pids), machine_busy_seconds(), time.monotonic()
        samplers = [asyncio.create_task(sample_watches()), asyncio.create_task(sample_rss())]
        await asyncio.gather(*(driver.steps(i, side) for i in range(args.deployments)))
        cpu1, busy1, t1 = _cpu(pids), machine_busy_seconds(), time.monotonic()
        stop.set()
        await asyncio.gather(*samplers)
        m1 = bytes_sent(await driver.apiserver_metrics())
        if proxied:
            samples = await _kproxy_metrics(info)
            side.kproxy_cached = _cached_labels(samples)
            kp1 = _watch_reads(samples)
            for (resource, served, reason), d in kp1.items():
                if d:
                    side.kproxy_watch_reads[served] = side.kproxy_watch_reads.get(served, 0.0) + d
                    if served != "cache":
                        key = f"{resource} ({reason})"
                        side.kproxy_passed[key] = side.kproxy_passed.get(key, 0.0) + d
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
        if driver.watch_error:
            side.failures.append(driver.watch_error)
        side.window_s = t1 - t0
        side.cpu = {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu0}
        side.others_cpu = max(0.0, (busy1 - busy0) - sum(side.cpu.values()))
        side.list_get_bytes, side.watch_bytes = m1[0] - m0[0], m1[1] - m0[1]
        side.peak_pods = driver.peak_pods
        await driver.delete_namespace()
    finally:
        stop.set()
        await driver.close()
    return side


def forget_kwok_leases(info: envtest.ControlPlaneInfo) -> None:
    """Delete the simulated nodes' leases an earlier kwok left (a reused control plane).

    A kwok starting where its nodes' leases exist tries to create them, gets AlreadyExists, and syncs them
    only ~30 s later; until then it moves none of those nodes' pods, so the first rollout of the side
    would wait for it (seen both direct and through kproxy).
    """
    leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
    code, body = info.request("GET", leases)
    if code != 200:
        raise BenchError(f"listing node leases: HTTP {code}")
    for item in json.loads(body)["items"]:
        name = item["metadata"]["name"]
        if name.startswith("kwok-node-"):
            info.request("DELETE", f"{leases}/{name}")


def run_side(args: argparse.Namespace, info: envtest.ControlPlaneInfo, mode: str, proxy: dict[str, Any]) -> Side:
    # The apiserver's own (loopback) informers' watches, before any component: not the clients'.
    code, body = info.request("GET", "/metrics", timeout=_REQUEST_TIMEOUT)
    if code != 200:
        raise BenchError(f"apiserver /metrics: HTTP {code}")
    baseline = watch_gauges(parse_metrics(body.decode()))
    forget_kwok_leases(info)
    log(f"{mode}: starting kube-controller-manager, kube-scheduler and kwok with {args.nodes} nodes ...")
    t = time.monotonic()
    with running_components(info, mode=mode, proxy=proxy if mode == PROXIED else None, nodes=args.nodes) as server:
        log(f"{mode}: components up in {time.monotonic() - t:.1f} s; churning {args.deployments} Deployments ...")
        if mode == PROXIED:
            server = _proxy_server(info)
        side = asyncio.run(churn(args, info, server, mode, baseline))
        log(f"{mode}: churn done; stopping the components")
    log(
        f"{mode}: {len(side.rollouts)} rollouts in {side.window_s:.0f} s, p50 {side.p(50):.2f} s, "
        f"p99 {side.p(99):.2f} s, {len(side.failures)} failures"
    )
    return side


def _proxy_server(info: envtest.ControlPlaneInfo) -> str:
    """kproxy's URL, from the admin kubeconfig through it that the living cluster writes."""
    cfg = yaml.safe_load(proxy_kubeconfig(info.dir).read_text())
    return str(cfg["clusters"][0]["cluster"]["server"])


@contextlib.contextmanager
def control_plane(reuse: Path | None, mode: str) -> Iterator[envtest.ControlPlaneInfo]:
    """``reuse``'s control plane (both sides share it), or a fresh one for this side, stopped at the end."""
    if reuse is not None:
        yield envtest.load(reuse)
        return
    directory = Path(tempfile.mkdtemp(prefix=f"kproxy-bench-cp-{mode}-"))
    ok = False
    try:
        log(f"{mode}: starting a control plane in {directory} ...")
        yield envtest.up(directory)
        ok = True
    finally:
        envtest.down(directory)
        if ok:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            log(f"{mode}: control-plane files kept for inspection in {directory}")


# --------------------------------------------------------------------------- report


def _s(x: float, digits: int = 1) -> str:
    return "-" if x != x else f"{x:,.{digits}f}"


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f}"


def _res(key: tuple[str, str]) -> str:
    return key[1] if not key[0] else f"{key[1]}.{key[0]}"


def report(
    args: argparse.Namespace, sides: Mapping[str, Side], cached: Sequence[tuple[str, str]], k8s: str, load0: Any
) -> tuple[str, bool]:
    from kproxy import __version__ as kproxy_version

    d, k = sides.get(DIRECT), sides.get(PROXIED)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        f"# control-plane load benchmark ({stamp})",
        "",
        f"- machine: {ncpu()} CPUs, Linux {platform.release()}, load average before the run "
        f"{load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f}; Python {platform.python_version()}, kproxy "
        f"{kproxy_version}, Kubernetes {k8s} (kube-apiserver, kube-controller-manager, kube-scheduler), KWOK",
        f"- load: {args.nodes} KWOK nodes; {args.deployments} Deployments started {args.stagger:g} s apart, each: "
        f"create at {args.replicas // 2}, scale to {args.replicas}, scale to {args.low}, rolling update at "
        f"{args.low}, scale to 0 (peak {args.deployments * args.replicas:,} pods if all were at the top at once)",
        "- sides: `direct` = components and driver on the apiserver; `kproxy` = components and driver through "
        "`kproxy run` with config.recommended.yaml's chain (access log off"
        + (", every resource cached: `resources: [\"*\"]`" if args.cache_all else "")
        + "), `credentials: forward`, HTTPS; "
        + ("one control plane per side, fresh" if args.envtest_dir is None else "one control plane for both sides"),
        "",
        "| side | rollouts | p50 s | p99 s | window s | apiserver CPU s | etcd CPU s | kproxy CPU s | "
        "kproxy RSS MiB | components CPU s | others CPU s | apiserver watches | MB sent: lists+gets / watch events |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, s in sides.items():
        comps = sum(s.cpu.get(n, 0.0) for n in PROCESSES[3:])
        rss = _s(s.kproxy_rss_max / 2**20, 0) if s.kproxy_rss_max else "-"
        kcpu = _s(s.cpu["kproxy"]) if "kproxy" in s.cpu else "-"
        lines.append(
            f"| {'kproxy' if name == PROXIED else name} | {len(s.rollouts)} | {_s(s.p(50), 2)} | {_s(s.p(99), 2)} | "
            f"{_s(s.window_s, 0)} | {_s(s.cpu.get('apiserver', 0.0))} | {_s(s.cpu.get('etcd', 0.0))} | {kcpu} | "
            f"{rss} | {_s(comps)} | {_s(s.others_cpu)} | {s.watches_total} | "
            f"{_mb(s.list_get_bytes)} / {_mb(s.watch_bytes)} |"
        )
    ok = all(not s.failures for s in sides.values())
    lines += [
        "",
        "CPU seconds over the churn window (all threads); components = kube-controller-manager + kube-scheduler + "
        "kwok; others = the rest of the machine. Watches: the apiserver's open client WATCH requests (highest "
        "sample, its own loopback informers subtracted; the driver's Deployments watch included). p50/p99 over "
        "every step of every Deployment.",
    ]
    if d is not None and k is not None:
        steps = ["create", "scale up", "scale down", "rolling update", "scale to 0"]
        lines += ["", "| step | direct p50 / p99 s | kproxy p50 / p99 s |", "|---|--:|--:|"]
        for st in steps:
            lines.append(
                f"| {st} | {_s(d.p(50, st), 2)} / {_s(d.p(99, st), 2)} | {_s(k.p(50, st), 2)} / {_s(k.p(99, st), 2)} |"
            )
        lines.append(
            f"| first rollout after start-up (1 pod, not counted above) | {_s(d.warm_up_s, 2)} | {_s(k.warm_up_s, 2)} |"
        )
        keys = sorted(set(d.watches) | set(k.watches), key=_res)
        over = [key for key in cached if k.watches.get(key, 0) > 1]
        lines += [
            "",
            "Open client watches at the apiserver by resource (highest sample; * = in kproxy's watchcache):",
            "",
            "| resource | direct | kproxy |",
            "|---|--:|--:|",
        ]
        same = 0
        same_watches = 0
        for key in keys:
            dw, kw = d.watches.get(key, 0), k.watches.get(key, 0)
            if key in cached or dw != kw:
                lines.append(f"| {_res(key)}{' *' if key in cached else ''} | {dw} | {kw} |")
            elif dw:
                same, same_watches = same + 1, same_watches + dw
        lines.append(f"| {same} other resources, the same on both sides | {same_watches} | {same_watches} |")
        p99_ratio = k.p(99) / d.p(99) if d.p(99) else float("nan")
        watch_ok, p99_ok = not over, p99_ratio <= GOAL_P99_RATIO
        reads = ", ".join(f"{served}: {v:.0f}" for served, v in sorted(k.kproxy_watch_reads.items())) or "none"
        passed = ", ".join(f"{r}: {v:.0f}" for r, v in sorted(k.kproxy_passed.items())) or "none"
        lines += [
            "",
            f"Watches of cached resources kproxy was asked for since it started, by who served them: {reads}; "
            f"passed to the apiserver: {passed}.",
            "",
            "- goal, at most one apiserver watch per cached resource through kproxy: "
            + ("met" if watch_ok else f"**not met** ({', '.join(_res(x) for x in over)})"),
            f"- goal, p99 rollout time through kproxy at most {GOAL_P99_RATIO}x direct: {p99_ratio:.2f}x, "
            + ("met" if p99_ok else "**not met**"),
            f"- apiserver CPU through kproxy / direct: {_ratio(k.cpu.get('apiserver'), d.cpu.get('apiserver'))}; "
            f"bytes it sent: {_ratio(k.list_get_bytes + k.watch_bytes, d.list_get_bytes + d.watch_bytes)}; "
            f"CPU of everything measured (apiserver, etcd, kproxy, components): "
            f"{_ratio(sum(k.cpu.values()), sum(d.cpu.values()))}",
            f"- peak pods seen (sum of the Deployments' status.replicas): direct {d.peak_pods:,}, "
            f"kproxy {k.peak_pods:,}",
        ]
        if args.quick:
            lines.append("- `--quick`: a smoke run; the goals are shown, not judged.")
        else:
            ok = ok and watch_ok and p99_ok
    for name, s in sides.items():
        for f in s.failures[:10]:
            lines.append(f"- **{name} failure**: {f}")
    return "\n".join(lines) + "\n", ok


def _ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:.2f}x"


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.controlplane", description=(__doc__ or "").split("\n\n")[1])
    p.add_argument("--nodes", type=int, default=100, help="KWOK nodes (100)")
    p.add_argument("--deployments", type=int, default=20, help="Deployments churned (20)")
    p.add_argument("--replicas", type=int, default=50, help="each Deployment's top replica count (50)")
    p.add_argument("--low", type=int, default=5, help="the replica count of the scale-down and rolling update (5)")
    p.add_argument("--stagger", type=float, default=2.0, help="seconds between two Deployments' first steps (2)")
    p.add_argument("--step-timeout", type=float, default=600.0, help="seconds a step may take before it fails (600)")
    p.add_argument("--sample", type=float, default=10.0, help="seconds between two samples of the watch gauge (10)")
    p.add_argument("--sides", default="direct,proxied", help="which sides, in order (direct,proxied)")
    p.add_argument("--access-log", action="store_true", help="keep kproxy's access log on")
    p.add_argument(
        "--cache-all", action="store_true", help='cache every resource (watchcache resources: ["*"]), not the list'
    )
    p.add_argument(
        "--kwok-delays", action="store_true", help="keep KWOK's simulated container start-up (1-6 s a stage)"
    )
    p.add_argument("--envtest-dir", type=Path, help="run both sides on this control plane (default: a fresh one each)")
    p.add_argument("--quick", action="store_true", help="smoke run: 3 nodes, 2 Deployments of 4 (goals not judged)")
    p.add_argument("--output", type=Path, help="also write the markdown report to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.deployments, args.replicas, args.low, args.stagger, args.sample = 3, 2, 4, 2, 0.5, 2.0
        args.step_timeout = min(args.step_timeout, 60.0)
    args.side_names = [x.strip() for x in args.sides.split(",") if x.strip()]
    if not args.side_names or any(x not in (DIRECT, PROXIED) for x in args.side_names):
        p.error("--sides is a comma-separated subset of direct,proxied")
    if args.nodes < 1 or args.deployments < 1 or args.replicas < 2 or not 0 < args.low <= args.replicas:
        p.error("--nodes, --deployments >= 1, --replicas >= 2 and 0 < --low <= --replicas")
    return args


def _k8s(info: envtest.ControlPlaneInfo) -> str:
    code, body = info.request("GET", "/version")
    return str(json.loads(body).get("gitVersion", "?")) if code == 200 else "?"


def bench(args: argparse.Namespace) -> tuple[str, bool]:
    load0 = os.getloadavg()
    proxy = proxy_config(args.access_log, args.cache_all)
    sides: dict[str, Side] = {}
    k8s = "?"
    for mode in args.side_names:
        with control_plane(args.envtest_dir, mode) as info:
            k8s = _k8s(info)
            sides[mode] = run_side(args, info, mode, proxy)
    proxied = sides.get(PROXIED)
    cached = sorted(proxied.kproxy_cached) if args.cache_all and proxied is not None else cached_resources(proxy)
    return report(args, sides, cached, k8s, load0)


def _on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        text, ok = bench(args)
    except (BenchError, envtest.EnvtestError, aiohttp.ClientError) as e:
        log(f"error: {e}")
        return 2
    except KeyboardInterrupt:
        log("interrupted")
        return 130
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text)
        log(f"wrote {args.output}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
