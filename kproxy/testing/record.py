"""Record apiserver answers for :mod:`kproxy.testing.replay`: ``python -m kproxy.testing.record``.

Starts the local control plane (``kproxy.localcluster.lifecycle.up``, the Go-built binaries of the
pin in ``tools/envtest/go.mod``), creates a small fixed set of objects in the namespace ``rec``
and sends the requests of :func:`plan` as the admin, writing each (method, target, selected
request headers) -> (status, headers, body) exchange as one JSON line of
``tests/recorded/apiserver.jsonl.gz`` (bodies base64, the file gzipped). Re-run it when the pin
moves; the in-process tests then replay the new answers.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import http.client
import json
import ssl
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kproxy.localcluster import lifecycle
from kproxy.localcluster.controlplane import ControlPlaneInfo

__all__ = ["DEFAULT_PATH", "NAMESPACE", "Request", "main", "plan", "record"]

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "tests" / "recorded" / "apiserver.jsonl.gz"
NAMESPACE = "rec"

JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"
PROTOBUF_WATCH = "application/vnd.kubernetes.protobuf;stream=watch"
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
DISCOVERY_V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"

#: Request headers that select a recording (besides method and target).
SELECTING = ("Accept", "Content-Type", "Impersonate-User")
#: Response headers that vary per run and are not kept.
_DROP = frozenset({"date", "audit-id", "x-kubernetes-pf-flowschema-uid", "x-kubernetes-pf-prioritylevel-uid"})


@dataclass(frozen=True)
class Request:
    method: str
    target: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    note: str = ""


def _cm(name: str, data: Mapping[str, str], extra: Mapping[str, Any] | None = None) -> bytes:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": dict(data)}
    obj.update(extra or {})
    return json.dumps(obj).encode()


def _setup(cp: _Conn) -> str:
    """Create the namespace and objects the plan reads; return the resource version to watch from."""
    ns = f"/api/v1/namespaces/{NAMESPACE}"
    cp.send("POST", "/api/v1/namespaces", json.dumps({"metadata": {"name": NAMESPACE}}).encode())
    cp.send("POST", f"{ns}/serviceaccounts", json.dumps({"metadata": {"name": "default"}}).encode())
    for name in ("cm-a", "cm-b"):
        cp.send("POST", f"{ns}/configmaps", _cm(name, {"key": name, "other": "x" * 40}))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pod-a", "labels": {"app": "rec"}},
        "spec": {"automountServiceAccountToken": False, "containers": [{"name": "c", "image": "busybox"}]},
    }
    cp.send("POST", f"{ns}/pods", json.dumps(pod).encode())
    _, body, _ = cp.send("GET", f"{ns}/configmaps")
    rv: str = json.loads(body)["metadata"]["resourceVersion"]
    # The events every recorded watch from ``rv`` replays: an ADDED, a MODIFIED, a DELETED.
    cp.send("POST", f"{ns}/configmaps", _cm("cm-w", {"key": "w"}))
    cp.send("PATCH", f"{ns}/configmaps/cm-w", b'{"data":{"key":"w2"}}', "application/merge-patch+json")
    cp.send("DELETE", f"{ns}/configmaps/cm-w")
    return rv


def plan(
    rv: str,
    openapi_urls: Mapping[str, str],
    user: Mapping[str, Any] | None = None,
    group_versions: Iterable[str] = (),
) -> Iterator[Request]:
    """The recorded requests (``rv``: the resource version watches start from; ``user``: the
    admin's userInfo, for the access review filters send about a caller; ``group_versions``:
    every ``group/version`` of ``/apis``, whose discovery documents are recorded)."""
    ns = f"/api/v1/namespaces/{NAMESPACE}"
    for accept in (JSON, YAML, PROTOBUF):
        yield Request("GET", f"{ns}/configmaps/cm-a", {"Accept": accept}, note="get")
        yield Request("GET", f"{ns}/configmaps", {"Accept": accept}, note="list")
    for accept in (JSON, PROTOBUF):
        yield Request("GET", f"{ns}/pods", {"Accept": accept}, note="list")
        yield Request("GET", f"{ns}/pods/pod-a", {"Accept": accept}, note="get")
        yield Request("GET", "/api/v1/namespaces", {"Accept": accept}, note="list")
        yield Request("GET", ns, {"Accept": accept}, note="get")
        yield Request("GET", f"{ns}/configmaps/missing", {"Accept": accept}, note="404")
    for accept in (JSON, PROTOBUF):
        target = f"{ns}/configmaps?resourceVersion={rv}&timeoutSeconds=1&watch=true"
        yield Request("GET", target, {"Accept": accept}, note="watch")
    # What the watchcache filter's reflector asks for: a streaming list (a watch sending the
    # initial events, then a bookmark), or a LIST and a watch from its version.
    for accept in (PROTOBUF, JSON):
        query = (
            "watch=1&allowWatchBookmarks=true&timeoutSeconds=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        )
        yield Request("GET", f"/api/v1/configmaps?{query}", {"Accept": accept}, note="streaming list")
        # The watch cache's consistent-read probe: the current resource version, no items.
        probe = "/api/v1/configmaps?limit=1&fieldSelector=metadata.name%3D.kproxy-matches-nothing"
        yield Request("GET", probe, {"Accept": accept}, note="list")
    yield Request("GET", f"{ns}/configmaps?limit=500&resourceVersion=0", {"Accept": JSON}, note="list")
    yield Request("GET", "/api/v1/configmaps?limit=500&resourceVersion=0", {"Accept": JSON}, note="list")
    yield Request("GET", "/api/v1/configmaps", {"Accept": JSON}, note="list")
    for path in ("/api", "/apis", "/api/v1", "/apis/apps/v1", "/version"):
        yield Request("GET", path, {"Accept": JSON}, note="discovery")
    for path in ("/api", "/apis"):
        yield Request("GET", path, {"Accept": DISCOVERY_V2}, note="discovery")
    for gv in group_versions:
        if gv != "apps/v1":
            yield Request("GET", f"/apis/{gv}", {"Accept": JSON}, note="discovery")
    yield Request("GET", "/openapi/v3", {"Accept": JSON}, note="openapi")
    for gv in ("api/v1", "apis/apps/v1"):
        if gv in openapi_urls:
            yield Request("GET", openapi_urls[gv], {"Accept": JSON}, note="openapi")
    yield Request("GET", f"{ns}/configmaps", {"Accept": JSON, "Impersonate-User": "kproxy-user"}, note="403")
    # Who the proxy is, and whether a caller may write (the validation and dryrun filters ask).
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    yield Request("POST", SELF_SUBJECT_REVIEWS, {"Accept": JSON, "Content-Type": JSON}, json.dumps(review).encode())
    if user is not None:
        attrs = {"namespace": NAMESPACE, "verb": "create", "version": "v1", "resource": "configmaps"}
        spec = {"user": user.get("username", ""), "groups": user.get("groups", []), "resourceAttributes": attrs}
        sar = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
        headers = {"Accept": JSON, "Content-Type": JSON}
        yield Request("POST", SUBJECT_ACCESS_REVIEWS, headers, json.dumps(sar).encode(), note="allowed")
    create = {"Accept": JSON, "Content-Type": JSON}
    yield Request("POST", f"{ns}/configmaps", create, _cm("Bad_Name", {"k": "v"}), note="422")
    unknown = _cm("cm-strict", {"k": "v"}, {"bogus": 1, "spec": {"x": 1}})
    for accept in (JSON, YAML):
        target = f"{ns}/configmaps?fieldValidation=Strict"
        yield Request("POST", target, {**create, "Accept": accept}, unknown, note="400 strict")
    yield Request("POST", f"{ns}/configmaps?dryRun=All", create, _cm("cm-new", {"k": "v"}), note="create dry run")
    yield Request("POST", f"{ns}/configmaps", create, _cm("cm-new", {"k": "v"}), note="create")


class _Conn:
    def __init__(self, cp: ControlPlaneInfo) -> None:
        self.port = cp.apiserver_port
        self.ctx: ssl.SSLContext = cp.ssl_context()

    def send(
        self, method: str, target: str, body: bytes = b"", content_type: str = JSON, headers: Mapping[str, str] = {}
    ) -> tuple[int, bytes, http.client.HTTPResponse]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=30)
        h = {"Accept": JSON, **headers}
        if body:
            h.setdefault("Content-Type", content_type)
        conn.request(method, target, body=body or None, headers=h)
        resp = conn.getresponse()
        chunks = []
        while piece := resp.read1(65536):
            chunks.append(piece)
        conn.close()
        resp.chunks = chunks  # type: ignore[attr-defined]
        return resp.status, b"".join(chunks), resp


def _entry(req: Request, status: int, resp: http.client.HTTPResponse) -> dict[str, Any]:
    chunks: list[bytes] = resp.chunks  # type: ignore[attr-defined]
    return {
        "note": req.note,
        "method": req.method,
        "target": req.target,
        "request_headers": {k: v for k, v in req.headers.items() if k in SELECTING},
        "request_body": base64.b64encode(req.body).decode(),
        "status": status,
        "headers": [[k, v] for k, v in resp.getheaders() if k.lower() not in _DROP],
        "chunks": [base64.b64encode(c).decode() for c in chunks],
    }


def record(cp: ControlPlaneInfo, out: Path) -> int:
    conn = _Conn(cp)
    rv = _setup(conn)
    _, index, _ = conn.send("GET", "/openapi/v3")
    urls = {k: v["serverRelativeURL"] for k, v in json.loads(index)["paths"].items()}
    review = b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'
    _, me, _ = conn.send("POST", SELF_SUBJECT_REVIEWS, review)
    entries = []
    _, apis, _ = conn.send("GET", "/apis")
    gvs = [v["groupVersion"] for g in json.loads(apis)["groups"] for v in g["versions"]]
    for req in plan(rv, urls, json.loads(me)["status"]["userInfo"], gvs):
        status, _, resp = conn.send(req.method, req.target, req.body, headers=req.headers)
        entries.append(_entry(req, status, resp))
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(e, sort_keys=True) + "\n" for e in entries)
    out.write_bytes(gzip.compress(lines.encode(), 9, mtime=0))
    return len(entries)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kproxy.testing.record", description=__doc__)
    ap.add_argument("--out", type=Path, default=DEFAULT_PATH)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kproxy-record-") as tmp:
        started = time.monotonic()
        cp = lifecycle.up(Path(tmp))
        try:
            n = record(cp, args.out)
        finally:
            lifecycle.down(Path(tmp))
    print(f"recorded {n} exchanges to {args.out} ({args.out.stat().st_size} bytes, {time.monotonic() - started:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
