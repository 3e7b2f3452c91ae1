"""Accept negotiation as the apiserver does it (kproxy/core/negotiation.py), and how the transcode
filter uses it to decide which requests it rewrites."""

from __future__ import annotations

import pytest

from kproxy.codec import ProtobufCodec
from kproxy.core.chain import Exchange
from kproxy.core.negotiation import (
    JSON,
    PROTOBUF,
    YAML,
    is_pretty,
    media_type_of,
    negotiate,
    parse_accept,
    router_accepts,
)
from kproxy.filters.transcode import Transcode, TranscodeSettings, envelope_type
from kproxy.testing.exchange import make_exchange


def test_parse_accept_sorts_by_q_then_specificity() -> None:
    clauses = parse_accept("text/*;q=0.5, application/json;q=0.8, */*;q=0.1, application/yaml")
    assert [(c.type, c.subtype, round(c.q, 3)) for c in clauses] == [
        ("application", "yaml", 1.0),
        ("application", "json", 0.8),
        ("text", "*", 0.5),
        ("*", "*", 0.1),
    ]


def test_parse_accept_skips_malformed_and_keeps_q_zero() -> None:
    clauses = parse_accept("foo, a/b/c, application/json;q=0, *")
    assert [(c.type, c.subtype, c.q) for c in clauses] == [("*", "*", 1.0), ("application", "json", 0.0)]


def test_parse_accept_goautoneg_quirk_concrete_before_wildcard_even_with_lower_q() -> None:
    # goautoneg's Less puts a concrete type before */* whatever the q: reproduced, not fixed.
    clauses = parse_accept("*/*;q=1, application/yaml;q=0.2")
    assert [(c.type, c.subtype) for c in clauses] == [("application", "yaml"), ("*", "*")]


def test_parse_accept_bad_q_is_zero() -> None:
    assert parse_accept("application/json;q=abc")[0].q == 0.0
    assert parse_accept("application/json;q= 1")[0].q == 0.0


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        (None, JSON),
        ("", JSON),
        ("*/*", JSON),
        ("application/*", JSON),
        ("application/yaml", YAML),
        ("application/vnd.kubernetes.protobuf, application/json", PROTOBUF),
        ("application/json, application/vnd.kubernetes.protobuf", JSON),
        ("application/json;q=0.5, application/yaml", YAML),
        ("text/html, application/yaml;q=0.1", YAML),
        ("application/json;stream=watch", JSON),
        ("application/yaml;stream=watch, application/json", JSON),  # YAML cannot stream: skipped
        ("application/json;sv=v1, application/yaml", YAML),
        ("application/json;as=Table;v=v1;g=meta.k8s.io", JSON),
        ("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io, application/yaml", YAML),
        ("application/json;as=Table;v=v2;g=meta.k8s.io, application/yaml", YAML),
        ("application/json;as=Table, application/yaml", YAML),  # no g/v: not meta.k8s.io
    ],
)
def test_negotiate_picks_what_the_apiserver_picks(accept: str | None, expected: str) -> None:
    chosen = negotiate(accept)
    assert chosen is not None
    assert chosen.media_type == expected


def test_negotiate_reports_conversion_and_pretty() -> None:
    chosen = negotiate("application/json;as=Table;v=v1;g=meta.k8s.io;pretty=1")
    assert chosen is not None
    assert chosen.convert == ("Table", "meta.k8s.io", "v1")
    assert chosen.pretty
    pom = negotiate("application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")
    assert pom is not None and pom.media_type == PROTOBUF and pom.convert is not None


@pytest.mark.parametrize(
    "accept", ["text/html", "application/xml, text/*", "application/json;as=Foo;g=meta.k8s.io;v=v1"]
)
def test_negotiate_refuses(accept: str) -> None:
    assert negotiate(accept) is None


def test_default_restrictions_refuse_conversions() -> None:
    assert negotiate("application/json;as=Table;v=v1;g=meta.k8s.io", conversions=False) is None


def test_yaml_cannot_stream() -> None:
    chosen = negotiate("application/yaml")
    assert chosen is not None and not chosen.streams
    assert negotiate("application/json") is not None and negotiate("application/json").streams  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("accept", "ok"),
    [
        (None, True),
        ("*/*", True),
        ("application/json;q=0", True),
        ("application/*", False),
        ("text/html", False),
        ("text/html, application/yaml;q=0.1", True),
        (" application/vnd.kubernetes.protobuf ;foo=bar", True),
    ],
)
def test_router_accepts(accept: str | None, ok: bool) -> None:
    assert router_accepts(accept) is ok


@pytest.mark.parametrize(
    ("pretty", "ua", "expected"),
    [
        (None, None, False),
        ("true", None, True),
        ("1", "kubectl/v1.37", True),
        ("false", "curl/8.0", False),
        ("yes", "curl/8.0", False),  # given but unparsable: false, the User-Agent is not consulted
        (None, "curl/8.0", True),
        (None, "Wget/1.21", True),
        (None, "Mozilla/5.0 (X11)", True),
        (None, "kubectl/v1.37.1", False),
        ("", "curl/8.0", True),
    ],
)
def test_is_pretty(pretty: str | None, ua: str | None, expected: bool) -> None:
    assert is_pretty(pretty, ua) is expected


def test_media_type_of() -> None:
    assert media_type_of("application/vnd.kubernetes.protobuf") == PROTOBUF
    assert media_type_of("application/vnd.kubernetes.protobuf;stream=watch") == PROTOBUF + ";stream=watch"
    assert media_type_of("Application/JSON; charset=utf-8") == JSON
    assert media_type_of(None) == ""


# ----------------------------------------------------------------------------- the filter's use of it


def _exchange(method: str, target: str, headers: dict[str, str]) -> Exchange:
    return make_exchange(method, target, headers)


@pytest.fixture(scope="module")
def transcode() -> Transcode:
    flt = Transcode(TranscodeSettings(upstream="protobuf"))
    flt.codec = ProtobufCodec()
    flt._known = frozenset({("", "v1"), ("apps", "v1")})
    return flt


@pytest.mark.parametrize(
    ("method", "target", "headers", "expected"),
    [
        ("GET", "/api/v1/namespaces/a/pods/p", {}, (JSON, False, "object")),
        ("GET", "/api/v1/namespaces/a/pods", {"Accept": YAML}, (YAML, False, "list")),
        ("GET", "/api/v1/namespaces/a/pods?watch=1", {"Accept": "application/json"}, (JSON, False, "watch")),
        ("GET", "/api/v1/pods?pretty=true", {}, (JSON, True, "list")),
        ("GET", "/api/v1/pods", {"User-Agent": "curl/8"}, (JSON, True, "list")),
        ("GET", "/api/v1/pods", {"Accept": "application/json;pretty=1"}, (JSON, True, "list")),
        ("POST", "/apis/apps/v1/namespaces/a/deployments", {}, (JSON, False, "object")),
        ("GET", "/api/v1/namespaces/a/pods?watch=1", {"Accept": YAML}, None),  # the apiserver's 406
        ("GET", "/api/v1/namespaces/a/pods/p", {"Accept": PROTOBUF}, None),
        ("GET", "/api/v1/namespaces/a/pods/p", {"Accept": "text/html"}, None),
        ("GET", "/api/v1/namespaces/a/pods/p", {"Accept": "application/*"}, None),
        ("GET", "/api/v1/namespaces/a/pods", {"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}, None),
        ("GET", "/api/v1/namespaces/a/pods/p/log", {}, None),
        ("GET", "/api/v1/namespaces/a/pods/p/exec?command=ls", {}, None),
        ("GET", "/api/v1/namespaces/a/services/s/proxy/x", {}, None),
        ("HEAD", "/api/v1/namespaces/a/pods/p", {}, None),
        ("GET", "/version", {}, None),
        ("GET", "/apis", {}, None),
    ],
)
def test_transcode_plan(
    transcode: Transcode, method: str, target: str, headers: dict[str, str], expected: tuple[str, bool, str] | None
) -> None:
    plan = transcode.plan(_exchange(method, target, headers))
    assert (None if plan is None else (plan.target, plan.pretty, plan.shape)) == expected


def test_transcode_auto_only_for_known_group_versions(transcode: Transcode) -> None:
    auto = Transcode(TranscodeSettings(upstream="auto"))
    auto.codec, auto._known = transcode.codec, transcode._known
    assert auto.plan(_exchange("GET", "/apis/apps/v1/deployments", {})) is not None
    assert auto.plan(_exchange("GET", "/apis/example.com/v1/widgets", {})) is None
    assert transcode.plan(_exchange("GET", "/apis/example.com/v1/widgets", {})) is not None  # protobuf: asks anyway


def test_transcode_json_mode_is_off() -> None:
    off = Transcode(TranscodeSettings(upstream="json"))
    assert off.plan(_exchange("GET", "/api/v1/pods", {})) is None


def test_envelope_type_names_the_kind_from_the_first_bytes() -> None:
    env = ProtobufCodec().from_json({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})
    assert envelope_type(env) == ("apps/v1", "Deployment")
    assert envelope_type(env[:30]) == ("apps/v1", "Deployment")  # a stream's first chunk is enough
    assert envelope_type(env[:8]) is None  # typeMeta cut short
    assert envelope_type(b"k9s\x00" + env[4:]) is None
    assert envelope_type(b"garbage") is None
