"""Differential proof of the watch cache's selectors against the real kube-apiserver v1.37.1.

A population of objects with varied labels and field values is created directly on the apiserver;
then, for a table of label selectors and one of field selectors (valid and invalid), the apiserver's
answer to a LIST with that selector (the names, or its error code and message) is compared with what
kproxy.cacher computes on the same objects listed without a selector: ``parse_label_selector`` /
``parse_field_selector`` plus ``matches`` over ``SelectableFields.from_dict`` (the JSON items) and over
``SelectableFields.from_message`` (the items of the same list fetched as protobuf).  Every disagreement
is reported; there must be none.
"""

from __future__ import annotations

import http.client
import json
import secrets
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from kproxy.cacher.fields import SelectableFields, builtin_fields, crd_fields, parse_field_selector
from kproxy.cacher.labels import parse_label_selector
from kproxy.cacher.selector_errors import SelectorError
from kproxy.codec.envelope import decode_envelope
from kproxy.codec.schema import Schema, load_schema
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually

PROTOBUF = "application/vnd.kubernetes.protobuf"
CRD_GROUP = "selectors.kproxy.test"


def _get(cp: ControlPlaneInfo, path: str, accept: str = "application/json") -> tuple[int, bytes]:
    conn = http.client.HTTPSConnection("127.0.0.1", cp.apiserver_port, context=cp.ssl_context(), timeout=30)
    try:
        conn.request("GET", path, headers={"Accept": accept})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _send(cp: ControlPlaneInfo, method: str, path: str, obj: dict[str, Any], ok: tuple[int, ...] = (200, 201)) -> Any:
    status, body = cp.request(method, path, body=json.dumps(obj).encode())
    assert status in ok, (method, path, status, body[:500])
    return json.loads(body)


def _create(cp: ControlPlaneInfo, path: str, obj: dict[str, Any]) -> Any:
    return _send(cp, "POST", path, obj)


def _set_status(cp: ControlPlaneInfo, path: str, status: dict[str, Any]) -> None:
    """Replace an object's status through its /status subresource (no controllers run in envtest)."""
    code, body = cp.request("GET", path)
    assert code == 200, body
    obj = json.loads(body)
    obj["status"] = {**obj.get("status", {}), **status}
    _send(cp, "PUT", path + "/status", obj)


@dataclass
class Target:
    """One list endpoint and the selectable fields kproxy uses for it."""

    path: str
    selectable: SelectableFields
    protobuf: bool = True


@dataclass
class Population:
    ns: str
    targets: dict[str, Target] = field(default_factory=dict)


def _pod(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "example.invalid/c"}], **spec},
    }


# Label sets chosen for the selector table below: empty values, keywords as keys and values, prefixes,
# numbers in forms Go's ParseInt reads differently from Python's int(), case.
CONFIGMAP_LABELS: list[dict[str, str]] = [
    {"app": "web", "tier": "frontend", "env": "prod", "n": "5"},
    {"app": "web", "tier": "backend", "env": "dev", "n": "10"},
    {"app": "db", "env": "prod", "n": "007"},
    {"app": "db", "tier": "", "n": "1_0"},
    {"example.com/team": "a", "n": "99999999999999999999"},
    {"example.com/team": "b", "app": "cache", "n": "abc"},
    {},
    {"in": "notin", "notin": "in", "app": "in"},
    {"a.b-c_d": "X", "n": "0"},
    {"n": "9223372036854775807"},
    {"n": "00", "k": "v", "K": "V"},
    {"app": "", "env": "staging", "n": "12"},
]


@pytest.fixture(scope="module")
def population(control_plane: ControlPlaneInfo) -> Iterator[Population]:
    cp = control_plane
    ns = f"selectors-{secrets.token_hex(3)}"
    _create(cp, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    pop = Population(ns)
    tag = ns.removeprefix("selectors-")

    # ConfigMaps: the label-selector population.
    for i, labels in enumerate(CONFIGMAP_LABELS):
        _create(
            cp,
            f"/api/v1/namespaces/{ns}/configmaps",
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}", "labels": labels}},
        )

    # Pods: every selectable field in more than one state.
    pods = f"/api/v1/namespaces/{ns}/pods"
    _create(cp, pods, _pod("p-plain", {"app": "web", "n": "3"}))
    _create(cp, pods, _pod("p-node", {"app": "db"}, nodeName="node-a", restartPolicy="Never"))
    _create(cp, pods, _pod("p-host", {}, hostNetwork=True, serviceAccountName="robot", schedulerName="custom"))
    _create(cp, pods, _pod("p-run", {"tier": ""}, restartPolicy="OnFailure"))
    _create(cp, pods, _pod("p-done", {"app": "web", "n": "11"}, nodeName="node-b"))
    _set_status(
        cp,
        f"{pods}/p-run",
        {"phase": "Running", "podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}, {"ip": "fd00::5"}]},
    )
    _set_status(cp, f"{pods}/p-done", {"phase": "Succeeded"})
    _set_status(cp, f"{pods}/p-plain", {"nominatedNodeName": "node-b"})
    _set_status(cp, f"{pods}/p-host", {"phase": "Failed", "podIPs": [{"ip": "10.1.0.9"}], "podIP": "10.1.0.9"})

    # Secrets of several types.
    secrets_path = f"/api/v1/namespaces/{ns}/secrets"
    _create(cp, secrets_path, {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s-opaque"}})
    _create(
        cp,
        secrets_path,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "s-basic", "labels": {"app": "web"}},
            "type": "kubernetes.io/basic-auth",
            "stringData": {"username": "u"},
        },
    )
    _create(
        cp,
        secrets_path,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s-custom"}, "type": "example.com/custom"},
    )

    # Core events, and an events.k8s.io event (both are listed by both APIs).
    core_events = f"/api/v1/namespaces/{ns}/events"
    for name, involved, source, reporting, etype, reason in [
        (
            "ev-kubelet",
            {"kind": "Pod", "name": "p-run", "namespace": ns, "fieldPath": "spec.containers{c}"},
            "kubelet",
            "",
            "Normal",
            "Started",
        ),
        (
            "ev-sched",
            {"kind": "Pod", "name": "p-node", "namespace": ns, "uid": "u-2", "apiVersion": "v1"},
            "default-scheduler",
            "sched",
            "Warning",
            "FailedScheduling",
        ),
        (
            "ev-node",
            {"kind": "ConfigMap", "name": "cm-1", "namespace": ns, "resourceVersion": "42"},
            "",
            "node-ctl",
            "Normal",
            "Ready",
        ),
    ]:
        _create(
            cp,
            core_events,
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name},
                "involvedObject": involved,
                "source": {"component": source} if source else {},
                "reportingComponent": reporting,
                "type": etype,
                "reason": reason,
                "message": "m",
            },
        )
    _create(
        cp,
        f"/apis/events.k8s.io/v1/namespaces/{ns}/events",
        {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "ev-new"},
            "eventTime": "2024-01-01T00:00:00.000000Z",
            "reportingController": "example.com/ctl",
            "reportingInstance": "inst-1",
            "action": "Doing",
            "reason": "Because",
            "type": "Warning",
            "regarding": {
                "kind": "Pod",
                "name": "p-run",
                "namespace": ns,
                "uid": "u-1",
                "apiVersion": "v1",
                "fieldPath": "spec.containers{c}",
            },
        },
    )

    # Services: ClusterIP (allocated), headless, ExternalName (no cluster IP).
    svcs = f"/api/v1/namespaces/{ns}/services"
    port = [{"port": 80}]
    _create(cp, svcs, {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc-ip"}, "spec": {"ports": port}})
    _create(
        cp,
        svcs,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "svc-headless"},
            "spec": {"clusterIP": "None", "ports": port},
        },
    )
    _create(
        cp,
        svcs,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "svc-ext"},
            "spec": {"type": "ExternalName", "externalName": "example.com"},
        },
    )

    # ReplicationControllers with status.replicas 0 and 3.
    rcs = f"/api/v1/namespaces/{ns}/replicationcontrollers"
    for name in ("rc-zero", "rc-three"):
        _create(
            cp,
            rcs,
            {
                "apiVersion": "v1",
                "kind": "ReplicationController",
                "metadata": {"name": name},
                "spec": {
                    "replicas": 0,
                    "selector": {"rc": name},
                    "template": {"metadata": {"labels": {"rc": name}}, "spec": _pod("x", {})["spec"]},
                },
            },
        )
    _set_status(cp, f"{rcs}/rc-three", {"replicas": 3})

    # Jobs with status.succeeded 0 and 2.
    jobs = f"/apis/batch/v1/namespaces/{ns}/jobs"
    for name in ("job-none", "job-two"):
        _create(
            cp,
            jobs,
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name},
                "spec": {"template": {"spec": {**_pod("x", {})["spec"], "restartPolicy": "Never"}}},
            },
        )
    _set_status(cp, f"{jobs}/job-two", {"succeeded": 2, "startTime": "2024-01-01T00:00:00Z"})

    # Deployments: a kind with only the default conversion.
    _create(
        cp,
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "deploy-a", "labels": {"app": "web"}},
            "spec": {
                "selector": {"matchLabels": {"d": "a"}},
                "template": {"metadata": {"labels": {"d": "a"}}, "spec": _pod("x", {})["spec"]},
            },
        },
    )

    # Cluster-scoped: nodes, a persistent volume, resource slices.
    for name, unschedulable in ((f"node-{tag}-a", True), (f"node-{tag}-b", False)):
        _create(
            cp,
            "/api/v1/nodes",
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "spec": {"unschedulable": unschedulable}},
        )
    _create(
        cp,
        "/api/v1/persistentvolumes",
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"pv-{tag}"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/x"}},
        },
    )
    for name, spec in (
        (f"rs-{tag}-node", {"nodeName": "node-a"}),
        (f"rs-{tag}-all", {"allNodes": True}),
    ):
        _create(
            cp,
            "/apis/resource.k8s.io/v1/resourceslices",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {
                    "driver": "drv.example.com",
                    "pool": {"name": f"pool-{name}", "generation": 1, "resourceSliceCount": 1},
                    **spec,
                },
            },
        )

    # Certificates: CertificateSigningRequests and ClusterTrustBundles with and without a signer.
    csr_pem, cert_pem = _csr_and_cert()
    for name, signer in ((f"csr-{tag}-a", "example.com/signer-a"), (f"csr-{tag}-b", "example.com/signer-b")):
        _create(
            cp,
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            {
                "apiVersion": "certificates.k8s.io/v1",
                "kind": "CertificateSigningRequest",
                "metadata": {"name": name},
                "spec": {"request": csr_pem, "signerName": signer, "usages": ["client auth"]},
            },
        )
    # certificates.k8s.io/v1 ClusterTrustBundles are served from 1.37 (beta before): not on older minors.
    _, cert_v1 = cp.request("GET", "/apis/certificates.k8s.io/v1")
    ctb_served = any(r["name"] == "clustertrustbundles" for r in json.loads(cert_v1).get("resources", []))
    bundles = ((f"example.com:signer-a:{tag}", "example.com/signer-a"), (f"ctb-{tag}", None)) if ctb_served else ()
    for name, signer in bundles:
        spec: dict[str, Any] = {"trustBundle": cert_pem}
        if signer:
            spec["signerName"] = signer
        _create(
            cp,
            "/apis/certificates.k8s.io/v1/clustertrustbundles",
            {
                "apiVersion": "certificates.k8s.io/v1",
                "kind": "ClusterTrustBundle",
                "metadata": {"name": name},
                "spec": spec,
            },
        )

    # Custom resources: a namespaced CRD with selectable fields, a cluster-scoped one without.
    widget_fields = [".spec.color", ".spec.size", ".spec.enabled"]
    _ensure_crd(cp, "widgets", "Widget", "Namespaced", widget_fields)
    _ensure_crd(cp, "gadgets", "Gadget", "Cluster", [])
    widgets = f"/apis/{CRD_GROUP}/v1/namespaces/{ns}/widgets"
    for name, spec in (
        ("w-red", {"color": "red", "size": 3, "enabled": True}),
        ("w-blue", {"color": "blue", "size": 10, "enabled": False}),
        ("w-bare", {}),
    ):
        _create(
            cp, widgets, {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}
        )
    _create(
        cp,
        f"/apis/{CRD_GROUP}/v1/gadgets",
        {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Gadget", "metadata": {"name": f"g-{tag}"}},
    )

    pop.targets = {
        "configmaps": Target(f"/api/v1/namespaces/{ns}/configmaps", builtin_fields("", "configmaps")),
        "pods": Target(pods, builtin_fields("", "pods")),
        "secrets": Target(secrets_path, builtin_fields("", "secrets")),
        "events": Target(core_events, builtin_fields("", "events")),
        "events.k8s.io": Target(
            f"/apis/events.k8s.io/v1/namespaces/{ns}/events", builtin_fields("events.k8s.io", "events")
        ),
        "services": Target(svcs, builtin_fields("", "services")),
        "replicationcontrollers": Target(rcs, builtin_fields("", "replicationcontrollers")),
        "jobs": Target(jobs, builtin_fields("batch", "jobs")),
        "deployments": Target(f"/apis/apps/v1/namespaces/{ns}/deployments", builtin_fields("apps", "deployments")),
        "nodes": Target("/api/v1/nodes", builtin_fields("", "nodes")),
        "namespaces": Target("/api/v1/namespaces", builtin_fields("", "namespaces")),
        "persistentvolumes": Target("/api/v1/persistentvolumes", builtin_fields("", "persistentvolumes")),
        "csrs": Target(
            "/apis/certificates.k8s.io/v1/certificatesigningrequests",
            builtin_fields("certificates.k8s.io", "certificatesigningrequests"),
        ),
        "ctbs": Target(
            "/apis/certificates.k8s.io/v1/clustertrustbundles",
            builtin_fields("certificates.k8s.io", "clustertrustbundles"),
        ),
        "resourceslices": Target(
            "/apis/resource.k8s.io/v1/resourceslices", builtin_fields("resource.k8s.io", "resourceslices")
        ),
        "widgets": Target(widgets, crd_fields(widget_fields), protobuf=False),
        "gadgets": Target(f"/apis/{CRD_GROUP}/v1/gadgets", crd_fields([], namespaced=False), protobuf=False),
    }
    if not ctb_served:
        del pop.targets["ctbs"]
    yield pop
    cp.request("DELETE", f"/api/v1/namespaces/{ns}")
    for path in (
        f"/api/v1/nodes/node-{tag}-a",
        f"/api/v1/nodes/node-{tag}-b",
        f"/api/v1/persistentvolumes/pv-{tag}",
        f"/apis/resource.k8s.io/v1/resourceslices/rs-{tag}-node",
        f"/apis/resource.k8s.io/v1/resourceslices/rs-{tag}-all",
        f"/apis/{CRD_GROUP}/v1/gadgets/g-{tag}",
        f"/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-{tag}-a",
        f"/apis/certificates.k8s.io/v1/certificatesigningrequests/csr-{tag}-b",
        f"/apis/certificates.k8s.io/v1/clustertrustbundles/example.com:signer-a:{tag}",
        f"/apis/certificates.k8s.io/v1/clustertrustbundles/ctb-{tag}",
    ):
        cp.request("DELETE", path)


def _csr_and_cert() -> tuple[str, str]:
    """A base64 PEM certificate request and a PEM self-signed CA certificate (for ClusterTrustBundles)."""
    import base64
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kproxy-selectors")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(name).sign(key, hashes.SHA256())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    csr_pem = base64.b64encode(csr.public_bytes(serialization.Encoding.PEM)).decode()
    return csr_pem, cert.public_bytes(serialization.Encoding.PEM).decode()


def _ensure_crd(cp: ControlPlaneInfo, plural: str, kind: str, scope: str, selectable: list[str]) -> None:
    """Create the CRD once per control plane (kept across runs) and wait until its API is served."""
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {
                        "type": "object",
                        "properties": {
                            "color": {"type": "string"},
                            "size": {"type": "integer"},
                            "enabled": {"type": "boolean"},
                        },
                    }
                },
            }
        },
    }
    if selectable:
        version["selectableFields"] = [{"jsonPath": p} for p in selectable]
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{CRD_GROUP}"},
        "spec": {
            "group": CRD_GROUP,
            "names": {"plural": plural, "singular": plural[:-1], "kind": kind, "listKind": f"{kind}List"},
            "scope": scope,
            "versions": [version],
        },
    }
    _send(cp, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd, ok=(201, 409))
    served = f"/apis/{CRD_GROUP}/v1/{plural}?limit=1"
    eventually(lambda: _get(cp, served)[0] == 200, 60, f"the CRD {plural}.{CRD_GROUP} to be served", 0.2)


# --------------------------------------------------------------------------- comparison


@dataclass
class Listed:
    """One target's objects, as JSON dicts and (builtins) as protobuf messages, by name."""

    json: dict[str, dict[str, Any]]
    messages: dict[str, Any]


def _list_everything(cp: ControlPlaneInfo, schema: Schema, target: Target) -> Listed:
    status, body = _get(cp, target.path)
    assert status == 200, body[:300]
    items = {i["metadata"]["name"]: i for i in json.loads(body)["items"]}
    messages: dict[str, Any] = {}
    if target.protobuf:
        status, body = _get(cp, target.path, PROTOBUF)
        assert status == 200, body[:300]
        env = decode_envelope(body)
        full = schema.lookup_kind(env.api_version, env.kind)
        assert full is not None, (env.api_version, env.kind)
        lst = schema.message_class(full).FromString(env.raw)
        messages = {m.metadata.name: m for m in lst.items}
        assert set(messages) == set(items)
    return Listed(items, messages)


def _ask(cp: ControlPlaneInfo, target: Target, param: str, text: str) -> tuple[int, set[str] | str]:
    status, body = _get(cp, f"{target.path}?{param}={urllib.parse.quote(text, safe='')}")
    doc = json.loads(body)
    if status == 200:
        return status, {i["metadata"]["name"] for i in doc["items"]}
    return status, str(doc.get("message"))


def _compare(
    cp: ControlPlaneInfo,
    target: Target,
    listed: Listed,
    param: str,
    text: str,
    parse: Callable[[str], Any],
    attrs_json: Callable[[dict[str, Any]], dict[str, str]],
    attrs_msg: Callable[[Any], dict[str, str]],
) -> list[str]:
    """The disagreements between the apiserver and kproxy.cacher for one selector on one target."""
    code, answer = _ask(cp, target, param, text)
    where = f"{target.path} {param}={text!r}"
    try:
        selector = parse(text)
    except SelectorError as err:
        if code != err.code:
            return [f"{where}: kproxy rejects ({err}) but the apiserver answers {code} {answer}"]
        if answer != err.message:
            return [f"{where}: message differs:\n  apiserver: {answer}\n  kproxy:    {err.message}"]
        return []
    if code != 200:
        return [f"{where}: kproxy accepts but the apiserver answers {code} {answer}"]
    problems = []
    from_json = {n for n, obj in listed.json.items() if selector.matches(attrs_json(obj))}
    if from_json != answer:
        problems.append(f"{where}: apiserver {sorted(answer)} != kproxy (JSON) {sorted(from_json)}")
    if target.protobuf:
        from_msg = {n for n, m in listed.messages.items() if selector.matches(attrs_msg(m))}
        if from_msg != answer:
            problems.append(f"{where}: apiserver {sorted(answer)} != kproxy (protobuf) {sorted(from_msg)}")
    return problems


LABEL_SELECTORS = [
    # empty and whitespace
    "",
    " ",
    "\t",
    # existence
    "app",
    "!app",
    "tier",
    "!tier",
    "app,!env",
    "!app,!example.com/team",
    " app ",
    # equality, including empty values and keys missing from some objects
    "app=web",
    "app==web",
    "app!=web",
    "app=",
    "app!=",
    "tier=",
    "tier!=",
    "tier==",
    "env=prod,app=web",
    "env=prod,app!=web",
    "app=web,app=db",
    " app = web ",
    "app=web ,env=prod",
    "app\t=\tweb",
    "K=V",
    "k=V",
    "a.b-c_d=X",
    "example.com/team=a",
    # set-based
    "app in (web,db)",
    "app notin (web,db)",
    "app in ()",
    "app notin ()",
    "tier in (,frontend)",
    "tier notin (,)",
    "app in (web,,db)",
    "app in (web)",
    "app in (in)",
    "in=notin",
    "in in (notin)",
    "notin notin (in)",
    "example.com/team in (a,b)",
    "x in (a),y notin (b),z",
    "app in(web)",
    # Gt / Lt
    "n>5",
    "n<10",
    "n>0",
    "n<1",
    "n>007",
    "n>9223372036854775806",
    "n<9223372036854775807",
    "n>00",
    # invalid
    "n>99999999999999999999",
    "n>-1",
    "n>+1",
    "n>1.5",
    "n>",
    "n>a",
    "n>=5",
    "n<>5",
    "app=web=x",
    "app in web",
    "app in (web",
    "app in (web,",
    "app in (web db)",
    "=web",
    "!",
    "!=x",
    "app===web",
    "-app",
    "app-",
    "Example.com/team=a",
    "example.com/=a",
    "/team=a",
    "a/b/c",
    "k" * 64,
    "k=" + "v" * 64,
    "p" * 254 + "/k",
    "app=we b",
    "app=web,",
    ",app",
    "app,,env",
    "app=(web)",
    "app!",
    "app notin",
    "!app=web",
    "!app in (x)",
    "app=web\x00",
    "app=web\x00junk",
    "\x00app",
    "app=w\u00e9b",
    "\u00e1pp",
    "app=web\n",
    "app in (a,-b)",
]


FIELD_CASES: list[tuple[str, str]] = [
    # pods: every field, renames, booleans, status, escaping and syntax errors
    ("pods", ""),
    ("pods", ","),
    ("pods", "metadata.name=p-run"),
    ("pods", "metadata.name!=p-run"),
    ("pods", "metadata.name==p-run"),
    ("pods", "metadata.namespace={ns}"),
    ("pods", "metadata.namespace!={ns}"),
    ("pods", "spec.nodeName=node-a"),
    ("pods", "spec.host=node-a"),
    ("pods", "spec.nodeName="),
    ("pods", "spec.nodeName!="),
    ("pods", "spec.restartPolicy=Never"),
    ("pods", "spec.restartPolicy=Always"),
    ("pods", "spec.schedulerName=default-scheduler"),
    ("pods", "spec.serviceAccountName=robot"),
    ("pods", "spec.hostNetwork=true"),
    ("pods", "spec.hostNetwork=false"),
    ("pods", "spec.hostNetwork=True"),
    ("pods", "status.phase=Running"),
    ("pods", "status.phase!=Pending,spec.restartPolicy=Always"),
    ("pods", "status.podIP=10.1.0.5"),
    ("pods", "status.podIP=10.1.0.9"),
    ("pods", "status.podIP="),
    ("pods", "status.podIPs="),
    ("pods", "status.podIPs=10.1.0.5"),
    ("pods", "status.nominatedNodeName=node-b"),
    ("pods", "metadata.name=p-run,metadata.name=p-host"),
    ("pods", ",metadata.name=p-run,"),
    ("pods", "metadata.name=p\\,x"),
    ("pods", "metadata.name=a\\=b"),
    ("pods", "metadata.name= p-run"),
    ("pods", "metadata.name=a=b"),
    ("pods", "metadata.name=a\\b"),
    ("pods", "metadata.name=a\\"),
    ("pods", "metadata.name"),
    ("pods", "metadata.uid=x"),
    ("pods", "spec.containers=x"),
    ("pods", "bogus"),
    ("pods", "metadata.name in (a,b)"),
    ("pods", " metadata.name=p-run"),
    ("pods", "metadata.name =p-run"),
    ("pods", "status.phase=Running,bogus=1"),
    ("pods", "bogus=1,metadata.name=a\\q"),
    ("pods", "metadata.name!=p-run,metadata.name!=p-node"),
    ("pods", "spec.nodeName\\,x=1"),
    # default conversion
    ("configmaps", "metadata.name=cm-1"),
    ("configmaps", "metadata.namespace={ns}"),
    ("configmaps", "metadata.namespace=other"),
    ("configmaps", "data.x=1"),
    ("configmaps", "metadata.name=cm-1,x=1"),
    ("deployments", "metadata.name=deploy-a"),
    ("deployments", "spec.replicas=1"),
    # secrets
    ("secrets", "type=Opaque"),
    ("secrets", "type=kubernetes.io/basic-auth"),
    ("secrets", "type!=Opaque"),
    ("secrets", "type=example.com/custom"),
    ("secrets", "data=x"),
    # core events
    ("events", "involvedObject.kind=Pod"),
    ("events", "involvedObject.name=p-run,type=Normal"),
    ("events", "involvedObject.namespace={ns}"),
    ("events", "involvedObject.uid=u-1"),
    ("events", "involvedObject.apiVersion=v1"),
    ("events", "involvedObject.resourceVersion=42"),
    ("events", "involvedObject.fieldPath=spec.containers{c}"),
    ("events", "source=kubelet"),
    ("events", "source=node-ctl"),
    ("events", "source=example.com/ctl"),
    ("events", "source="),
    ("events", "reportingComponent=example.com/ctl"),
    ("events", "reportingComponent="),
    ("events", "reason=Because"),
    ("events", "type=Warning"),
    ("events", "regarding.kind=Pod"),
    ("events", "message=m"),
    # events.k8s.io
    ("events.k8s.io", "regarding.kind=Pod"),
    ("events.k8s.io", "regarding.name=p-run"),
    ("events.k8s.io", "regarding.uid=u-2"),
    ("events.k8s.io", "regarding.fieldPath=spec.containers{c}"),
    ("events.k8s.io", "regarding.resourceVersion=42"),
    ("events.k8s.io", "reportingController=example.com/ctl"),
    ("events.k8s.io", "reportingController=sched"),
    ("events.k8s.io", "reportingController="),
    ("events.k8s.io", "type=Normal"),
    ("events.k8s.io", "reason=Started"),
    ("events.k8s.io", "source=kubelet"),
    ("events.k8s.io", "involvedObject.kind=Pod"),
    ("events.k8s.io", "reportingComponent=sched"),
    # services
    ("services", "spec.type=ClusterIP"),
    ("services", "spec.type=ExternalName"),
    ("services", "spec.clusterIP=None"),
    ("services", "spec.clusterIP="),
    ("services", "spec.clusterIP!=None"),
    ("services", "spec.ports=80"),
    # replication controllers and jobs: integers
    ("replicationcontrollers", "status.replicas=0"),
    ("replicationcontrollers", "status.replicas=3"),
    ("replicationcontrollers", "status.replicas!=0"),
    ("replicationcontrollers", "status.replicas=03"),
    ("replicationcontrollers", "spec.replicas=0"),
    ("jobs", "status.successful=0"),
    ("jobs", "status.successful=2"),
    ("jobs", "status.succeeded=2"),
    # cluster-scoped
    ("nodes", "spec.unschedulable=true"),
    ("nodes", "spec.unschedulable=false"),
    ("nodes", "metadata.namespace="),
    ("nodes", "spec.podCIDR="),
    ("namespaces", "status.phase=Active"),
    ("namespaces", "status.phase=Terminating"),
    ("namespaces", "metadata.name={ns}"),
    ("namespaces", "metadata.namespace="),
    ("persistentvolumes", "metadata.namespace="),
    ("persistentvolumes", "metadata.namespace=x"),
    ("persistentvolumes", "spec.storageClassName="),
    ("resourceslices", "spec.nodeName=node-a"),
    ("resourceslices", "spec.nodeName="),
    ("resourceslices", "spec.driver=drv.example.com"),
    ("resourceslices", "spec.pool.name!=x"),
    ("resourceslices", "metadata.namespace="),
    # certificates
    ("csrs", "spec.signerName=example.com/signer-a"),
    ("csrs", "spec.signerName!=example.com/signer-a"),
    ("csrs", "metadata.namespace="),
    ("csrs", "spec.usages=x"),
    ("ctbs", "spec.signerName=example.com/signer-a"),
    ("ctbs", "spec.signerName="),
    ("ctbs", "metadata.namespace="),
    # custom resources
    ("widgets", "spec.color=red"),
    ("widgets", "spec.color="),
    ("widgets", "spec.size=3"),
    ("widgets", "spec.size!=10"),
    ("widgets", "spec.enabled=true"),
    ("widgets", "spec.enabled=false"),
    ("widgets", "spec.enabled="),
    ("widgets", "metadata.namespace={ns}"),
    ("widgets", "spec.shape=x"),
    ("widgets", ".spec.color=red"),
    ("gadgets", "metadata.namespace="),
    ("gadgets", "metadata.name!=x"),
]


def _labels_json(obj: dict[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("labels") or {})


def _labels_msg(msg: Any) -> dict[str, str]:
    return dict(msg.metadata.labels)


def test_label_selectors_match_the_apiserver(control_plane: ControlPlaneInfo, population: Population) -> None:
    schema = load_schema()
    problems: list[str] = []
    for name in ("configmaps", "pods"):
        target = population.targets[name]
        listed = _list_everything(control_plane, schema, target)
        assert len(listed.json) >= 5
        for text in LABEL_SELECTORS:
            problems += _compare(
                control_plane, target, listed, "labelSelector", text, parse_label_selector, _labels_json, _labels_msg
            )
    assert not problems, "\n".join(problems)


def test_field_selectors_match_the_apiserver(control_plane: ControlPlaneInfo, population: Population) -> None:
    schema = load_schema()
    problems: list[str] = []
    listed: dict[str, Listed] = {}
    answered = {"accepted": 0, "rejected": 0, "matched-some": 0}
    for name, text in FIELD_CASES:
        if name not in population.targets:  # a kind this apiserver does not serve
            continue
        target = population.targets[name]
        if name not in listed:
            listed[name] = _list_everything(control_plane, schema, target)
        text = text.replace("{ns}", population.ns)
        sel = target.selectable.at(control_plane.minor)  # as kproxy has it for this apiserver
        problems += _compare(
            control_plane,
            target,
            listed[name],
            "fieldSelector",
            text,
            lambda t, sel=sel: parse_field_selector(t, sel),  # type: ignore[misc]
            sel.from_dict,
            sel.from_message,
        )
        try:
            parsed = parse_field_selector(text, sel)
        except SelectorError:
            answered["rejected"] += 1
        else:
            answered["accepted"] += 1
            if any(parsed.matches(sel.from_dict(o)) for o in listed[name].json.values()) and not parsed.empty:
                answered["matched-some"] += 1
    assert not problems, "\n".join(problems)
    # The table exercises all three outcomes in quantity (a guard against a table that tests nothing).
    assert answered["rejected"] >= 25 and answered["accepted"] >= 60 and answered["matched-some"] >= 40, answered


def test_extractors_agree_on_every_listed_object(control_plane: ControlPlaneInfo, population: Population) -> None:
    """from_dict on the JSON item and from_message on the protobuf item give the same field set."""
    schema = load_schema()
    checked = 0
    for name, target in population.targets.items():
        if not target.protobuf:
            continue
        listed = _list_everything(control_plane, schema, target)
        for obj_name, obj in listed.json.items():
            assert target.selectable.from_dict(obj) == target.selectable.from_message(listed.messages[obj_name]), (
                name,
                obj_name,
            )
            checked += 1
    assert checked >= 40
