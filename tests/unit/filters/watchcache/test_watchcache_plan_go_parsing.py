"""The watch cache reads query values as Go does before it serves anything: int64 (``limit``,
``timeoutSeconds``), the request-deadline filter's ``timeout`` duration, and object names that
must be path segments; whatever Go refuses goes to the apiserver for its own 400."""

from __future__ import annotations

import pytest

from kproxy.cacher.fields import builtin_fields
from kproxy.filters.watchcache.plan import Pass, Read, deadline_ok, go_int64, plan, valid_path_segment_name
from kproxy.testing.exchange import make_exchange

PODS = builtin_fields("", "pods")


def _plan(target: str) -> Read | Pass:
    ex = make_exchange("GET", target)
    return plan(ex, protobuf=True, selectable=PODS, namespaced=True)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("5", 5),
        ("+5", 5),
        ("-0", 0),
        ("007", 7),
        ("9223372036854775807", 2**63 - 1),
        ("-9223372036854775808", -(2**63)),
        ("9223372036854775808", None),
        ("-9223372036854775809", None),
        ("9999999999999999999", None),
        ("", None),
        (" 5", None),
        ("5.0", None),
        ("\u0663", None),  # an Arabic-Indic digit: Python's int() reads it, Go's ParseInt does not
    ],
)
def test_go_int64(text: str, value: int | None) -> None:
    assert go_int64(text) == value


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (None, True),
        ("", True),
        ("0", True),
        ("-0", True),
        ("30s", True),
        ("-1s", True),
        ("1.s", True),
        (".5m", True),
        ("1h2m3.5s", True),
        ("100\u00b5s", True),
        ("100\u03bcs", True),
        ("9223372036854775807ns", True),
        ("9223372036854775808ns", False),
        ("abc", False),
        ("5", False),
        ("00", False),
        (".s", False),
        ("1m1", False),
        ("1sm", False),
        ("1 s", False),
        ("\u0663s", False),
    ],
)
def test_deadline_ok(text: str | None, ok: bool) -> None:
    assert deadline_ok(text) is ok


@pytest.mark.parametrize(("name", "ok"), [("p1", True), ("a b", True), (".", False), ("..", False), ("a%b", False)])
def test_valid_path_segment_name(name: str, ok: bool) -> None:
    assert valid_path_segment_name(name) is ok


@pytest.mark.parametrize(
    "target",
    [
        "/api/v1/pods?limit=9223372036854775808",
        "/api/v1/pods?resourceVersion=0&timeoutSeconds=-9223372036854775809",
        "/api/v1/pods?resourceVersion=0&timeout=5",
        "/api/v1/namespaces/ns/pods/p1?resourceVersion=0&timeout=abc",
        "/api/v1/namespaces/ns/pods/a%25b?resourceVersion=0",
    ],
)
def test_what_go_refuses_goes_to_the_apiserver(target: str) -> None:
    assert _plan(target) == Pass("invalid")


def test_valid_values_are_served() -> None:
    read = _plan("/api/v1/pods?limit=9223372036854775807&timeout=1h2m")
    assert isinstance(read, Read) and read.limit == 2**63 - 1
    assert isinstance(_plan("/api/v1/namespaces/ns/pods/p1?resourceVersion=0&timeout=30s"), Read)


@pytest.mark.parametrize(
    ("target", "limit"),
    [
        ("/api/v1/namespaces/ns/pods?limit=1&fieldSelector=metadata.name%3Dp1", 0),
        ("/api/v1/namespaces/ns/pods?limit=1&fieldSelector=metadata.name%3D%3Dp1,spec.nodeName%3Dn", 0),
        ("/api/v1/pods?limit=1&fieldSelector=metadata.name%3Dp1,metadata.namespace%3Dns", 0),
        ("/api/v1/pods?limit=1&fieldSelector=metadata.name%3Dp1", 1),  # no namespace: no key
        ("/api/v1/pods?limit=1&fieldSelector=metadata.name%3Dp1,metadata.namespace%3DNS", 1),  # not a DNS label
        ("/api/v1/namespaces/ns/pods?limit=1&fieldSelector=metadata.name%3D", 1),  # no name: no key
        ("/api/v1/namespaces/ns/pods?limit=1&fieldSelector=metadata.name%3Da%25b", 1),  # not a path segment
        ("/api/v1/namespaces/ns/pods?limit=1&fieldSelector=metadata.name!%3Dp1", 1),
        ("/api/v1/namespaces/ns/pods?limit=1&labelSelector=metadata.name%3Dp1", 1),
    ],
)
def test_a_list_of_one_name_is_one_key(target: str, limit: int) -> None:
    read = _plan(target)
    assert isinstance(read, Read) and read.limit == limit
