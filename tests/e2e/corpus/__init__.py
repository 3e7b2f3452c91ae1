"""The fidelity corpus: built-in objects chosen to exercise every special type of the
Kubernetes API (binary ``data``, ``IntOrString``, ``Quantity``, ``MicroTime``, ``RawExtension``,
``JSONSchemaProps``, inlined volume sources, ``managedFields``), as YAML manifests beside this file,
and a loader that creates them in a namespace of the real apiserver.

Any test that needs realistic objects of many kinds can load it::

    objs = corpus.load(control_plane, namespace)
    ...
    corpus.cleanup(control_plane, objs)   # cluster-scoped objects; the namespace takes the rest

Every object is created by server-side apply (field manager ``kproxy-corpus``) and then touched by
a second manager with a merge patch, so each carries ``managedFields`` with an ``Apply`` and an
``Update`` entry, as objects in a live cluster do. ``__NS__`` in a manifest is the namespace (the
cluster-scoped names carry it, so loads into several namespaces never collide).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

HERE = Path(__file__).parent
MANIFESTS = ("core.yaml", "workloads.yaml", "networking.yaml", "rbac.yaml", "cluster.yaml", "events.yaml")
FIELD_MANAGER = "kproxy-corpus"
SECOND_MANAGER = "corpus-editor"

# (apiVersion, kind) -> (resource, namespaced): what the loader needs to build URLs.
KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "Service"): ("services", True),
    ("v1", "Pod"): ("pods", True),
    ("v1", "PersistentVolumeClaim"): ("persistentvolumeclaims", True),
    ("v1", "PersistentVolume"): ("persistentvolumes", False),
    ("v1", "ResourceQuota"): ("resourcequotas", True),
    ("v1", "LimitRange"): ("limitranges", True),
    ("v1", "Event"): ("events", True),
    ("v1", "PodTemplate"): ("podtemplates", True),
    ("v1", "ReplicationController"): ("replicationcontrollers", True),
    ("v1", "Node"): ("nodes", False),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("apps/v1", "StatefulSet"): ("statefulsets", True),
    ("apps/v1", "DaemonSet"): ("daemonsets", True),
    ("apps/v1", "ReplicaSet"): ("replicasets", True),
    ("apps/v1", "ControllerRevision"): ("controllerrevisions", True),
    ("batch/v1", "Job"): ("jobs", True),
    ("batch/v1", "CronJob"): ("cronjobs", True),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): ("horizontalpodautoscalers", True),
    ("policy/v1", "PodDisruptionBudget"): ("poddisruptionbudgets", True),
    ("networking.k8s.io/v1", "Ingress"): ("ingresses", True),
    ("networking.k8s.io/v1", "IngressClass"): ("ingressclasses", False),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("networkpolicies", True),
    ("discovery.k8s.io/v1", "EndpointSlice"): ("endpointslices", True),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("storage.k8s.io/v1", "StorageClass"): ("storageclasses", False),
    ("storage.k8s.io/v1", "CSIDriver"): ("csidrivers", False),
    ("scheduling.k8s.io/v1", "PriorityClass"): ("priorityclasses", False),
    ("node.k8s.io/v1", "RuntimeClass"): ("runtimeclasses", False),
    ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"): ("validatingwebhookconfigurations", False),
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"): ("mutatingwebhookconfigurations", False),
    ("apiregistration.k8s.io/v1", "APIService"): ("apiservices", False),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): ("customresourcedefinitions", False),
    ("coordination.k8s.io/v1", "Lease"): ("leases", True),
    ("events.k8s.io/v1", "Event"): ("events", True),
}


class Requester(Protocol):
    """What the loader needs of the control plane (``ControlPlaneInfo.request`` fits)."""

    def request(
        self, method: str, path: str, *, body: bytes | None = ..., content_type: str = ..., timeout: float = ...
    ) -> tuple[int, bytes]: ...


@dataclass(frozen=True, slots=True)
class CorpusObject:
    """One created object and where it lives."""

    api_version: str
    kind: str
    name: str
    namespace: str | None
    resource: str

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def collection(self) -> str:
        """The LIST/WATCH path (namespaced collections in the object's namespace)."""
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        ns = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"{root}{ns}/{self.resource}"

    @property
    def path(self) -> str:
        return f"{self.collection}/{self.name}"

    def __str__(self) -> str:
        return f"{self.api_version} {self.kind} {self.name}"


class CorpusError(AssertionError):
    pass


def manifests(namespace: str) -> list[dict[str, Any]]:
    """Every manifest of the corpus, with ``__NS__`` replaced, in creation order."""
    docs: list[dict[str, Any]] = []
    for name in MANIFESTS:
        text = (HERE / name).read_text().replace("__NS__", namespace)
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def describe(doc: dict[str, Any], namespace: str) -> CorpusObject:
    key = (doc["apiVersion"], doc["kind"])
    if key not in KINDS:
        raise CorpusError(f"corpus: no resource known for {key}")
    resource, namespaced = KINDS[key]
    return CorpusObject(key[0], key[1], doc["metadata"]["name"], namespace if namespaced else None, resource)


def load(cp: Requester, namespace: str) -> list[CorpusObject]:
    """Create every corpus object in ``namespace`` (cluster-scoped ones by their own names)."""
    created: list[CorpusObject] = []
    for doc in manifests(namespace):
        obj = describe(doc, namespace)
        body = json.dumps(doc).encode()  # JSON is YAML: the apply-patch body
        code, resp = cp.request(
            "PATCH",
            f"{obj.path}?fieldManager={FIELD_MANAGER}&force=true",
            body=body,
            content_type="application/apply-patch+yaml",
        )
        if code not in (200, 201):
            raise CorpusError(f"corpus: applying {obj}: HTTP {code}: {resp[:600]!r}")
        touch = {"metadata": {"labels": {"corpus.kproxy.test/touched": "true"}}}
        code, resp = cp.request(
            "PATCH",
            f"{obj.path}?fieldManager={SECOND_MANAGER}",
            body=json.dumps(touch).encode(),
            content_type="application/merge-patch+json",
        )
        if code != 200:
            raise CorpusError(f"corpus: patching {obj}: HTTP {code}: {resp[:600]!r}")
        created.append(obj)
    return created


def cleanup(cp: Requester, objects: list[CorpusObject]) -> None:
    """Delete the cluster-scoped objects (namespaced ones go with their namespace)."""
    for obj in reversed(objects):
        if obj.namespace is None:
            cp.request("DELETE", obj.path)


def kinds(objects: list[CorpusObject]) -> set[tuple[str, str]]:
    return {(o.api_version, o.kind) for o in objects}
