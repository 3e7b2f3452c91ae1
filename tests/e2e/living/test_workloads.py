"""The real controllers through kproxy end where they end without it: the same workloads, compared.

One control plane, two runs. First kube-controller-manager, kube-scheduler and kwok talk to the
apiserver directly and kubectl uses the admin kubeconfig; then they (and kubectl) go through a
``kproxy run`` with the recommended chain (compression, watchcache, dryrun, validation, transcode) and
``credentials: forward``. Each run does the same workloads, concurrently, in namespaces named alike but
for a ``-direct``/``-proxied`` suffix, and waits (bounded polls and watches) until the controllers have
nothing left to do. Then the object graphs (see ``graph.py``: names up to their random part, owners,
replica counts, conditions, phases, revisions, managers, the spread over nodes) must be equal, and the
proxied run must have crossed kproxy for real: its access log shows the controller-manager's and the
scheduler's requests, binds and leases, and the apiserver's flow-control metrics count them under the
components' own identities (a kproxy that called with its own credentials would land in ``exempt``).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import http.client
import json
import re
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from graph import Masker, cluster_nodes, get_json, graph_diff, list_items, namespace_graph, unsettled
from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster.cluster import proxy_kubeconfig, recommended_config, running_components
from kproxy.localcluster.envtest import ControlPlaneInfo, Kubectl, KubectlError
from kproxy.testing.eventually import eventually

# Both runs happen in the first test's fixtures (a fresh control plane, then each side's components and workloads).
pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[3]
NODES = 3
#: Each workload's own deadline (a controller that stops converging fails its workload, not the module).
TIMEOUT = 120.0
#: kwok's pod stages wait 1 s plus up to 5 s of jitter by default; these pod annotations make them immediate,
#: so a run waits for the controllers, not for simulated container starts.
KWOK_NOW = {
    f"{stage}.stage.kwok.x-k8s.io/{knob}": "0s"
    for stage in ("pod-create", "pod-ready", "pod-complete", "pod-delete")
    for knob in ("delay", "jitter-delay")
}
V1, V2 = "registry.invalid/app:1", "registry.invalid/app:2"
AGGREGATE_TO = "rbac.authorization.k8s.io/aggregate-to-{}"


# --------------------------------------------------------------------------- one run's tools


@dataclass
class Side:
    """One run: how kubectl reaches the apiserver, and the names it made (masked when graphs are compared)."""

    mode: str
    info: ControlPlaneInfo
    kubectl: Kubectl
    kubeconfig: Path
    names: dict[str, str] = field(default_factory=dict)

    def name(self, base: str) -> str:
        """This run's name for ``base`` (a namespace or a cluster-scoped object)."""
        full = f"wl-{base}-{self.mode}"
        self.names[full] = f"wl-{base}-SIDE"
        return full

    def k(self, *args: str, input: str | None = None, timeout: float = TIMEOUT) -> str:
        return str(self.kubectl.run(args, kubeconfig=self.kubeconfig, input=input, timeout=timeout).stdout)

    def create(self, namespace: str | None, *objects: dict[str, Any]) -> None:
        doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        self.k(*(("-n", namespace) if namespace else ()), "create", "-f", "-", input=doc)

    def namespace(self, base: str) -> str:
        ns = self.name(base)
        self.k("create", "namespace", ns)
        return ns

    def rollout(self, namespace: str, what: str) -> None:
        """``kubectl rollout status`` (a watch, through kproxy on the proxied side)."""
        self.k("-n", namespace, "rollout", "status", what, f"--timeout={int(TIMEOUT)}s")

    def masker(self) -> Masker:
        return Masker(self.names)


def wait_settled(side: Side, namespace: str) -> None:
    eventually(
        lambda: unsettled(side.info, namespace), TIMEOUT, f"{namespace} to settle", 0.25, until=lambda left: not left
    )


def pod_template(app: str, image: str = V1, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": app}, "annotations": KWOK_NOW},
        # One second of grace: kwok finishes the deletion (it waits for deletionTimestamp).
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "app", "image": image}], **spec},
    }


def deployment(name: str, replicas: int, image: str = V1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": pod_template(name, image),
        },
    }


def replicaset(name: str, replicas: int) -> dict[str, Any]:
    return {**deployment(name, replicas), "kind": "ReplicaSet"}


def live_pods(side: Side, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    query = f"?labelSelector={selector}" if selector else ""
    return list_items(side.info, f"/api/v1/namespaces/{namespace}/pods{query}")


class PodWatch:
    """A watch on a namespace's pods, straight at the apiserver (admin), recording the order of events."""

    def __init__(self, info: ControlPlaneInfo, namespace: str) -> None:
        rv = get_json(info, f"/api/v1/namespaces/{namespace}/pods")["metadata"]["resourceVersion"]
        self._conn = http.client.HTTPSConnection("127.0.0.1", info.apiserver_port, context=info.ssl_context())
        self._conn.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/pods?watch=1&resourceVersion={rv}",
            headers={"Accept": "application/json"},
        )
        self._resp = self._conn.getresponse()
        self.events: list[tuple[str, str, bool]] = []  # (type, pod name, Ready)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        # close() ends the stream under the reader; whatever http.client raises then ends the recording.
        with contextlib.suppress(Exception):
            for line in self._resp:
                ev = json.loads(line)
                pod = ev["object"]
                ready = any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (pod.get("status") or {}).get("conditions") or []
                )
                self.events.append((ev["type"], pod["metadata"]["name"], ready))

    def close(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self._conn.sock.shutdown(socket.SHUT_RDWR)
        self._conn.close()
        self._thread.join(timeout=5)

    def milestones(self) -> list[str]:
        """``created NAME`` and ``ready NAME``, each the first time it happened, in order."""
        out: list[str] = []
        for typ, name, ready in self.events:
            for step, happened in (("created", typ == "ADDED"), ("ready", ready)):
                if happened and f"{step} {name}" not in out:
                    out.append(f"{step} {name}")
        return out


# --------------------------------------------------------------------------- the workloads


@dataclass
class Outcome:
    """What one workload left behind: namespaces to compare, its own observations, or its failure."""

    namespaces: list[str] = field(default_factory=list)
    observed: dict[str, Any] = field(default_factory=dict)
    graph: Any = None
    error: str | None = None
    seconds: float = 0.0


def w_deployment(side: Side, out: Outcome) -> None:
    """Create at 0, scale to 20 and down to 3, roll to a new image, roll back (kubectl rollout undo)."""
    ns = side.namespace("deploy")
    out.namespaces.append(ns)
    side.create(ns, deployment("web", 0))
    side.rollout(ns, "deployment/web")
    for replicas in (20, 3):
        side.k("-n", ns, "scale", "deployment/web", f"--replicas={replicas}")
        side.rollout(ns, "deployment/web")
        wait_settled(side, ns)
        out.observed[f"pods at {replicas}"] = len(live_pods(side, ns))
    side.k("-n", ns, "set", "image", "deployment/web", f"app={V2}")
    side.rollout(ns, "deployment/web")
    side.k("-n", ns, "rollout", "undo", "deployment/web")
    side.rollout(ns, "deployment/web")
    wait_settled(side, ns)
    out.observed["history"] = side.k("-n", ns, "rollout", "history", "deployment/web").split("\n", 1)[1].split()


def w_job(side: Side, out: Outcome) -> None:
    """A Job of three completions, two at a time; kwok completes its pods."""
    ns = side.namespace("job")
    out.namespaces.append(ns)
    template = pod_template("batch", restartPolicy="Never")
    side.create(
        ns,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "batch"},
            "spec": {"completions": 3, "parallelism": 2, "backoffLimit": 0, "template": template},
        },
    )
    side.k("-n", ns, "wait", "--for=condition=Complete", "job/batch", f"--timeout={int(TIMEOUT)}s")
    wait_settled(side, ns)


def w_statefulset(side: Side, out: Outcome) -> None:
    """Three ordered pods: each created only once the one before it is Ready."""
    ns = side.namespace("sts")
    out.namespaces.append(ns)
    watch = PodWatch(side.info, ns)
    try:
        side.create(
            ns,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "db"},
                "spec": {"clusterIP": "None", "selector": {"app": "db"}, "ports": [{"port": 5432}]},
            },
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": {"name": "db"},
                "spec": {
                    "replicas": 3,
                    "serviceName": "db",
                    "podManagementPolicy": "OrderedReady",
                    "selector": {"matchLabels": {"app": "db"}},
                    "template": pod_template("db"),
                },
            },
        )
        side.rollout(ns, "statefulset/db")
        wait_settled(side, ns)
    finally:
        watch.close()
    out.observed["order"] = watch.milestones()


def w_daemonset(side: Side, out: Outcome) -> None:
    """A DaemonSet: one ready pod on each simulated node."""
    ns = side.namespace("ds")
    out.namespaces.append(ns)
    side.create(
        ns,
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": pod_template("agent")},
        },
    )
    side.rollout(ns, "daemonset/agent")
    wait_settled(side, ns)
    out.observed["nodes"] = sorted(p["spec"]["nodeName"] for p in live_pods(side, ns))


def w_service(side: Side, out: Outcome) -> None:
    """A Service over a two-pod Deployment: the EndpointSlice controller lists both pods, ready."""
    ns = side.namespace("svc")
    out.namespaces.append(ns)
    side.create(
        ns,
        deployment("api", 2),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "api"},
            "spec": {"selector": {"app": "api"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    side.rollout(ns, "deployment/api")
    wait_settled(side, ns)

    def ready_endpoints() -> int:
        slices = list_items(side.info, f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices")
        return sum(bool((e.get("conditions") or {}).get("ready")) for s in slices for e in s.get("endpoints") or [])

    out.observed["ready endpoints"] = eventually(
        ready_endpoints, TIMEOUT, "2 ready endpoints", 0.25, until=lambda n: n == 2
    )


def w_gc(side: Side, out: Outcome) -> None:
    """Garbage collection: a ReplicaSet deleted in background, foreground and orphan modes."""
    ns = side.namespace("gc")
    out.namespaces.append(ns)
    modes = ("background", "foreground", "orphan")
    side.create(ns, *(replicaset(f"rs-{mode}", 2) for mode in modes))
    wait_settled(side, ns)
    for mode in modes:
        # kubectl waits until the ReplicaSet is gone; in foreground mode that is after its pods are.
        side.k("-n", ns, "delete", f"replicaset/rs-{mode}", f"--cascade={mode}")
        out.observed[f"{mode}: pods when owner gone"] = (
            len(live_pods(side, ns, f"app%3Drs-{mode}")) if mode == "foreground" else None
        )

    def dependents() -> list[str]:
        return [p["metadata"]["name"] for p in live_pods(side, ns, "app+in+(rs-background,rs-foreground)")]

    eventually(
        dependents, TIMEOUT, "the background and foreground dependents to be gone", 0.25, until=lambda left: not left
    )
    wait_settled(side, ns)
    out.observed["orphans"] = sorted(
        (p["metadata"]["labels"]["app"], len(p["metadata"].get("ownerReferences") or [])) for p in live_pods(side, ns)
    )


def w_namespace_deletion(side: Side, out: Outcome) -> None:
    """A namespace with a Deployment and a ConfigMap is deleted; the namespace controller finishes it."""
    ns = side.namespace("nsdel")
    out.namespaces.append(ns)
    side.create(ns, deployment("doomed", 2), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}})
    side.rollout(ns, "deployment/doomed")
    side.k("delete", "namespace", ns, "--wait=false")
    eventually(
        lambda: get_json(side.info, f"/api/v1/namespaces/{ns}"),
        TIMEOUT,
        f"namespace {ns} to be gone",
        0.25,
        until=lambda n: n is None,
    )
    out.observed["gone"] = True


def w_aggregation(side: Side, out: Outcome) -> None:
    """ClusterRoles labelled aggregate-to-view / aggregate-to-edit get their rules into view, edit and admin."""
    resource = side.name("widgets")
    roles = {"view": side.name("agg-view"), "edit": side.name("agg-edit")}
    verbs = {"view": ["get", "list", "watch"], "edit": ["create", "delete"]}
    side.create(
        None,
        *(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name, "labels": {AGGREGATE_TO.format(to): "true"}},
                "rules": [{"apiGroups": ["example.com"], "resources": [resource], "verbs": verbs[to]}],
            }
            for to, name in roles.items()
        ),
    )

    want = {"view": [verbs["view"]], "edit": sorted(verbs.values(), key=str), "admin": sorted(verbs.values(), key=str)}

    def aggregated() -> dict[str, list[Any]]:
        got = {}
        for role in ("view", "edit", "admin"):
            rules = get_json(side.info, f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{role}").get("rules") or []
            got[role] = sorted((r["verbs"] for r in rules if resource in r.get("resources", [])), key=str)
        return got

    out.graph = eventually(
        aggregated, TIMEOUT, "aggregated rules in view, edit and admin", 0.25, until=lambda got: got == want
    )


def w_quota(side: Side, out: Outcome) -> None:
    """A ResourceQuota's status.used counts pods and ConfigMaps; the create past its limit is refused."""
    ns = side.namespace("quota")
    out.namespaces.append(ns)
    # The quota comes after the namespace's kube-root-ca.crt, as it would in any namespace in use. Created
    # together, the ConfigMap can slip between the quota's creation and the controller's first status:
    # admission charges only what status.hard lists (apiserver admission/plugin/resourcequota/controller.go
    # CheckRequest) and the controller counts from its informers, which may not have it yet
    # (pkg/controller/resourcequota/resource_quota_controller.go syncResourceQuota); it is then missing from
    # status.used until the next full resync, minutes later, with the controllers direct or through kproxy.
    root_ca = f"/api/v1/namespaces/{ns}/configmaps/kube-root-ca.crt"
    eventually(
        lambda: get_json(side.info, root_ca),
        TIMEOUT,
        "the namespace's kube-root-ca.crt",
        0.25,
        until=lambda cm: cm is not None,
    )
    hard = {"pods": "4", "count/configmaps": "4", "services": "1"}
    side.create(
        ns, {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "counts"}, "spec": {"hard": hard}}
    )
    path = f"/api/v1/namespaces/{ns}/resourcequotas/counts"
    status = lambda: get_json(side.info, path).get("status") or {}  # noqa: E731
    eventually(status, TIMEOUT, "the quota's status", 0.25, until=lambda st: st.get("hard") == hard)
    cm = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}} for i in range(4)]
    side.create(ns, cm[0], cm[1], deployment("counted", 2))
    side.rollout(ns, "deployment/counted")
    # kube-root-ca.crt (published by the controller-manager) counts too.
    used = {"pods": "2", "count/configmaps": "3", "services": "0"}
    eventually(status, TIMEOUT, f"status.used {used}", 0.25, until=lambda st: st.get("used") == used)
    side.create(ns, cm[2])
    try:
        side.create(ns, cm[3])
        out.observed["past the limit"] = "created"
    except KubectlError as e:
        out.observed["past the limit"] = re.sub(r"\s+", " ", e.stderr.strip())
    wait_settled(side, ns)


WORKLOADS: dict[str, Callable[[Side, Outcome], None]] = {
    "deployment": w_deployment,
    "job": w_job,
    "statefulset": w_statefulset,
    "daemonset": w_daemonset,
    "service": w_service,
    "gc": w_gc,
    "namespace-deletion": w_namespace_deletion,
    "aggregation": w_aggregation,
    "quota": w_quota,
}


def _run_one(side: Side, fn: Callable[[Side, Outcome], None]) -> Outcome:
    out = Outcome()
    started = time.monotonic()
    try:
        fn(side, out)
    except Exception as e:  # a workload's failure is its own test's failure, not the whole module's
        out.error = f"{type(e).__name__}: {e}"
    out.seconds = time.monotonic() - started
    return out


@dataclass
class Run:
    side: Side
    outcomes: dict[str, Outcome]
    seconds: float
    #: For the proxied run: kproxy's access log, its metrics and the apiserver's flow-control counts.
    access_log: str = ""
    flow_before: dict[str, float] = field(default_factory=dict)
    flow_after: dict[str, float] = field(default_factory=dict)
    kproxy_metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    component_servers: dict[str, str] = field(default_factory=dict)
    #: Both runs' namespaces still there after being deleted at the end (the proxied controllers finish them).
    leftover: list[str] = field(default_factory=list)
    #: Seconds of the fixture's phases besides the workloads (components started, namespaces removed, stopped).
    phases: dict[str, float] = field(default_factory=dict)


def run_side(side: Side) -> Run:
    """All workloads at once (they are independent), then each one's graph, masked for comparison."""
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(WORKLOADS)) as pool:
        futures = {name: pool.submit(_run_one, side, fn) for name, fn in WORKLOADS.items()}
        outcomes = {name: f.result() for name, f in futures.items()}
    mask = side.masker()
    for out in outcomes.values():
        if out.error is None:
            graphs = {mask(ns): namespace_graph(side.info, ns, mask) for ns in out.namespaces}
            out.graph = mask({"namespaces": graphs, "graph": out.graph, "observed": out.observed})
    # Kept beside the control plane's logs, for reading a difference in full.
    dump = {name: out.graph if out.error is None else out.error for name, out in outcomes.items()}
    (side.info.dir / f"graphs-{side.mode}.json").write_text(json.dumps(dump, indent=1, sort_keys=True, default=str))
    return Run(side, outcomes, time.monotonic() - started)


# --------------------------------------------------------------------------- the two runs


def _flow_counts(info: ControlPlaneInfo) -> dict[str, float]:
    """The apiserver's dispatched requests by flow schema (which identity the apiserver classified)."""
    code, body = info.request("GET", "/metrics", timeout=20.0)
    assert code == 200
    counts: dict[str, float] = {}
    for m in re.finditer(
        r'^apiserver_flowcontrol_dispatched_requests_total\{flow_schema="([^"]+)"[^}]*\} (\S+)$', body.decode(), re.M
    ):
        counts[m.group(1)] = counts.get(m.group(1), 0.0) + float(m.group(2))
    return counts


def _kproxy_metrics(directory: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """kproxy's own metrics (its admin listener, from the config the cluster wrote), by name and labels."""
    admin = yaml.safe_load((directory / "kproxy.yaml").read_text())["admin_listen"]
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _recommended_chain() -> dict[str, Any]:
    return recommended_config()


@pytest.fixture(scope="module")
def direct_run(living: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    kubectl = Kubectl(living.kubectl, living.admin_kubeconfig, tmp_path_factory.mktemp("kubectl-cache"))
    side = Side("direct", living, kubectl, living.admin_kubeconfig)
    _release_node_leases(living)
    started = time.monotonic()
    with running_components(living, mode="direct", nodes=NODES):
        up = time.monotonic() - started
        assert len(cluster_nodes(living)) >= NODES
        run = run_side(side)
        stopping = time.monotonic()
    run.phases = {"start": up, "stop": time.monotonic() - stopping}
    yield run


def _release_node_leases(info: ControlPlaneInfo) -> None:
    """Delete the simulated nodes' leases the stopped kwok held.

    A new kwok process has a new holder identity: it waits for a lease held by another one to expire
    (its --node-lease-duration-seconds, 40 s) before it manages the node and its pods. The kwok that
    held them is stopped, so nothing is lost; the next one takes the nodes over at once.
    """
    for node in cluster_nodes(info):
        code, body = info.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
        assert code in (200, 404), (code, body[:200])


def _remove_namespaces(info: ControlPlaneInfo) -> list[str]:
    """Delete both runs' namespaces while the controllers still run; return those not gone in time.

    The living control plane is shared by the session's other living-cluster modules, which should not
    meet these pods (nor have their controllers finish these deletions while they measure).
    """
    ours = re.compile(r"^wl-[a-z]+-(direct|proxied)$")

    def left() -> list[str]:
        names = [n["metadata"]["name"] for n in list_items(info, "/api/v1/namespaces")]
        return [n for n in names if ours.match(n)]

    for ns in left():
        info.request("DELETE", f"/api/v1/namespaces/{ns}")
    try:
        eventually(left, TIMEOUT, "the workloads' namespaces to be gone", 0.25, until=lambda names: not names)
    except AssertionError:
        return left()
    return []


def _server(kubeconfig: Path) -> str:
    return str(yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"])


@pytest.fixture(scope="module")
def proxied_run(living: ControlPlaneInfo, direct_run: Run, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    kubectl = Kubectl(living.kubectl, living.admin_kubeconfig, tmp_path_factory.mktemp("kubectl-cache"))
    side = Side("proxied", living, kubectl, proxy_kubeconfig(living.dir))
    log = living.dir / "kproxy.log"
    offset = log.stat().st_size if log.exists() else 0
    flow_before = _flow_counts(living)
    _release_node_leases(living)
    started = time.monotonic()
    with running_components(living, mode="proxied", proxy=_recommended_chain(), nodes=NODES):
        up = time.monotonic() - started
        run = run_side(side)
        run.flow_before, run.flow_after = flow_before, _flow_counts(living)
        run.kproxy_metrics = _kproxy_metrics(living.dir)
        run.component_servers = {
            name: _server(living.dir / f"{name}.kubeconfig")
            for name in ("kube-controller-manager", "kube-scheduler", "kwok")
        }
        removing = time.monotonic()
        run.leftover = _remove_namespaces(living)
        stopping = time.monotonic()
    run.phases = {"start": up, "cleanup": stopping - removing, "stop": time.monotonic() - stopping}
    # Read after kproxy stopped: a watch is logged when it ends, and the components' informers end only now.
    with log.open("rb") as f:
        f.seek(offset)
        run.access_log = f.read().decode(errors="replace")
    report_timings(direct_run, run)
    yield run


@pytest.fixture(scope="module", autouse=True)
def _cluster_roles_removed(living: ControlPlaneInfo) -> Iterator[None]:
    """The ClusterRoles the aggregation workload made are cluster-wide: remove them after the module."""
    yield
    for side in ("direct", "proxied"):
        for role in ("agg-view", "agg-edit"):
            living.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/clusterroles/wl-{role}-{side}")


# --------------------------------------------------------------------------- the tests


def _outcome(run: Run, name: str) -> Outcome:
    out = run.outcomes[name]
    assert out.error is None, f"{run.side.mode} run of {name} failed after {out.seconds:.1f}s: {out.error}"
    return out


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_same_graph_direct_and_through_kproxy(name: str, direct_run: Run, proxied_run: Run) -> None:
    """Each workload ends in the same object graph whether the controllers and kubectl went through kproxy."""
    direct, proxied = _outcome(direct_run, name), _outcome(proxied_run, name)
    diff = graph_diff(direct.graph, proxied.graph)
    assert not diff, f"{name}: the graphs differ\n{diff}"


EXPECTED: dict[str, dict[str, Any]] = {
    "deployment": {
        "pods at 20": 20,
        "pods at 3": 3,
        # The rollback makes revision 1's template revision 3.
        "history": ["REVISION", "CHANGE-CAUSE", "2", "<none>", "3", "<none>"],
    },
    "statefulset": {
        "order": ["created db-0", "ready db-0", "created db-1", "ready db-1", "created db-2", "ready db-2"],
    },
    "service": {"ready endpoints": 2},
    "gc": {
        "background: pods when owner gone": None,
        "foreground: pods when owner gone": 0,
        "orphan: pods when owner gone": None,
        "orphans": [["rs-orphan", 0], ["rs-orphan", 0]],
    },
    "namespace-deletion": {"gone": True},
}


@pytest.mark.parametrize("mode", ["direct", "proxied"])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_did_what_it_should(name: str, mode: str, direct_run: Run, proxied_run: Run) -> None:
    """Equal graphs could be equally wrong: each run's own observations are what the controllers must do."""
    run = direct_run if mode == "direct" else proxied_run
    out = _outcome(run, name)
    observed = out.graph["observed"]
    for key, want in EXPECTED.get(name, {}).items():
        assert observed[key] == want, f"{mode} {name}: {key}: {observed[key]!r}"
    if name == "daemonset":
        assert observed["nodes"] == cluster_nodes(run.side.info)
    if name == "quota":
        assert "exceeded quota: counts" in observed["past the limit"], observed
        quota = next(o for o in out.graph["namespaces"]["wl-quota-SIDE"]["objects"] if o["kind"] == "ResourceQuota")
        assert quota["status"]["used"] == {"pods": "2", "count/configmaps": "4", "services": "0"}
    if name == "namespace-deletion":
        assert out.graph["namespaces"]["wl-nsdel-SIDE"] == {"namespace": None, "objects": [], "spread": {}}


def test_proxied_run_crossed_kproxy(proxied_run: Run) -> None:
    """The components' informers, binds and leases went through kproxy, under their own identities."""
    run = proxied_run
    kproxy_url = _server(proxy_kubeconfig(run.side.info.dir))
    assert set(run.component_servers.values()) == {kproxy_url}, run.component_servers
    log = run.access_log.splitlines()
    by_agent = {
        agent: [line for line in log if f"user_agent={agent}/" in line]
        for agent in ("kube-controller-manager", "kube-scheduler", "kwok")
    }
    assert all(by_agent.values()), {a: len(lines) for a, lines in by_agent.items()}
    # No request of theirs failed in kproxy or upstream of it (a 5xx is never the workload's doing here).
    failed = [line for line in log if re.search(r"kproxy\.access \S+ \S+ 5\d\d ", line)]
    assert not failed, failed[:5]
    assert any(re.search(r" /api\S*/namespaces/wl-\S+-proxied\S* 20\d .*user_agent=kubectl/", line) for line in log)
    binds = [
        line
        for line in by_agent["kube-scheduler"]
        if re.search(r"POST /api/v1/namespaces/wl-\S+/pods/\S+/binding 201", line)
    ]
    pods_made = sum(
        o["kind"] == "Pod"
        for out in run.outcomes.values()
        if out.error is None
        for graph in out.graph["namespaces"].values()
        for o in graph["objects"]
    )
    assert len(binds) >= min(pods_made, 20), (len(binds), pods_made)
    leases = [
        line
        for line in by_agent["kwok"]
        if re.search(r"PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/", line)
    ]
    assert leases, "no node lease renewals through kproxy"
    informers = [line for line in by_agent["kube-controller-manager"] if "watch=true" in line and "verb=watch" in line]
    assert informers, "no controller-manager watches through kproxy"
    # The controllers ran as their own service accounts (use-service-account-credentials).
    assert any(
        "system:serviceaccount:kube-system:replicaset-controller" in line
        for line in by_agent["kube-controller-manager"]
    )

    # At the apiserver: flow control classifies by the authenticated user, so the components' requests land in
    # their own flow schemas; had kproxy called with its own (system:masters) credentials they would be 'exempt'.
    delta = {k: run.flow_after.get(k, 0.0) - run.flow_before.get(k, 0.0) for k in run.flow_after}
    assert delta.get("kube-scheduler", 0) >= len(binds), delta
    assert delta.get("kube-controller-manager", 0) > 0, delta
    assert delta.get("kube-system-service-accounts", 0) > 0, delta

    # kproxy's watch cache served the components' pod and node informers (one upstream watch each).
    open_watches = {
        dict(labels)["resource"]: value
        for (metric, labels), value in run.kproxy_metrics.items()
        if metric == "kproxy_watchcache_watches"
    }
    assert open_watches.get("pods", 0) > 0 and open_watches.get("nodes", 0) > 0, open_watches

    # And the apiserver recorded the writers by their user agents, as it does for direct callers.
    objects = _outcome(run, "deployment").graph["namespaces"]["wl-deploy-SIDE"]["objects"]
    writers = [{m[0] for m in o["managers"]} for o in objects if o["kind"] in ("ReplicaSet", "Pod")]
    assert writers and all("kube-controller-manager" in w for w in writers), writers
    assert any("kwok" in w for w in writers), writers


def test_all_namespaces_deleted_at_the_end(proxied_run: Run) -> None:
    """Both runs' namespaces, deleted together at the end, are finished by the controllers through kproxy."""
    assert proxied_run.leftover == []


def report_timings(direct_run: Run, proxied_run: Run) -> None:
    """Not a verdict (the tests are): the runs' durations, printed once both runs are done
    (``pytest -s`` shows them)."""
    for run in (direct_run, proxied_run):
        per = ", ".join(f"{n} {o.seconds:.1f}s" for n, o in run.outcomes.items())
        phases = ", ".join(f"{n} {s:.1f}s" for n, s in run.phases.items())
        print(f"\n{run.side.mode}: workloads {run.seconds:.1f}s ({per}); {phases}")
    delta = {k: v - proxied_run.flow_before.get(k, 0.0) for k, v in proxied_run.flow_after.items()}
    print(f"apiserver requests by flow schema during the proxied run: {delta}")
    agents = re.findall(r" user_agent=([a-z-]+)/", proxied_run.access_log)
    print(f"kproxy access log by user agent: {dict(collections.Counter(agents))}")
