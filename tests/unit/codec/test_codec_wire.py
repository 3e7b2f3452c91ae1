"""The wire reader (JSON straight from protobuf bytes) against the upb path it stands in for.

Both paths must give the same bytes or the same CodecError, for the apiserver's own bodies
(codec_fixtures), for random objects of every kind, for encodings the apiserver never writes
but protobuf allows (repeated singular messages that upb merges, packed repeated scalars,
unknown fields, other field orders, negative and oversized integers, odd map entries), and
for damaged bytes. The fixtures must also be read by the wire reader itself, not by its
fallback, or the fast path would not be what the benchmark measures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_codec_roundtrip import objects

from kproxy.codec import CodecError, ProtobufCodec, decode_envelope, load_schema
from kproxy.codec.envelope import encode_envelope, encode_varint
from kproxy.codec.envelope import ld as _ld

FIXTURES = Path(__file__).parent / "codec_fixtures"
BODIES = sorted(p.stem for p in FIXTURES.glob("*.pb") if not p.stem.startswith("watch-"))
SCHEMA = load_schema()
WIRE = ProtobufCodec(SCHEMA)
UPB = ProtobufCodec(SCHEMA, wire=False)


def _out(codec: ProtobufCodec, body: bytes) -> bytes | str:
    try:
        return codec.to_json(body)
    except CodecError as e:
        return f"error: {e}"


def _listed(codec: ProtobufCodec, body: bytes, chunk: int) -> bytes | str:
    t = codec.list_transcoder()
    try:
        return b"".join(t.feed(body[i : i + chunk]) for i in range(0, len(body), chunk)) + t.finish()
    except CodecError as e:
        return f"error: {e}"


def _same(body: bytes) -> bytes | str:
    """Fresh codecs (empty memos) and the shared ones (warm memos) all agree."""
    fresh_wire, fresh_upb = ProtobufCodec(SCHEMA), ProtobufCodec(SCHEMA, wire=False)
    expected = _out(fresh_upb, body)
    assert _out(fresh_wire, body) == expected
    assert _out(WIRE, body) == expected
    assert _listed(WIRE, body, 97) == _listed(UPB, body, 97)
    return expected


def _varint_field(num: int, value: int) -> bytes:
    return encode_varint(num << 3) + encode_varint(value & (2**64 - 1))


@pytest.mark.parametrize("name", BODIES)
def test_fixtures_are_read_by_the_wire_reader_and_match_upb(name: str) -> None:
    body = (FIXTURES / f"{name}.pb").read_bytes()
    env = decode_envelope(body)
    _, _, wire = WIRE._kind(WIRE._frag, env.api_version, env.kind)
    assert wire is not None
    wire(env.raw, 0, len(env.raw), {})  # no Fallback raised: the fast path read it all
    before = WIRE.wire_fallbacks
    assert _same(body) == UPB.to_json(body)
    assert WIRE.wire_fallbacks == before


def test_fallbacks_are_counted() -> None:
    before = WIRE.wire_fallbacks
    merged = _pod(META, _ld(1, _ld(2, b"gen-")))  # metadata twice: left to upb, which merges
    assert json.loads(WIRE.to_json(merged))["metadata"] == {"name": "name", "generateName": "gen-", "namespace": "ns"}
    assert WIRE.wire_fallbacks == before + 1


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(objects())
def test_random_objects_of_every_kind(obj: dict[str, Any]) -> None:
    body = UPB.from_json(obj)
    out = _same(body)
    assert isinstance(out, bytes)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(BODIES), st.data())
def test_damaged_bodies_give_the_same_json_or_error(name: str, data: st.DataObject) -> None:
    body = bytearray((FIXTURES / f"{name}.pb").read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(8, len(body) - 1))
        body[at] = data.draw(st.integers(0, 255))
    _same(bytes(body))


def test_a_string_field_set_twice_keeps_the_last_value_even_when_empty() -> None:
    """Proto3's last-wins for a repeated scalar: an APIResource whose name tag was damaged into
    a second storageVersionHash ("componentstatuses", then the entry's own empty one) has an
    empty hash, as upb reads it; the wire reader kept the first (found by the test above)."""
    body = bytearray((FIXTURES / "apiresourcelist.pb").read_bytes())
    body[82] = 82
    out = _same(bytes(body))
    assert isinstance(out, bytes) and b'"storageVersionHash":"componentstatuses"' not in out


def _pod(*fields: bytes) -> bytes:
    return encode_envelope("v1", "Pod", b"".join(fields))


META = _ld(1, _ld(1, b"name") + _ld(3, b"ns"))
CONTAINER = _ld(1, b"c") + _ld(2, b"img")


@pytest.mark.parametrize(
    "body",
    [
        # metadata twice: upb merges the two messages
        _pod(META, _ld(2, _ld(2, CONTAINER)), _ld(1, _ld(2, b"gen-"))),
        # fields out of number order, and the spec before the metadata
        _pod(_ld(2, _ld(2, _ld(2, b"img") + _ld(1, b"c"))), META),
        # unknown fields of every wire type, with small and large numbers
        _pod(META, _varint_field(99, 5), _ld(3000, b"x"), b"\x29" + b"\x00" * 8, b"\x2d" + b"\x00" * 4),
        # negative numbers (10-byte varints), an int32 given 64 bits, an int64 at its limits
        _pod(_ld(1, _ld(1, b"n") + _varint_field(10, -5)), _ld(2, _varint_field(25, -30) + _varint_field(4, -1))),
        _pod(_ld(2, _varint_field(25, 2**32 + 7) + _varint_field(5, 2**63 - 1))),
        _pod(_ld(2, _varint_field(5, -(2**63)))),
        # a 10-byte varint whose last byte carries more than one bit
        _pod(_ld(2, b"\x20" + b"\xff" * 9 + b"\x7f")),
        # a repeated int64 packed (the other encoding protobuf allows) and not packed
        _pod(_ld(2, _ld(14, _ld(4, b"\x01\x02")))),
        _pod(_ld(2, _ld(14, _varint_field(4, 1) + _varint_field(4, 2)))),
        # map entries: value before key, key missing, value missing, a repeated key, extra field
        _pod(_ld(1, _ld(11, _ld(2, b"v") + _ld(1, b"k")) + _ld(11, _ld(2, b"nokey")) + _ld(11, _ld(1, b"noval")))),
        _pod(_ld(1, _ld(11, _ld(1, b"k") + _ld(2, b"a")) + _ld(11, _ld(1, b"k") + _ld(2, b"b")))),
        _pod(_ld(1, _ld(11, _ld(1, b"k") + _ld(2, b"a") + _varint_field(3, 1)))),
        # a Time given twice (merged), an empty Time, a Time of seconds 0
        _pod(_ld(1, _ld(8, _varint_field(1, 100)) + _ld(8, _varint_field(2, 5)))),
        _pod(_ld(1, _ld(8, b""))),
        _pod(_ld(1, _ld(8, _varint_field(1, 0)))),
        # a string that is not UTF-8, a field that runs past its message, a truncated varint
        _pod(_ld(1, _ld(1, b"\xff\xfe"))),
        _pod(_ld(1, b"\x0a\x20abc")),
        _pod(_ld(1, b"\x50\x80")),
        # field number 0, a group wire type
        _pod(_ld(1, b"\x02\x00")),
        _pod(_ld(1, b"\x0b\x0c")),
    ],
)
def test_encodings_the_apiserver_does_not_write(body: bytes) -> None:
    _same(body)


def test_secret_bytes_and_quantities_and_intorstring() -> None:
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"b": "AAEC", "a": ""}}
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 80, "targetPort": "http"}, {"port": 81, "targetPort": 8081}]},
    }
    for obj in (secret, svc):
        out = _same(UPB.from_json(obj))
        assert isinstance(out, bytes)
        got = json.loads(out)
        assert got["metadata"]["name"] == "s"
    assert json.loads(WIRE.to_json(UPB.from_json(secret)))["data"] == {"a": "", "b": "AAEC"}


def _watched(codec: ProtobufCodec, frames: bytes) -> bytes | str:
    t = codec.watch_transcoder()
    try:
        return t.feed(frames) + t.finish()
    except CodecError as e:
        return f"error: {e}"


WATCHES = sorted(p.stem for p in FIXTURES.glob("watch-*.pb"))


@pytest.mark.parametrize("name", WATCHES)
def test_watch_fixtures_match_upb(name: str) -> None:
    frames = (FIXTURES / f"{name}.pb").read_bytes()
    out = _watched(ProtobufCodec(SCHEMA), frames)
    assert isinstance(out, bytes) and out.count(b"\n") >= 1
    assert out == _watched(ProtobufCodec(SCHEMA, wire=False), frames)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(WATCHES), st.data())
def test_damaged_watch_frames_give_the_same_json_or_error(name: str, data: st.DataObject) -> None:
    frames = bytearray((FIXTURES / f"{name}.pb").read_bytes())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(4, len(frames) - 1))
        frames[at] = data.draw(st.integers(0, 255))
    assert _watched(WIRE, bytes(frames)) == _watched(UPB, bytes(frames))


def test_list_with_an_item_left_to_upb_in_the_middle() -> None:
    """The list transcoder's walk over complete items stops at an item the wire reader leaves
    to upb (metadata given twice), which the general path then takes; fed in chunks that cut
    items anywhere, the JSON is the upb path's."""
    good = _ld(1, _ld(1, b"a") + _ld(3, b"ns")) + _ld(2, _ld(2, CONTAINER))
    odd = _ld(1, _ld(1, b"b")) + _ld(1, _ld(2, b"gen-"))
    items = b"".join(_ld(2, item) for item in (good, good, odd, good, odd, good))
    body = encode_envelope("v1", "PodList", _ld(1, _ld(2, b"42")) + items)
    expected = UPB.to_json(body)
    assert json.loads(expected)["items"][2]["metadata"] == {"name": "b", "generateName": "gen-"}
    before = WIRE.wire_fallbacks
    for chunk in (1, 7, 64, 4096):
        assert _listed(WIRE, body, chunk) == expected
    assert WIRE.wire_fallbacks > before
    assert _out(WIRE, body) == expected
