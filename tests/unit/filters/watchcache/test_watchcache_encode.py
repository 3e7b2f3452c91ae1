"""Bodies the watch cache writes: the apiserver's byte layout for lists and objects."""

from __future__ import annotations

import orjson

from kproxy.cacher import CachedObject, Kind
from kproxy.codec import ProtobufCodec, decode_envelope
from kproxy.core.negotiation import JSON, PROTOBUF, YAML
from kproxy.filters.watchcache.encode import list_body, list_meta_json, list_meta_proto, object_body

POD = Kind("v1", "Pod", "PodList", True)
GIZMO = Kind("x.example/v1", "Gizmo", "GizmoList", False)


def _pod(codec: ProtobufCodec, name: str) -> CachedObject:
    env = codec.from_json(
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns", "resourceVersion": "7"}}
    )
    raw = decode_envelope(env).raw

    def encode(b: bytes) -> bytes:
        data = codec.to_json(env)
        return b"{" + data[len(POD.type_meta_json) :]

    return CachedObject(f"ns/{name}", "ns", name, 7, {}, {}, proto=raw, encode=encode)


def test_list_meta_layouts() -> None:
    assert list_meta_json(5, "", None) == b'{"resourceVersion":"5"}'
    assert list_meta_json(5, "tok", 3) == b'{"resourceVersion":"5","continue":"tok","remainingItemCount":3}'
    # gogo writes every string field, even empty, then remainingItemCount only when set.
    assert list_meta_proto(5, "", None) == b"\x0a\x00\x12\x015\x1a\x00"
    assert list_meta_proto(5, "t", 0) == b"\x0a\x00\x12\x015\x1a\x01t\x20\x00"


def test_builtin_list_json_and_protobuf() -> None:
    codec = ProtobufCodec()
    pods = [_pod(codec, "a"), _pod(codec, "b")]
    body = list_body(POD, pods, 9, "tok", 1, JSON, False)
    assert body.startswith(b'{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"9","continue":"tok"')
    assert body.endswith(b"]}\n")
    doc = orjson.loads(body)
    assert [i["metadata"]["name"] for i in doc["items"]] == ["a", "b"]
    assert "kind" not in doc["items"][0]  # built-in items carry no type meta
    pb = list_body(POD, pods, 9, "tok", 1, PROTOBUF, False)
    assert codec.to_json(pb) == body[:-1]
    assert orjson.loads(list_body(POD, [], 9, "", None, JSON, False))["items"] == []
    yaml = list_body(POD, pods, 9, "", None, YAML, False)
    assert yaml.startswith(b"apiVersion: v1\nitems:\n")
    pretty = list_body(POD, pods, 9, "", None, JSON, True)
    assert pretty.startswith(b'{\n  "kind": "PodList"') and orjson.loads(pretty) == orjson.loads(
        list_body(POD, pods, 9, "", None, JSON, False)
    )


def test_object_bodies() -> None:
    codec = ProtobufCodec()
    pod = _pod(codec, "a")
    assert object_body(POD, pod, JSON, False).startswith(b'{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a"')
    assert decode_envelope(object_body(POD, pod, PROTOBUF, False)).raw == pod.proto


def test_custom_resource_list_is_an_unstructured_list() -> None:
    raw = b'{"apiVersion":"x.example/v1","kind":"Gizmo","metadata":{"name":"g"}}'
    g = CachedObject("ns/g", "ns", "g", 3, {}, {}, json=raw)
    assert object_body(GIZMO, g, JSON, False) == raw + b"\n"
    assert list_body(GIZMO, [g], 4, "", None, JSON, False) == (
        b'{"apiVersion":"x.example/v1","items":[' + raw + b'],"kind":"GizmoList",'
        b'"metadata":{"continue":"","resourceVersion":"4"}}\n'
    )
    assert list_body(GIZMO, [g], 4, "t", 2, JSON, False).endswith(
        b'"metadata":{"continue":"t","remainingItemCount":2,"resourceVersion":"4"}}\n'
    )
