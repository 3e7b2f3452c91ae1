"""An object's metadata alone, as PartialObjectMetadata: field 1 of its protobuf message."""

from __future__ import annotations

from kproxy.cacher import CachedObject
from kproxy.cacher.objects import metadata_field
from kproxy.codec import ProtobufCodec, decode_envelope, encode_envelope


def test_partial_object_metadata_is_field_one() -> None:
    codec = ProtobufCodec()
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "namespace": "n", "resourceVersion": "7", "labels": {"b": "2", "a": "1"}},
        "data": {"k": "v"},
    }
    raw = decode_envelope(codec.from_json(cm)).raw
    partial = metadata_field(raw)
    assert partial[0] == 0x0A and raw.startswith(partial)  # ObjectMeta is written first
    doc = codec.to_obj(encode_envelope("meta.k8s.io/v1", "PartialObjectMetadata", partial))
    assert doc == {
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": codec.to_obj(codec.from_json(cm))["metadata"],
    }
    assert metadata_field(b"") == b"" and metadata_field(b"\x12\x00") == b""  # no metadata: an empty one


def test_partial_is_made_once() -> None:
    calls: list[bytes] = []

    def encode(raw: bytes) -> bytes:
        calls.append(raw)
        return b"{}"

    obj = CachedObject("n/c", "n", "c", 7, {}, {}, proto=b"\x0a\x03\x0a\x01c\x12\x00")
    first = obj.partial(encode)
    assert first is obj.partial(encode) and first.proto == b"\x0a\x03\x0a\x01c" and first.rv == 7
    assert first.item_json == b"{}" and first.item_json == b"{}" and len(calls) == 1
