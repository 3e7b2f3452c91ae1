"""An object's bytes with another resource version (DELETED events' form), protobuf and JSON."""

from __future__ import annotations

import orjson

from kproxy.cacher.resource_version import json_with_resource_version, proto_with_resource_version
from kproxy.codec import ProtobufCodec, decode_envelope, encode_envelope

_codec = ProtobufCodec()

POD = {
    "kind": "Pod",
    "apiVersion": "v1",
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "resourceVersion": "41",
        "labels": {"app": "x"},
    },
    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
}


def _message(obj: dict[str, object]) -> bytes:
    return decode_envelope(_codec.from_json(obj)).raw


def _decoded(message: bytes) -> dict[str, object]:
    return orjson.loads(_codec.to_json(encode_envelope("v1", "Pod", message)))


def test_protobuf_resource_version_replaced_everything_else_kept() -> None:
    patched = _decoded(proto_with_resource_version(_message(POD), 1234567))
    want = orjson.loads(_codec.to_json(_codec.from_json(POD)))
    want["metadata"]["resourceVersion"] = "1234567"
    assert patched == want


def test_protobuf_resource_version_added_in_field_order_when_absent() -> None:
    bare = {**POD, "metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}}}
    patched = proto_with_resource_version(_message(bare), 7)
    with_rv = {**POD, "metadata": {**bare["metadata"], "resourceVersion": "7"}}  # type: ignore[dict-item]
    # Byte-equal to what the encoder writes for the object that has it: fields stay in number order.
    assert patched == _message(with_rv)


def test_protobuf_without_metadata_gets_one() -> None:
    patched = _decoded(proto_with_resource_version(b"", 9))
    assert patched["metadata"] == {"resourceVersion": "9"}


def test_json_resource_version_replaced_key_order_and_go_escapes_kept() -> None:
    data = (
        b'{"apiVersion":"x/v1","kind":"K","metadata":{"name":"a","resourceVersion":"5"},"spec":{"s":"\\u003cb\\u003e"}}'
    )
    assert json_with_resource_version(data, 77) == data.replace(b'"5"', b'"77"')
