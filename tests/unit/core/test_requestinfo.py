"""RequestInfo parsing must agree with kube-apiserver's NewRequestInfo on every path shape.

The resource table starts with the upstream cases from
staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo_test.go and adds the shapes the gateway
depends on (connect subresources, watch spellings, selectors, encoded paths).
"""

from __future__ import annotations

import dataclasses

import pytest
from multidict import MultiDict, MultiDictProxy

from kproxy.core.requestinfo import (
    InvalidRequestURIError,
    RequestInfo,
    RequestInfoError,
    parse_query,
    parse_request_info,
    request_info_from_target,
    unescape_path,
)

# (method, target, verb, prefix, group, version, namespace, resource, subresource, name, parts)
RESOURCE_CASES: list[tuple[str, str, str, str, str, str, str, str, str, str, tuple[str, ...]]] = [
    # --- upstream TestGetAPIRequestInfo ---
    ("GET", "/api/v1/namespaces", "list", "api", "", "v1", "", "namespaces", "", "", ("namespaces",)),
    (
        "GET",
        "/api/v1/namespaces/other",
        "get",
        "api",
        "",
        "v1",
        "other",
        "namespaces",
        "",
        "other",
        ("namespaces", "other"),
    ),
    ("GET", "/api/v1/namespaces/other/pods", "list", "api", "", "v1", "other", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/namespaces/other/pods/foo", "get", "api", "", "v1", "other", "pods", "", "foo", ("pods", "foo")),
    ("HEAD", "/api/v1/namespaces/other/pods/foo", "get", "api", "", "v1", "other", "pods", "", "foo", ("pods", "foo")),
    ("GET", "/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("HEAD", "/api/v1/pods", "list", "api", "", "v1", "", "pods", "", "", ("pods",)),
    (
        "GET",
        "/api/v1/proxy/namespaces/other/pods/foo",
        "proxy",
        "api",
        "",
        "v1",
        "other",
        "pods",
        "",
        "foo",
        ("pods", "foo"),
    ),
    (
        "GET",
        "/api/v1/proxy/namespaces/other/pods/foo/subpath/not/a/subresource",
        "proxy",
        "api",
        "",
        "v1",
        "other",
        "pods",
        "",
        "foo",
        ("pods", "foo", "subpath", "not", "a", "subresource"),
    ),
    ("GET", "/api/v1/watch/pods", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch=true", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch=false", "list", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/watch/namespaces/other/pods", "watch", "api", "", "v1", "other", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/namespaces/other/pods?watch=1", "watch", "api", "", "v1", "other", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/namespaces/other/pods?watch=0", "list", "api", "", "v1", "other", "pods", "", "", ("pods",)),
    (
        "GET",
        "/api/v1/namespaces/other/pods/foo/status",
        "get",
        "api",
        "",
        "v1",
        "other",
        "pods",
        "status",
        "foo",
        ("pods", "foo", "status"),
    ),
    (
        "GET",
        "/api/v1/namespaces/other/pods/foo/proxy/subpath",
        "get",
        "api",
        "",
        "v1",
        "other",
        "pods",
        "proxy",
        "foo",
        ("pods", "foo", "proxy", "subpath"),
    ),
    (
        "PUT",
        "/api/v1/namespaces/other/finalize",
        "update",
        "api",
        "",
        "v1",
        "other",
        "namespaces",
        "finalize",
        "other",
        ("namespaces", "other", "finalize"),
    ),
    (
        "PUT",
        "/api/v1/namespaces/other/status",
        "update",
        "api",
        "",
        "v1",
        "other",
        "namespaces",
        "status",
        "other",
        ("namespaces", "other", "status"),
    ),
    (
        "PATCH",
        "/api/v1/namespaces/other/pods/foo",
        "patch",
        "api",
        "",
        "v1",
        "other",
        "pods",
        "",
        "foo",
        ("pods", "foo"),
    ),
    (
        "DELETE",
        "/api/v1/namespaces/other/pods/foo",
        "delete",
        "api",
        "",
        "v1",
        "other",
        "pods",
        "",
        "foo",
        ("pods", "foo"),
    ),
    ("POST", "/api/v1/namespaces/other/pods", "create", "api", "", "v1", "other", "pods", "", "", ("pods",)),
    ("DELETE", "/api/v1/nodes", "deletecollection", "api", "", "v1", "", "nodes", "", "", ("nodes",)),
    ("DELETE", "/api/v1/namespaces", "deletecollection", "api", "", "v1", "", "namespaces", "", "", ("namespaces",)),
    (
        "DELETE",
        "/api/v1/namespaces/other/pods",
        "deletecollection",
        "api",
        "",
        "v1",
        "other",
        "pods",
        "",
        "",
        ("pods",),
    ),
    (
        "DELETE",
        "/apis/extensions/v1/namespaces/other/pods",
        "deletecollection",
        "apis",
        "extensions",
        "v1",
        "other",
        "pods",
        "",
        "",
        ("pods",),
    ),
    (
        "POST",
        "/apis/extensions/v1beta3/namespaces/other/pods",
        "create",
        "apis",
        "extensions",
        "v1beta3",
        "other",
        "pods",
        "",
        "",
        ("pods",),
    ),
    # --- grouped, cluster-scoped and namespaced ---
    ("GET", "/apis/apps/v1/deployments", "list", "apis", "apps", "v1", "", "deployments", "", "", ("deployments",)),
    (
        "GET",
        "/apis/apps/v1/namespaces/ns/deployments/web",
        "get",
        "apis",
        "apps",
        "v1",
        "ns",
        "deployments",
        "",
        "web",
        ("deployments", "web"),
    ),
    (
        "PUT",
        "/apis/apps/v1/namespaces/ns/deployments/web/scale",
        "update",
        "apis",
        "apps",
        "v1",
        "ns",
        "deployments",
        "scale",
        "web",
        ("deployments", "web", "scale"),
    ),
    (
        "PATCH",
        "/apis/apps/v1/namespaces/ns/deployments/web/status",
        "patch",
        "apis",
        "apps",
        "v1",
        "ns",
        "deployments",
        "status",
        "web",
        ("deployments", "web", "status"),
    ),
    (
        "GET",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles/admin",
        "get",
        "apis",
        "rbac.authorization.k8s.io",
        "v1",
        "",
        "clusterroles",
        "",
        "admin",
        ("clusterroles", "admin"),
    ),
    (
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        "create",
        "apis",
        "authorization.k8s.io",
        "v1",
        "",
        "subjectaccessreviews",
        "",
        "",
        ("subjectaccessreviews",),
    ),
    ("GET", "/api/v1/nodes/n1", "get", "api", "", "v1", "", "nodes", "", "n1", ("nodes", "n1")),
    (
        "GET",
        "/api/v1/nodes/n1/proxy/metrics",
        "get",
        "api",
        "",
        "v1",
        "",
        "nodes",
        "proxy",
        "n1",
        ("nodes", "n1", "proxy", "metrics"),
    ),
    # --- pod subresources ---
    (
        "POST",
        "/api/v1/namespaces/ns/pods/p/exec",
        "create",
        "api",
        "",
        "v1",
        "ns",
        "pods",
        "exec",
        "p",
        ("pods", "p", "exec"),
    ),
    (
        "GET",
        "/api/v1/namespaces/ns/pods/p/exec?command=ls",
        "get",
        "api",
        "",
        "v1",
        "ns",
        "pods",
        "exec",
        "p",
        ("pods", "p", "exec"),
    ),
    (
        "GET",
        "/api/v1/namespaces/ns/pods/p/log",
        "get",
        "api",
        "",
        "v1",
        "ns",
        "pods",
        "log",
        "p",
        ("pods", "p", "log"),
    ),
    (
        "POST",
        "/api/v1/namespaces/ns/pods/p/eviction",
        "create",
        "api",
        "",
        "v1",
        "ns",
        "pods",
        "eviction",
        "p",
        ("pods", "p", "eviction"),
    ),
    (
        "POST",
        "/api/v1/namespaces/ns/pods/p/binding",
        "create",
        "api",
        "",
        "v1",
        "ns",
        "pods",
        "binding",
        "p",
        ("pods", "p", "binding"),
    ),
    (
        "POST",
        "/api/v1/namespaces/ns/bindings",
        "create",
        "api",
        "",
        "v1",
        "ns",
        "bindings",
        "",
        "",
        ("bindings",),
    ),
    # --- the namespace itself vs. resources in it ---
    ("GET", "/api/v1/namespaces/ns", "get", "api", "", "v1", "ns", "namespaces", "", "ns", ("namespaces", "ns")),
    (
        "DELETE",
        "/api/v1/namespaces/ns",
        "delete",
        "api",
        "",
        "v1",
        "ns",
        "namespaces",
        "",
        "ns",
        ("namespaces", "ns"),
    ),
    (
        "GET",
        "/api/v1/namespaces/ns/status",
        "get",
        "api",
        "",
        "v1",
        "ns",
        "namespaces",
        "status",
        "ns",
        ("namespaces", "ns", "status"),
    ),
    # a namespace subresource keeps the whole tail, even with more segments after it
    (
        "GET",
        "/api/v1/namespaces/ns/status/extra",
        "get",
        "api",
        "",
        "v1",
        "ns",
        "namespaces",
        "status",
        "ns",
        ("namespaces", "ns", "status", "extra"),
    ),
    # empty namespace segment: namespace "" and the tail is treated as a (cluster-looking) resource
    ("GET", "/api/v1/namespaces//pods", "list", "api", "", "v1", "", "pods", "", "", ("pods",)),
    # --- watch via query, several spellings (Convert_Slice_string_To_bool) ---
    ("GET", "/api/v1/pods?watch=", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch=yes", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch=no", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch=TRUE", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch=FaLsE", "list", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch=00", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch=false&watch=true", "list", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch=true&watch=false", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/pods?watch=+", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("HEAD", "/api/v1/pods?watch=1", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    # a semicolon makes Go drop the whole pair, so this is a list
    ("GET", "/api/v1/pods?watch=1;x=y", "list", "api", "", "v1", "", "pods", "", "", ("pods",)),
    # watch on a named object is a plain get (watch is only consulted without a name)
    ("GET", "/api/v1/namespaces/ns/pods/p?watch=1", "get", "api", "", "v1", "ns", "pods", "", "p", ("pods", "p")),
    # --- deprecated path forms ---
    (
        "GET",
        "/api/v1/watch/namespaces/ns/pods/p",
        "watch",
        "api",
        "",
        "v1",
        "ns",
        "pods",
        "",
        "p",
        ("pods", "p"),
    ),
    ("POST", "/api/v1/watch/pods", "watch", "api", "", "v1", "", "pods", "", "", ("pods",)),
    (
        "GET",
        "/apis/apps/v1/watch/namespaces/ns/deployments?watch=false",
        "watch",
        "apis",
        "apps",
        "v1",
        "ns",
        "deployments",
        "",
        "",
        ("deployments",),
    ),
    ("GET", "/api/v1/proxy/nodes/n1/stats", "proxy", "api", "", "v1", "", "nodes", "", "n1", ("nodes", "n1", "stats")),
    # --- trailing and doubled slashes (strings.Trim + strings.Split) ---
    ("GET", "/api/v1/pods/", "list", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "//api/v1/pods//", "list", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("GET", "/api/v1/namespaces/ns/pods/p/", "get", "api", "", "v1", "ns", "pods", "", "p", ("pods", "p")),
    ("GET", "/api//pods", "list", "api", "", "", "", "pods", "", "", ("pods",)),
    # an empty name segment still counts as "no name": a GET becomes a list, subresource and all
    ("GET", "/api/v1/pods//x", "list", "api", "", "v1", "", "pods", "x", "", ("pods", "", "x")),
    # --- percent-decoding happens before splitting ---
    ("GET", "/api/v1/namespaces/a%2Fb/pods", "get", "api", "", "v1", "a", "b", "", "pods", ("b", "pods")),
    ("GET", "/api/v1/namespaces/ns/pods/a%20b", "get", "api", "", "v1", "ns", "pods", "", "a b", ("pods", "a b")),
    ("GET", "/api/v1/namespaces/ns/pods/a+b", "get", "api", "", "v1", "ns", "pods", "", "a+b", ("pods", "a+b")),
    # --- methods ---
    ("OPTIONS", "/api/v1/pods", "", "api", "", "v1", "", "pods", "", "", ("pods",)),
    ("get", "/api/v1/pods", "", "api", "", "v1", "", "pods", "", "", ("pods",)),
    (
        "CONNECT",
        "/api/v1/namespaces/ns/pods/p/exec",
        "",
        "api",
        "",
        "v1",
        "ns",
        "pods",
        "exec",
        "p",
        ("pods", "p", "exec"),
    ),
]


@pytest.mark.parametrize(
    ("method", "target", "verb", "prefix", "group", "version", "namespace", "resource", "sub", "name", "parts"),
    RESOURCE_CASES,
    ids=[f"{c[0]} {c[1]}" for c in RESOURCE_CASES],
)
def test_resource_requests(
    method: str,
    target: str,
    verb: str,
    prefix: str,
    group: str,
    version: str,
    namespace: str,
    resource: str,
    sub: str,
    name: str,
    parts: tuple[str, ...],
) -> None:
    info = request_info_from_target(method, target)
    expected = RequestInfo(
        path=unescape_path(target.partition("?")[0]),
        verb=verb,
        is_resource_request=True,
        api_prefix=prefix,
        api_group=group,
        api_version=version,
        namespace=namespace,
        resource=resource,
        subresource=sub,
        name=name,
        parts=parts,
    )
    assert dataclasses.replace(info, field_selector="", label_selector="") == expected


NON_RESOURCE_PATHS = [
    "",
    "/",
    "/version",
    "/healthz",
    "/readyz/etcd",
    "/livez",
    "/metrics",
    "/openapi/v2",
    "/openapi/v3/apis/apps/v1",
    "/api",
    "/api/",
    "/api/v1",
    "/api/v1/",
    "/apis",
    "/apis/apps",
    "/apis/apps/v1",
    "/apis/apps/v1/",
    "/apis/extensions/v1beta1",
    "/badprefix/version/resource",
    "/not-api/version/resource",
    "/Api/v1/pods",
    "/.well-known/openid-configuration",
    "/openid/v1/jwks",
]


@pytest.mark.parametrize("path", NON_RESOURCE_PATHS)
@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "Delete"])
def test_non_resource_requests(method: str, path: str) -> None:
    info = parse_request_info(method, path, "watch=1")
    assert info == RequestInfo(path=path, verb=method.lower(), is_resource_request=False)
    assert info.parts == ()
    assert not info.is_watch


def test_upstream_non_api_classification() -> None:
    """upstream TestGetNonAPIRequestInfo."""
    cases = {
        "/api/version/resource": True,
        "/apis/group/version/resource/name/subresource": True,
        "/api/version/resource/name/subresource": True,
        "/apis/batch/v1/job": True,
        "/apis/batch/v1/job/foo": True,
        "/apis/batch/v1/job/foo/scale": True,
        "/not-api/version/resource": False,
        "/apis/extensions/v1beta1": False,
        "/apis/extensions/v1beta1/": False,
        "/api/version": False,
        "/api": False,
        "/": False,
        "": False,
        "/apis/version/resource": False,
    }
    for path, expected in cases.items():
        assert parse_request_info("GET", path).is_resource_request is expected, path


@pytest.mark.parametrize("target", ["/api/v1/watch", "/api/v1/proxy/", "/apis/apps/v1/watch", "/apis/g/v1/proxy//"])
def test_special_verb_without_resource_is_an_error(target: str) -> None:
    with pytest.raises(RequestInfoError, match="unable to determine kind and namespace from url") as exc:
        request_info_from_target("GET", target)
    info = exc.value.info
    assert info.is_resource_request
    assert info.verb == "get"  # still the lower-cased method: Go fails before mapping the verb
    assert info.resource == ""
    assert info.parts == ()


# --- list vs watch and the fieldSelector name (upstream TestSelectorParsing + decode-failure cases) ---

SELECTOR_CASES: list[tuple[str, str, str, str, str, str]] = [
    # (method, target, verb, name, fieldSelector, labelSelector)
    ("GET", "/apis/group/version/resource", "list", "", "", ""),
    (
        "GET",
        "/apis/group/version/resource?fieldSelector=metadata.name=name1",
        "list",
        "name1",
        "metadata.name=name1",
        "",
    ),
    (
        "GET",
        "/apis/group/version/resource?watch=true&fieldSelector=metadata.name=name1",
        "watch",
        "name1",
        "metadata.name=name1",
        "",
    ),
    (
        "GET",
        "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux",
        "list",
        "",
        "foo=bar",
        "baz=qux",
    ),
    (
        "GET",
        "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo",
        "list",
        "",
        "metadata.name=name1,foo",
        "",
    ),
    (
        "GET",
        "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=true",
        "watch",
        "",
        "metadata.name=name1,foo",
        "",
    ),
    (
        "GET",
        "/apis/group/version/resource?fieldSelector=metadata.name=name1,foo&watch=false",
        "list",
        "",
        "metadata.name=name1,foo",
        "",
    ),
    (
        "DELETE",
        "/apis/group/version/resource?fieldSelector=foo=bar&labelSelector=baz=qux",
        "deletecollection",
        "",
        "foo=bar",
        "baz=qux",
    ),
    (
        "GET",
        "/apis/group/version/resource?fieldSelector=metadata.name=foo&fieldSelector=metadata.name=bar"
        "&labelSelector=foo=bar&labelSelector=foo=baz",
        "list",
        "foo",
        "metadata.name=foo",
        "foo=bar",
    ),
    ("GET", "/apis/group/version/resource/name?fieldSelector=foo=bar&labelSelector=foo=bar", "get", "name", "", ""),
    (
        "GET",
        "/apis/group/version/watch/resource?fieldSelector=metadata.name=foo&labelSelector=foo=bar",
        "watch",
        "",
        "",
        "",
    ),
    (
        "GET",
        "/apis/group/version/watch/resource/name?fieldSelector=metadata.name=foo&labelSelector=foo=bar",
        "watch",
        "name",
        "",
        "",
    ),
    # --- gateway additions ---
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3D%3Dp1", "list", "p1", "metadata.name==p1", ""),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name!%3Dp1", "list", "", "metadata.name!=p1", ""),
    # terms are sorted before the first exact match wins
    (
        "GET",
        "/api/v1/pods?fieldSelector=metadata.name%3Db,metadata.name%3Da",
        "list",
        "a",
        "metadata.name=b,metadata.name=a",
        "",
    ),
    (
        "GET",
        "/api/v1/pods?fieldSelector=metadata.namespace%3Dns,metadata.name%3Dp",
        "list",
        "p",
        "metadata.namespace=ns,metadata.name=p",
        "",
    ),
    # an escaped comma is part of the value; only "/", "%", "." and ".." make a name unusable
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Da%5C,b", "list", "a,b", "metadata.name=a\\,b", ""),
    # names that are not valid path segments are ignored
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3D..", "list", "", "metadata.name=..", ""),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Da%2Fb", "list", "", "metadata.name=a/b", ""),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Da%25b", "list", "", "metadata.name=a%b", ""),
    # spaces are not trimmed from the field name
    ("GET", "/api/v1/pods?fieldSelector=metadata.name+%3Dp", "list", "", "metadata.name =p", ""),
    # any list option that fails to decode drops the selector name
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Dp&limit=abc", "list", "", "metadata.name=p", ""),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Dp&limit=", "list", "", "metadata.name=p", ""),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Dp&limit=-5", "list", "p", "metadata.name=p", ""),
    (
        "GET",
        "/api/v1/pods?fieldSelector=metadata.name%3Dp&limit=9223372036854775808",
        "list",
        "",
        "metadata.name=p",
        "",
    ),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Dp&timeoutSeconds=1.5", "list", "", "metadata.name=p", ""),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Dp&timeoutSeconds=+30", "list", "", "metadata.name=p", ""),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Dp&timeoutSeconds=%2B30", "list", "p", "metadata.name=p", ""),
    (
        "GET",
        "/api/v1/pods?fieldSelector=metadata.name%3Dp&labelSelector=a+in+(b",
        "list",
        "",
        "metadata.name=p",
        "a in (b",
    ),
    (
        "GET",
        "/api/v1/pods?fieldSelector=metadata.name%3Dp&labelSelector=app+in+(a,b),!beta,tier%3Dweb",
        "list",
        "p",
        "metadata.name=p",
        "app in (a,b),!beta,tier=web",
    ),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Dp&labelSelector=x%3E-1", "list", "", "metadata.name=p", "x>-1"),
    (
        "GET",
        "/api/v1/pods?fieldSelector=metadata.name%3Dp&labelSelector=Bad_Key%2F",
        "list",
        "",
        "metadata.name=p",
        "Bad_Key/",
    ),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3Dp&watch=1&limit=x", "watch", "", "metadata.name=p", ""),
    # continue / resourceVersion never fail to decode
    (
        "GET",
        "/api/v1/pods?fieldSelector=metadata.name%3Dp&resourceVersion=abc&continue=%25&allowWatchBookmarks=x",
        "list",
        "p",
        "metadata.name=p",
        "",
    ),
]


@pytest.mark.parametrize(
    ("method", "target", "verb", "name", "field_selector", "label_selector"),
    SELECTOR_CASES,
    ids=[f"{c[0]} {c[1]}" for c in SELECTOR_CASES],
)
def test_list_watch_and_selectors(
    method: str, target: str, verb: str, name: str, field_selector: str, label_selector: str
) -> None:
    info = request_info_from_target(method, target)
    assert (info.verb, info.name, info.field_selector, info.label_selector) == (
        verb,
        name,
        field_selector,
        label_selector,
    )


def test_watch_false_uses_unicode_case_folding_only_when_decode_succeeds() -> None:
    """EqualFold("fal\\u017fe", "false") is true in the codec; the decode-error fallback uses ToLower."""
    assert request_info_from_target("GET", "/api/v1/pods?watch=fal%C5%BFe").verb == "list"
    assert request_info_from_target("GET", "/api/v1/pods?watch=FAL%C5%BFE").verb == "list"
    assert request_info_from_target("GET", "/api/v1/pods?watch=fal%C5%BFe&limit=x").verb == "watch"
    assert request_info_from_target("GET", "/api/v1/pods?watch=FALSE&limit=x").verb == "list"


@pytest.mark.parametrize(
    "query",
    [
        {"watch": "yes", "fieldSelector": "metadata.name=p"},
        MultiDictProxy(MultiDict([("watch", "yes"), ("watch", "false"), ("fieldSelector", "metadata.name=p")])),
        "watch=yes&watch=false&fieldSelector=metadata.name%3Dp",
    ],
    ids=["dict", "multidict", "raw"],
)
def test_query_argument_forms(query: object) -> None:
    info = parse_request_info("GET", "/api/v1/namespaces/ns/pods", query)  # type: ignore[arg-type]
    assert (info.verb, info.name, info.namespace, info.field_selector) == ("watch", "p", "ns", "metadata.name=p")


def test_query_not_needed_for_named_requests() -> None:
    class Exploding(dict[str, str]):
        def get(self, *args: object, **kwargs: object) -> str | None:  # type: ignore[override]
            raise AssertionError("query must not be consulted")

    assert parse_request_info("GET", "/api/v1/namespaces/ns/pods/p", Exploding()).verb == "get"
    assert parse_request_info("PUT", "/api/v1/namespaces/ns/pods/p", Exploding()).verb == "update"


# --- convenience properties ---


def test_group_resource() -> None:
    assert parse_request_info("GET", "/apis/apps/v1/namespaces/ns/deployments").group_resource == "deployments.apps"
    assert parse_request_info("GET", "/api/v1/pods").group_resource == "pods"
    assert parse_request_info("GET", "/healthz").group_resource == ""


@pytest.mark.parametrize(
    ("method", "path", "mutating"),
    [
        ("POST", "/api/v1/namespaces/ns/pods", True),
        ("PUT", "/api/v1/namespaces/ns/pods/p", True),
        ("PATCH", "/api/v1/namespaces/ns/pods/p", True),
        ("DELETE", "/api/v1/namespaces/ns/pods/p", True),
        ("DELETE", "/api/v1/namespaces/ns/pods", True),
        ("GET", "/api/v1/namespaces/ns/pods/p", False),
        ("GET", "/api/v1/namespaces/ns/pods", False),
        ("GET", "/api/v1/watch/pods", False),
        ("POST", "/healthz", False),
        ("OPTIONS", "/api/v1/pods", False),
    ],
)
def test_is_mutating(method: str, path: str, mutating: bool) -> None:
    assert parse_request_info(method, path).is_mutating is mutating


@pytest.mark.parametrize(
    ("method", "path", "connect"),
    [
        ("POST", "/api/v1/namespaces/ns/pods/p/exec", True),
        ("GET", "/api/v1/namespaces/ns/pods/p/exec", True),
        ("POST", "/api/v1/namespaces/ns/pods/p/attach", True),
        ("POST", "/api/v1/namespaces/ns/pods/p/portforward", True),
        ("GET", "/api/v1/namespaces/ns/pods/p/proxy/some/path", True),
        ("GET", "/api/v1/namespaces/ns/services/s/proxy", True),
        ("GET", "/api/v1/nodes/n/proxy/metrics", True),
        ("GET", "/api/v1/namespaces/ns/pods/p/log", False),
        ("POST", "/api/v1/namespaces/ns/pods/p/eviction", False),
        ("GET", "/api/v1/namespaces/ns/services/s/status", False),
        ("GET", "/apis/example.com/v1/namespaces/ns/pods/p/exec", False),
        ("GET", "/api/v1/proxy/namespaces/ns/pods/p", False),
        ("GET", "/api/v1/namespaces/ns/configmaps/c/proxy", False),
        ("GET", "/proxy/exec", False),
    ],
)
def test_is_connect(method: str, path: str, connect: bool) -> None:
    assert parse_request_info(method, path).is_connect is connect


@pytest.mark.parametrize(
    ("path", "in_path", "name_in_path"),
    [
        ("/api/v1/namespaces/x", False, True),  # the Namespace x: RequestInfo's namespace is its name
        ("/api/v1/namespaces/x/status", False, True),
        ("/api/v1/namespaces/x/namespaces/x", True, True),  # no such route: namespaces are cluster-scoped
        ("/api/v1/namespaces/x/namespaces", True, False),
        ("/api/v1/namespaces", False, False),
        ("/api/v1/namespaces/x/pods", True, False),
        ("/api/v1/namespaces/x/pods/p/log", True, True),
        ("/api/v1/pods/p", False, True),
        ("/api/v1/watch/namespaces/x/pods/p", True, True),
        ("/api/v1/watch/namespaces/x", False, True),
        ("/apis/apps/v1/namespaces/x/deployments", True, False),
        ("/apis/apps/v1/namespaces/deployments", False, True),  # the group's resource "namespaces", named
        ("/apis/apps/v1/deployments", False, False),
        ("/version", False, False),
    ],
)
def test_namespace_and_name_in_path(path: str, in_path: bool, name_in_path: bool) -> None:
    """Which routes the installer registers (installer.go): ``namespaces/{ns}/{resource}`` for
    namespaced resources only; RequestInfo's namespace alone cannot tell them apart."""
    info = parse_request_info("GET", path)
    assert (info.namespace_in_path, info.name_in_path) == (in_path, name_in_path)


def test_is_watch() -> None:
    assert parse_request_info("GET", "/api/v1/pods", {"watch": "1"}).is_watch
    assert parse_request_info("GET", "/api/v1/watch/pods").is_watch
    assert not parse_request_info("GET", "/api/v1/pods").is_watch


def test_request_info_is_frozen_and_slotted() -> None:
    info = parse_request_info("GET", "/api/v1/pods")
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.verb = "watch"  # type: ignore[misc]
    assert not hasattr(info, "__dict__")


# --- Go net/url decoding ---


def test_unescape_path_matches_go() -> None:
    assert unescape_path("/a%2Fb") == "/a/b"
    assert unescape_path("/a+b%20c") == "/a+b c"
    assert unescape_path("/%C3%A9") == "/é"
    assert unescape_path("/é%C3%A9") == "/éé"
    # not UTF-8: kept byte-exact as a surrogate escape
    assert unescape_path("/%FF").encode("utf-8", "surrogateescape") == b"/\xff"
    for bad in ("/%", "/%4", "/%zz", "/a%G1"):
        with pytest.raises(InvalidRequestURIError):
            unescape_path(bad)


def test_parse_query_matches_go() -> None:
    assert parse_query("") == {}
    assert parse_query("a=1&a=2&b=%zz&c=x+y&d;e=1&=v&f&&g=%41") == {"a": "1", "c": "x y", "": "v", "f": "", "g": "A"}
    assert parse_query("k=a=b") == {"k": "a=b"}


@pytest.mark.parametrize(
    "target", ["/api/v1/pods\x7f", "/api/v1/\npods", "api/v1/pods", "http://h:x/api/v1/pods", "/x%zz"]
)
def test_request_target_rejected_like_go(target: str) -> None:
    with pytest.raises(InvalidRequestURIError):
        request_info_from_target("GET", target)


def test_request_target_forms() -> None:
    # absolute form: Go's server routes it by its path, whatever the scheme and host
    absolute = request_info_from_target("POST", "http://x/api/v1/namespaces/dry-a/configmaps")
    assert (absolute.verb, absolute.namespace, absolute.resource) == ("create", "dry-a", "configmaps")
    assert request_info_from_target("OPTIONS", "*") == RequestInfo(path="*", verb="options", is_resource_request=False)
    # "?" as the only question mark and last character: ForceQuery with an empty query
    assert request_info_from_target("GET", "/api/v1/pods?").verb == "list"
    assert request_info_from_target("GET", "/api/v1/pods?a?b").path == "/api/v1/pods"
