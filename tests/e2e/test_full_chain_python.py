"""Every built-in filter in one chain, driven by the official Python client and by bad input.

The chain is the one users run (compression with watches, transcode to protobuf, dryrun enforcing
in ``dry-*`` namespaces, validation Strict in ``strict-*`` and Warn elsewhere, the watch cache for
pods and configmaps), over TLS with ``credentials: forward``. Each answer through kproxy is
compared with the apiserver's own answer to the same request, made with the same token.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

import pytest
import urllib3
import yaml
from backports import zstd
from full_chain import (
    DRY_RULE,
    JSON,
    ORDERS,
    PROTOBUF,
    YAML,
    Raw,
    Side,
    api_client,
    drop_namespace,
    make_namespace,
    plain,
    watch_lines,
    without,
)
from full_chain_bad import BAD, Bad
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from watchcache_diff import reads_total

from kproxy.codec import ProtobufCodec
from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.eventually import eventually
from kproxy.testing.proxyproc import RunningProxy, start_proxy

# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", params=list(ORDERS))
def chain(
    request: pytest.FixtureRequest, control_plane: ControlPlaneInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningProxy]:
    """kproxy with every built-in filter, in each of the two orders the docs show."""
    rp = start_proxy(
        tmp_path_factory.mktemp("kproxy-full-chain"),
        control_plane.admin_kubeconfig,
        credentials="forward",
        tls=True,
        extra={"filters": ORDERS[request.param]},
    )
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def sides(control_plane: ControlPlaneInfo, chain: RunningProxy) -> tuple[Side, Side]:
    """(straight to the apiserver, through kproxy), both as the admin token's user."""
    assert chain.ca_file is not None
    return (
        Side(control_plane.server, control_plane.ca_file, control_plane.admin_token),
        Side(chain.url, chain.ca_file, control_plane.admin_token),
    )


@pytest.fixture(scope="module")
def apis(control_plane: ControlPlaneInfo, chain: RunningProxy) -> Iterator[tuple[client.CoreV1Api, client.CoreV1Api]]:
    """The official client (direct, through kproxy), both with the admin token."""
    assert chain.ca_file is not None
    direct = api_client(control_plane.server, control_plane.ca_file, control_plane.admin_token)
    proxied = api_client(chain.url, chain.ca_file, control_plane.admin_token)
    with direct, proxied:
        yield client.CoreV1Api(direct), client.CoreV1Api(proxied)


@pytest.fixture(scope="module")
def dry_ns(control_plane: ControlPlaneInfo, chain: RunningProxy) -> Iterator[str]:
    name = make_namespace(control_plane, "dry-fc")
    yield name
    drop_namespace(control_plane, name)


@pytest.fixture(scope="module")
def strict_ns(control_plane: ControlPlaneInfo, chain: RunningProxy) -> Iterator[str]:
    name = make_namespace(control_plane, "strict-fc")
    yield name
    drop_namespace(control_plane, name)


@pytest.fixture(scope="module")
def plain_ns(control_plane: ControlPlaneInfo, chain: RunningProxy) -> Iterator[str]:
    name = make_namespace(control_plane, "fc")
    yield name
    drop_namespace(control_plane, name)


def _cm(name: str, data: dict[str, str] | None = None, labels: dict[str, str] | None = None) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels), data=data)


def _pod(name: str, labels: dict[str, str] | None = None, node: str | None = None) -> client.V1Pod:
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1PodSpec(
            containers=[client.V1Container(name="c", image="registry.example/app:1")],
            node_name=node,
            restart_policy="Never",
        ),
    )


def _served_from_cache(rp: RunningProxy, resource: str, verb: str = "list") -> float:
    return reads_total(rp.metrics(), resource=resource, verb=verb, served="cache")


# --------------------------------------------------------------------------- CRUD with the Python client


def test_configmap_crud_every_patch_type(apis: tuple[client.CoreV1Api, client.CoreV1Api], plain_ns: str) -> None:
    """create, read, replace, merge/strategic/json-patch/apply patches and delete of a ConfigMap through
    the whole chain: each answer is the object the apiserver then holds."""
    direct, proxied = apis
    ns = plain_ns
    created = proxied.create_namespaced_config_map(ns, _cm("crud", {"a": "1"}, {"app": "x"}))
    assert created.metadata.uid and created.data == {"a": "1"}

    def stored() -> Any:
        return plain(direct.api_client, direct.read_namespaced_config_map("crud", ns))

    assert plain(proxied.api_client, proxied.read_namespaced_config_map("crud", ns)) == stored()
    assert plain(proxied.api_client, created) == stored()

    got = proxied.read_namespaced_config_map("crud", ns)
    got.data = {"a": "2", "b": "3"}
    replaced = proxied.replace_namespaced_config_map("crud", ns, got)
    assert replaced.data == {"a": "2", "b": "3"}
    assert plain(proxied.api_client, replaced) == stored()

    merged = proxied.patch_namespaced_config_map(
        "crud", ns, {"data": {"b": None, "c": "4"}}, _content_type="application/merge-patch+json"
    )
    assert merged.data == {"a": "2", "c": "4"}
    assert plain(proxied.api_client, merged) == stored()

    strategic = proxied.patch_namespaced_config_map("crud", ns, {"metadata": {"labels": {"tier": "t"}}})
    assert strategic.metadata.labels == {"app": "x", "tier": "t"}
    assert plain(proxied.api_client, strategic) == stored()

    jp = proxied.patch_namespaced_config_map(
        "crud",
        ns,
        [{"op": "replace", "path": "/data/a", "value": "json-patch"}, {"op": "remove", "path": "/data/c"}],
    )
    assert jp.data == {"a": "json-patch"}
    assert plain(proxied.api_client, jp) == stored()

    applied = proxied.patch_namespaced_config_map(
        "crud",
        ns,
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "crud"}, "data": {"applied": "yes"}},
        field_manager="full-chain-test",
        force=True,
        _content_type="application/apply-patch+yaml",
    )
    assert applied.data == {"a": "json-patch", "applied": "yes"}
    managers = {m.manager: m.operation for m in applied.metadata.managed_fields}
    assert managers.get("full-chain-test") == "Apply", managers
    assert plain(proxied.api_client, applied) == stored()

    status = proxied.delete_namespaced_config_map("crud", ns)
    assert plain(proxied.api_client, status)["status"] == "Success"
    errors = []
    for api in (direct, proxied):
        with pytest.raises(ApiException) as err:
            api.read_namespaced_config_map("crud", ns)
        errors.append((err.value.status, err.value.reason, err.value.body))
    assert errors[1] == errors[0]
    assert errors[0][0] == 404


def test_pod_crud_every_patch_type(apis: tuple[client.CoreV1Api, client.CoreV1Api], plain_ns: str) -> None:
    """The same for a Pod (defaulted by the apiserver, protobuf-transcoded on the way back)."""
    direct, proxied = apis
    ns = plain_ns
    created = proxied.create_namespaced_pod(ns, _pod("crud-pod", {"app": "web"}))
    assert created.spec.containers[0].image == "registry.example/app:1"
    assert created.spec.dns_policy == "ClusterFirst"  # defaulted by the apiserver, back through transcode

    def stored() -> Any:
        return plain(direct.api_client, direct.read_namespaced_pod("crud-pod", ns))

    assert plain(proxied.api_client, created) == stored()
    assert plain(proxied.api_client, proxied.read_namespaced_pod("crud-pod", ns)) == stored()

    got = proxied.read_namespaced_pod("crud-pod", ns)
    got.metadata.annotations = {"replaced": "1"}
    assert plain(proxied.api_client, proxied.replace_namespaced_pod("crud-pod", ns, got)) == stored()

    strategic = proxied.patch_namespaced_pod(
        "crud-pod", ns, {"spec": {"containers": [{"name": "c", "image": "registry.example/app:2"}]}}
    )
    assert strategic.spec.containers[0].image == "registry.example/app:2"
    assert plain(proxied.api_client, strategic) == stored()

    merged = proxied.patch_namespaced_pod(
        "crud-pod", ns, {"metadata": {"labels": {"app": None, "m": "1"}}}, _content_type="application/merge-patch+json"
    )
    assert merged.metadata.labels == {"m": "1"}
    assert plain(proxied.api_client, merged) == stored()

    jp = proxied.patch_namespaced_pod("crud-pod", ns, [{"op": "add", "path": "/metadata/labels/jp", "value": "1"}])
    assert jp.metadata.labels == {"m": "1", "jp": "1"}
    assert plain(proxied.api_client, jp) == stored()

    applied = proxied.patch_namespaced_pod(
        "crud-pod",
        ns,
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "crud-pod", "labels": {"applied": "yes"}}},
        field_manager="full-chain-test",
        _content_type="application/apply-patch+yaml",
    )
    assert applied.metadata.labels == {"m": "1", "jp": "1", "applied": "yes"}
    assert plain(proxied.api_client, applied) == stored()

    deleted = proxied.delete_namespaced_pod("crud-pod", ns, grace_period_seconds=0)
    assert deleted.metadata.name == "crud-pod"
    with pytest.raises(ApiException) as err:
        direct.read_namespaced_pod("crud-pod", ns)
    assert err.value.status == 404


# --------------------------------------------------------------------------- lists from the cache


@pytest.fixture(scope="module")
def listed_ns(control_plane: ControlPlaneInfo, apis: tuple[client.CoreV1Api, client.CoreV1Api]) -> Iterator[str]:
    """A namespace of 17 pods and 13 configmaps with varied labels and fields, written directly."""
    direct, _ = apis
    ns = make_namespace(control_plane, "fc-list")
    for i in range(17):
        labels = {"app": ("web", "db", "cache")[i % 3]} if i % 4 else {"tier": "front"}
        direct.create_namespaced_pod(ns, _pod(f"p-{(i * 7) % 17:02d}", labels, ("node-a", None)[i % 2]))
    for i in range(13):
        direct.create_namespaced_config_map(ns, _cm(f"c-{(i * 5) % 13:02d}", {"i": str(i)}, {"n": str(i % 3)}))
    yield ns
    drop_namespace(control_plane, ns)


def _page_all(call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
    """Every page of a paginated list: the list of (items, remainingItemCount) per page."""
    pages: list[Any] = []
    token: str | None = None
    while True:
        result = call(*args, _continue=token, **kwargs) if token else call(*args, **kwargs)
        pages.append(result)
        token = result.metadata._continue
        if not token or len(pages) > 100:
            return pages


LIST_CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("pods", "list_namespaced_pod", {}),
    ("pods", "list_namespaced_pod", {"label_selector": "app in (web,db)"}),
    ("pods", "list_namespaced_pod", {"label_selector": "!app"}),
    ("pods", "list_namespaced_pod", {"field_selector": "spec.nodeName=node-a"}),
    ("pods", "list_namespaced_pod", {"field_selector": "spec.nodeName!=node-a,status.phase=Pending"}),
    ("pods", "list_namespaced_pod", {"label_selector": "app", "field_selector": "metadata.name!=p-03"}),
    ("pods", "list_namespaced_pod", {"resource_version": "0", "label_selector": "app=cache"}),
    ("configmaps", "list_namespaced_config_map", {"label_selector": "n=1"}),
    ("configmaps", "list_namespaced_config_map", {"field_selector": "metadata.name=c-04"}),
]


@pytest.mark.parametrize("resource,call,kwargs", LIST_CALLS, ids=[f"{c[1]}-{c[2]}" for c in LIST_CALLS])
def test_list_with_selectors_matches_apiserver(
    resource: str,
    call: str,
    kwargs: dict[str, Any],
    apis: tuple[client.CoreV1Api, client.CoreV1Api],
    chain: RunningProxy,
    listed_ns: str,
) -> None:
    """Label and field selectors: the same items, item for item, and the cache answered."""
    direct, proxied = apis
    before = _served_from_cache(chain, resource)
    earlier = getattr(direct, call)(listed_ns, **kwargs)
    got = getattr(proxied, call)(listed_ns, **kwargs)
    want = getattr(direct, call)(listed_ns, **kwargs)
    assert got.items, "the selector should match something in this population"
    assert plain(proxied.api_client, got.items) == plain(direct.api_client, want.items)
    assert (got.kind, got.api_version) == (want.kind, want.api_version)
    if "resource_version" not in kwargs:  # a consistent read: at the apiserver's revision then
        lo, hi = int(earlier.metadata.resource_version), int(want.metadata.resource_version)
        assert lo <= int(got.metadata.resource_version) <= hi
    assert _served_from_cache(chain, resource) - before == 1


PAGED: list[tuple[str, str, dict[str, Any]]] = [
    ("pods", "list_namespaced_pod", {"limit": 4}),
    ("pods", "list_namespaced_pod", {"limit": 3, "label_selector": "app"}),
    ("configmaps", "list_namespaced_config_map", {"limit": 5}),
    ("configmaps", "list_namespaced_config_map", {"limit": 2, "field_selector": "metadata.name!=c-00"}),
]


@pytest.mark.parametrize("resource,call,kwargs", PAGED, ids=[f"{c[1]}-{c[2]}" for c in PAGED])
def test_pagination_matches_apiserver(
    resource: str,
    call: str,
    kwargs: dict[str, Any],
    apis: tuple[client.CoreV1Api, client.CoreV1Api],
    chain: RunningProxy,
    listed_ns: str,
) -> None:
    """limit/_continue to the end: the same pages (items, remainingItemCount) as the apiserver's,
    every page answered by the cache."""
    direct, proxied = apis
    before = _served_from_cache(chain, resource)
    got = _page_all(getattr(proxied, call), listed_ns, **kwargs)
    want = _page_all(getattr(direct, call), listed_ns, **kwargs)
    assert len(got) == len(want) > 1
    for g, w in zip(got, want, strict=True):
        assert plain(proxied.api_client, g.items) == plain(direct.api_client, w.items)
        assert g.metadata.remaining_item_count == w.metadata.remaining_item_count
        assert bool(g.metadata._continue) == bool(w.metadata._continue)
    assert _served_from_cache(chain, resource) - before == len(got)


# --------------------------------------------------------------------------- watches


class _Watcher:
    """``watch.Watch().stream(...)`` in a thread, collecting (type, name, resourceVersion, labels)."""

    def __init__(self, call: Callable[..., Any], *args: Any, stop_on: tuple[str, str] | None, **kwargs: Any) -> None:
        self.events: list[tuple[str, str, str, dict[str, str]]] = []
        self.raw: list[dict[str, Any]] = []
        self.error: BaseException | None = None
        self.w = watch.Watch()
        self.stop_on = stop_on

        def run() -> None:
            try:
                for ev in self.w.stream(call, *args, **kwargs):
                    meta = ev["raw_object"].get("metadata", {})
                    self.raw.append(ev["raw_object"])
                    self.events.append(
                        (ev["type"], meta.get("name", ""), meta.get("resourceVersion", ""), meta.get("labels") or {})
                    )
                    if self.stop_on and (ev["type"], meta.get("name")) == self.stop_on:
                        self.w.stop()
            except BaseException as e:
                self.error = e

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 30) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the watch did not end; saw {self.events}"

    def types(self, name: str | None = None) -> list[str]:
        return [t for t, n, _, _ in self.events if name is None or n == name or t == "BOOKMARK"]


def _initial_end(raw: dict[str, Any]) -> bool:
    return (raw.get("metadata", {}).get("annotations") or {}).get("k8s.io/initial-events-end") == "true"


def test_watch_sees_direct_writes_then_resumes(
    apis: tuple[client.CoreV1Api, client.CoreV1Api], chain: RunningProxy, namespace: str
) -> None:
    """watch.Watch().stream(list_namespaced_pod) through kproxy (served by the cache, behind
    compression and transcode) and straight from the apiserver, side by side: the same ADDED,
    MODIFIED, (deletion's MODIFIED,) DELETED events with the same resource versions for writes made
    on the apiserver; with allow_watch_bookmarks the initial-events-end bookmark arrives; a new
    watch from the ADDED event's resource version replays the same events on both sides."""
    direct, proxied = apis
    direct.create_namespaced_pod(namespace, _pod("before", {"a": "b"}))
    before = reads_total(chain.metrics(), resource="pods", verb="watch", served="cache")
    watchers = [
        _Watcher(
            api.list_namespaced_pod,
            namespace,
            stop_on=("DELETED", "w"),
            allow_watch_bookmarks=True,
            timeout_seconds=60,
        )
        for api in (direct, proxied)
    ]
    for w in watchers:
        eventually(lambda w=w: any(_initial_end(r) for r in w.raw), 20, "the initial-events-end bookmark")
        assert w.events[0][:2] == ("ADDED", "before")
    added = direct.create_namespaced_pod(namespace, _pod("w", {"v": "1"}))
    modified = direct.patch_namespaced_pod("w", namespace, {"metadata": {"labels": {"v": "2"}}})
    deleted = direct.delete_namespaced_pod("w", namespace, grace_period_seconds=0)
    seen = []
    for w in watchers:
        w.join()
        assert w.error is None, w.error
        seen.append([(t, rv, labels) for t, n, rv, labels in w.events if n == "w"])
    assert seen[1] == seen[0]
    assert seen[1][:2] == [
        ("ADDED", added.metadata.resource_version, {"v": "1"}),
        ("MODIFIED", modified.metadata.resource_version, {"v": "2"}),
    ]
    assert seen[1][-1] == ("DELETED", deleted.metadata.resource_version, {"v": "2"})
    assert reads_total(chain.metrics(), resource="pods", verb="watch", served="cache") - before >= 1

    # resume from the ADDED event's resourceVersion, through kproxy and directly: the same events
    resumed = []
    for api in (direct, proxied):
        r = _Watcher(
            api.list_namespaced_pod,
            namespace,
            stop_on=("DELETED", "w"),
            resource_version=added.metadata.resource_version,
            timeout_seconds=30,
        )
        r.join()
        assert r.error is None, r.error
        resumed.append([(t, n, rv) for t, n, rv, _ in r.events if t != "BOOKMARK"])
    assert resumed[1] == resumed[0]
    assert resumed[1][0] == ("MODIFIED", "w", modified.metadata.resource_version)
    assert resumed[1][-1] == ("DELETED", "w", deleted.metadata.resource_version)


# --------------------------------------------------------------------------- protobuf through the whole chain


def _raw(api: client.CoreV1Api, method: str, *args: Any, accept: str, **kwargs: Any) -> tuple[int, str, bytes]:
    resp = getattr(api, method)(*args, _preload_content=False, _headers={"Accept": accept}, **kwargs)
    try:
        return resp.status, resp.headers.get("Content-Type", ""), resp.data
    finally:
        resp.release_conn()


def test_protobuf_through_the_chain(
    apis: tuple[client.CoreV1Api, client.CoreV1Api], chain: RunningProxy, listed_ns: str
) -> None:
    """The client asking for protobuf (raw, `_preload_content=False`): GET and LIST answered in
    protobuf byte for byte as the apiserver answers (the list from the cache), and the same objects
    as the JSON answers once decoded."""
    direct, proxied = apis
    codec = ProtobufCodec()
    cases: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        ("read_namespaced_pod", ("p-03", listed_ns), {}),
        ("read_namespaced_config_map", ("c-04", listed_ns), {}),
        ("list_namespaced_pod", (listed_ns,), {}),
        ("list_namespaced_pod", (listed_ns,), {"label_selector": "app=web"}),
        ("list_namespaced_config_map", (listed_ns,), {"limit": 4}),
    ]
    before = _served_from_cache(chain, "pods") + _served_from_cache(chain, "configmaps")
    for method, args, kwargs in cases:
        d = _raw(direct, method, *args, accept=PROTOBUF, **kwargs)
        p = _raw(proxied, method, *args, accept=PROTOBUF, **kwargs)
        if p != d:  # the apiserver's leases move the list's resourceVersion: ask again after kproxy
            d = _raw(direct, method, *args, accept=PROTOBUF, **kwargs)
        assert p[:2] == d[:2] == (200, PROTOBUF), (method, kwargs)
        if "limit" in kwargs:  # the continue tokens differ (kproxy's carry "kp":1): compare objects
            dp, pp = json.loads(codec.to_json(d[2])), json.loads(codec.to_json(p[2]))
            assert pp["items"] == dp["items"]
            assert pp["metadata"]["remainingItemCount"] == dp["metadata"]["remainingItemCount"]
        else:
            assert p[2] == d[2], (method, kwargs)
        as_json = _raw(proxied, method, *args, accept=JSON, **kwargs)
        assert as_json[:2] == (200, JSON)
        via_codec = json.loads(codec.to_json(p[2]))
        json_doc = json.loads(as_json[2])
        if "limit" in kwargs:
            assert via_codec["items"] == json_doc["items"]
        else:
            assert via_codec == json_doc
    assert _served_from_cache(chain, "pods") + _served_from_cache(chain, "configmaps") - before >= 6


def test_protobuf_write_and_watch(
    apis: tuple[client.CoreV1Api, client.CoreV1Api], sides: tuple[Side, Side], namespace: str
) -> None:
    """A protobuf request body (POST) and a protobuf watch through the chain: the created object
    comes back as the apiserver stored it, and the watch frames carry the stored bytes."""
    direct, _proxied = apis
    codec = ProtobufCodec()
    _, via_proxy = sides
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pb"}, "data": {"k": "v"}}
    created = via_proxy.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/configmaps",
        headers={"Content-Type": PROTOBUF, "Accept": PROTOBUF},
        body=codec.from_json(obj),
    )
    assert (created.status, created.content_type) == (201, PROTOBUF), created.body[:300]
    stored = direct.read_namespaced_config_map("pb", namespace, _preload_content=False, _headers={"Accept": PROTOBUF})
    assert created.body == stored.data

    resp = via_proxy.stream(
        f"/api/v1/namespaces/{namespace}/configmaps",
        query={"watch": "1", "resourceVersion": "0", "timeoutSeconds": "5"},
        headers={"Accept": PROTOBUF + ";stream=watch"},
    )
    try:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == PROTOBUF + ";stream=watch"
        data = resp.read()
    finally:
        resp.release_conn()
    transcoder = codec.watch_transcoder()
    events = [json.loads(line) for line in (transcoder.feed(data) + transcoder.finish()).splitlines()]
    assert [e["type"] for e in events] == ["ADDED"]
    assert events[0]["object"] == json.loads(codec.to_json(stored.data))


# --------------------------------------------------------------------------- dryrun and validation policy


def test_dry_run_namespace(
    apis: tuple[client.CoreV1Api, client.CoreV1Api], control_plane: ControlPlaneInfo, dry_ns: str
) -> None:
    """In a ``dry-*`` namespace every write is the apiserver's dry run: the client gets the object
    it would have made and the rule's Warning header, and nothing is stored."""
    direct, proxied = apis
    warning = f'299 - "kproxy dryrun rule \\"{DRY_RULE}\\" ran this request as a dry run: nothing was persisted"'
    obj, code, headers = proxied.create_namespaced_config_map_with_http_info(dry_ns, _cm("dry", {"a": "1"}))
    assert code == 201
    assert headers.getlist("Warning") == [warning]
    want = direct.create_namespaced_config_map(dry_ns, _cm("dry", {"a": "1"}), dry_run="All")
    volatile = ("metadata.uid", "metadata.creationTimestamp", "metadata.managedFields")
    assert without(plain(proxied.api_client, obj), *volatile) == without(plain(direct.api_client, want), *volatile)
    with pytest.raises(ApiException) as err:
        direct.read_namespaced_config_map("dry", dry_ns)
    assert err.value.status == 404

    real = direct.create_namespaced_config_map(dry_ns, _cm("kept", {"a": "1"}))
    patched, code, headers = proxied.patch_namespaced_config_map_with_http_info("kept", dry_ns, {"data": {"a": "2"}})
    assert code == 200 and patched.data == {"a": "2"} and headers.getlist("Warning") == [warning]
    _, code, headers = proxied.delete_namespaced_config_map_with_http_info("kept", dry_ns)
    assert code == 200 and headers.getlist("Warning") == [warning]
    after = direct.read_namespaced_config_map("kept", dry_ns)
    assert (after.data, after.metadata.resource_version) == ({"a": "1"}, real.metadata.resource_version)
    # reads pass untouched, with no warning
    _, code, headers = proxied.read_namespaced_config_map_with_http_info("kept", dry_ns)
    assert code == 200 and not headers.getlist("Warning")


def _with_unknown_field(name: str) -> bytes:
    return json.dumps(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "colour": "red"}, "data": {"a": "1"}}
    ).encode()


def test_strict_namespace_post_answered_as_the_apiserver(sides: tuple[Side, Side], strict_ns: str) -> None:
    """A POST with an unknown field in a ``strict-*`` namespace: the apiserver's Strict 400, byte for
    byte (kproxy answers it itself), and nothing is created."""
    d, p = sides
    path = f"/api/v1/namespaces/{strict_ns}/configmaps"
    want = d.request(
        "POST", path, query={"fieldValidation": "Strict"}, headers={"Content-Type": JSON}, body=_with_unknown_field("s")
    )
    got = p.request("POST", path, headers={"Content-Type": JSON}, body=_with_unknown_field("s"))
    assert want.status == 400
    assert (got.status, got.content_type, got.body) == (want.status, want.content_type, want.body)
    assert 'unknown field \\"metadata.colour\\"' in got.body.decode()
    assert d.request("GET", path + "/s").status == 404


def test_strict_and_warn_patch_with_the_python_client(
    apis: tuple[client.CoreV1Api, client.CoreV1Api], strict_ns: str, plain_ns: str
) -> None:
    """A merge patch with an unknown field through the Python client: in a ``strict-*`` namespace
    the ApiException the apiserver raises for a Strict patch (the same status, reason and body);
    elsewhere success with the apiserver's Warn warning in the headers the client returns."""
    direct, proxied = apis
    patch = {"metadata": {"colour": "red"}, "data": {"b": "2"}}
    for ns in (strict_ns, plain_ns):
        direct.create_namespaced_config_map(ns, _cm("target", {"a": "1"}))

    errors = []
    for api, level in ((direct, "Strict"), (proxied, None)):
        with pytest.raises(ApiException) as err:
            api.patch_namespaced_config_map(
                "target", strict_ns, patch, field_validation=level, _content_type="application/merge-patch+json"
            )
        errors.append((err.value.status, err.value.reason, err.value.body))
    assert errors[1] == errors[0]
    assert errors[0][0] == 422 and "unknown field" in errors[0][2]
    assert direct.read_namespaced_config_map("target", strict_ns).data == {"a": "1"}

    answers = []
    for api in (direct, proxied):
        obj, code, headers = api.patch_namespaced_config_map_with_http_info(
            "target", plain_ns, patch, dry_run="All", _content_type="application/merge-patch+json"
        )
        answers.append((code, obj.data, headers.getlist("Warning")))
    assert answers[1] == answers[0] == (200, {"a": "1", "b": "2"}, ['299 - "unknown field \\"metadata.colour\\""'])


# --------------------------------------------------------------------------- negotiation matrix

_ACCEPTS = [
    JSON,
    YAML,
    PROTOBUF,
    f"{PROTOBUF}, {JSON}",  # client-go's default
    "application/json;as=Table;g=meta.k8s.io;v=v1",
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    f"{PROTOBUF};as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    "*/*",
    "application/*",
    "text/plain, */*;q=0.1",
    None,
]


def _same_read(d: Side, p: Side, path: str, query: dict[str, str], headers: dict[str, str]) -> str | None:
    """None when kproxy answers a GET as the apiserver does (the apiserver asked before and after
    kproxy: its leases move consistent reads' resourceVersion); else what differs."""
    first = d.request("GET", path, query=query, headers=headers)
    got = p.request("GET", path, query=query, headers=headers)
    ours = (got.status, got.content_type, _comparable(got))
    last = d.request("GET", path, query=query, headers=headers)
    for want in (first, last):
        if ours == (want.status, want.content_type, _comparable(want)):
            return None
    if _between(first, got, last, any_version=query.get("resourceVersion") == "0"):
        return None
    theirs = f"{last.status} {last.content_type} {last.body[:150]!r} (before: {_list_rv(first)})"
    return f"{path} {query} {headers}: {theirs} | {ours[:2]} {ours[2][:150]!r}"


def _list_rv(answer: Raw) -> tuple[int, Any] | None:
    """A list's resource version and its decoded body without it; None for anything else."""
    if answer.status != 200:
        return None
    if answer.content_type.startswith(PROTOBUF):
        doc = json.loads(ProtobufCodec().to_json(answer.body))
    elif answer.content_type.startswith(YAML):
        doc = yaml.safe_load(answer.body)
    else:
        doc = json.loads(answer.body)
    rv = doc.get("metadata", {}).pop("resourceVersion", None) if isinstance(doc, dict) else None
    if not (isinstance(rv, str) and rv.isdigit()) or ("items" not in doc and "rows" not in doc):
        return None
    doc.get("metadata", {}).pop("continue", None)
    return int(rv), doc


def _between(first: Raw, got: Raw, last: Raw, any_version: bool = False) -> bool:
    """A consistent list at a resource version the apiserver reached between the two reads
    around kproxy's (another client wrote meanwhile), the same list otherwise: as a read
    served between them. Never older than the first: that would be a stale read. With
    ``any_version`` (``resourceVersion=0``: any state the server holds) an older resource version
    is the same read when the items are (a cache a write elsewhere in the cluster has not yet
    reached: the apiserver's own caches differ the same way)."""
    a, o, b = _list_rv(first), _list_rv(got), _list_rv(last)
    if a is None or o is None or b is None or got.content_type != last.content_type:
        return False
    return (any_version or a[0] <= o[0]) and o[0] <= b[0] and o[1] == b[1]


_CONTINUE = re.compile(rb'"continue":"[^"]*"|continue: \S+')


def _comparable(answer: Raw) -> bytes:
    """The body without its continue token (kproxy's tokens carry ``"kp":1``); protobuf lists read
    as JSON first (the token's length is inside the message)."""
    body = answer.body
    if "limit" in answer.url and answer.content_type == PROTOBUF and answer.status == 200:
        body = ProtobufCodec().to_json(body)
    return _CONTINUE.sub(b"", body)


def test_reads_in_every_media_type_and_encoding(sides: tuple[Side, Side], listed_ns: str) -> None:
    """GET and LIST (from the cache, consistent, resourceVersion=0, paged, selected, pretty) in
    every Accept clients send, with and without Accept-Encoding: through the whole chain the same
    status, Content-Type and decoded body as straight from the apiserver (paged lists: but for
    the continue token)."""
    d, p = sides
    ns = listed_ns
    paths = [
        f"/api/v1/namespaces/{ns}/pods",
        f"/api/v1/namespaces/{ns}/configmaps/c-04",
        f"/api/v1/namespaces/{ns}/pods/p-03",
    ]
    queries: list[dict[str, str]] = [
        {},
        {"resourceVersion": "0"},
        {"pretty": "true"},
        {"limit": "2"},
        {"labelSelector": "app=db"},
    ]
    jobs = [
        (path, q, {**({"Accept": a} if a else {}), **({"Accept-Encoding": e} if e else {})})
        for path in paths
        for q in (queries if path.endswith("pods") else queries[:3])
        for a in _ACCEPTS
        for e in (None, "gzip", "zstd")
    ]
    with ThreadPoolExecutor(4) as pool:
        found = [m for m in pool.map(lambda j: _same_read(d, p, *j), jobs) if m]
    assert not found, f"{len(found)} of {len(jobs)} differ:\n" + "\n".join(found[:10])


def _watch_body(side: Side, path: str, query: dict[str, str], headers: dict[str, str]) -> tuple[int, str, bytes]:
    resp = side.stream(path, query=query, headers=headers)
    try:
        data = b"".join(resp.read_chunked(decode_content=True))
    finally:
        resp.release_conn()
    ct = str(resp.headers.get("Content-Type", ""))
    if ct.startswith(PROTOBUF):  # compare events as the codec reads them
        t = ProtobufCodec().watch_transcoder()
        data = t.feed(data) + t.finish()
    events = [json.loads(line) for line in data.splitlines() if line.strip()]
    # Periodic bookmarks (2 s before the timeout, on each side's own tick) come or not with timing;
    # the initial-events-end bookmark is compared, but for each cache's own resourceVersion.
    events = [ev for ev in events if ev["type"] != "BOOKMARK" or _initial_end(ev["object"])]
    for ev in events:
        if ev["type"] == "BOOKMARK":
            ev["object"]["metadata"]["resourceVersion"] = "*"
    return resp.status, ct, json.dumps(events).encode()


def test_watches_in_every_media_type_and_encoding(sides: tuple[Side, Side], listed_ns: str) -> None:
    """Watches (state then timeout, watch-list with bookmarks, selected, matching nothing) in JSON,
    protobuf and client-go's Accept, plain, gzip and zstd: the same events as straight from the
    apiserver (bookmarks compared but for their resourceVersion). Each watch lasts 3 s: a watch-list
    first waits for a consistent state, which under load can take more than a second."""
    d, p = sides
    path = f"/api/v1/namespaces/{listed_ns}/pods"
    queries = [
        {"watch": "1", "resourceVersion": "0", "timeoutSeconds": "3"},
        {
            "watch": "1",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "3",
        },
        {"watch": "1", "resourceVersion": "0", "timeoutSeconds": "3", "fieldSelector": "spec.nodeName=node-a"},
        {"watch": "1", "resourceVersion": "0", "timeoutSeconds": "3", "labelSelector": "app=none"},
    ]
    jobs = [
        (q, {"Accept": a, **({"Accept-Encoding": e} if e else {})})
        for q in queries
        for a in (JSON, f"{PROTOBUF};stream=watch", f"{PROTOBUF}, {JSON}")
        for e in (None, "gzip", "zstd")
    ]

    def one(job: tuple[dict[str, str], dict[str, str]]) -> str | None:
        q, h = job
        want, got = _watch_body(d, path, q, h), _watch_body(p, path, q, h)
        return None if got == want else f"{q} {h}: {want[:2]} {want[2][:200]!r} | {got[:2]} {got[2][:200]!r}"

    with ThreadPoolExecutor(6) as pool:
        found = [m for m in pool.map(one, jobs) if m]
    assert not found, f"{len(found)} of {len(jobs)} differ:\n" + "\n".join(found[:10])


# --------------------------------------------------------------------------- compressed watches that end empty


@pytest.mark.parametrize("accept", [JSON, PROTOBUF + ";stream=watch"], ids=["json", "protobuf"])
@pytest.mark.parametrize("encoding", ["zstd", "gzip"])
def test_compressed_watch_with_no_event_is_a_valid_stream(
    accept: str, encoding: str, sides: tuple[Side, Side], listed_ns: str
) -> None:
    """A watch that matches nothing and times out, with ``Accept-Encoding``: the body kproxy sends
    under ``Content-Encoding`` decodes (an empty body is not a zstd or gzip stream: urllib3 and
    other strict decoders fail on it) to what the apiserver sends, nothing."""
    path = f"/api/v1/namespaces/{listed_ns}/pods"
    query = {"watch": "1", "resourceVersion": "0", "timeoutSeconds": "1", "labelSelector": "app=none"}
    answers = []
    for side in sides:
        resp = side.stream(path, query=query, headers={"Accept": accept, "Accept-Encoding": encoding})
        try:
            raw = b"".join(resp.read_chunked(decode_content=False))
            coding = resp.headers.get("Content-Encoding")
        finally:
            resp.release_conn()
        answers.append((resp.status, coding, raw))
    (d_status, _, d_raw), (p_status, p_coding, p_raw) = answers
    assert p_status == d_status == 200
    assert d_raw == b""
    assert p_coding == encoding  # kproxy compresses watches (watch: true)
    assert _decode(encoding, p_raw) == b""


def _decode(encoding: str, raw: bytes) -> bytes:
    """``raw`` decoded as a whole stream of complete frames (zstd) or members (gzip); fails on
    anything else, an empty body included."""
    assert raw, f"an empty body is not a {encoding} stream"
    if encoding == "gzip":
        return gzip.decompress(raw)
    out = b""
    while raw:
        d = zstd.ZstdDecompressor()
        out += d.decompress(raw)
        assert d.eof, "a zstd frame that does not end"
        raw = d.unused_data
    return out


# --------------------------------------------------------------------------- bad input through the whole chain


@pytest.fixture(scope="module")
def bad_spaces(
    control_plane: ControlPlaneInfo, apis: tuple[client.CoreV1Api, client.CoreV1Api]
) -> Iterator[dict[str, str]]:
    """A plain, a dry-* and a strict-* namespace, each with configmap x and pod p."""
    direct, _ = apis
    spaces = {
        "plain": make_namespace(control_plane, "fc-bad"),
        "dry": make_namespace(control_plane, "dry-fc-bad"),
        "strict": make_namespace(control_plane, "strict-fc-bad"),
    }
    for ns in spaces.values():
        direct.create_namespaced_config_map(ns, _cm("x", {"a": "1"}))
        direct.create_namespaced_pod(ns, _pod("p", {"app": "web"}))
    yield spaces
    for ns in spaces.values():
        drop_namespace(control_plane, ns)


def _send(side: Side, case: Bad, ns: str, extra: tuple[tuple[str, str], ...]) -> tuple[int, str, bytes]:
    path = case.path.format(ns=ns)
    query = list(case.query) + list(extra)
    if not case.watch:
        got = side.request(case.method, path, query=query, headers=dict(case.headers), body=case.body)
        return got.status, got.content_type, got.body
    url = side.base + path + "?" + urlencode(query)
    resp = side.pool.request(
        "GET",
        url,
        headers={"Authorization": f"Bearer {side.token}", **dict(case.headers)},
        preload_content=False,
        timeout=urllib3.Timeout(connect=10, read=3),
    )
    data = b""
    try:
        chunks = resp.read_chunked(decode_content=True) if resp.chunked else iter([resp.read()])
        for chunk in chunks:
            data += chunk
            if b"\n" in data:  # the first event (or the whole answer) is enough
                break
    except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError):
        pass  # a watch that stays open and quiet: what arrived so far
    finally:
        resp.close()  # never back to the pool half read
        resp.release_conn()
    return resp.status, str(resp.headers.get("Content-Type", "")), data.split(b"\n", 1)[0]


_VOLATILE = re.compile(rb'"(uid|creationTimestamp|time)":"[^"]*"')


@pytest.mark.parametrize("encoding", [None, "zstd, gzip"], ids=["plain", "compressed"])
@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_bad_input_answered_as_the_apiserver(
    case: Bad, encoding: str | None, sides: tuple[Side, Side], bad_spaces: dict[str, str], chain: RunningProxy
) -> None:
    """The same malformed request through the whole chain and straight to the apiserver (which gets
    the query a policy adds in that namespace: dryRun=All in dry-*, fieldValidation=Strict in
    strict-*): the same status code, Content-Type and body (a Status with the same reason and
    message), never a traceback or an HTML page; also with ``Accept-Encoding`` (kproxy's
    compression then encodes what it sends, the client decodes it)."""
    d, p = sides
    ns = bad_spaces[case.ns]
    extra = {"plain": (), "dry": (("dryRun", "All"),), "strict": (("fieldValidation", "Strict"),)}[case.ns]
    if case.method == "GET":
        extra = ()  # policies add nothing to reads
    if encoding:
        case = replace(case, headers=(*case.headers, ("Accept-Encoding", encoding)))
    want = _send(d, case, ns, extra)
    got = _send(p, case, ns, ())
    assert got[0] == want[0], (got, want)
    assert got[1] == want[1], (got[1], want[1])
    assert b"Traceback" not in got[2] and b"<html" not in got[2].lower()
    if want[1] == JSON and not case.watch and want[0] >= 400:
        theirs, ours = json.loads(want[2]), json.loads(got[2])
        assert ours.get("kind") == "Status", ours
        assert (ours.get("reason"), ours.get("message"), ours.get("code")) == (
            theirs.get("reason"),
            theirs.get("message"),
            theirs.get("code"),
        )
    if case.racy_first_event:
        for body in (got[2], want[2]):
            assert body == b"" or json.loads(body)["object"]["metadata"]["name"] == "x", body
    else:
        if got != want and case.method == "GET" and not case.watch and want[0] == 200:
            want = _send(d, case, ns, extra)  # a consistent list: the apiserver's revision moved meanwhile
        assert _VOLATILE.sub(b"", got[2]) == _VOLATILE.sub(b"", want[2])
    assert "Traceback" not in chain.log_text()


# ------------------------------------------------- 410 after compaction (last: restarts the apiserver)


def _try(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception:
        return None


def test_too_old_and_compacted_resource_versions_after_restart(
    apis: tuple[client.CoreV1Api, client.CoreV1Api],
    sides: tuple[Side, Side],
    control_plane: ControlPlaneInfo,
    chain: RunningProxy,
    namespace: str,
) -> None:
    """etcd compacted and the apiserver restarted (its watch cache then starts at the current
    revision): a watch from a resourceVersion older than both caches (the apiserver's, and
    kproxy's, which began when kproxy started) is a 410 Expired for the Python client through
    kproxy as directly (timeout_seconds set: no retry), one ERROR event on the raw stream with the
    same Status (the number in parentheses is each cache's own oldest resource version), and an
    exact list at a compacted revision is the apiserver's own 410, word for word. (A version
    kproxy's history still holds is resumed from it, by design: no 410 storms.)"""
    direct, proxied = apis
    old = direct.create_namespaced_pod(namespace, _pod("old")).metadata.resource_version
    direct.patch_namespaced_pod("old", namespace, {"metadata": {"labels": {"x": "1"}}})
    revision = control_plane.etcd_revision()
    control_plane.stop_apiserver(kill=True)
    try:
        control_plane.compact_etcd(revision)
    finally:
        control_plane.start_apiserver()
    # kproxy reconnects on its own; wait until it reads through again
    eventually(lambda: chain.get("/readyz", admin=True)[0] == 200, 60, "kproxy ready again")
    eventually(
        lambda: _try(lambda: proxied.read_namespaced_pod("old", namespace)) is not None, 60, "kproxy reading again"
    )
    too_old = "2"  # before kproxy started, and before the restarted apiserver's cache
    path = f"/api/v1/namespaces/{namespace}/pods"

    def apiserver_cache_ready() -> bool:
        got = sides[0].request("GET", path, query={"watch": "1", "resourceVersion": too_old, "timeoutSeconds": "1"})
        return got.body.startswith(b'{"type":"ERROR"')

    eventually(apiserver_cache_ready, 60, "the restarted apiserver's pod cache")

    errs = []
    for api in (direct, proxied):
        w = _Watcher(api.list_namespaced_pod, namespace, stop_on=None, resource_version=too_old, timeout_seconds=10)
        w.join()
        assert isinstance(w.error, ApiException), (w.error, w.events)
        errs.append((w.error.status, re.sub(r"\(\d+\)", "(M)", str(w.error.reason))))
    assert errs[1] == errs[0] == (410, f"Expired: too old resource version: {too_old} (M)")

    events = []
    for side in sides:
        resp = side.stream(path, query={"watch": "1", "resourceVersion": too_old})
        try:
            assert resp.status == 200
            events.append((resp.headers.get("Content-Type"), list(watch_lines(resp))))
        finally:
            resp.release_conn()
    (d_type, d_events), (p_type, p_events) = events
    assert p_type == d_type == JSON
    assert len(p_events) == len(d_events) == 1
    for ev in (d_events[0], p_events[0]):
        ev["object"]["message"] = re.sub(r"\(\d+\)", "(M)", ev["object"]["message"])
    assert p_events[0] == d_events[0]
    assert p_events[0]["type"] == "ERROR" and p_events[0]["object"]["reason"] == "Expired"

    answers = []
    for api in (direct, proxied):
        with pytest.raises(ApiException) as err:
            api.list_namespaced_pod(namespace, resource_version=old, resource_version_match="Exact")
        answers.append((err.value.status, err.value.reason, err.value.body))
    assert answers[1] == answers[0]
    assert answers[0][0] == 410 and "too old" in answers[0][2]
