"""Which reads the watch cache answers itself, and which go to the apiserver (and why)."""

from __future__ import annotations

import pytest

from kproxy.cacher import encode_continue
from kproxy.cacher.fields import builtin_fields
from kproxy.filters.watchcache.partial import base_media, partial_media
from kproxy.filters.watchcache.plan import Pass, Read, plan
from kproxy.testing.exchange import make_exchange

PODS = builtin_fields("", "pods")
TOKEN = encode_continue(42, "/p1")
APISERVER_TOKEN = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MjE2LCJzdGFydCI6Ii9jbTJcdTAwMDAifQ"
# The apiserver's inconsistent continue (rv -1, start "template-0003\0"), from its 410.
LATEST_TOKEN = "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6LTEsInN0YXJ0IjoidGVtcGxhdGUtMDAwM1x1MDAwMCJ9"


def _plan(target: str, accept: str | None = None, method: str = "GET", namespaced: bool = True) -> Read | Pass:
    ex = make_exchange(method, target, {"Accept": accept} if accept else {})
    return plan(ex, protobuf=True, selectable=PODS, namespaced=namespaced)


@pytest.mark.parametrize(
    ("target", "mode", "limit"),
    [
        ("/api/v1/pods?resourceVersion=0", "any", 0),
        ("/api/v1/pods?resourceVersion=0&limit=5", "any", 0),  # limit ignored, as the apiserver does
        ("/api/v1/pods?resourceVersion=0&resourceVersionMatch=NotOlderThan&limit=5", "any", 0),
        ("/api/v1/pods", "consistent", 0),
        ("/api/v1/pods?limit=5", "consistent", 5),
        ("/api/v1/pods?limit=-3", "consistent", 0),
        ("/api/v1/pods?resourceVersion=17", "min", 0),
        ("/api/v1/pods?resourceVersion=17&resourceVersionMatch=NotOlderThan&limit=5", "min", 5),
        ("/api/v1/pods?resourceVersion=17&limit=-1", "min", 0),
        (f"/api/v1/pods?continue={TOKEN}&limit=5", "continue", 5),
        (f"/api/v1/namespaces/ns/pods?continue={LATEST_TOKEN}&limit=5", "consistent", 5),
        (f"/api/v1/pods?continue={LATEST_TOKEN}", "consistent", 0),
        ("/api/v1/namespaces/ns/pods?labelSelector=a%3Db&fieldSelector=spec.nodeName%3Dn1", "consistent", 0),
        ("/api/v1/pods?watch=false&resourceVersion=0", "any", 0),
        ("/api/v1/pods?resourceVersion=0&timeoutSeconds=5&allowWatchBookmarks=true", "any", 0),
    ],
)
def test_reads_the_cache_serves(target: str, mode: str, limit: int) -> None:
    read = _plan(target)
    assert isinstance(read, Read), read
    assert (read.mode, read.limit) == (mode, limit)


def test_read_details() -> None:
    read = _plan("/api/v1/namespaces/ns/pods?labelSelector=a%3Db&resourceVersion=0", "application/yaml")
    assert isinstance(read, Read)
    assert (read.namespace, read.media_type, read.filtered) == ("ns", "application/yaml", True)
    assert read.labels is not None and read.labels.matches({"a": "b"}) and not read.labels.matches({"a": "c"})
    got = _plan(f"/api/v1/pods?continue={TOKEN}")
    assert isinstance(got, Read) and got.cont is not None and (got.cont.rv, got.cont.start) == (42, "/p1\x00")
    get = _plan("/api/v1/namespaces/ns/pods/p1?resourceVersion=0", "application/vnd.kubernetes.protobuf")
    assert isinstance(get, Read) and (get.verb, get.name, get.media_type) == (
        "get",
        "p1",
        "application/vnd.kubernetes.protobuf",
    )
    pretty = _plan("/api/v1/pods?resourceVersion=0&pretty=true")
    assert isinstance(pretty, Read) and pretty.pretty
    empty = _plan("/api/v1/pods?resourceVersion=0&labelSelector=&fieldSelector=")
    assert isinstance(empty, Read) and not empty.filtered


@pytest.mark.parametrize(
    ("target", "reason", "accept"),
    [
        ("/api/v1/pods?resourceVersion=17&resourceVersionMatch=Exact", "exact", None),
        ("/api/v1/pods?resourceVersion=17&limit=5", "exact", None),  # the legacy exact match
        ("/api/v1/pods?resourceVersionMatch=NotOlderThan", "invalid", None),
        ("/api/v1/pods?resourceVersion=0&resourceVersionMatch=exact", "invalid", None),
        ("/api/v1/pods?resourceVersion=abc", "invalid", None),
        ("/api/v1/pods?resourceVersion=00", "invalid", None),
        ("/api/v1/pods?resourceVersion=-1", "invalid", None),
        ("/api/v1/pods?limit=", "invalid", None),
        ("/api/v1/pods?limit=x", "invalid", None),
        ("/api/v1/pods?timeoutSeconds=x", "invalid", None),
        (f"/api/v1/pods?continue={TOKEN}&resourceVersion=5", "invalid", None),
        (f"/api/v1/pods?continue={TOKEN}&resourceVersionMatch=NotOlderThan&resourceVersion=5", "invalid", None),
        (f"/api/v1/pods?continue={APISERVER_TOKEN}", "continue", None),
        (f"/api/v1/namespaces/ns/pods?continue={TOKEN}&fieldSelector=metadata.name%3Dp1", "continue", None),
        (f"/api/v1/namespaces/ns/pods?continue={LATEST_TOKEN}&fieldSelector=metadata.name%3Dp", "continue", None),
        (f"/api/v1/pods?continue={LATEST_TOKEN}&resourceVersion=0", "invalid", None),
        ("/api/v1/pods?continue=garbage", "continue", None),
        ("/api/v1/pods?sendInitialEvents=true", "parameters", None),
        ("/api/v1/pods?resourceVersion=0&unknown=1", "parameters", None),
        ("/api/v1/pods?resourceVersion=0&limit=1&limit=2", "parameters", None),
        ("/api/v1/pods?watch=1", "watch", None),
        ("/api/v1/pods?labelSelector=a%20in%20(", "selector", None),
        ("/api/v1/pods?fieldSelector=spec.unknown%3Dx", "selector", None),
        ("/api/v1/pods?resourceVersion=0", "media type", "application/json;as=Table;g=meta.k8s.io;v=v1"),
        ("/api/v1/pods?resourceVersion=0", "media type", "text/html"),
        ("/api/v1/pods?resourceVersion=0&labelSelector=a%3D%FF", "encoding", None),
        ("/api/v1/pods?resourceVersion=0;limit=1", "encoding", None),
        ("/api/v1/namespaces/ns/pods/p1", "get", None),
        ("/api/v1/namespaces/ns/pods/p1?resourceVersion=5", "get", None),
        ("/api/v1/pods/p1?resourceVersion=0", "scope", None),
    ],
)
def test_reads_that_go_to_the_apiserver(target: str, reason: str, accept: str | None) -> None:
    assert _plan(target, accept) == Pass(reason)


def test_impersonation_goes_to_the_apiserver() -> None:
    for header in ("Impersonate-User", "impersonate-group", "Impersonate-Extra-Scopes"):
        path = "/api/v1/pods?resourceVersion=0"
        ex = make_exchange("GET", path, {header: "bob"})
        assert plan(ex, protobuf=True, selectable=PODS) == Pass("impersonation")


@pytest.mark.parametrize(
    ("target", "namespaced"),
    [
        ("/api/v1/namespaces/x/namespaces/x?resourceVersion=0", False),
        ("/api/v1/namespaces/x/namespaces?resourceVersion=0&fieldSelector=metadata.name%3Dx", False),
        ("/api/v1/namespaces/x/namespaces?resourceVersion=0", False),
        ("/api/v1/namespaces/x/nodes/n1?resourceVersion=0", False),
        ("/apis/rbac.authorization.k8s.io/v1/namespaces/x/clusterroles?resourceVersion=0", False),
        ("/api/v1/configmaps/c1?resourceVersion=0", True),
    ],
)
def test_routes_the_installer_does_not_register_are_the_apiservers(target: str, namespaced: bool) -> None:
    """A cluster-scoped resource under ``namespaces/{ns}/`` (namespaces itself included) and a
    namespaced object by name without a namespace have no route (installer.go): 404 upstream."""
    assert _plan(target, namespaced=namespaced) == Pass("scope")


def test_methods_and_scopes() -> None:
    assert _plan("/api/v1/pods", method="HEAD") == Pass("method")
    assert _plan("/api/v1/namespaces/ns/nodes?resourceVersion=0", namespaced=False) == Pass("scope")
    node = _plan("/api/v1/nodes/n1?resourceVersion=0", namespaced=False)
    assert isinstance(node, Read) and (node.namespace, node.name) == ("", "n1")
    ns = _plan("/api/v1/namespaces/kube-system?resourceVersion=0", namespaced=False)
    assert isinstance(ns, Read) and (ns.namespace, ns.name) == ("", "kube-system")


@pytest.mark.parametrize(
    "target",
    [
        "//api/v1/namespaces/ns/pods",
        "/api//v1/namespaces/ns/pods",
        "/api/v1/namespaces/ns//pods",
        "/api/v1/namespaces/ns/pods%2F%2F",
        "/api/v1/namespaces/ns/./pods",
        "/api/v1/namespaces/x/../ns/pods",
        "http://h//api/v1/namespaces/ns/pods",
    ],
)
def test_paths_the_apiserver_does_not_route_are_its_own_to_answer(target: str) -> None:
    """RequestInfo trims and splits such paths into a resource; the apiserver's router has no
    route for them (404 page not found), so the cache must not answer them."""
    assert _plan(target) == Pass("scope")
    assert isinstance(_plan("/api/v1/namespaces/ns/pods/"), Read)  # a trailing slash is routed


META = "application/{};as={};g=meta.k8s.io;v={}"


@pytest.mark.parametrize(
    ("target", "accept", "media"),
    [
        ("/api/v1/pods", META.format("json", "PartialObjectMetadataList", "v1"), "application/json"),
        ("/api/v1/pods", META.format("yaml", "PartialObjectMetadataList", "v1"), "application/yaml"),
        (
            "/api/v1/pods",
            f"{META.format('vnd.kubernetes.protobuf', 'PartialObjectMetadataList', 'v1')}, application/json",
            "application/vnd.kubernetes.protobuf",
        ),
        (
            "/api/v1/namespaces/a/pods/p?resourceVersion=0",
            META.format("json", "PartialObjectMetadata", "v1"),
            "application/json",
        ),
    ],
)
def test_metadata_only_reads_are_served(target: str, accept: str, media: str) -> None:
    read = _plan(target, accept)
    assert isinstance(read, Read) and read.media_type == partial_media(media)
    assert base_media(read.media_type) == (media, True)


@pytest.mark.parametrize(
    ("target", "accept"),
    [
        ("/api/v1/pods", META.format("json", "PartialObjectMetadata", "v1")),  # an object's form for a list: 406
        ("/api/v1/namespaces/a/pods/p?resourceVersion=0", META.format("json", "PartialObjectMetadataList", "v1")),
        ("/api/v1/pods", META.format("json", "PartialObjectMetadataList", "v1beta1")),
        ("/api/v1/pods", META.format("json", "Table", "v1")),
    ],
)
def test_other_transforms_pass(target: str, accept: str) -> None:
    assert _plan(target, accept) == Pass("media type")


def test_custom_resources_are_not_transformed_here() -> None:
    ex = make_exchange(
        "GET", "/apis/x.example/v1/gizmos", {"Accept": META.format("json", "PartialObjectMetadataList", "v1")}
    )
    assert plan(ex, protobuf=False, selectable=PODS) == Pass("media type")
