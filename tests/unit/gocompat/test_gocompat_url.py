"""kproxy.gocompat.url against Go's own net/url (tools/gooracle), input for input.

A request target or query that Go reads differently from kproxy is a request whose meaning to
kproxy's policy differs from its meaning to the apiserver, so the ports are checked against Go
itself on Go's own test table, the spellings attackers use, and seeded random inputs."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from kproxy.gocompat.url import (
    MAX_QUERY_PARAMS,
    InvalidRequestURIError,
    TooManyQueryParams,
    parse_query,
    parse_request_uri,
    query_values,
    with_param,
)
from kproxy.testing.gooracle import GoOracle, b64


@pytest.fixture(scope="module")
def go() -> Iterator[GoOracle]:
    oracle = GoOracle()
    yield oracle
    oracle.close()


# net/url url_test.go parseRequestURLTests, and the forms an attacker reaches for.
TARGETS = [
    "http://foo.com",
    "http://foo.com/",
    "http://foo.com/path",
    "/",
    "//not.a.user@not.a.host/just/a/path",
    "//not.a.user@%66%6f%6f.com/just/a/path/also",
    "*",
    "http://192.168.0.1/",
    "http://192.168.0.1:8080/",
    "http://[fe80::1]/",
    "http://[fe80::1]:8080/",
    "http://[fe80::1%25en0]/",
    "http://[fe80::1%25en0]:8080/",
    "http://[fe80::1%25%65%6e%301-._~]/",
    "http://[fe80::1%25%65%6e%301-._~]:8080/",
    "foo.html",
    "../dir/",
    " http://foo.com",
    "http://192.168.0.%31/",
    "http://192.168.0.%31:8080/",
    "http://[fe80::%31]/",
    "http://[fe80::%31]:8080/",
    "http://[fe80::%31%25en0]/",
    "http://[fe80::1%en0]/",
    "https://[1:2:3:4:5:6:7:8]",
    "https://[2001:db8::a:b:c:d]",
    "https://[fe80::1%25eth0]",
    "https://[fe80::abc:def%254]",
    "https://[::ffff:192.0.2.1]",
    "https://[:1] ",
    "https://[1:2:3:4:5:6:7:8:9]",
    "https://[1::1::1]",
    "https://[1:2:3:]",
    "https://[ffff::127.0.0.4000]",
    "https://[0:0::test.com]:80",
    "https://[test.com]",
    "https://1:2:3:4:5:6:7:8",
    "https://example.com:80:",
    "mongodb://a:1,b:2/x",
    # absolute forms of API paths: Go routes each by its path
    "http://x/api/v1/namespaces/dry-a/configmaps",
    "HTTP://X/api/v1/namespaces/dry-a/configmaps?dryRun=All",
    "https://evil.example.com:443/apis/apps/v1/namespaces/a/deployments",
    "http:/api/v1/namespaces/a/pods",
    "x+y.z-1:/api/v1/pods",
    "1http://x/api",
    "http://u:p@h/api/v1/pods",
    "http://u@h@h2/api",
    "http://[::1]x/api",
    "http:api/v1/pods",
    "http://h",
    "http://h?x",
    "http://h/a%2Fb",
    "http://h/%zz",
    "http://h:/api",
    "http://%41/",
    "http://h%80/api",
    "http://a b/",
    "http://h/a b",
    "http://<h>/",
    "http://h\x7f/",
    "/api/v1/pods?",
    "/a?b?",
    "/a#f?x",
    "/api/v1/namespaces/dry-a/configmaps/%2e%2e/x",
    "/%",
    "/%4",
    "/a%G1",
    "/é/%C3%A9",
    "/%FF",
    ":/api",
    "a:",
    "?x",
]

QUERIES = [
    "",
    "a=1&a=2&b=%zz&c=x+y&d;e=1&=v&f&&g=%41",
    "k=a=b",
    "dryRun=All",
    "dry%52un=%41ll",
    "dryRun=All;x",
    "dryRun=%zz&dryRun=All",
    "fieldValidation=%zz&fieldValidation=Ignore",
    "fieldValidation=%",
    "fieldValidation=Ignore;",
    "fieldValidation=Strict%zz",
    "%66ieldValidation=Ignore",
    "a=%FF&b=%C3%A9",
    "a+b=c+d",
    "=",
    "&&&",
    "a=1&;&b=2",
    "x=%2",
    "x=%%41",
    "&".join(["p=1"] * MAX_QUERY_PARAMS),
    "&".join(["p=1"] * MAX_QUERY_PARAMS) + "&dryRun=All",
    "&" * MAX_QUERY_PARAMS,
]

_ALPHABET = [*"/%?#&=;:@[]+._~-!$'()*, aAzZ09fF", "%2F", "%2e", "%25", "%zz", "%C3%A9", "é", "\x7f", "\x00"]


def _random_inputs(seed: int, count: int, prefixes: list[str]) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        body = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 24)))
        out.append(rng.choice(prefixes) + body)
    return out


def _check_targets(go: GoOracle, targets: list[str]) -> None:
    for target, want in zip(targets, go.ask_many("requesturi", targets), strict=True):
        try:
            got = parse_request_uri(target)
        except InvalidRequestURIError:
            assert want["err"], f"kproxy refuses {target!r}, Go reads {want}"
            continue
        assert not want["err"], f"Go refuses {target!r}, kproxy reads {got}"
        assert got.path.encode("utf-8", "surrogateescape") == b64(want["path"]), target
        assert got.raw_query == want["rawQuery"], target
        assert got.host.encode("utf-8", "surrogateescape") == b64(want["host"]), target
        assert (got.scheme, got.opaque) == (want["scheme"], want["opaque"]), target


def _check_queries(go: GoOracle, queries: list[str]) -> None:
    for query, want in zip(queries, go.ask_many("query", queries), strict=True):
        expected = {b64(k): [b64(v) for v in vs] for k, vs in want["values"]}
        got = {
            k.encode("utf-8", "surrogateescape"): [v.encode("utf-8", "surrogateescape") for v in vs]
            for k, vs in query_values(query).items()
        }
        assert got == expected, f"query {query[:200]!r}"


def test_request_targets_read_as_go_reads_them(go: GoOracle) -> None:
    _check_targets(go, TARGETS)


def test_random_request_targets_read_as_go_reads_them(go: GoOracle) -> None:
    _check_targets(go, _random_inputs(19, 4000, ["/", "http://", "http:", "h://x", "/api/", "HTTP://[", "*", ""]))


def test_queries_read_as_go_reads_them(go: GoOracle) -> None:
    _check_queries(go, QUERIES)


def test_random_queries_read_as_go_reads_them(go: GoOracle) -> None:
    _check_queries(go, _random_inputs(20, 4000, ["", "dryRun=", "fieldValidation=", "a=1&", "%"]))


def test_absolute_form_is_routed_by_its_path() -> None:
    uri = parse_request_uri("hTTp://Evil.Example:443/api/v1/namespaces/dry-a/configmaps?dryRun=x")
    assert (uri.scheme, uri.host, uri.path, uri.raw_query) == (
        "http",
        "Evil.Example:443",
        "/api/v1/namespaces/dry-a/configmaps",
        "dryRun=x",
    )
    assert uri.origin_form == "/api/v1/namespaces/dry-a/configmaps?dryRun=x"
    assert parse_request_uri("/api/v1/pods?watch=1").origin_form == "/api/v1/pods?watch=1"


@pytest.mark.parametrize(
    ("query", "out"),
    [
        ("", "fieldValidation=Strict"),
        ("fieldValidation=%zz&fieldValidation=Ignore", "fieldValidation=%zz&fieldValidation=Strict"),
        ("fieldValidation=Ignore;", "fieldValidation=Ignore;&fieldValidation=Strict"),
        ("%66ieldValidation=Ignore&pretty=1", "pretty=1&fieldValidation=Strict"),
        ("fieldValidation=Strict%zz&x=%C3%A9", "fieldValidation=Strict%zz&x=%C3%A9&fieldValidation=Strict"),
    ],
)
def test_with_param_leaves_go_one_reading(query: str, out: str) -> None:
    assert with_param(query, "fieldValidation", "Strict") == out
    assert query_values(out)["fieldValidation"] == ["Strict"]


def test_with_param_over_gos_limit() -> None:
    over = "&".join(["p=1"] * MAX_QUERY_PARAMS) + "&dryRun=x"
    assert query_values(over) == {}  # Go reads none of them
    assert with_param(over, "dryRun", "All") == "dryRun=All"
    at_limit = "&".join(["p=1"] * MAX_QUERY_PARAMS)
    with pytest.raises(TooManyQueryParams):
        with_param(at_limit, "dryRun", "All")
    assert len(parse_query(at_limit)) == MAX_QUERY_PARAMS
