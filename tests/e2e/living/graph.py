"""The object graph of a namespace as the apiserver holds it, reduced to what must not depend on the run.

Two runs of the same workload (controllers direct, or through kproxy) never produce the same uids,
times, resource versions, IPs or random name suffixes, nor place the same pod on the same node. What
they must agree on is everything the controllers decide: which objects exist, their names up to the
random part (``generateName`` + ``*``), who owns whom, replica counts, conditions (type, status,
reason), phases, revisions, who wrote each object (managedFields managers, which the apiserver derives
from the caller's user agent) and how many pods each controller put on each node (the spread, sorted:
the scheduler may pick other nodes, not another balance). :func:`namespace_graph` reads that summary
with direct admin GETs (the verdict is the apiserver's, not what a client through kproxy was told) and
:func:`graph_diff` says where two summaries differ.
"""

from __future__ import annotations

import difflib
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kproxy.localcluster.envtest import ControlPlaneInfo

__all__ = ["Masker", "cluster_nodes", "get_json", "graph_diff", "list_items", "namespace_graph", "summarize"]

#: The namespaced kinds a workload's graph holds, with their list paths (``{ns}`` is the namespace).
KINDS: Mapping[str, str] = {
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
    "ControllerRevision": "/apis/apps/v1/namespaces/{ns}/controllerrevisions",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "Service": "/api/v1/namespaces/{ns}/services",
    "EndpointSlice": "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ResourceQuota": "/api/v1/namespaces/{ns}/resourcequotas",
}

_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: Annotations the controllers decide (revisions, desired counts); others are the test's own or carry times.
_KEPT_ANNOTATION_PREFIXES = ("deployment.kubernetes.io/",)


class Masker:
    """Rewrites a run's own names (its namespaces, its cluster-scoped objects) to placeholders, uids to ``<uid>``."""

    def __init__(self, replacements: Mapping[str, str]) -> None:
        # Longest first, so a name that contains another is replaced whole.
        self._pairs = sorted(replacements.items(), key=lambda kv: -len(kv[0]))

    def text(self, value: str) -> str:
        for old, new in self._pairs:
            value = value.replace(old, new)
        return _UID.sub("<uid>", value)

    def __call__(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {self.text(str(k)): self(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self(v) for v in value]
        return value


def get_json(info: ControlPlaneInfo, path: str) -> Any:
    """GET ``path`` as the admin, straight from the apiserver; None on 404."""
    code, body = info.request("GET", path, timeout=20.0)
    if code == 404:
        return None
    if code != 200:
        raise AssertionError(f"GET {path}: HTTP {code}: {body[:300]!r}")
    return json.loads(body)


def list_items(info: ControlPlaneInfo, path: str) -> list[dict[str, Any]]:
    out = get_json(info, path)
    return [] if out is None else list(out["items"])


def cluster_nodes(info: ControlPlaneInfo) -> list[str]:
    """The simulated nodes' names."""
    return sorted(n["metadata"]["name"] for n in list_items(info, "/api/v1/nodes?labelSelector=type%3Dkwok"))


def stable_name(meta: Mapping[str, Any]) -> str:
    """The name without the random part the apiserver added to ``generateName``."""
    name = str(meta.get("name", ""))
    gen = meta.get("generateName")
    if gen and name.startswith(gen):
        return f"{gen}*"
    return name


def _conditions(status: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return sorted((c.get("type", ""), c.get("status", ""), c.get("reason", "")) for c in status.get("conditions") or [])


def _observed(obj: Mapping[str, Any]) -> bool | None:
    """Whether the controller has seen the latest spec (generation values themselves may differ by timing)."""
    status = obj.get("status") or {}
    if "observedGeneration" not in status:
        return None
    return bool(status["observedGeneration"] == obj["metadata"].get("generation"))


def _pick(mapping: Mapping[str, Any] | None, keys: Sequence[str]) -> dict[str, Any]:
    mapping = mapping or {}
    return {k: mapping[k] for k in keys if k in mapping}


def _images(spec: Mapping[str, Any]) -> list[str]:
    pod_spec = ((spec.get("template") or {}).get("spec")) or spec
    return [str(c.get("image")) for c in pod_spec.get("containers") or []]


def _pod(obj: Mapping[str, Any]) -> dict[str, Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return {
        "phase": status.get("phase"),
        "scheduled": bool(spec.get("nodeName")),
        "podIP": bool(status.get("podIP")),
        "containers": sorted(
            (c.get("name"), bool(c.get("ready")), sorted((c.get("state") or {}).keys()))
            for c in status.get("containerStatuses") or []
        ),
        "images": _images(spec),
    }


_REPLICA_KEYS = ("replicas", "fullyLabeledReplicas", "readyReplicas", "availableReplicas", "updatedReplicas")


def _workload(obj: Mapping[str, Any], status_keys: Sequence[str]) -> dict[str, Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    return {
        "replicas": spec.get("replicas"),
        "images": _images(spec),
        "status": _pick(status, status_keys),
        "observed": _observed(obj),
    }


def _kind_fields(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if kind == "Pod":
        return _pod(obj)
    if kind in ("Deployment", "ReplicaSet"):
        return _workload(obj, (*_REPLICA_KEYS, "unavailableReplicas", "terminatingReplicas"))
    if kind == "StatefulSet":
        out = _workload(obj, (*_REPLICA_KEYS, "currentReplicas", "currentRevision", "updateRevision"))
        out["podManagementPolicy"] = spec.get("podManagementPolicy")
        return out
    if kind == "DaemonSet":
        ds_keys = ("currentNumberScheduled", "desiredNumberScheduled", "numberReady", "numberAvailable")
        return {**_workload(obj, (*ds_keys, "updatedNumberScheduled", "numberMisscheduled")), "replicas": None}
    if kind == "ControllerRevision":
        return {"revision": obj.get("revision")}
    if kind == "Job":
        keys = ("succeeded", "failed", "active", "ready", "terminating")
        return {
            "completions": spec.get("completions"),
            "parallelism": spec.get("parallelism"),
            "status": _pick(status, keys),
            "uncounted": status.get("uncountedTerminatedPods") or {},
        }
    if kind == "Service":
        return {
            "type": spec.get("type"),
            "clusterIP": "None" if spec.get("clusterIP") == "None" else bool(spec.get("clusterIP")),
            "ports": sorted((p.get("port"), p.get("protocol")) for p in spec.get("ports") or []),
            "selector": spec.get("selector"),
        }
    if kind == "EndpointSlice":
        return {
            "addressType": obj.get("addressType"),
            "ports": sorted((p.get("port"), p.get("protocol")) for p in obj.get("ports") or []),
            "endpoints": sorted(
                (
                    sorted((e.get("conditions") or {}).items()),
                    (e.get("targetRef") or {}).get("kind"),
                    # targetRef names a pod by its full name; keep the stable part.
                    _target_name(e.get("targetRef") or {}),
                    bool(e.get("nodeName")),
                    len(e.get("addresses") or []),
                )
                for e in obj.get("endpoints") or []
            ),
        }
    if kind == "ConfigMap":
        return {"keys": sorted((obj.get("data") or {}).keys())}
    if kind == "ResourceQuota":
        return {"hard": spec.get("hard"), "status": status}
    return {}


def _target_name(ref: Mapping[str, Any]) -> str:
    # A pod's generated name is its owner's prefix plus five characters of the apiserver's alphabet.
    return re.sub(r"-[bcdfghjklmnpqrstvwxz2456789]{5}$", "-*", str(ref.get("name", "")))


def summarize(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """One object's summary: what a controller decided about it, without what varies by run."""
    meta = obj.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(_KEPT_ANNOTATION_PREFIXES)}
    return {
        "kind": kind,
        "name": stable_name(meta),
        "labels": meta.get("labels") or {},
        "annotations": annotations,
        "owners": sorted(
            (o.get("kind"), o.get("name"), bool(o.get("controller")), bool(o.get("blockOwnerDeletion")))
            for o in meta.get("ownerReferences") or []
        ),
        "finalizers": sorted(meta.get("finalizers") or []),
        "deleting": "deletionTimestamp" in meta,
        "managers": sorted(
            {(m.get("manager"), m.get("operation"), m.get("subresource", "")) for m in meta.get("managedFields") or []}
        ),
        "conditions": _conditions(obj.get("status") or {}),
        **_kind_fields(kind, obj),
    }


def _owner_key(pod: Mapping[str, Any]) -> str:
    for o in pod["metadata"].get("ownerReferences") or []:
        if o.get("controller"):
            return f"{o.get('kind')}/{o.get('name')}"
    return "-"


#: Owners whose pods' placement is left to resource scores alone: the scheduler's default spreading
#: constraints select a pod's siblings through its Services, ReplicationControllers, ReplicaSets and
#: StatefulSets (pkg/scheduler/framework/plugins/helper/spread.go, DefaultSelector), never a Job. Such
#: pods land wherever the rest of the cluster's load leaves the most room, which differs between runs.
_UNSPREAD_OWNERS = ("Job",)


def spread(pods: Sequence[Mapping[str, Any]], nodes: Sequence[str]) -> dict[str, list[int]]:
    """Per controlling owner, how many of its live pods each node runs (sorted, nodes with none included).

    Only where the scheduler spreads on purpose (see :data:`_UNSPREAD_OWNERS`); whether every pod was
    scheduled at all is in each pod's summary.
    """
    counts: dict[str, Counter[str]] = {}
    for pod in pods:
        if "deletionTimestamp" in pod["metadata"] or _owner_key(pod).startswith(
            tuple(f"{k}/" for k in _UNSPREAD_OWNERS)
        ):
            continue
        node = (pod.get("spec") or {}).get("nodeName") or "<unscheduled>"
        counts.setdefault(_owner_key(pod), Counter())[node] += 1
    return {
        owner: sorted((c[n] for n in [*nodes, *(set(c) - set(nodes))]), reverse=True) for owner, c in counts.items()
    }


def namespace_graph(
    info: ControlPlaneInfo,
    namespace: str,
    mask: Masker,
    *,
    kinds: Mapping[str, str] = KINDS,
    keep: Callable[[str, Mapping[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """The summary of ``namespace``: its objects (sorted), the pods' spread, and whether the namespace exists."""
    ns = get_json(info, f"/api/v1/namespaces/{namespace}")
    objects: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for kind, path in kinds.items():
        for obj in list_items(info, path.format(ns=namespace)):
            if keep is not None and not keep(kind, obj):
                continue
            if kind == "Pod":
                pods.append(obj)
            objects.append(mask(summarize(kind, obj)))
    objects.sort(key=lambda o: json.dumps(o, sort_keys=True))
    return {
        "namespace": None if ns is None else {"phase": (ns.get("status") or {}).get("phase")},
        "objects": objects,
        "spread": mask(spread(pods, cluster_nodes(info))),
    }


def _lines(value: Any) -> list[str]:
    return json.dumps(value, indent=1, sort_keys=True, default=str).splitlines()


def graph_diff(a: Any, b: Any, *, names: tuple[str, str] = ("direct", "proxied")) -> str:
    """A unified diff of two summaries ('' when equal), for assertion messages."""
    if a == b:
        return ""
    return "\n".join(difflib.unified_diff(_lines(a), _lines(b), names[0], names[1], lineterm="", n=4))


def _ready(pod: Mapping[str, Any]) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def _counts_match(obj: Mapping[str, Any], want: int, keys: Sequence[str]) -> bool:
    status = obj.get("status") or {}
    return all(int(status.get(k) or 0) == want for k in keys)


def unsettled(info: ControlPlaneInfo, namespace: str) -> list[str]:
    """What in ``namespace`` the controllers have not finished yet ([] when the graph is quiescent).

    Quiescent: nothing being deleted; every Deployment, ReplicaSet and StatefulSet has observed its spec
    and has exactly its replicas ready and available; every DaemonSet runs ready on all its nodes; every
    Job is Complete with all its pods accounted; every pod is Running and Ready, or Succeeded.
    """
    out: list[str] = []
    for kind, path in KINDS.items():
        for obj in list_items(info, path.format(ns=namespace)):
            meta = obj["metadata"]
            name = f"{kind}/{meta['name']}"
            if "deletionTimestamp" in meta:
                out.append(f"{name} being deleted")
            spec = obj.get("spec") or {}
            if kind in ("Deployment", "ReplicaSet", "StatefulSet", "DaemonSet") and not _observed(obj):
                out.append(f"{name} spec not observed")
            if kind == "Deployment":
                dep_keys = ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")
                if not _counts_match(obj, int(spec.get("replicas", 1)), dep_keys):
                    out.append(f"{name} status {_pick(obj.get('status'), dep_keys)}")
            elif kind in ("ReplicaSet", "StatefulSet"):
                keys = ("replicas", "readyReplicas", "availableReplicas")
                if not _counts_match(obj, int(spec.get("replicas", 1)), keys):
                    out.append(f"{name} status {_pick(obj.get('status'), keys)}")
                status = obj.get("status") or {}
                if kind == "StatefulSet" and status.get("currentRevision") != status.get("updateRevision"):
                    out.append(f"{name} revision not current")
            elif kind == "DaemonSet":
                ds_keys = ("currentNumberScheduled", "numberReady", "numberAvailable", "updatedNumberScheduled")
                want = int((obj.get("status") or {}).get("desiredNumberScheduled") or 0)
                if want == 0 or not _counts_match(obj, want, ds_keys):
                    out.append(f"{name} status {obj.get('status')}")
            elif kind == "Job":
                status = obj.get("status") or {}
                if ("Complete", "True") not in {
                    (c.get("type"), c.get("status")) for c in status.get("conditions") or []
                }:
                    out.append(f"{name} not Complete")
                if any(status.get("uncountedTerminatedPods", {}).values()):
                    out.append(f"{name} has uncounted pods")
            elif kind == "Pod":
                phase = (obj.get("status") or {}).get("phase")
                if not (phase == "Succeeded" or (phase == "Running" and _ready(obj))) or meta.get("finalizers"):
                    out.append(f"{name} {phase} ready={_ready(obj)} finalizers={meta.get('finalizers')}")
    return out
