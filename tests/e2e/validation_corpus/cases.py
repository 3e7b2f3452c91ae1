# ruff: noqa: E501, UP031 -- request bodies are data, kept one per line as sent
"""The corpus: at least 100 write requests covering what strict decoding looks at.

Every case is sent with ``dryRun=All`` (nothing is stored, so creates can repeat) and, by the
test, once per ``fieldValidation`` level. PUT and PATCH cases target the base objects that
``BASE_OBJECTS`` creates. Bodies are raw text where duplicates or YAML layout matter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from validation_corpus.crds import GROUP

JSON = "application/json"
YAML = "application/yaml"
MERGE = "application/merge-patch+json"
SMP = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"


@dataclass(frozen=True)
class Case:
    name: str
    method: str
    path: str  # under /api/v1/namespaces/{ns}/ or /apis/<gv>/namespaces/{ns}/
    content_type: str
    body: bytes
    api: str = "/api/v1"
    query: str = ""  # extra query, appended after dryRun=All
    accept: str = JSON

    def target(self, namespace: str, level: str | None) -> str:
        q = "dryRun=All" + self.query
        if level is not None:
            q += f"&fieldValidation={level}"
        return f"{self.api}/namespaces/{namespace}/{self.path}?{q}"


def _j(obj: Any) -> bytes:
    return json.dumps(obj).encode()


APPS = "/apis/apps/v1"
CR = f"/apis/{GROUP}/v1"

_CONTAINER = {"name": "c", "image": "nginx:1.27"}


def deployment(name: str = "web", spec_extra: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": 1,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [dict(_CONTAINER)]}},
    }
    spec.update(spec_extra or {})
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}, "spec": spec, **top}


def widget(name: str = "w", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


BASE_OBJECTS: list[tuple[str, dict[str, Any]]] = [
    ("/api/v1", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "base-cm"}, "data": {"a": "1"}}),
    (APPS, deployment("base-deploy")),
    ("/api/v1", {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "base-svc"},
                 "spec": {"ports": [{"port": 80, "targetPort": 8080}]}}),
    (CR, widget("base-widget", size=1)),
]  # fmt: skip


def _cases() -> list[Case]:
    c: list[Case] = []

    def add(
        name: str, method: str, path: str, body: bytes | str, ctype: str = JSON, api: str = "/api/v1", **kw: Any
    ) -> None:
        c.append(Case(name, method, path, ctype, body.encode() if isinstance(body, str) else body, api, **kw))

    # ---- ConfigMap: unknown and duplicate fields at several depths (JSON, document order)
    cm = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm1"%s}%s}'
    add("cm-clean", "POST", "configmaps", cm % ("", ',"data":{"k":"v"}'))
    add("cm-unknown-top", "POST", "configmaps", cm % ("", ',"bogus":1'))
    add("cm-unknown-metadata", "POST", "configmaps", cm % (',"nickname":"x"', ""))
    add("cm-unknown-top-and-meta", "POST", "configmaps", cm % (',"zeta":1', ',"alpha":{"b":1}'))
    add("cm-dup-name", "POST", "configmaps", cm % (',"name":"cm2"', ""))
    add("cm-dup-data-key", "POST", "configmaps", cm % ("", ',"data":{"k":"v","k":"w"}'))
    add("cm-dup-label", "POST", "configmaps", cm % (',"labels":{"x":"1","y":"2","x":"3"}', ""))
    add("cm-dup-unknown", "POST", "configmaps", cm % ("", ',"bogus":1,"bogus":2'))
    add("cm-dup-data-object", "POST", "configmaps", cm % ("", ',"data":{"a":"1"},"data":{"b":"2"}'))
    add("cm-mixed-order", "POST", "configmaps",
        '{"zz":1,"apiVersion":"v1","metadata":{"q":1,"name":"cm1","name":"cm1"},"kind":"ConfigMap","aa":2,"data":{"k":"v","k":"v"}}')  # fmt: skip
    add("cm-many-unknown", "POST", "configmaps", cm % ("", "".join(f',"u{i}":{i}' for i in range(12))))
    add("cm-whitespace-json", "POST", "configmaps",
        '{ "apiVersion" : "v1", "kind" : "ConfigMap",\n "metadata" : { "name" : "cm1", "name" : "cm1" },\n "extra" : true }')  # fmt: skip
    add("cm-unicode-escape", "POST", "configmaps", cm % ("", ',"data":{"k\\u00e9":"v","k\\u00e9":"w"},"b\\u00e4d":1'))
    add("cm-escaped-quote-in-value", "POST", "configmaps", cm % ("", ',"data":{"k":"a\\":b","j":"\\" :"},"x":1'))
    add("cm-binarydata", "POST", "configmaps", cm % ("", ',"binaryData":{"b":"aGVsbG8="},"binaryData2":1'))
    add("cm-immutable-type-error", "POST", "configmaps", cm % ("", ',"immutable":"yes","bogus":1'))
    add("cm-data-type-error", "POST", "configmaps", cm % ("", ',"data":{"k":1},"bogus":1'))
    add("cm-null-data", "POST", "configmaps", cm % ("", ',"data":null,"bogus":null'))
    add("cm-syntax-error", "POST", "configmaps", '{"apiVersion":"v1","kind":"ConfigMap",')
    add("cm-not-object", "POST", "configmaps", "[1,2]")
    add("cm-wrong-kind", "POST", "configmaps", '{"apiVersion":"v1","kind":"Secret","metadata":{"name":"x"},"bogus":1}')
    add("cm-no-typemeta", "POST", "configmaps", '{"metadata":{"name":"x"},"bogus":1}')
    add(
        "cm-put-unknown",
        "PUT",
        "configmaps/base-cm",
        '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"base-cm","extra":1},"data":{"a":"2"},"more":2}',
    )
    add(
        "cm-put-dup",
        "PUT",
        "configmaps/base-cm",
        '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"base-cm"},"data":{"a":"2","a":"3"}}',
    )
    add(
        "cm-put-clean",
        "PUT",
        "configmaps/base-cm",
        '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"base-cm"},"data":{"a":"9"}}',
    )
    add("cm-pretty-param", "POST", "configmaps", cm % ("", ',"bogus":1'), query="&pretty=true")
    add("cm-accept-yaml", "POST", "configmaps", cm % ("", ',"bogus":1'), accept=YAML)
    add("cm-accept-protobuf-json", "POST", "configmaps", cm % ("", ',"bogus":1'),
        accept="application/vnd.kubernetes.protobuf, application/json")  # fmt: skip
    add("cm-bad-dryrun", "POST", "configmaps", cm % ("", ',"bogus":1'), query="&dryRun=Nope")
    add("cm-bad-fieldmanager", "POST", "configmaps", cm % ("", ',"bogus":1'), query="&fieldManager=" + "m" * 129)
    add("cm-fieldmanager", "POST", "configmaps", cm % ("", ',"bogus":1'), query="&fieldManager=corpus")
    add(
        "cm-content-type-charset",
        "POST",
        "configmaps",
        cm % ("", ',"bogus":1'),
        ctype="application/json; charset=utf-8",
    )

    # ---- ConfigMap as YAML: go-yaml duplicates (line numbers), unknown fields in sorted order
    add(
        "cm-yaml-clean",
        "POST",
        "configmaps",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y1\ndata:\n  k: v\n",
        YAML,
    )
    add("cm-yaml-unknown", "POST", "configmaps",
        "apiVersion: v1\nkind: ConfigMap\nzeta: 1\nmetadata:\n  name: y1\n  nick: n\nalpha: 2\n", YAML)  # fmt: skip
    add("cm-yaml-dup", "POST", "configmaps",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y1\n  name: y2\ndata:\n  k: v\n  k: w\n", YAML)  # fmt: skip
    add("cm-yaml-dup-and-unknown", "POST", "configmaps",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  name: b\n  foo: 1\ndata:\n  k: v\n  k: w\nbar: 1\n", YAML)  # fmt: skip
    add("cm-yaml-flow", "POST", "configmaps",
        '{apiVersion: v1, kind: ConfigMap, metadata: {name: y1, name: y1}, data: {a: "1"}, x: 1}', YAML)  # fmt: skip
    add("cm-yaml-json-body", "POST", "configmaps", cm % ("", ',"data":{"k":"v","k":"w"},"zz":1,"aa":1'), YAML)
    add("cm-yaml-nested-dup-top", "POST", "configmaps",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y1\n  labels:\n    a: '1'\n    a: '2'\ndata:\n  k: v\ndata:\n  j: w\n", YAML)  # fmt: skip
    add(
        "cm-yaml-int-key",
        "POST",
        "configmaps",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y1\ndata:\n  1: one\n  x: y\n",
        YAML,
    )
    add(
        "cm-yaml-type-error",
        "POST",
        "configmaps",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y1\ndata:\n  k: [1]\nbad: 1\n",
        YAML,
    )
    add("cm-yaml-syntax-error", "POST", "configmaps", "apiVersion: v1\nkind: ConfigMap\nmetadata: [\n", YAML)
    add("cm-yaml-put-dup", "PUT", "configmaps/base-cm",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: base-cm\ndata:\n  a: '1'\n  a: '2'\nzz: 0\n", YAML)  # fmt: skip
    add("cm-yaml-comments", "POST", "configmaps",
        "# leading comment\napiVersion: v1\nkind: ConfigMap\n\nmetadata:\n  name: y1 # trailing\n\n  name: y3\n", YAML)  # fmt: skip

    # ---- Deployment: lists, nested structs, quantities, int-or-string
    d = deployment()
    add("deploy-clean", "POST", "deployments", _j(d), api=APPS)
    add("deploy-unknown-spec", "POST", "deployments", _j(deployment(spec_extra={"zz": 1})), api=APPS)
    dc = deployment()
    dc["spec"]["template"]["spec"]["containers"][0]["foo"] = 1
    dc["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "bar": 1}]
    add("deploy-unknown-in-lists", "POST", "deployments", _j(dc), api=APPS)
    dc2 = deployment()
    dc2["spec"]["template"]["spec"]["containers"].append(
        {"name": "d", "image": "i", "envv": [], "env": [{"name": "A", "value": "1", "valueFrm": {}}]}
    )
    add("deploy-unknown-second-container", "POST", "deployments", _j(dc2), api=APPS)
    dq = deployment()
    dq["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "limits": {"cpu": 1, "memory": "1Gi"},
        "requests": {"cpu": "100m"},
        "claims2": 1,
    }
    add("deploy-quantities-numbers", "POST", "deployments", _j(dq), api=APPS)
    dq2 = deployment()
    dq2["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": 0.5}}
    dq2["spec"]["x"] = 1
    add("deploy-quantity-float", "POST", "deployments", _j(dq2), api=APPS)
    ds = deployment(
        spec_extra={
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1, "maxx": 2}}
        }
    )
    add("deploy-int-or-string", "POST", "deployments", _j(ds), api=APPS)
    ds2 = deployment(spec_extra={"strategy": {"rollingUpdate": {"maxSurge": 1.5}}, "bogus": 1})
    add("deploy-int-or-string-float", "POST", "deployments", _j(ds2), api=APPS)
    ds3 = deployment(spec_extra={"strategy": {"rollingUpdate": {"maxSurge": True}}, "bogus": 1})
    add("deploy-int-or-string-bool", "POST", "deployments", _j(ds3), api=APPS)
    add(
        "deploy-replicas-string", "POST", "deployments", _j(deployment(spec_extra={"replicas": "3", "zz": 1})), api=APPS
    )
    add("deploy-replicas-float", "POST", "deployments", _j(deployment(spec_extra={"replicas": 1.0, "zz": 1})), api=APPS)
    add("deploy-containers-object", "POST", "deployments",
        _j(deployment(spec_extra={"template": {"spec": {"containers": {"name": "c"}}}, "zz": 1})), api=APPS)  # fmt: skip
    add("deploy-status-unknown", "POST", "deployments", _j(deployment(status={"replicas": 1, "bogus": 2})), api=APPS)
    add("deploy-dup-replicas", "POST", "deployments",
        _j(deployment()).replace(b'"replicas": 1', b'"replicas": 1, "replicas": 2'), api=APPS)  # fmt: skip
    add("deploy-dup-in-container", "POST", "deployments",
        _j(deployment()).replace(b'"image": "nginx:1.27"', b'"image": "a", "image": "b", "imagex": 1'), api=APPS)  # fmt: skip
    da = deployment()
    da["metadata"]["annotations"] = {"a": "1"}
    da["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u", "bogus": 1}]
    add("deploy-owner-ref-unknown", "POST", "deployments", _j(da), api=APPS)
    dt = deployment()
    dt["spec"]["template"]["spec"]["tolerations"] = [{"key": "k", "operator": "Exists", "effect": "NoSchedule", "x": 1}]
    dt["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"], "y": 2}]}]
            }
        }
    }
    add("deploy-deep-lists", "POST", "deployments", _j(dt), api=APPS)
    dp = deployment()
    dp["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = {
        "httpGet": {"port": "http", "path": "/", "schema": "HTTP"}
    }
    add("deploy-probe-port-name", "POST", "deployments", _j(dp), api=APPS)
    dp2 = deployment()
    dp2["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = {"tcpSocket": {"port": 8080}, "periodSecond": 3}
    add("deploy-probe-port-int", "POST", "deployments", _j(dp2), api=APPS)
    add(
        "deploy-put-unknown",
        "PUT",
        "deployments/base-deploy",
        _j(deployment("base-deploy", spec_extra={"paused": False, "pausd": True})),
        api=APPS,
    )
    add(
        "deploy-put-clean",
        "PUT",
        "deployments/base-deploy",
        _j(deployment("base-deploy", spec_extra={"replicas": 2})),
        api=APPS,
    )
    add("deploy-put-dup", "PUT", "deployments/base-deploy",
        _j(deployment("base-deploy")).replace(b'"replicas": 1', b'"replicas": 1, "replicas": 3'), api=APPS)  # fmt: skip
    dy = ("apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: yd\nspec:\n  replicas: 1\n  replicas: 2\n  selector:\n"
          "    matchLabels: {app: yd}\n  template:\n    metadata:\n      labels: {app: yd}\n    spec:\n      containers:\n"
          "      - name: c\n        image: i\n        imagePullPolicy: Always\n        foo: bar\n        ports:\n        - containerPort: 80\n          bar: 1\n  zz: 1\n")  # fmt: skip
    add("deploy-yaml-everything", "POST", "deployments", dy, YAML, api=APPS)
    add(
        "deploy-yaml-clean",
        "POST",
        "deployments",
        dy.replace("  replicas: 2\n", "")
        .replace("        foo: bar\n", "")
        .replace("          bar: 1\n", "")
        .replace("  zz: 1\n", ""),
        YAML,
        api=APPS,
    )
    add(
        "deploy-yaml-timestamp-annotation",
        "POST",
        "deployments",
        dy.replace("metadata:\n  name: yd\n", "metadata:\n  name: yd\n  annotations:\n    at: 2024-01-01\n"),
        YAML,
        api=APPS,
    )
    add("deploy-scale-subresource", "PUT", "deployments/base-deploy/scale",
        '{"apiVersion":"autoscaling/v1","kind":"Scale","metadata":{"name":"base-deploy"},"spec":{"replicas":2,"replica":3}}', api=APPS)  # fmt: skip
    add("deploy-status-subresource", "PUT", "deployments/base-deploy/status",
        _j(deployment("base-deploy", status={"replicas": 0, "bogus": 1})), api=APPS)  # fmt: skip

    # ---- Service (int-or-string targetPort), Secret (bytes), Pod
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s1"},
        "spec": {"ports": [{"port": 80, "targetPort": "http", "protocl": "TCP"}]},
    }
    add("svc-target-port-name", "POST", "services", _j(svc))
    svc2 = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s1"},
        "spec": {"ports": [{"port": 80, "targetPort": 8080}], "typo": "x"},
    }
    add("svc-target-port-int", "POST", "services", _j(svc2))
    svc3 = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s1"},
        "spec": {"ports": [{"port": 80, "targetPort": [1]}], "typo": "x"},
    }
    add("svc-target-port-list", "POST", "services", _j(svc3))
    add("svc-put-unknown", "PUT", "services/base-svc",
        '{"apiVersion":"v1","kind":"Service","metadata":{"name":"base-svc"},"spec":{"ports":[{"port":80,"targetPort":8080,"x":1}]}}')  # fmt: skip
    add(
        "secret-data",
        "POST",
        "secrets",
        '{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"aGk="},"stringData":{"j":"v"},"typ":"Opaque"}',
    )
    add(
        "secret-bad-base64",
        "POST",
        "secrets",
        '{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"},"data":{"k":"!!"},"typ":"Opaque"}',
    )
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [{"name": "c", "image": "i", "securityContext": {"runAsUser": 1, "runAsUsr": 2}}],
            "volumes": [{"name": "v", "emptyDir": {"medium": "", "sizeLimit": "1Gi", "x": 1}}],
        },
    }
    add("pod-nested", "POST", "pods", _j(pod))
    pod2 = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "b"}, "annotations": {"c": "d"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "command": ["a"],
                    "args": ["b"],
                    "env": [{"name": "E", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name", "x": 1}}}],
                }
            ]
        },
    }
    add("pod-env-fieldref", "POST", "pods", _j(pod2))
    add("pod-dup-container-fields", "POST", "pods",
        '{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"},"spec":{"containers":[{"name":"c","image":"i"},{"name":"d","image":"i","name":"e","tty":true,"tty":false}]}}')  # fmt: skip

    # ---- Custom resources: pruning semantics
    w = widget
    add("cr-clean", "POST", "widgets", _j(w(size=1, title="t", port="http", labels={"a": "b"})), api=CR)
    add("cr-unknown-spec", "POST", "widgets", _j(w(size=1, zz=1)), api=CR)
    add("cr-unknown-sorted", "POST", "widgets", _j(w(zz=1, aa=2, mm=3)), api=CR)
    add("cr-unknown-top", "POST", "widgets", _j({**w(), "top": 1, "also": {"x": 1}}), api=CR)
    add("cr-unknown-metadata", "POST", "widgets", _j({**w(), "metadata": {"name": "w", "zeta": 1, "alpha": 2}}), api=CR)
    add("cr-unknown-in-list", "POST", "widgets", _j(w(items=[{"a": "x", "b": 1}, {"a": "y", "c": 2}])), api=CR)
    add("cr-unknown-in-map", "POST", "widgets", _j(w(slots={"one": {"v": "1", "w": 2}, "two": {"v": "2"}})), api=CR)
    add("cr-map-of-strings", "POST", "widgets", _j(w(labels={"a": "b", "c": "d"}, extra=1)), api=CR)
    add(
        "cr-preserve-unknown",
        "POST",
        "widgets",
        _j(w(free={"u": 1, "deep": {"v": [1, 2]}, "known": {"x": "1"}})),
        api=CR,
    )
    add("cr-preserve-declared-checked", "POST", "widgets", _j(w(free={"u": 1, "known": {"x": "1", "y": 2}})), api=CR)
    add("cr-preserve-any", "POST", "widgets", _j(w(anything={"a": {"b": [{"c": 1}]}, "d": None})), api=CR)
    add("cr-embedded", "POST", "widgets",
        _j(w(embedded={"apiVersion": "v1", "kind": "X", "metadata": {"name": "e"}, "spec": {"q": "1"}})), api=CR)  # fmt: skip
    add("cr-embedded-unknown", "POST", "widgets",
        _j(w(embedded={"apiVersion": "v1", "kind": "X", "metadata": {"name": "e", "bad": 1}, "spec": {"q": "1", "r": 2}, "s": 3})), api=CR)  # fmt: skip
    add("cr-everything", "POST", "widgets",
        '{"apiVersion":"%s/v1","kind":"Widget","metadata":{"name":"w1","foo":1},"spec":{"size":1,"size":2,"zz":1,"aa":2,"items":[{"a":"x","b":1}],"free":{"u":1,"known":{"x":"1","y":2}},"embedded":{"apiVersion":"v1","kind":"X","metadata":{"name":"e","bad":1},"spec":{"q":"1","r":2}}},"top":1}' % GROUP, api=CR)  # fmt: skip
    add(
        "cr-dup",
        "POST",
        "widgets",
        '{"apiVersion":"%s/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"title":"a","title":"b"}}' % GROUP,
        api=CR,
    )
    add("cr-dup-in-preserved", "POST", "widgets",
        '{"apiVersion":"%s/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"anything":{"k":1,"k":2},"free":{"u":1,"u":2}}}' % GROUP, api=CR)  # fmt: skip
    add("cr-dup-metadata", "POST", "widgets",
        '{"apiVersion":"%s/v1","kind":"Widget","metadata":{"name":"w","name":"v","labels":{"a":"1","a":"2"}},"spec":{}}' % GROUP, api=CR)  # fmt: skip
    add("cr-type-error-and-unknown", "POST", "widgets", _j(w(size="big", zz=1)), api=CR)
    add("cr-type-error-only", "POST", "widgets", _j(w(size="big")), api=CR)
    add("cr-int-or-string", "POST", "widgets", _j(w(port=8080, extra=True)), api=CR)
    add("cr-nullable", "POST", "widgets", _j(w(maybe=None, items=[{"a": "x", "n": None}], q=None)), api=CR)
    add("cr-status-unknown", "POST", "widgets", _j({**w(), "status": {"ready": True, "reason": "x"}}), api=CR)
    add("cr-yaml-unknown-dup", "POST", "widgets",
        f"apiVersion: {GROUP}/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: 1\n  size: 2\n  zz: 1\n  aa: 1\ntop: 1\n", YAML, api=CR)  # fmt: skip
    add(
        "cr-yaml-clean",
        "POST",
        "widgets",
        f"apiVersion: {GROUP}/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  size: 1\n",
        YAML,
        api=CR,
    )
    add("cr-put-unknown", "PUT", "widgets/base-widget", _j({**w("base-widget", size=2, zz=1)}), api=CR)
    add("cr-put-dup", "PUT", "widgets/base-widget",
        '{"apiVersion":"%s/v1","kind":"Widget","metadata":{"name":"base-widget"},"spec":{"size":1,"size":2}}' % GROUP, api=CR)  # fmt: skip
    add("cr-root-preserve", "POST", "gadgets",
        '{"apiVersion":"%s/v1","kind":"Gadget","metadata":{"name":"g","odd":1},"spec":{"mode":"a","more":1},"other":{"x":1}}' % GROUP, api=CR)  # fmt: skip
    add("cr-root-preserve-dup", "POST", "gadgets",
        '{"apiVersion":"%s/v1","kind":"Gadget","metadata":{"name":"g"},"other":1,"other":2}' % GROUP, api=CR)  # fmt: skip
    add(
        "cr-wrong-version",
        "POST",
        "widgets",
        '{"apiVersion":"%s/v2","kind":"Widget","metadata":{"name":"w"},"zz":1}' % GROUP,
        api=CR,
    )

    # ---- Bodies read back and written again: managedFields (FieldsV1 stays opaque, also in CRs)
    mf = [{"manager": "m", "operation": "Update", "apiVersion": "v1", "time": "2024-01-01T00:00:00Z",
           "fieldsType": "FieldsV1", "fieldsV1": {"f:data": {"f:a": {}}, "f:spec": {".": {}, "f:size": {}}}}]  # fmt: skip
    add("cm-put-managed-fields", "PUT", "configmaps/base-cm",
        _j({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "base-cm", "managedFields": mf}, "data": {"a": "3"}, "zz": 1}))  # fmt: skip
    add("cr-put-managed-fields", "PUT", "widgets/base-widget",
        _j({**w("base-widget", size=2, zz=1), "metadata": {"name": "base-widget", "managedFields": mf}}), api=CR)  # fmt: skip
    add("cr-post-managed-fields-clean", "POST", "widgets",
        _j({**w("mf", size=2), "metadata": {"name": "mf", "managedFields": mf, "labels": {"a": "b"}}}), api=CR)  # fmt: skip

    # ---- PATCH, every type (kproxy forwards with the level; the apiserver answers)
    add("patch-merge-unknown", "PATCH", "configmaps/base-cm", '{"data":{"b":"2"},"foo":1}', MERGE)
    add("patch-merge-dup", "PATCH", "configmaps/base-cm", '{"data":{"b":"2","b":"3"}}', MERGE)
    add("patch-merge-clean", "PATCH", "configmaps/base-cm", '{"data":{"b":"2"}}', MERGE)
    add("patch-smp-unknown", "PATCH", "deployments/base-deploy", '{"spec":{"replicas":2,"zz":1}}', SMP, api=APPS)
    add("patch-smp-directives", "PATCH", "deployments/base-deploy",
        '{"spec":{"template":{"spec":{"$setElementOrder/containers":[{"name":"c"}],"containers":[{"name":"c","image":"x","foo":1}]}}}}', SMP, api=APPS)  # fmt: skip
    add("patch-smp-patch-delete", "PATCH", "deployments/base-deploy",
        '{"spec":{"template":{"spec":{"containers":[{"name":"zz","$patch":"delete"}]}}},"bogus":1}', SMP, api=APPS)  # fmt: skip
    add("patch-smp-dup", "PATCH", "configmaps/base-cm", '{"data":{"b":"2","b":"3"},"foo":1}', SMP)
    add("patch-json-unknown", "PATCH", "configmaps/base-cm", '[{"op":"add","path":"/foo","value":1}]', JSON_PATCH)
    add("patch-json-nested-unknown", "PATCH", "deployments/base-deploy",
        '[{"op":"add","path":"/spec/template/spec/containers/0/foo","value":{"a":1}}]', JSON_PATCH, api=APPS)  # fmt: skip
    add(
        "patch-json-clean", "PATCH", "configmaps/base-cm", '[{"op":"replace","path":"/data/a","value":"5"}]', JSON_PATCH
    )
    add(
        "patch-json-dup-in-value",
        "PATCH",
        "configmaps/base-cm",
        '[{"op":"add","path":"/data","value":{"x":"1","x":"2"}}]',
        JSON_PATCH,
    )
    add("patch-cr-merge-unknown", "PATCH", "widgets/base-widget", '{"spec":{"size":3,"zz":1}}', MERGE, api=CR)
    add(
        "patch-cr-json-unknown",
        "PATCH",
        "widgets/base-widget",
        '[{"op":"add","path":"/spec/zz","value":1}]',
        JSON_PATCH,
        api=CR,
    )
    add("apply-dup", "PATCH", "configmaps/base-cm",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: base-cm\ndata:\n  a: '1'\n  a: '2'\n", APPLY, query="&fieldManager=corpus&force=true")  # fmt: skip
    add("apply-unknown", "PATCH", "configmaps/base-cm",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: base-cm\nfoo: 1\n", APPLY, query="&fieldManager=corpus&force=true")  # fmt: skip
    add("apply-managed-fields", "PATCH", "configmaps/base-cm",
        '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"base-cm","managedFields":[{"manager":"x"}]}}', APPLY, query="&fieldManager=corpus&force=true")  # fmt: skip
    add("apply-clean", "PATCH", "configmaps/base-cm",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: base-cm\ndata:\n  a: '7'\n", APPLY, query="&fieldManager=corpus&force=true")  # fmt: skip
    add("apply-cr-unknown", "PATCH", "widgets/base-widget",
        f"apiVersion: {GROUP}/v1\nkind: Widget\nmetadata:\n  name: base-widget\nspec:\n  size: 1\n  zz: 2\n", APPLY, api=CR, query="&fieldManager=corpus&force=true")  # fmt: skip
    return c


CASES = _cases()
