"""The malformed requests ``test_full_chain_python.py`` sends through the whole chain and straight
to the apiserver: one table, each row a request whose answers must be the same."""

from __future__ import annotations

from dataclasses import dataclass

from full_chain import JSON, PROTOBUF, YAML

BIG = 3 * 1024 * 1024  # the apiserver's and kproxy's default max_request_body_bytes


@dataclass(frozen=True)
class Bad:
    """One malformed request, sent through kproxy and straight to the apiserver."""

    id: str
    method: str
    path: str  # {ns} is the namespace
    query: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes | None = None
    ns: str = "plain"  # plain | dry | strict: which policy namespace the request is in
    watch: bool = False  # a stream: read what arrives within a few seconds
    #: The apiserver itself races here (a watch with timeoutSeconds=-1 ends at once, sometimes
    #: after its first event): the first line may be that event or nothing, on either side.
    racy_first_event: bool = False


CM = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"new"},"data":{"a":"1"}}'
J = (("Content-Type", JSON),)
BAD: list[Bad] = [
    Bad("post-malformed-json", "POST", "/api/v1/namespaces/{ns}/configmaps", headers=J, body=CM[:40].encode()),
    Bad(
        "post-malformed-json-strict", "POST", "/api/v1/namespaces/{ns}/configmaps", headers=J, body=b"{,}", ns="strict"
    ),
    Bad("post-malformed-json-dry", "POST", "/api/v1/namespaces/{ns}/configmaps", headers=J, body=b"[1,", ns="dry"),
    Bad("post-json-wrong-type", "POST", "/api/v1/namespaces/{ns}/configmaps", headers=J, body=b'{"data":[1]}'),
    Bad(
        "post-malformed-yaml",
        "POST",
        "/api/v1/namespaces/{ns}/configmaps",
        headers=(("Content-Type", YAML),),
        body=b"apiVersion: v1\nkind: ConfigMap\nmetadata: [name: x\n",
    ),
    Bad(
        "post-yaml-tab-strict",
        "POST",
        "/api/v1/namespaces/{ns}/configmaps",
        headers=(("Content-Type", YAML),),
        body=b"apiVersion: v1\n\tkind: ConfigMap\n",
        ns="strict",
    ),
    Bad(
        "post-not-protobuf",
        "POST",
        "/api/v1/namespaces/{ns}/configmaps",
        headers=(("Content-Type", PROTOBUF),),
        body=b"this is not protobuf",
    ),
    Bad(
        "post-protobuf-garbage-after-magic",
        "POST",
        "/api/v1/namespaces/{ns}/pods",
        headers=(("Content-Type", PROTOBUF), ("Accept", PROTOBUF)),
        body=b"k8s\x00\x0a\xff\xff\xff\x0f",
    ),
    Bad(
        "post-wrong-content-type",
        "POST",
        "/api/v1/namespaces/{ns}/configmaps",
        headers=(("Content-Type", "text/plain"),),
        body=CM.encode(),
    ),
    Bad(
        "post-no-content-type",
        "POST",
        "/api/v1/namespaces/{ns}/configmaps",
        query=(("dryRun", "All"),),
        body=CM.encode(),
    ),
    Bad("put-malformed-json", "PUT", "/api/v1/namespaces/{ns}/configmaps/x", headers=J, body=b'{"kind":'),
    Bad("put-empty-body", "PUT", "/api/v1/namespaces/{ns}/configmaps/x", headers=J, body=b""),
    Bad("patch-content-type-json", "PATCH", "/api/v1/namespaces/{ns}/configmaps/x", headers=J, body=b"{}"),
    Bad("patch-no-content-type", "PATCH", "/api/v1/namespaces/{ns}/configmaps/x", body=b'{"data":{"b":"2"}}'),
    Bad(
        "patch-unsupported-type",
        "PATCH",
        "/api/v1/namespaces/{ns}/configmaps/x",
        headers=(("Content-Type", "application/apply-patch+cbor"),),
        body=b"\xa0",
    ),
    Bad(
        "patch-unknown-type",
        "PATCH",
        "/api/v1/namespaces/{ns}/pods/p",
        headers=(("Content-Type", "application/x-kproxy-patch"),),
        body=b"{}",
        ns="dry",
    ),
    Bad(
        "patch-malformed-merge",
        "PATCH",
        "/api/v1/namespaces/{ns}/configmaps/x",
        headers=(("Content-Type", "application/merge-patch+json"),),
        body=b'{"data":',
    ),
    Bad(
        "patch-json-patch-not-a-list",
        "PATCH",
        "/api/v1/namespaces/{ns}/configmaps/x",
        headers=(("Content-Type", "application/json-patch+json"),),
        body=b'{"op":"add"}',
        ns="strict",
    ),
    Bad(
        "post-oversized",
        "POST",
        "/api/v1/namespaces/{ns}/configmaps",
        headers=J,
        body=b'{"data":{"a":"' + b"x" * BIG + b'"}}',
    ),
    Bad(
        "patch-oversized",
        "PATCH",
        "/api/v1/namespaces/{ns}/configmaps/x",
        headers=(("Content-Type", "application/merge-patch+json"),),
        body=b'{"data":{"a":"' + b"x" * BIG + b'"}}',
        ns="dry",
    ),
    Bad("delete-malformed-body", "DELETE", "/api/v1/namespaces/{ns}/configmaps/x", headers=J, body=b"{nope"),
    Bad(
        "delete-malformed-body-dry",
        "DELETE",
        "/api/v1/namespaces/{ns}/configmaps/x",
        headers=J,
        body=b"{nope",
        ns="dry",
    ),
    Bad("list-unknown-query", "GET", "/api/v1/namespaces/{ns}/pods", query=(("foo", "bar"), ("labelSelector", "a=b"))),
    Bad(
        "post-unknown-query",
        "POST",
        "/api/v1/namespaces/{ns}/configmaps",
        query=(("foo", "bar"), ("dryRun", "All")),
        headers=J,
        body=CM.encode(),
    ),
    Bad(
        "watch-unknown-query",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("watch", "1"), ("foo", "bar"), ("resourceVersion", "0"), ("timeoutSeconds", "2")),
        watch=True,
    ),
    Bad(
        "watch-limit-negative",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("watch", "1"), ("limit", "-5"), ("resourceVersion", "0"), ("timeoutSeconds", "2")),
        watch=True,
    ),
    Bad("list-rv-abc", "GET", "/api/v1/namespaces/{ns}/pods", query=(("resourceVersion", "abc"),)),
    Bad("list-timeout-negative", "GET", "/api/v1/namespaces/{ns}/configmaps", query=(("timeoutSeconds", "-1"),)),
    Bad("list-limit-negative", "GET", "/api/v1/namespaces/{ns}/pods", query=(("limit", "-5"),)),
    Bad(
        "list-limit-negative-rv0",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("limit", "-5"), ("resourceVersion", "0")),
    ),
    Bad("list-label-selector-invalid", "GET", "/api/v1/namespaces/{ns}/pods", query=(("labelSelector", "app=("),)),
    Bad("list-label-selector-spaces", "GET", "/api/v1/namespaces/{ns}/configmaps", query=(("labelSelector", "a b c"),)),
    Bad("list-field-selector-unknown", "GET", "/api/v1/namespaces/{ns}/pods", query=(("fieldSelector", "spec.foo=x"),)),
    Bad(
        "list-field-selector-no-op", "GET", "/api/v1/namespaces/{ns}/pods", query=(("fieldSelector", "metadata.name"),)
    ),
    Bad(
        "list-field-selector-cm-data",
        "GET",
        "/api/v1/namespaces/{ns}/configmaps",
        query=(("fieldSelector", "data.a=1"),),
    ),
    Bad(
        "list-rvm-bogus",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("resourceVersion", "1"), ("resourceVersionMatch", "Bogus")),
    ),
    Bad(
        "list-rvm-without-rv", "GET", "/api/v1/namespaces/{ns}/pods", query=(("resourceVersionMatch", "NotOlderThan"),)
    ),
    Bad(
        "list-continue-garbage",
        "GET",
        "/api/v1/namespaces/{ns}/configmaps",
        query=(("limit", "1"), ("continue", "garbage")),
    ),
    Bad("get-accept-html", "GET", "/api/v1/namespaces/{ns}/configmaps/x", headers=(("Accept", "text/html"),)),
    Bad(
        "list-accept-unknown-as",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        headers=(("Accept", "application/json;as=Bogus;g=x;v=y"),),
    ),
    Bad("list-accept-image", "GET", "/api/v1/namespaces/{ns}/pods", headers=(("Accept", "image/png"),)),
    Bad(
        "watch-accept-yaml",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("watch", "1"),),
        headers=(("Accept", YAML),),
        watch=True,
    ),
    Bad(
        "watch-rv-abc",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("watch", "1"), ("resourceVersion", "abc")),
        watch=True,
    ),
    Bad(
        "watch-timeout-negative",
        "GET",
        "/api/v1/namespaces/{ns}/configmaps",
        query=(("watch", "1"), ("timeoutSeconds", "-1"), ("resourceVersion", "0")),
        watch=True,
        racy_first_event=True,
    ),
    Bad(
        "watch-label-selector-invalid",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("watch", "1"), ("labelSelector", "app=(")),
        watch=True,
    ),
    Bad(
        "watch-field-selector-unknown",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("watch", "1"), ("fieldSelector", "spec.foo=x")),
        watch=True,
    ),
    Bad(
        "watch-rvm-exact",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("watch", "1"), ("resourceVersion", "1"), ("resourceVersionMatch", "Exact")),
        watch=True,
    ),
    Bad(
        "watch-rvm-without-rv",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("watch", "1"), ("resourceVersionMatch", "NotOlderThan")),
        watch=True,
    ),
    Bad(
        "watch-initial-events-without-rvm",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(("watch", "1"), ("sendInitialEvents", "true")),
        watch=True,
    ),
    Bad(
        "watch-initial-events-rvm-exact",
        "GET",
        "/api/v1/namespaces/{ns}/pods",
        query=(
            ("watch", "1"),
            ("sendInitialEvents", "true"),
            ("resourceVersionMatch", "Exact"),
            ("resourceVersion", "0"),
        ),
        watch=True,
    ),
]
