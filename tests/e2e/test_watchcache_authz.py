"""The watch cache in `credentials: forward`: nothing leaves the cache for a caller the apiserver
would refuse. A caller without permission gets the apiserver's own 403 (word for word) from the
cache; once a RoleBinding grants the list, the caller is served from the cache after the deny TTL."""

from __future__ import annotations

import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from kproxy.localcluster.controlplane import USER_NAME
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy


def _get(rp: RunningProxy, path: str, token: str, accept: str | None = None) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cafile=str(rp.ca_file))
    headers = {"Authorization": f"Bearer {token}"} | ({"Accept": accept} if accept else {})
    req = urllib.request.Request(rp.url + path, headers=headers)
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _served(rp: RunningProxy, served: str, reason: str, verb: str = "list") -> float:
    pattern = (
        r'kproxy_watchcache_reads_total\{reason="'
        + re.escape(reason)
        + r'",resource="configmaps",served="'
        + served
        + r'",verb="'
        + verb
        + r'"\} ([0-9.e+]+)'
    )
    m = re.search(pattern, rp.metrics())
    return float(m.group(1)) if m else 0.0


@pytest.fixture
def forward_cache(proxy_factory: Callable[..., RunningProxy], control_plane: ControlPlaneInfo) -> RunningProxy:
    rp = proxy_factory(
        credentials="forward",
        tls=True,
        extra={
            "filters": [
                {
                    "name": "watchcache",
                    "resources": ["configmaps"],
                    "authorization": {"allow_ttl": 30, "deny_ttl": 2},
                }
            ]
        },
    )
    eventually(
        lambda: (
            _get(rp, "/api/v1/configmaps?resourceVersion=0", control_plane.admin_token)[0] == 200
            and _served(rp, "cache", "any") > 0
        ),
        30,
        "the configmaps cache to be ready",
    )
    return rp


def test_denied_caller_gets_the_apiservers_403_then_is_served_after_a_rolebinding(
    forward_cache: RunningProxy, control_plane: ControlPlaneInfo, namespace: str
) -> None:
    rp = forward_cache
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "secret-ish"}, "data": {"k": "v"}}
    status, _ = control_plane.request(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps", body=json.dumps(cm).encode()
    )
    assert status == 201
    token = control_plane.user_token
    for path in (
        f"/api/v1/namespaces/{namespace}/configmaps?resourceVersion=0",
        f"/api/v1/namespaces/{namespace}/configmaps",
        f"/api/v1/namespaces/{namespace}/configmaps/secret-ish?resourceVersion=0",
        "/api/v1/configmaps?resourceVersion=0",
    ):
        direct = control_plane.request("GET", path, token=token)
        via = _get(rp, path, token)
        assert direct[0] == 403, direct
        assert via == direct, (path, via, direct)
    assert _served(rp, "cache", "status 403") >= 3
    assert _served(rp, "cache", "status 403", verb="get") >= 1

    # A Role of its own: the aggregated "view" ClusterRole is empty without a controller-manager.
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "read-cms"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
    }
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    assert control_plane.request("POST", f"{rbac}/roles", body=json.dumps(role).encode())[0] == 201
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "read-cms"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-cms"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER_NAME}],
    }
    assert control_plane.request("POST", f"{rbac}/rolebindings", body=json.dumps(binding).encode())[0] == 201
    list_path = f"/api/v1/namespaces/{namespace}/configmaps?resourceVersion=0"
    eventually(lambda: _get(rp, list_path, token)[0] == 200, 20, "the grant to be seen after the deny TTL")
    status, body = _get(rp, list_path, token)
    assert [i["metadata"]["name"] for i in json.loads(body)["items"]] == ["secret-ish"]
    before = _served(rp, "cache", "any")
    assert _get(rp, list_path, token)[0] == 200
    assert _served(rp, "cache", "any") == before + 1
    # Cluster-wide is still denied: the grant is for one namespace.
    direct = control_plane.request("GET", "/api/v1/configmaps?resourceVersion=0", token=token)
    assert _get(rp, "/api/v1/configmaps?resourceVersion=0", token) == direct


@pytest.mark.parametrize("encoding", ["json", "vnd.kubernetes.protobuf"])
def test_metadata_only_reads_are_authorized_like_any_read(
    forward_cache: RunningProxy, control_plane: ControlPlaneInfo, namespace: str, encoding: str
) -> None:
    """Asking for objects' metadata alone (``as=PartialObjectMetadata[List]``, what a metadata
    informer sends) changes nothing about who may read: a caller the apiserver refuses gets its
    403 byte for byte from the cache, in the error's own negotiated encoding, for a list, a get and
    a watch."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "meta-only"}, "data": {"k": "v"}}
    status, _ = control_plane.request(
        "POST", f"/api/v1/namespaces/{namespace}/configmaps", body=json.dumps(cm).encode()
    )
    assert status == 201
    rp, token = forward_cache, control_plane.user_token
    as_list = f"application/{encoding};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
    as_object = f"application/{encoding};as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
    before = _served(rp, "cache", "status 403") + _served(rp, "cache", "status 403", "get")
    before += _served(rp, "cache", "status 403", "watch")
    for path, accept in (
        (f"/api/v1/namespaces/{namespace}/configmaps?resourceVersion=0", as_list),
        ("/api/v1/configmaps?resourceVersion=0", as_list),
        (f"/api/v1/namespaces/{namespace}/configmaps/meta-only?resourceVersion=0", as_object),
        (f"/api/v1/namespaces/{namespace}/configmaps?watch=1&resourceVersion=0", as_object),
    ):
        direct = control_plane.request("GET", path, token=token, accept=accept)
        via = _get(rp, path, token, accept)
        assert direct[0] == 403, direct
        assert via == direct, (path, via, direct)
    after = _served(rp, "cache", "status 403") + _served(rp, "cache", "status 403", "get")
    assert after + _served(rp, "cache", "status 403", "watch") - before == 4


def test_rejected_token_gets_the_apiservers_401(forward_cache: RunningProxy, control_plane: ControlPlaneInfo) -> None:
    path = "/api/v1/configmaps?resourceVersion=0"
    direct = control_plane.request("GET", path, token="not-a-token")
    assert direct[0] == 401
    assert _get(forward_cache, path, "not-a-token") == direct
