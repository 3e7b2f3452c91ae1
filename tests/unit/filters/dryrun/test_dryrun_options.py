"""Where the apiserver reads ``dryRun`` and how the dryrun filter rewrites it (pure logic).

Whether the apiserver agrees is tested end to end in tests/e2e/test_dryrun.py; these pin the
parsing rules down case by case.
"""

from __future__ import annotations

import json

import orjson
import pytest

from kproxy.codec.envelope import ld as _ld
from kproxy.filters.dryrun import (
    BodyError,
    UnsupportedBodyType,
    delete_body_dry_run,
    enforce_delete_body,
    enforce_query,
    invalid_dry_run,
    is_dry_run,
    query_dry_run,
)
from kproxy.filters.dryrun.deleteoptions import _fields, _protobuf_dry_run


@pytest.mark.parametrize(
    ("query", "values"),
    [
        ("", []),
        ("dryRun=All", ["All"]),
        ("dryRun=All&dryRun=x", ["All", "x"]),
        ("dryRun=", [""]),
        ("dryrun=All", []),  # the apiserver's map lookup is case-sensitive
        ("dry%52un=%41ll", ["All"]),
        ("dryRun=All+", ["All "]),
        ("dryRun=All;x", []),  # Go drops a pair containing ';'
        ("dryRun=%zz&dryRun=All", ["All"]),  # and one with a bad escape
    ],
)
def test_query_dry_run(query: str, values: list[str]) -> None:
    assert query_dry_run(query) == values


@pytest.mark.parametrize(
    ("query", "out"),
    [
        ("", "dryRun=All"),
        ("fieldManager=kubectl&dryRun=foo", "fieldManager=kubectl&dryRun=All"),
        ("DRYRUN=x&dryrun=&dry%52un=All&a=%zz&b=1;2", "a=%zz&b=1;2&dryRun=All"),
        ("labelSelector=a%3Db&pretty", "labelSelector=a%3Db&pretty&dryRun=All"),
    ],
)
def test_enforce_query_keeps_other_pairs_byte_for_byte(query: str, out: str) -> None:
    assert enforce_query(query) == out
    assert query_dry_run(enforce_query(query)) == ["All"]


def test_is_dry_run() -> None:
    assert is_dry_run(["All"]) and is_dry_run(["All", "All"])
    assert not is_dry_run([]) and not is_dry_run(None) and not is_dry_run(["All", "x"])


def test_invalid_dry_run_is_the_apiservers_422() -> None:
    err = invalid_dry_run("CreateOptions", ["foo", "<&>"])
    assert err.http_status == 422
    body = json.loads(err.body())
    assert body["message"] == (
        'CreateOptions.meta.k8s.io "" is invalid: dryRun: Unsupported value: ["foo","\\u003c\\u0026\\u003e"]: '
        'supported values: "All"'
    )
    assert body["details"] == {
        "group": "meta.k8s.io",
        "kind": "CreateOptions",
        "causes": [
            {
                "reason": "FieldValueNotSupported",
                "message": 'Unsupported value: ["foo","\\u003c\\u0026\\u003e"]: supported values: "All"',
                "field": "dryRun",
            }
        ],
    }


@pytest.mark.parametrize(
    ("body", "ctype", "values"),
    [
        (b"{}", "", None),
        (b"null", "application/json", None),
        (b'{"dryRun":[]}', "application/json", None),
        (b'{"dryRun":["All"]}', "application/json; charset=utf-8", ["All"]),
        (b'{"dryRun":"All"}', "application/json", ["<not a list of strings>"]),
        (b"dryRun: [All]\n", "application/yaml", ["All"]),
    ],
)
def test_delete_body_dry_run(body: bytes, ctype: str, values: list[str] | None) -> None:
    assert delete_body_dry_run(body, ctype) == values


@pytest.mark.parametrize(
    ("body", "ctype", "error"),
    [
        (b"{}", "text/plain", UnsupportedBodyType),
        (b"{}", "application/cbor", UnsupportedBodyType),
        (b"{bad", "application/json", BodyError),
        (b"[]", "application/json", BodyError),
        (b"a: [\n", "application/yaml", BodyError),
        (b"\x00\x01", "application/vnd.kubernetes.protobuf", BodyError),
    ],
)
def test_unreadable_delete_bodies(body: bytes, ctype: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        enforce_delete_body(body, ctype)


def test_yaml_delete_body_is_its_first_document() -> None:
    """go-yaml's Unmarshal reads one document: what follows it is never looked at."""
    body, _, values = enforce_delete_body(b"gracePeriodSeconds: 0\n---\n[unclosed\n", "application/yaml")
    assert values is None
    assert body == b'{"gracePeriodSeconds":0,"dryRun":["All"]}'


def test_enforce_json_and_yaml_bodies() -> None:
    out, ctype, values = enforce_delete_body(
        b'{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0,"DryRun":["x"],"dryRun":["All"]}', ""
    )
    assert ctype == "application/json" and values == ["All"]
    assert orjson.loads(out) == {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "gracePeriodSeconds": 0,
        "dryRun": ["All"],
    }
    out, ctype, values = enforce_delete_body(b"propagationPolicy: Foreground\n", "application/yaml")
    assert ctype == "application/json" and values is None
    assert orjson.loads(out) == {"propagationPolicy": "Foreground", "dryRun": ["All"]}
    out, _, _ = enforce_delete_body(b"null", "application/json")
    assert orjson.loads(out) == {"dryRun": ["All"]}


def _envelope(raw: bytes, *more: bytes) -> bytes:
    return b"k8s\x00" + _ld(1, _ld(1, b"v1") + _ld(2, b"DeleteOptions")) + _ld(2, raw) + b"".join(more)


def test_protobuf_dry_run_is_read_and_rewritten() -> None:
    raw = bytes([1 << 3, 30]) + _ld(5, b"x") + _ld(4, b"Foreground") + _ld(5, b"All")
    body = _envelope(raw)
    assert delete_body_dry_run(body, "application/vnd.kubernetes.protobuf") == ["x", "All"]
    out, ctype, values = enforce_delete_body(body, "application/vnd.kubernetes.protobuf")
    assert ctype == "application/vnd.kubernetes.protobuf" and values == ["x", "All"]
    unknown = _fields(out[4:])
    assert [f[0] for f in unknown] == [1, 2]
    assert unknown[0][3] == _ld(1, b"v1") + _ld(2, b"DeleteOptions")
    fields = [(n, p) for n, _, _, p in _fields(unknown[1][3])]
    assert fields == [(1, b""), (4, b"Foreground"), (5, b"All")]
    assert _protobuf_dry_run(out)[1] == ["All"]


def test_protobuf_last_raw_wins_and_missing_raw_gets_one() -> None:
    # Go's unmarshaller keeps the last occurrence of the raw bytes field: so does the rewrite.
    body = _envelope(_ld(5, b"All"), _ld(2, _ld(4, b"Orphan")))
    assert _protobuf_dry_run(body)[1] == []
    out, _, _ = enforce_delete_body(body, "application/vnd.kubernetes.protobuf")
    raws = [p for n, _, _, p in _fields(out[4:]) if n == 2]
    assert len(raws) == 1 and [(n, p) for n, _, _, p in _fields(raws[0])] == [(4, b"Orphan"), (5, b"All")]
    out, _, _ = enforce_delete_body(b"k8s\x00", "application/vnd.kubernetes.protobuf")
    assert _protobuf_dry_run(out)[1] == ["All"]
