"""Property tests: JSON -> protobuf -> JSON over the whole schema (hypothesis).

Objects are generated from the descriptors and Go field plans themselves, for every built-in
kind: strings, integers at their limits, bytes, maps, nested and inlined structs, Quantity,
IntOrString, Time, MicroTime, Duration, RawExtension/FieldsV1, JSONSchemaProps' unions. The
properties: no non-zero value is lost, to_json and to_obj agree, the JSON printed is a fixed
point (encoding it again gives the same protobuf bytes), and watch frames round-trip.
"""

from __future__ import annotations

import base64
import json
from functools import cache
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.codec import ProtobufCodec, canonical_quantity, load_schema
from kproxy.codec.gotypes import SPECIAL, GoType
from kproxy.codec.wellknown import format_duration, format_micro_time, format_time

SCHEMA = load_schema()
CODEC = ProtobufCodec(SCHEMA)
MAX_DEPTH = 4

KINDS = sorted(
    (group, version, kind, full) for (group, version, kind), full in SCHEMA.kinds.items() if "testapigroup" not in full
)

_INTS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}

text = st.text(max_size=6)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**53), 2**53), text)
raw_json = st.dictionaries(st.text(max_size=4), st.one_of(json_leaf, st.lists(json_leaf, max_size=2)), max_size=3)
quantity = st.builds(
    lambda whole, frac, suffix: canonical_quantity(f"{whole}{frac}{suffix}"),
    st.integers(-(10**6), 10**9),
    st.sampled_from(["", ".5", ".25", ".001"]),
    st.sampled_from(["", "m", "k", "M", "Ki", "Mi", "Gi", "e3"]),
)


def _special(kind: str, fd: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if kind == "time":
        return st.integers(0, 4102444800).map(format_time)
    if kind == "microtime":
        seconds, micros = st.integers(0, 4102444800), st.integers(0, 999999)
        return st.builds(lambda s, us: format_micro_time(s, us * 1000), seconds, micros)
    if kind == "duration":
        return st.integers(-(10**15), 10**15).map(format_duration)
    if kind == "quantity":
        return quantity
    if kind == "intorstring":
        return st.one_of(st.integers(-(2**31), 2**31 - 1), text)
    if kind in ("rawext", "rawjson"):
        return raw_json
    schema = fd.message_type.fields_by_name["schema"].message_type.full_name
    nested = message(schema, depth + 1)
    if kind == "schemaorbool":
        return st.one_of(st.booleans(), nested)
    if kind == "schemaorarray":
        return st.one_of(nested, st.lists(nested, min_size=1, max_size=2))
    return st.one_of(nested, st.lists(text, min_size=1, max_size=2))


def _scalar(fd: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = fd.type
    if t == FieldDescriptor.TYPE_STRING:
        return text
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode())
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t in _INTS:
        lo, hi = _INTS[t]
        return st.one_of(st.integers(lo, hi), st.sampled_from([lo, hi, 0, 1, -1 if lo else 2]))
    if t == FieldDescriptor.TYPE_DOUBLE:
        return st.floats(allow_nan=False, allow_infinity=False)
    raise AssertionError(f"no strategy for {fd.full_name}")


def _value(go: GoType, fd: FieldDescriptor, depth: int, element: bool = False) -> st.SearchStrategy[Any]:
    """A JSON value for one (non-repeated) value of the field."""
    if go.kind == "ptr" and go.elem is not None:
        go = go.elem
    if fd.type != FieldDescriptor.TYPE_MESSAGE:
        return _scalar(fd)
    special = SPECIAL.get(SCHEMA.go_of_message.get(fd.message_type.full_name, ""))
    if special is not None:
        return _special(special, fd, depth)
    if go.kind == "slice" and not element:
        items = fd.message_type.fields_by_name["items"]
        return st.lists(_scalar(items), max_size=2)
    return message(fd.message_type.full_name, depth + 1)


def _field(go: GoType, fd: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
    if fd.is_repeated and fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        val_fd = fd.message_type.fields_by_name["value"]
        elem = go.elem if go.kind == "map" and go.elem is not None else GoType("other")
        return st.dictionaries(text, _value(elem, val_fd, depth), max_size=2)
    if fd.is_repeated:
        elem = go.elem if go.kind == "slice" and go.elem is not None else GoType("other")
        return st.lists(_value(elem, fd, depth, element=True), max_size=2)
    return _value(go, fd, depth)


def _keys(full: str, depth: int) -> dict[str, st.SearchStrategy[Any]]:
    keys: dict[str, st.SearchStrategy[Any]] = {}
    for fp in SCHEMA.plan(full).fields:
        if fp.inline:
            for key, strategy in _keys(fp.proto.message_type.full_name, depth).items():
                keys.setdefault(key, strategy)
        else:
            keys[fp.json] = _field(fp.go, fp.proto, depth)
    return keys


@cache
def message(full: str, depth: int) -> st.SearchStrategy[dict[str, Any]]:
    if depth > MAX_DEPTH:
        return st.just({})
    return st.deferred(lambda: st.fixed_dictionaries({}, optional=_keys(full, depth)))


def _is_zero(v: Any) -> bool:
    """Go's zero value as JSON shows it (a zero Quantity is "0", a zero Duration "0s")."""
    if isinstance(v, dict):
        return all(_is_zero(x) for x in v.values())
    if isinstance(v, list):
        return not v
    return v is None or v is False or v in ("", "0", "0s") or (not isinstance(v, str) and v == 0)


def _assert_preserved(sent: Any, got: Any, path: str = "") -> None:
    """Every non-zero value sent comes back (zero values may be printed, null or omitted, as Go
    does for that field)."""
    if isinstance(sent, dict):
        assert isinstance(got, dict), path
        for k, v in sent.items():
            if _is_zero(v):
                assert k not in got or _is_zero(got[k]), f"{path}.{k}"
            else:
                assert k in got, f"{path}.{k} lost"
                _assert_preserved(v, got[k], f"{path}.{k}")
    elif isinstance(sent, list):
        assert isinstance(got, list) and len(got) == len(sent), path
        for i, (a, b) in enumerate(zip(sent, got, strict=True)):
            _assert_preserved(a, b, f"{path}[{i}]")
    else:
        assert sent == got, f"{path}: {sent!r} != {got!r}"


@st.composite
def objects(draw: st.DrawFn) -> dict[str, Any]:
    group, version, kind, full = draw(st.sampled_from(KINDS))
    body = draw(message(full, 0))
    return {"apiVersion": f"{group}/{version}" if group else version, "kind": kind, **body}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(objects())
def test_json_protobuf_json_round_trip(obj: dict[str, Any]) -> None:
    envelope = CODEC.from_json(obj)
    out = CODEC.to_obj(envelope)
    assert out["kind"] == obj["kind"] and out.get("apiVersion", "") == obj["apiVersion"]
    _assert_preserved(obj, out)
    assert json.loads(CODEC.to_json(envelope)) == out
    # The JSON we print is a fixed point, and so are the bytes after one cycle (not before: an
    # empty omitempty []byte is sent as "" but printed as nothing, both as Go does).
    again = CODEC.from_json(out)
    assert CODEC.to_obj(again) == out
    assert CODEC.from_json(CODEC.to_obj(again)) == again
    t = CODEC.list_transcoder()
    assert json.loads(t.feed(envelope) + t.finish()) == out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(objects(), st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]))
def test_watch_event_round_trip(obj: dict[str, Any], type_: str) -> None:
    frame = CODEC.encode_watch_event(type_, obj)
    t = CODEC.watch_transcoder()
    line = t.feed(frame[:3]) + t.feed(frame[3:]) + t.finish()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"type": type_, "object": CODEC.to_obj(CODEC.from_json(obj))}


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "CustomResourceDefinition", "Status", "Lease", "Secret"])
def test_strategies_cover_the_interesting_kinds(kind: str) -> None:
    assert any(k[2] == kind for k in KINDS)


def test_every_kind_has_a_plan() -> None:
    assert len(KINDS) > 300
    for _, _, _, full in KINDS:
        assert SCHEMA.plan(full).fields is not None
