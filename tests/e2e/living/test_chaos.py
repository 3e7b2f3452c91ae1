"""Chaos in the middle of a rollout: the real controllers through kproxy, and directly for comparison.

The living cluster (kube-controller-manager, kube-scheduler, KWOK nodes) rolls a Deployment of
:data:`REPLICAS` pods from one image to another. When the rollout is part-way, the apiserver is killed
(SIGKILL), etcd is compacted to its head while the apiserver is down, the apiserver is started again
and etcd is compacted once more while the rollout goes on. The run is made twice on the same control
plane: the components straight at the apiserver, then through a ``kproxy run`` with the recommended
chain and ``watchcache`` on every resource (``resources: ["*"]``, rediscovering every second so that a
rediscovery lands in each moment of the restart, discovery half-assembled included).

Both runs must end in the same object graph (the expected one: every replica of the new revision
available, the old ReplicaSet at zero). The controller-manager's log (:mod:`kcmlog`) is counted for
each run: through kproxy no reflector of a cached resource may see a 410 or list again, no event may be
lost, and its "read version is not as new as written version" lines may be no more than directly.
The metadata informers of the garbage collector and the quota controller (``as=PartialObjectMetadata``)
are served by the cache too (it holds every resource they watch), so they count as cached. The numbers
side by side are printed by :func:`report_numbers` (``pytest -s``) and written to
``chaos-numbers.json`` in the control plane's directory.

Two known failures are named xfails, taken only when the run shows their cause (both depend on where
the kill lands): the discovery blip (kproxy drops caches while the restarted apiserver assembles its
discovery) and a KWOK write that kproxy could not forward during the outage (no answer, which KWOK does
not retry, where directly it meets a refused connection and retries). When the rollout through kproxy
stalls, the pods KWOK left unstarted are touched so that both runs' counts cover the same work.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kcmlog
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster import cluster
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import Timeout, eventually

REPLICAS = 20
#: Seconds a new pod must be Ready before it counts as available: with 25% surge and no
#: unavailability the rollout takes four waves of at least this long, so it is mid-way for a while.
MIN_READY_SECONDS = 2
CONVERGE_TIMEOUT = 60.0
REPO = Path(__file__).resolve().parents[3]
KCM_ARGS = {"kube-controller-manager": [kcmlog.VMODULE]}


def _proxy_config() -> dict[str, Any]:
    """config.recommended.yaml with every list+watch resource cached and a fast discovery cycle."""
    cfg = cluster.recommended_config()
    for f in cfg["filters"]:
        if f["name"] == "watchcache":
            f["resources"] = ["*"]
            f["rediscovery_interval"] = 1.0
    return cfg


# --------------------------------------------------------------------------- the apiserver, as admin


def _deployment(image: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": REPLICAS,
            "minReadySeconds": MIN_READY_SECONDS,
            "selector": {"matchLabels": {"app": "web"}},
            "strategy": {"rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 0}},
            "template": {
                # KWOK starts a pod after 1-6 s and removes a deleted one before its grace period ends
                # (30 s by default): shorter, so that the run is bounded by the controllers, not by KWOK.
                "metadata": {
                    "labels": {"app": "web"},
                    "annotations": {
                        "pod-create.stage.kwok.x-k8s.io/delay": "100ms",
                        "pod-create.stage.kwok.x-k8s.io/jitter-delay": "500ms",
                    },
                },
                "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c", "image": image}]},
            },
        },
    }


def _rolling(dep: dict[str, Any]) -> bool:
    """The controller has seen the new template and has started, not finished, replacing pods."""
    s = dep.get("status", {})
    return bool(
        s.get("observedGeneration") == dep["metadata"]["generation"]
        and s.get("updatedReplicas", 0) > 0
        and not _complete(dep)
    )


def _complete(dep: dict[str, Any]) -> bool:
    s = dep.get("status", {})
    return bool(
        s.get("observedGeneration") == dep["metadata"]["generation"]
        and s.get("replicas") == s.get("updatedReplicas") == s.get("availableReplicas") == REPLICAS
        and not s.get("unavailableReplicas")
    )


def graph(info: ControlPlaneInfo, ns: str) -> dict[str, Any]:
    """The namespace's Deployment, ReplicaSets and pods with names, uids and times masked."""
    dep = info.json("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/web")
    rss = info.json("GET", f"/apis/apps/v1/namespaces/{ns}/replicasets")["items"]
    pods = info.json("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
    revision = {rs["metadata"]["uid"]: rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"] for rs in rss}
    s = dep["status"]
    pod_rows: dict[str, int] = {}
    for p in pods:
        owner = [o for o in p["metadata"].get("ownerReferences", []) if o.get("controller")]
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        row = "rev={} phase={} ready={} bound={} terminating={}".format(
            revision.get(owner[0]["uid"]) if owner else None,
            p["status"].get("phase"),
            ready,
            bool(p["spec"].get("nodeName")),
            "deletionTimestamp" in p["metadata"],
        )
        pod_rows[row] = pod_rows.get(row, 0) + 1
    return {
        "deployment": {
            "generation": dep["metadata"]["generation"],
            # Counts the apiserver leaves out when zero are read as 0.
            "status": {
                k: s.get(k, 0)
                for k in (
                    "observedGeneration",
                    "replicas",
                    "updatedReplicas",
                    "readyReplicas",
                    "availableReplicas",
                    "unavailableReplicas",
                    "terminatingReplicas",
                )
            },
            "conditions": sorted((c["type"], c["status"], c["reason"]) for c in s.get("conditions", [])),
        },
        "replicasets": sorted(
            (
                rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"],
                rs["spec"]["template"]["spec"]["containers"][0]["image"],
                [o["kind"] + "/" + o["name"] for o in rs["metadata"].get("ownerReferences", []) if o.get("controller")],
                rs["spec"]["replicas"],
                rs["status"].get("readyReplicas", 0),
                rs["status"].get("availableReplicas", 0),
            )
            for rs in rss
        ),
        "pods": pod_rows,
    }


EXPECTED_GRAPH = {
    "deployment": {
        "generation": 2,
        "status": {
            "observedGeneration": 2,
            "replicas": REPLICAS,
            "updatedReplicas": REPLICAS,
            "readyReplicas": REPLICAS,
            "availableReplicas": REPLICAS,
            "unavailableReplicas": 0,
            "terminatingReplicas": 0,
        },
        "conditions": [
            ("Available", "True", "MinimumReplicasAvailable"),
            ("Progressing", "True", "NewReplicaSetAvailable"),
        ],
    },
    "replicasets": [
        ("1", "registry.invalid/web:1", ["Deployment/web"], 0, 0, 0),
        ("2", "registry.invalid/web:2", ["Deployment/web"], REPLICAS, REPLICAS, REPLICAS),
    ],
    "pods": {"rev=2 phase=Running ready=True bound=True terminating=False": REPLICAS},
}


# --------------------------------------------------------------------------- one run


@dataclass
class ChaosRun:
    mode: str
    #: Whether the namespace reached :data:`EXPECTED_GRAPH` within :data:`CONVERGE_TIMEOUT` of the restart.
    converged: bool
    log: kcmlog.KcmLog
    #: The namespace's graph when it converged or the time was up.
    graph: dict[str, Any]
    #: Whether the rollout was still going at each disturbance (kill, compaction while down, after restart).
    mid_rollout: dict[str, bool]
    seconds: dict[str, float]
    #: Kinds of the resources kproxy served from its cache (proxied only).
    cached_kinds: set[str]
    #: Kinds of the caches kproxy dropped as "no longer served" (the discovery blip); kproxy and KWOK log facts.
    dropped_kinds: set[str]
    facts: dict[str, int]
    #: KWOK's failed stage steps other than deletes of pods already gone (the reason a pod is stuck).
    kwok_errors: list[str] = field(default_factory=list)


def _served_kinds(info: ControlPlaneInfo) -> dict[str, str]:
    """resource label (``deployments.apps``) -> kind, for every watchable resource of every preferred
    version in discovery."""
    out: dict[str, str] = {}
    paths = [("", "/api/v1")] + [
        (g["name"], "/apis/" + g["preferredVersion"]["groupVersion"]) for g in info.json("GET", "/apis")["groups"]
    ]
    for group, path in paths:
        for r in info.json("GET", path)["resources"]:
            if "/" not in r["name"] and "watch" in r.get("verbs", ()):
                out[f"{r['name']}.{group}" if group else r["name"]] = r["kind"]
    return out


def _kproxy_cached(info: ControlPlaneInfo) -> set[str]:
    admin = yaml.safe_load((info.dir / "kproxy.yaml").read_text())["admin_listen"]
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        s.labels["resource"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "kproxy_watchcache_objects"
    }


#: kproxy's log lines for a cache it stops serving: dropped because discovery no longer lists the
#: resource (filters/watchcache), or made unready because the upstream answers 404 (cacher/reflector).
_DROPPED = re.compile(r"watchcache: (\S+) [^;]*; dropping its cache|kproxy\.cache (\S+): no longer served")


def _kproxy_log(path: Path, offset: int) -> tuple[dict[str, int], set[str]]:
    """Facts of kproxy's log from ``offset`` on, and the labels of the caches it dropped."""
    with open(path, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()
    dropped = {m.group(1) or m.group(2) for m in map(_DROPPED.search, lines) if m}
    facts = {
        "caches dropped or unready (discovery)": len(dropped),
        "upstream relists (expired)": sum("expired upstream; listing again" in ln for ln in lines),
        "503 answers": sum(" 503 " in ln and "kproxy.access" in ln for ln in lines),
        "429 answers": sum(" 429 " in ln and "kproxy.access" in ln for ln in lines),
        "tracebacks": sum(ln.startswith("Traceback") for ln in lines),
    }
    return facts, dropped


#: How a request cut off by the apiserver's death reaches KWOK: over HTTP/1.1 the connection ends
#: (EOF, reset); over HTTP/2 kproxy resets the one stream with INTERNAL_ERROR, as Go's server does
#: for a handler that aborts, and Go's client reports "stream error: ... INTERNAL_ERROR".
_CUT = ("EOF", "connection reset", "INTERNAL_ERROR", "client connection lost")


def _kwok_log(path: Path, offset: int, ns: str) -> dict[str, int]:
    """KWOK's stage steps for the namespace's pods that failed, and those it gives up on: KWOK
    (pkg/kwok/controllers/utils.go, shouldRetry) tries a failed step again only after a refused
    connection, a 429, a 503 or a timeout; after any other error the pod stays where it is until an
    event about it arrives."""
    with open(path, "rb") as f:
        f.seek(offset)
        lines = [ln for ln in f.read().decode(errors="replace").splitlines() if f'"{ns}/' in ln]
    failed = [ln for ln in lines if "failed to apply stage" in ln]
    return {
        "kwok failed stage steps": len(failed),
        "kwok stage steps lost to a cut connection": sum(any(m in ln for m in _CUT) for ln in failed),
        "kwok retried stage steps": sum("retrying for failed job" in ln for ln in lines),
    }


def _kwok_errors(path: Path, offset: int, ns: str) -> list[str]:
    with open(path, "rb") as f:
        f.seek(offset)
        lines = [ln for ln in f.read().decode(errors="replace").splitlines() if f'"{ns}/' in ln]
    return [ln[-400:] for ln in lines if "failed to apply stage" in ln and "not found" not in ln]


def _nudge_unstarted(info: ControlPlaneInfo, ns: str) -> int:
    """Annotate the namespace's pods KWOK has not started (no IP, not deleted); how many."""
    pods = info.json("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
    stuck = [p for p in pods if not p["status"].get("podIP") and "deletionTimestamp" not in p["metadata"]]
    for pod in stuck:
        patch = {"metadata": {"annotations": {"chaos-test/nudged": "true"}}}
        path = f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}"
        info.json("PATCH", path, patch, "application/merge-patch+json")
    return len(stuck)


def _settle(done: Callable[[], bool], timeout: float = CONVERGE_TIMEOUT) -> bool:
    """Poll ``done`` until true or ``timeout``; whether it became true (the verdict is a test's).
    Connection errors while the apiserver restarts count as not yet."""
    try:
        eventually(done, timeout, "the condition", 0.2, ignore=(OSError, AssertionError))
    except Timeout:
        return False
    return True


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def chaos_run(info: ControlPlaneInfo, mode: str) -> ChaosRun:
    ns = f"chaos-{mode}"
    kcm_log, kproxy_log = info.dir / "kube-controller-manager.log", info.dir / "kproxy.log"
    kcm_offset, kproxy_offset, kwok_offset = _size(kcm_log), _size(kproxy_log), _size(info.dir / "kwok.log")
    cfg = _proxy_config() if mode == "proxied" else None
    # The nodes' leases of the previous run's KWOK would keep this run's from taking the nodes over
    # for their 40 s; that KWOK is gone.
    code, body = info.request("DELETE", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
    assert code == 200, body
    t0 = time.monotonic()
    seconds: dict[str, float] = {}
    mid: dict[str, bool] = {}
    facts: dict[str, int] = {}
    cached: set[str] = set()
    with cluster.running_components(info, mode=mode, proxy=cfg, extra_args=KCM_ARGS):
        seconds["components up"] = time.monotonic() - t0
        dep_path = f"/apis/apps/v1/namespaces/{ns}/deployments/web"

        def dep() -> dict[str, Any]:
            out: dict[str, Any] = info.json("GET", dep_path)
            return out

        info.json("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        info.json("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", _deployment("registry.invalid/web:1"))
        eventually(lambda: _complete(dep()), CONVERGE_TIMEOUT, "first rollout", 0.2, ignore=(OSError, AssertionError))
        t1 = time.monotonic()
        patch = {"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "registry.invalid/web:2"}]}}}}
        info.json("PATCH", dep_path, patch, "application/strategic-merge-patch+json")
        eventually(
            lambda: _rolling(dep()),
            CONVERGE_TIMEOUT,
            "the second rollout part-way",
            0.2,
            ignore=(OSError, AssertionError),
        )
        mid["kill"] = True
        info.stop_apiserver(kill=True)
        info.compact_etcd(info.etcd_revision())
        mid["compaction while down"] = True  # nothing moves while the apiserver is down
        t2 = time.monotonic()
        seconds["first rollout"], seconds["to mid-way"] = t1 - t0 - seconds["components up"], t2 - t1
        info.start_apiserver()
        t3 = time.monotonic()
        seconds["apiserver restart"] = t3 - t2
        mid["compaction after restart"] = _rolling(dep())
        info.compact_etcd(info.etcd_revision())
        converged = _settle(lambda: graph(info, ns) == EXPECTED_GRAPH)
        seconds["restart to convergence"] = time.monotonic() - t3
        final = graph(info, ns)
        if not converged:
            # So that the two runs' counts cover the same work, pods KWOK left unstarted are touched
            # (an event KWOK acts on) and the rollout given the same time again; the verdict stays.
            facts["pods nudged"] = _nudge_unstarted(info, ns)
            facts["converged after the nudge"] = int(_settle(lambda: graph(info, ns) == EXPECTED_GRAPH))
        if mode == "proxied":
            cached = _kproxy_cached(info)
        # Gone before the next run starts, so that neither run's counts include the other's cleanup.
        info.json("DELETE", f"/api/v1/namespaces/{ns}")
        _settle(lambda: info.request("GET", f"/api/v1/namespaces/{ns}")[0] == 404, timeout=30)
    kinds = _served_kinds(info)
    log_facts, dropped = _kproxy_log(kproxy_log, kproxy_offset) if mode == "proxied" else ({}, set())
    facts.update(log_facts)
    facts.update(_kwok_log(info.dir / "kwok.log", kwok_offset, ns))
    return ChaosRun(
        kwok_errors=_kwok_errors(info.dir / "kwok.log", kwok_offset, ns),
        mode=mode,
        converged=converged,
        log=kcmlog.read(kcm_log, kcm_offset),
        graph=final,
        mid_rollout=mid,
        seconds=seconds,
        # The metadata informers (garbage collector, quota) ask for ``as=PartialObjectMetadata`` of every
        # resource: served by the cache when it holds every resource they may watch.
        cached_kinds={kinds[r] for r in cached if r in kinds}
        | ({"PartialObjectMetadata"} if kinds.keys() <= cached else set()),
        dropped_kinds={kinds[r] for r in dropped if r in kinds},
        facts=facts,
    )


@pytest.fixture(scope="module")
def direct(living: ControlPlaneInfo) -> ChaosRun:
    return chaos_run(living, "direct")


@pytest.fixture(scope="module")
def proxied(living: ControlPlaneInfo, direct: ChaosRun) -> ChaosRun:
    # After the direct run (which it is compared with), on the same control plane.
    run = chaos_run(living, "proxied")
    report_numbers(run, direct, living)
    return run


def _cached(run: ChaosRun, counts: dict[str, int]) -> dict[str, int]:
    return {t: n for t, n in counts.items() if n and kcmlog.type_kind(t) in run.cached_kinds}


# --------------------------------------------------------------------------- the verdicts


@pytest.mark.parametrize("mode", ["direct", "proxied"])
def test_rollout_converges_to_the_expected_graph(mode: str, request: pytest.FixtureRequest) -> None:
    run: ChaosRun = request.getfixturevalue(mode)
    assert run.mid_rollout == {"kill": True, "compaction while down": True, "compaction after restart": True}
    lost = run.facts.get("kwok stage steps lost to a cut connection", 0)
    if not run.converged and mode == "proxied" and lost:
        # KWOK's status write to a pod was in flight when the apiserver was killed: it is cut off
        # after it was sent (its outcome unknown), so kproxy closes the connection (EOF) or, over
        # HTTP/2, resets the stream, as the dying apiserver ends its connection directly. KWOK
        # retries only a refused connection, 429, 503 and
        # timeouts, so it drops that step on both sides; directly the restarted apiserver's 410
        # makes KWOK's informer relist and replay the pod, through kproxy its watch survives (no
        # relist: the point of the cache) and the pod never starts. A kubelet resyncs its status.
        pytest.xfail(
            "KWOK does not retry a status write cut off by the apiserver's death, and through kproxy no "
            f"relist replays the pod: {lost} pod stage steps lost"
        )
    assert run.converged, (
        f"no convergence in {CONVERGE_TIMEOUT:.0f} s after the restart: {run.graph}; KWOK's failed steps: "
        + "\n".join(run.kwok_errors)
    )
    assert run.graph == EXPECTED_GRAPH


def test_kproxy_caches_every_resource_the_controllers_watch(proxied: ChaosRun) -> None:
    """The verdicts below are about cached resources: make sure that is every typed informer's."""
    watched = {kcmlog.type_kind(t) for t in proxied.log.started}
    assert {"Pod", "ReplicaSet", "Deployment", "Node", "Lease", "PartialObjectMetadata"} <= proxied.cached_kinds
    assert watched <= proxied.cached_kinds, watched - proxied.cached_kinds


def _xfail_if_discovery_blip(run: ChaosRun, failing: dict[str, int]) -> None:
    """A failure whose every type is a cache kproxy dropped (or made unready) is the known
    discovery blip: the rediscovery that lands while the restarted apiserver is still assembling its
    discovery drops the cache of every non-core resource and closes its watches; the
    controller-manager watches the apiserver again from its old resource version, is answered 410
    and lists again. Whether a rediscovery lands in that second is chance (about one run in two),
    hence no static xfail; once the blip is fixed nothing is dropped and the verdict stands."""
    if failing and {kcmlog.type_kind(t) for t in failing} <= run.dropped_kinds:
        pytest.xfail(
            f"discovery blip with resources ['*']: kproxy dropped {len(run.dropped_kinds)} caches during the "
            f"apiserver's restart; {len(failing)} informers of them relisted"
        )


def test_no_410_through_kproxy(proxied: ChaosRun) -> None:
    _xfail_if_discovery_blip(proxied, _cached(proxied, proxied.log.expired))
    assert _cached(proxied, proxied.log.expired) == {}
    assert _cached(proxied, proxied.log.relists_after_410) == {}


def test_no_relist_through_kproxy(proxied: ChaosRun) -> None:
    _xfail_if_discovery_blip(proxied, _cached(proxied, proxied.log.relists))
    assert _cached(proxied, proxied.log.relists) == {}, proxied.facts


def test_no_lost_events_through_kproxy(proxied: ChaosRun) -> None:
    assert proxied.log.lost_events == 0, proxied.log.lost_event_lines[:5]


def test_read_version_lag_no_worse_than_direct(proxied: ChaosRun, direct: ChaosRun) -> None:
    if not proxied.converged and not proxied.facts.get("converged after the nudge"):
        pytest.xfail("not comparable: the rollout through kproxy stalled, so its controllers did less work")
    assert sum(proxied.log.read_version.values()) <= sum(direct.log.read_version.values())


def report_numbers(proxied: ChaosRun, direct: ChaosRun, living: ControlPlaneInfo) -> None:
    """Not a verdict (the tests above are): the two runs' numbers side by side, written to
    ``chaos-numbers.json`` and printed (``pytest -s``) once both runs are done."""
    rows = {name: (proxied.log.summary()[name], direct.log.summary()[name]) for name in direct.log.summary()}
    # Direct ran against the same apiserver: the same kinds count as "cached" for the comparison.
    for name, counts in (("relists (cached kinds)", "relists"), ("410s (cached kinds)", "expired")):
        rows[name] = tuple(sum(_cached(proxied, getattr(r.log, counts)).values()) for r in (proxied, direct))
    report = {
        "through kproxy vs direct": rows,
        "by type, through kproxy": {
            "relists": dict(proxied.log.relists),
            "410s": dict(proxied.log.expired),
            "failed": dict(proxied.log.failed),
            "failed, why": dict(proxied.log.failure_reasons),
            "read version": dict(proxied.log.read_version),
        },
        "by type, direct": {
            "relists": dict(direct.log.relists),
            "410s": dict(direct.log.expired),
            "failed": dict(direct.log.failed),
            "failed, why": dict(direct.log.failure_reasons),
            "read version": dict(direct.log.read_version),
        },
        "kproxy and kwok, through kproxy": proxied.facts,
        "kwok, direct": direct.facts,
        "seconds": {"proxied": proxied.seconds, "direct": direct.seconds},
    }
    (living.dir / "chaos-numbers.json").write_text(json.dumps(report, indent=2))
    print()
    print(f"{'':28} {'kproxy':>8} {'direct':>8}")
    for name, (p, d) in rows.items():
        print(f"{name:28} {p:>8} {d:>8}")
    print(json.dumps({k: v for k, v in report.items() if k != "through kproxy vs direct"}, indent=1))


def test_kcmlog_reads_the_controller_managers_lines() -> None:
    """The counter on lines as the controller-manager writes them (two reflectors of one type, a 410, a
    relist, a forbidden list, a dropped event, a retried one, a consistency skip)."""
    r = 'reflector="k8s.io/client-go@v0.37.1/tools/cache/reflector.go:343"'
    text = "\n".join(
        [
            "=== kproxy envtest 2026-11-26T16:54:07: kube-controller-manager --vmodule=reflector=4",
            f'I1126 16:54:37.560559   31077 reflector.go:425] "Starting reflector" type="*v1.Pod" resyncPeriod="1h" '
            f"{r}",
            f'I1126 16:54:37.560702   31077 reflector.go:472] "Listing and watching" type="*v1.Pod" {r}',
            f'I1126 16:54:37.561094   31077 reflector.go:425] "Starting reflector" type="*v1.Pod" resyncPeriod="2h" '
            f"{r}",
            f'I1126 16:54:37.561111   31077 reflector.go:472] "Listing and watching" type="*v1.Pod" {r}',
            f'I1126 16:54:37.600000   31077 reflector.go:507] "Caches populated" type="*v1.Pod" {r}',
            f'I1126 16:55:28.000000   31077 reflector.go:651] "Watch closed" {r} type="*v1.Pod" '
            'err="too old resource version: 769 (800)"',
            f'I1126 16:55:28.100000   31077 reflector.go:472] "Listing and watching" type="*v1.Pod" {r}',
            'E1126 16:55:28.200000   31077 reflector.go:227] "Failed to watch" err="nodes is forbidden: User '
            '\\"system:kube-controller-manager\\" cannot watch resource \\"nodes\\"" logger="UnhandledError" '
            f'{r} type="*v1.Node"',
            'E1126 16:55:29.000000   31077 event.go:365] "Server rejected event (will not retry!)" '
            'err="the server is currently unable to handle the request" event="&Event{ObjectMeta:{web.1 ns}}"',
            'E1126 16:55:23.348703   31077 event.go:374] "Unable to write event (may retry after sleeping)" '
            'err="Post \\"https://127.0.0.1:18471/api/v1/namespaces/chaos1/events\\": EOF" event="&Event{}"',
            'E1126 16:55:28.682409   31077 replica_set.go:640] "Unhandled Error" err="sync \\"chaos1/web-b5b5d6c4\\" '
            "failed with read version: 768 is not as new as written version: 771 for group resource "
            'replicasets.apps" logger="UnhandledError"',
        ]
    )
    log = kcmlog.parse(text)
    assert log.started == {"*v1.Pod": 2}
    assert log.relists == {"*v1.Pod": 1}
    assert log.expired == {"*v1.Pod": 1} and log.relists_after_410 == {"*v1.Pod": 1}
    assert log.failed == {"*v1.Node": 1} and log.failure_reasons == {"forbidden": 1}
    assert (log.lost_events, log.retried_events) == (1, 1)
    assert log.read_version == {"replicasets.apps": 1}
    assert kcmlog.type_kind("*v1.Pod") == "Pod"
