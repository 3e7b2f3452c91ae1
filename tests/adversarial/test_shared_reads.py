"""The shared watch cache and shared lists: no caller reads through kproxy what it could not read
directly, whatever path or query trick it tries; and no object one caller can store breaks
other callers' lists and watches."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator

import pytest

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy

from .bodies import PROTOBUF, cm_protobuf
from .conftest import Twins, start_capped
from .wire import Endpoint, exchange, request_bytes

MARKER = "adv-secret-" + secrets.token_hex(4)


@pytest.fixture(scope="module")
def namespaces(control_plane: ControlPlaneInfo) -> Iterator[tuple[str, str]]:
    """(allowed, forbidden): kproxy-user may get/list configmaps in the first only; the second
    holds a ConfigMap whose value is MARKER."""
    tag = secrets.token_hex(3)
    allowed, forbidden = f"adv-allowed-{tag}", f"adv-forbid-{tag}"
    for ns in (allowed, forbidden):
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
        assert control_plane.request("POST", "/api/v1/namespaces", body=json.dumps(body).encode())[0] == 201
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "secret-cm"}, "data": {"v": MARKER}}
    code, resp = control_plane.request("POST", f"/api/v1/namespaces/{forbidden}/configmaps",
                                       body=json.dumps(cm).encode())  # fmt: skip
    assert code == 201, resp
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/" + allowed
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "reader"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
               "subjects": [{"kind": "User", "name": control_plane.user_name,
                             "apiGroup": "rbac.authorization.k8s.io"}]}  # fmt: skip
    assert control_plane.request("POST", f"{rbac}/roles", body=json.dumps(role).encode())[0] == 201
    assert control_plane.request("POST", f"{rbac}/rolebindings", body=json.dumps(binding).encode())[0] == 201
    yield allowed, forbidden
    for ns in (allowed, forbidden):
        control_plane.request("DELETE", f"/api/v1/namespaces/{ns}")


@pytest.fixture(scope="module")
def forward_cache(
    control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory, namespaces: tuple[str, str]
) -> Iterator[RunningProxy]:
    """`credentials: forward` with configmaps and secrets cached, TLS (bearer tokens)."""
    rp = start_capped(tmp_path_factory.mktemp("adv-cache"), control_plane, credentials="forward", tls=True,
                      extra={"filters": [{"name": "watchcache", "resources": ["configmaps", "secrets"]}]})  # fmt: skip
    ctx = control_plane.ssl_context(client_cert=False)
    ctx.load_verify_locations(str(rp.ca_file))
    ep = Endpoint.from_url(rp.url, ctx)
    raw = request_bytes("GET", f"/api/v1/namespaces/{namespaces[1]}/configmaps",
                        [("Authorization", f"Bearer {control_plane.admin_token}")])  # fmt: skip
    eventually(lambda: MARKER.encode() in exchange(ep, raw).body, 30, "the cache to hold the marker")
    yield rp
    rp.stop()


# Targets that try to read the forbidden namespace (F) from the allowed one (A).
READS = {
    "forbidden-list": "/api/v1/namespaces/{F}/configmaps",
    "forbidden-list-rv0": "/api/v1/namespaces/{F}/configmaps?resourceVersion=0",
    "forbidden-get": "/api/v1/namespaces/{F}/configmaps/secret-cm",
    "cluster-list": "/api/v1/configmaps",
    "cluster-list-selector-allowed": "/api/v1/configmaps?fieldSelector=metadata.namespace%3D{A}",
    "allowed-list-selector-forbidden": "/api/v1/namespaces/{A}/configmaps?fieldSelector=metadata.namespace%3D{F}",
    "dotdot-namespace": "/api/v1/namespaces/{A}/../{F}/configmaps",
    "dotdot-from-name": "/api/v1/namespaces/{A}/configmaps/../../{F}/configmaps/secret-cm",
    "pct-slash-namespace": "/api/v1/namespaces/{A}%2F..%2F{F}/configmaps",
    "pct-encoded-forbidden": "/api/v1/namespaces/{Fpct}/configmaps",
    "double-slash": "//api/v1/namespaces/{F}/configmaps",
    "absolute-form": "http://x/api/v1/namespaces/{F}/configmaps",
    "absolute-form-get": "https://x/api/v1/namespaces/{F}/configmaps/secret-cm",
    "semicolon-path": "/api/v1/namespaces/{F}/configmaps;x",
    "name-with-query-chars": "/api/v1/namespaces/{F}/configmaps/secret-cm%3Fx",
    "watch-forbidden": "/api/v1/namespaces/{F}/configmaps?watch=1&timeoutSeconds=1",
    "secrets-list": "/api/v1/namespaces/{F}/secrets",
    "yaml-accept": "/api/v1/namespaces/{F}/configmaps",
    "impersonate-admin": "/api/v1/namespaces/{F}/configmaps",
    "impersonate-masters-cluster": "/api/v1/configmaps",
    "second-authorization-admin": "/api/v1/namespaces/{F}/configmaps",
}
#: Headers a case adds to the caller's own bearer token.
EXTRA_HEADERS = {
    "impersonate-admin": [("Impersonate-User", "system:admin")],
    "impersonate-masters-cluster": [("Impersonate-User", "kproxy-user"), ("Impersonate-Group", "system:masters")],
}


@pytest.mark.parametrize("case", list(READS))
def test_cache_serves_no_caller_what_the_apiserver_would_not(
    case: str, forward_cache: RunningProxy, control_plane: ControlPlaneInfo, namespaces: tuple[str, str]
) -> None:
    allowed, forbidden = namespaces
    fpct = "".join(f"%{ord(c):02X}" if c in "-" else c for c in forbidden)
    path = READS[case].format(A=allowed, F=forbidden, Fpct=fpct)
    accept = "application/yaml" if case == "yaml-accept" else "application/json"
    headers = [("Accept", accept), ("Authorization", f"Bearer {control_plane.user_token}")]
    headers += EXTRA_HEADERS.get(case, [])
    if case == "second-authorization-admin":  # Go's Header.Get reads the first; a second must not count
        headers.append(("Authorization", f"Bearer {control_plane.admin_token}"))
    raw = request_bytes("GET", path, headers)
    ctx = control_plane.ssl_context(client_cert=False)
    direct = exchange(Endpoint("127.0.0.1", control_plane.apiserver_port, ctx), raw)
    ctx.load_verify_locations(str(forward_cache.ca_file))
    via = exchange(Endpoint.from_url(forward_cache.url, ctx), raw)
    assert MARKER.encode() not in direct.body  # the test's premise: the caller may not read it directly
    assert MARKER.encode() not in via.body, f"kproxy served {via.short()}; raw={raw!r}"
    assert via.status < 500 or direct.status >= 500, (via.short(), direct.short())
    assert forward_cache.proc.poll() is None
    assert "Traceback" not in forward_cache.log_text()


@pytest.fixture(scope="module")
def chain(control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The cache and transcode (protobuf from the apiserver, JSON to callers), as in production."""
    filters = [{"name": "watchcache", "resources": ["configmaps"]}, {"name": "transcode", "upstream": "protobuf"}]
    rp = start_capped(tmp_path_factory.mktemp("adv-chain"), control_plane, extra={"filters": filters})
    yield rp
    rp.stop()


@pytest.mark.parametrize(
    "target",
    [
        pytest.param("/api/v1/namespaces/{ns}/configmaps", id="list-cached"),
        pytest.param("/api/v1/namespaces/{ns}/configmaps?limit=500", id="list-paged"),
        pytest.param("/api/v1/namespaces/{ns}/configmaps?resourceVersion=0", id="list-rv0"),
        pytest.param("/api/v1/configmaps", id="list-cluster"),
        pytest.param("/api/v1/namespaces/{ns}/configmaps/good", id="get-other-object"),
        pytest.param("/api/v1/namespaces/{ns}/configmaps/bad", id="get-the-object"),
        pytest.param("/api/v1/namespaces/{ns}/configmaps?watch=1&timeoutSeconds=2", id="watch"),
    ],
)
@pytest.mark.parametrize("accept", ["application/json", "application/yaml"])
def test_one_object_does_not_break_other_callers_reads(
    target: str, accept: str, chain: RunningProxy, twins: Twins, control_plane: ControlPlaneInfo
) -> None:
    """A ConfigMap stored in protobuf with a value that is not UTF-8 (the apiserver stores it and
    writes U+FFFD in JSON): every list, get and watch through kproxy answers as the apiserver does."""
    ns = twins.via
    if twins.get(f"/api/v1/namespaces/{ns}/configmaps/bad") is None:
        for name, value in (("good", b"fine"), ("bad", b"\xff\xfe-not-utf8")):
            raw = request_bytes("POST", f"/api/v1/namespaces/{ns}/configmaps",
                                [("Content-Type", PROTOBUF), ("Accept", "application/json")],
                                cm_protobuf(name, data={b"k": value}))  # fmt: skip
            assert exchange(twins.direct_endpoint, raw).status == 201
    raw = request_bytes("GET", target.format(ns=ns), [("Accept", accept)])
    direct = exchange(twins.direct_endpoint, raw)
    via = exchange(Endpoint.from_url(chain.url), raw)
    mark = b"not-utf8"
    assert via.status == direct.status, f"kproxy {via.short()}; apiserver {direct.short()}; raw={raw!r}"
    assert (mark in via.body) == (mark in direct.body), f"{via.short()}; raw={raw!r}"
    if b"watch=1" in raw and direct.status == 200:  # ran to its timeout: every event came, no ERROR cut it
        assert via.body.count(b"ADDED") == direct.body.count(b"ADDED") > 0, via.short()
    assert "Traceback" not in chain.log_text()
