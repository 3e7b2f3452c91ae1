"""Which watches the watch cache serves (and how they start), and which go to the apiserver."""

from __future__ import annotations

import pytest

from kproxy.cacher.fields import builtin_fields
from kproxy.core.negotiation import JSON, PROTOBUF
from kproxy.filters.watchcache.partial import partial_media
from kproxy.filters.watchcache.plan import Pass
from kproxy.filters.watchcache.watch_plan import WatchRead, plan_watch
from kproxy.testing.exchange import make_exchange

PODS = builtin_fields("", "pods")


def _plan(target: str, accept: str | None = None, *, protobuf: bool = True, **headers: str) -> WatchRead | Pass:
    ex = make_exchange("GET", target, {**({"Accept": accept} if accept else {}), **headers})
    return plan_watch(ex, protobuf=protobuf, selectable=PODS, namespaced=True)


@pytest.mark.parametrize(
    ("query", "initial", "consistency", "rv", "end"),
    [
        ("watch=1", True, "consistent", 0, False),  # WatchList defaulting of an unset resourceVersion
        ("watch=1&allowWatchBookmarks=true", True, "consistent", 0, True),
        ("watch=1&resourceVersion=0", True, "any", 0, False),
        ("watch=1&resourceVersion=0&allowWatchBookmarks=1", True, "any", 0, True),
        ("watch=1&resourceVersion=12", False, "since", 12, False),
        ("watch=1&resourceVersion=12&allowWatchBookmarks=true", False, "since", 12, False),
        ("watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion=12", True, "min", 12, False),
        (
            "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
            True,
            "consistent",
            0,
            True,
        ),
        ("watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan", False, "consistent", 0, False),
        ("watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=0", False, "any", 0, False),
        (
            "watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan&resourceVersion=9",
            False,
            "since",
            9,
            False,
        ),
        ("watch=1&resourceVersion=12&timeout=5s&pretty=true", False, "since", 12, False),
    ],
)
def test_watches_the_cache_serves(query: str, initial: bool, consistency: str, rv: int, end: bool) -> None:
    read = _plan(f"/api/v1/namespaces/ns/pods?{query}")
    assert isinstance(read, WatchRead), read
    assert (read.initial, read.consistency, read.rv, read.initial_events_end) == (initial, consistency, rv, end)
    assert read.namespace == "ns" and read.media_type == JSON


def test_watch_details() -> None:
    read = _plan("/api/v1/watch/pods?labelSelector=app%3Dx&fieldSelector=spec.nodeName%3Dn1&timeoutSeconds=7")
    assert isinstance(read, WatchRead)
    assert read.namespace == "" and read.timeout_seconds == 7
    assert read.labels is not None and read.fields is not None
    assert read.label_text == "app=x" and read.field_text == "spec.nodeName=n1"


@pytest.mark.parametrize(
    ("accept", "protobuf", "media"),
    [
        ("application/vnd.kubernetes.protobuf, application/json", True, PROTOBUF),
        ("application/vnd.kubernetes.protobuf;stream=watch", True, PROTOBUF),
        ("application/json;stream=watch", True, JSON),
        ("application/yaml, application/json", True, JSON),  # YAML has no stream form: the next one
        ("*/*", True, JSON),
        ("application/vnd.kubernetes.protobuf, application/json", False, JSON),  # a custom resource
    ],
)
def test_watch_media_types(accept: str, protobuf: bool, media: str) -> None:
    read = _plan("/api/v1/pods?watch=1", accept, protobuf=protobuf)
    assert isinstance(read, WatchRead), read
    assert read.media_type == media


@pytest.mark.parametrize(
    ("target", "accept", "reason"),
    [
        ("/api/v1/pods?watch=1&resourceVersionMatch=Exact&resourceVersion=5", None, "invalid"),
        ("/api/v1/pods?watch=1&sendInitialEvents=true", None, "invalid"),
        ("/api/v1/pods?watch=1&resourceVersionMatch=NotOlderThan&resourceVersion=5", None, "invalid"),
        ("/api/v1/pods?watch=1&resourceVersion=abc", None, "invalid"),
        ("/api/v1/pods?watch=1&timeoutSeconds=x", None, "invalid"),
        ("/api/v1/pods?watch=1&timeoutSeconds=-1", None, "timeout"),
        ("/api/v1/pods?watch=1&continue=abc", None, "parameters"),
        ("/api/v1/pods?watch=1&limit=5", None, "parameters"),
        ("/api/v1/pods?watch=1&labelSelector=a%3D%3D%3Db", None, "selector"),
        ("/api/v1/pods?watch=1&fieldSelector=spec.unknown%3Dx", None, "selector"),
        ("/api/v1/pods?watch=1", "application/yaml", "media type"),
        ("/api/v1/pods?watch=1", "application/json;as=Table;g=meta.k8s.io;v=v1", "media type"),
        ("/api/v1/pods?watch=1", "text/html", "media type"),
        ("/api/v1/pods?watch=1&watch=1", None, "parameters"),
        ("/api/v1/pods?watch=1;x=1", None, "encoding"),
    ],
)
def test_watches_passed_to_the_apiserver(target: str, accept: str | None, reason: str) -> None:
    assert _plan(target, accept) == Pass(reason)


def test_a_watch_of_one_object_selects_it_by_name() -> None:
    read = _plan("/api/v1/watch/namespaces/ns/pods/p1")
    assert isinstance(read, WatchRead) and read.field_text == "metadata.name=p1"
    # A field selector of its own must require that name (get.go): else the apiserver's 400.
    read = _plan("/api/v1/watch/namespaces/ns/pods/p1?fieldSelector=metadata.name%3Dp1,spec.nodeName%3Dn1")
    assert isinstance(read, WatchRead) and read.fields is not None
    assert read.fields.terms == (("metadata.name", "p1", True), ("spec.nodeName", "n1", True))
    for selector in (
        "spec.nodeName%3Dn1",
        "metadata.name%3Dp2",
        "metadata.name!%3Dp1",
        "metadata.name%3Da,metadata.name%3Dp1",
    ):
        assert _plan(f"/api/v1/watch/namespaces/ns/pods/p1?fieldSelector={selector}") == Pass("invalid")
    read = _plan("/api/v1/watch/namespaces/ns/pods/a,b%3Dc")  # escaped into the selector
    assert isinstance(read, WatchRead) and read.fields is not None
    assert read.fields.terms == (("metadata.name", "a,b=c", True),)


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [("5", 5.0), ("0", 0.0), ("18446744074", 0.290448384), ("9223372036", 9223372036.0)],
)
def test_timeout_seconds_as_go_multiplies_it(seconds: str, expected: float) -> None:
    read = _plan(f"/api/v1/pods?watch=1&timeoutSeconds={seconds}")
    assert isinstance(read, WatchRead) and read.timeout_seconds == pytest.approx(expected)


@pytest.mark.parametrize(
    ("seconds", "reason"),
    [
        ("-1", "timeout"),
        ("9999999999", "timeout"),
        ("9223372036854775808", "invalid"),
        ("-9223372036854775809", "invalid"),
    ],
)
def test_timeout_seconds_go_would_refuse_or_end_at_once(seconds: str, reason: str) -> None:
    assert _plan(f"/api/v1/pods?watch=1&timeoutSeconds={seconds}") == Pass(reason)


def test_websocket_watches_pass_through() -> None:
    for spelling in ("websocket", "WebSocket", "web\u017focket"):
        headers = {"Upgrade": spelling, "Connection": "Upgrade"}
        ex = make_exchange("GET", "/api/v1/pods?watch=1", headers, upgrade=True)
        assert plan_watch(ex, protobuf=True, selectable=PODS, namespaced=True) == Pass("websocket")


def test_other_upgrades_are_watches_like_any() -> None:
    """The apiserver serves a watch with ``Upgrade: h2c`` (or any other non-WebSocket upgrade)
    as an ordinary watch, so the cache may too."""
    ex = make_exchange("GET", "/api/v1/pods?watch=1", {"Upgrade": "h2c", "Connection": "Upgrade"}, upgrade=True)
    assert isinstance(plan_watch(ex, protobuf=True, selectable=PODS, namespaced=True), WatchRead)


def test_impersonation_passes_through() -> None:
    assert _plan("/api/v1/pods?watch=1", None, **{"Impersonate-User": "bob"}) == Pass("impersonation")


def test_protobuf_alone_for_a_custom_resource_gets_the_apiservers_406() -> None:
    assert _plan("/api/v1/pods?watch=1", "application/vnd.kubernetes.protobuf", protobuf=False) == Pass("media type")


@pytest.mark.parametrize(
    ("query", "encoding", "gzip"),
    [
        ("watch=1&allowWatchBookmarks=true", "gzip", True),  # a watch-list (defaulted), bookmarks
        ("watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=1", "br, gzip", True),
        ("watch=1", "gzip", False),  # no bookmarks: not a watch-list for compression
        ("watch=1&resourceVersion=5&allowWatchBookmarks=true", "gzip", False),
        ("watch=1&allowWatchBookmarks=true", "gzip;q=1", False),  # only the exact token
        ("watch=1&allowWatchBookmarks=true", "GZIP", False),
        ("watch=1&allowWatchBookmarks=true", "", False),
    ],
)
def test_watch_list_gzip_as_the_apiserver(query: str, encoding: str, gzip: bool) -> None:
    headers = {"Accept-Encoding": encoding} if encoding else {}
    read = _plan(f"/api/v1/pods?{query}", None, **headers)
    assert isinstance(read, WatchRead) and read.gzip is gzip


def test_watch_list_gzip_only_from_the_minor_that_has_it() -> None:
    """1.35 and 1.36 never compress a watch: kproxy answers as the upstream's minor would."""
    ex = make_exchange("GET", "/api/v1/pods?watch=1&allowWatchBookmarks=true", {"Accept-Encoding": "gzip"})
    older = plan_watch(ex, protobuf=True, selectable=PODS, namespaced=True, list_gzip=False)
    assert isinstance(older, WatchRead) and older.gzip is False


@pytest.mark.parametrize(
    ("accept", "media"),
    [
        ("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1", JSON),
        (
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json",
            PROTOBUF,
        ),
        # The transform from NegotiateOutputMediaType, the encoding from the stream serializer's.
        ("application/yaml;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json", JSON),
    ],
)
def test_metadata_only_watches(accept: str, media: str) -> None:
    read = _plan("/api/v1/pods?watch=1", accept)
    assert isinstance(read, WatchRead) and read.media_type == partial_media(media)


@pytest.mark.parametrize(
    "accept",
    [
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",  # the apiserver sends objects as they are
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1beta1",
        "application/yaml;as=PartialObjectMetadata;g=meta.k8s.io;v=v1",  # no stream serializer
    ],
)
def test_other_watch_transforms_pass(accept: str) -> None:
    assert _plan("/api/v1/pods?watch=1", accept) == Pass("media type")


def test_a_watch_of_a_namespaced_object_by_name_needs_its_namespace() -> None:
    """``/api/v1/watch/pods/NAME`` has no route (the installer registers the cross-namespace
    watch only for the collection): the apiserver's 404, not a watch of every pod so named."""
    assert _plan("/api/v1/watch/pods/p1") == Pass("scope")
    assert isinstance(_plan("/api/v1/watch/namespaces/ns/pods/p1"), WatchRead)
    assert isinstance(_plan("/api/v1/watch/pods"), WatchRead)
