"""Reads through an outage, attacked from outside: while the apiserver of a control plane of this
module's own is stopped for a few seconds, only a caller and request the apiserver itself allowed
within ``outage.authorization_ttl`` reads from the cache; every neighbour of that decision, every
other spelling of that caller, and that caller past the bound get the outage answer (no data).

kproxy runs in ``credentials: forward`` with ``allow_ttl``/``deny_ttl`` 0, so each read before the
outage is a SubjectAccessReview of its own: what kproxy remembers is exactly what it asked. The
caller (a ServiceAccount bound to reading pods and configmaps cluster-wide) may, by RBAC, do every read refused here:
after the outage the apiserver answers each of them 200 directly for the same token, so each
refusal during the outage is kproxy's rule (never reviewed, or past the bound), not RBAC's.
"""

from __future__ import annotations

import json
import secrets
import signal
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kproxy.localcluster import envtest
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy

pytestmark = pytest.mark.timeout(300)

#: A ClusterRole of this module's own (``view`` is aggregated by the controller manager, which a
#: bare control plane does not run: it has no rules there).
READER = "rt3-outage-reader"
#: The bound of the kproxy that shows it (seconds): its decision is older than this mid-outage.
SHORT_TTL = 6.0


@pytest.fixture(scope="module")
def own_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlaneInfo]:
    directory = tmp_path_factory.mktemp("redteam3-outage-envtest")
    try:
        yield envtest.up(directory)
    finally:
        envtest.down(directory)


def _post(cp: ControlPlaneInfo, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    status, body = cp.request("POST", path, body=json.dumps(obj).encode())
    assert status == 201, body
    result: dict[str, Any] = json.loads(body)
    return result


def _sa_token(cp: ControlPlaneInfo, ns: str, name: str) -> str:
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    token: str = _post(cp, f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token", request)["status"]["token"]
    return token


def _binding(kind: str, name: str, ns: str, sa: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": READER},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}],
    }


def _pod(name: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/none"}]},
    }


def _read(rp: RunningProxy, path: str, headers: dict[str, str]) -> tuple[int, list[str], bytes]:
    assert rp.ca_file is not None
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    req = urllib.request.Request(rp.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=20, context=ctx) as r:
            return r.status, r.headers.get_all("Warning") or [], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get_all("Warning") or [], e.read()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _metric(rp: RunningProxy, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(rp.metrics()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def _data(body: bytes) -> bool:
    """Whether ``body`` carries any object (a list's items, a pod, a watch event)."""
    for line in body.splitlines() or [body]:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and (doc.get("items") or doc.get("kind") == "Pod" or "object" in doc):
            return True
    return False


def _start(tmp: Path, cp: ControlPlaneInfo, ttl: float) -> RunningProxy:
    cache = {
        "name": "watchcache",
        "resources": ["pods", "configmaps"],
        "bookmark_interval": 2,
        "authorization": {"allow_ttl": 0, "deny_ttl": 0},
        "outage": {"serve": True, "authorization_ttl": ttl},
    }
    rp = start_proxy(tmp, cp.admin_kubeconfig, credentials="forward", tls=True, token=cp.admin_token,
                     extra={"filters": [cache]})  # fmt: skip
    for resource in ("pods", "configmaps"):

        def cached(resource: str = resource) -> bool:
            before = _metric(rp, "kproxy_watchcache_reads_total", resource=resource, served="cache")
            status = _read(rp, f"/api/v1/{resource}?resourceVersion=0", _bearer(cp.admin_token))[0]
            return (
                status == 200
                and _metric(rp, "kproxy_watchcache_reads_total", resource=resource, served="cache") > before
            )

        eventually(cached, 60, f"the {resource} cache", interval=0.2)
    return rp


def test_only_the_reviewed_caller_and_request_read_through_an_outage(own_cp: ControlPlaneInfo, tmp_path: Path) -> None:
    cp = own_cp
    a, b = f"rt3-a-{secrets.token_hex(3)}", f"rt3-b-{secrets.token_hex(3)}"
    for ns in (a, b):
        _post(cp, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        _post(cp, f"/api/v1/namespaces/{ns}/pods", _pod("p0", "x"))
        _post(cp, f"/api/v1/namespaces/{ns}/pods", _pod("p1", "y"))
        _post(cp, f"/api/v1/namespaces/{ns}/configmaps", {"metadata": {"name": "cm"}})
    rules = [{"apiGroups": [""], "resources": ["pods", "configmaps"], "verbs": ["get", "list", "watch"]}]
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": READER}}
    role["rules"] = rules
    status, body = cp.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", body=json.dumps(role).encode())
    assert status in (201, 409), body
    for sa in ("reader", "revoked"):
        _post(cp, f"/api/v1/namespaces/{a}/serviceaccounts", {"metadata": {"name": sa}})
    _post(cp, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", _binding("ClusterRoleBinding", a, a, "reader"))
    _post(
        cp,
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{a}/rolebindings",
        _binding("RoleBinding", "r", a, "revoked"),
    )
    reader = _sa_token(cp, a, "reader")
    reader_other_token = _sa_token(cp, a, "reader")  # the same ServiceAccount, a token kproxy never saw
    revoked = _sa_token(cp, a, "revoked")

    reviewed = f"/api/v1/namespaces/{a}/pods?labelSelector=app%3Dx"
    reviewed_get = f"/api/v1/namespaces/{a}/pods/p0?resourceVersion=0"  # a GET the cache serves
    # The neighbours of those two decisions: every one allowed by RBAC, none ever asked about.
    neighbours = {
        "no selector": f"/api/v1/namespaces/{a}/pods",
        "another selector": f"/api/v1/namespaces/{a}/pods?labelSelector=app%3Dy",
        "a field selector added": f"{reviewed}&fieldSelector=metadata.name%3Dp0",
        "another namespace": f"/api/v1/namespaces/{b}/pods?labelSelector=app%3Dx",
        "every namespace": "/api/v1/pods?labelSelector=app%3Dx",
        "watch, not list": f"{reviewed}&watch=1&timeoutSeconds=1",
        "another resource": f"/api/v1/namespaces/{a}/configmaps",
        "another name": f"/api/v1/namespaces/{a}/pods/p1?resourceVersion=0",
        "a list, not the get": f"/api/v1/namespaces/{a}/pods?fieldSelector=metadata.name%3Dp0",
    }
    for token in (reader, revoked):  # the bindings reached the apiserver's authorizer
        eventually(lambda t=token: cp.request("GET", reviewed, token=t)[0] == 200, 30, "RBAC", interval=0.2)
    wide = _start(tmp_path / "wide", cp, 120.0)  # decisions outlast the outage
    short = _start(tmp_path / "short", cp, SHORT_TTL)
    try:
        # Before the outage: the reader's two reads reviewed and allowed; the revoked caller allowed,
        # then its binding deleted and the denial seen by kproxy (a 403 from a fresh review).
        for path in (reviewed, reviewed_get):
            assert _read(wide, path, _bearer(reader))[0] == 200
        assert _read(wide, reviewed, _bearer(revoked))[0] == 200
        status, _ = cp.request("DELETE", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{a}/rolebindings/r")
        assert status == 200
        eventually(lambda: _read(wide, reviewed, _bearer(revoked))[0] == 403, 30, "the revocation seen", interval=0.2)
        assert _read(short, reviewed, _bearer(reader))[0] == 200
        short_reviewed = time.monotonic()

        cp.stop_apiserver(kill=True)  # at once: the short bound is seconds
        # The bound: within it the short kproxy serves its decision (with the Warning) ...
        status, warnings, body = _read(short, reviewed, _bearer(reader))
        assert time.monotonic() - short_reviewed < SHORT_TTL, "too slow to see the bound's inside"
        assert status == 200 and warnings and _data(body), (status, body[:300])
        # The reviewed caller and requests, through the outage, from the cache.
        for path in (reviewed, reviewed_get):
            status, warnings, body = _read(wide, path, _bearer(reader))
            assert status == 200 and _data(body), (path, status, body[:300])
            assert len(warnings) == 1 and "the kube-apiserver is unreachable" in warnings[0], warnings
        refused: dict[str, tuple[str, dict[str, str]]] = {
            f"neighbour: {what}": (path, _bearer(reader)) for what, path in neighbours.items()
        }
        refused |= {
            "another token of the same ServiceAccount": (reviewed, _bearer(reader_other_token)),
            "no token (anonymous)": (reviewed, {}),
            "the token after two spaces (the apiserver reads no token)": (
                reviewed,
                {"Authorization": f"Bearer  {reader}"},
            ),
            "the token as a WebSocket protocol of a plain GET": (
                reviewed,
                {"Sec-WebSocket-Protocol": f"base64url.bearer.authorization.k8s.io.{reader}"},
            ),
            "impersonating the admin": (reviewed, {**_bearer(reader), "Impersonate-User": "system:admin"}),
            "impersonating itself with another group": (
                reviewed,
                {
                    **_bearer(reader),
                    "Impersonate-User": f"system:serviceaccount:{a}:reader",
                    "Impersonate-Group": "system:masters",
                },
            ),
            "the revoked caller whose denial kproxy saw": (reviewed, _bearer(revoked)),
        }
        for what, (path, headers) in refused.items():
            status, _, body = _read(wide, path, headers)
            assert status != 200 and not _data(body), (what, status, body[:300])
            assert json.loads(body)["kind"] == "Status", (what, body[:300])
        # ... and past it, the same caller and request get the outage answer.
        eventually(lambda: time.monotonic() - short_reviewed > SHORT_TTL + 0.5, SHORT_TTL + 5, "the bound to pass")
        status, _, body = _read(short, reviewed, _bearer(reader))
        assert status != 200 and not _data(body), ("past the bound", status, body[:300])
    finally:
        if not cp.apiserver_alive():
            cp.start_apiserver()
        for rp in (wide, short):
            rp.stop(signal.SIGKILL)

    # The judge: the apiserver itself serves every neighbour to the reader (RBAC allowed each).
    for what, path in neighbours.items():
        status, body = cp.request("GET", path, token=reader)
        assert status == 200, (what, status, body[:300])
    status, body = cp.request("GET", reviewed, token=reader_other_token)
    assert status == 200, body[:300]
    status, body = cp.request("GET", reviewed, token=revoked)
    assert status == 403, body[:300]
