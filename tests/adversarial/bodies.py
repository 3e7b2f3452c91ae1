"""Request bodies, well-formed and hostile, in every media type the apiserver reads: JSON, YAML,
protobuf (hand-built, so a string can hold bytes that are not UTF-8), CBOR, and the patch types."""

from __future__ import annotations

import json
from typing import Any

from kproxy.codec import encode_envelope
from kproxy.codec.envelope import ld as _ld

JSON = "application/json"
YAML = "application/yaml"
PROTOBUF = "application/vnd.kubernetes.protobuf"
CBOR = "application/cbor"
APPLY_YAML = "application/apply-patch+yaml"
APPLY_CBOR = "application/apply-patch+cbor"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def cm(name: str, namespace: str | None = None, data: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data or {"k": "v"}, **extra}


def cm_json(name: str, namespace: str | None = None, **extra: Any) -> bytes:
    return json.dumps(cm(name, namespace, **extra)).encode()


def cm_yaml(name: str, namespace: str | None = None) -> bytes:
    ns = f"\n  namespace: {namespace}" if namespace else ""
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}{ns}\ndata:\n  k: v\n".encode()


def cm_protobuf(name: str, namespace: str | None = None, data: dict[bytes, bytes] | None = None) -> bytes:
    """A ConfigMap in the apiserver's protobuf envelope; keys and values are raw bytes (generated.proto:
    ConfigMap{metadata=1, data=2 (map entries key=1 value=2)}, ObjectMeta{name=1, namespace=3})."""
    meta = _ld(1, name.encode()) + (_ld(3, namespace.encode()) if namespace else b"")
    entries = b"".join(_ld(2, _ld(1, k) + _ld(2, v)) for k, v in (data or {b"k": b"v"}).items())
    return encode_envelope("v1", "ConfigMap", _ld(1, meta) + entries)


def delete_options_protobuf(dry_run: list[bytes] | None = None) -> bytes:
    """DeleteOptions{dryRun=5 (repeated string)} in the envelope."""
    raw = b"".join(_ld(5, v) for v in (dry_run or []))
    return encode_envelope("v1", "DeleteOptions", raw)


# --------------------------------------------------------------------------- CBOR (RFC 8949)


def _cbor_head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([major << 5 | n])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if n < 1 << (8 * size):
            return bytes([major << 5 | extra]) + n.to_bytes(size, "big")
    raise ValueError(n)


def cbor(value: Any) -> bytes:
    """A minimal CBOR encoder (maps, arrays, text, bytes, ints, bools, null), behind the
    self-described CBOR tag 55799 the apiserver's serializer recognises its data by."""

    def enc(v: Any) -> bytes:
        if v is None:
            return b"\xf6"
        if isinstance(v, bool):
            return b"\xf5" if v else b"\xf4"
        if isinstance(v, int):
            return _cbor_head(0, v) if v >= 0 else _cbor_head(1, -1 - v)
        if isinstance(v, str):
            b = v.encode()
            return _cbor_head(3, len(b)) + b
        if isinstance(v, bytes):  # a text string with these exact bytes (may be invalid UTF-8)
            return _cbor_head(3, len(v)) + v
        if isinstance(v, list):
            return _cbor_head(4, len(v)) + b"".join(enc(x) for x in v)
        if isinstance(v, dict):
            return _cbor_head(5, len(v)) + b"".join(enc(k) + enc(x) for k, x in v.items())
        raise TypeError(type(v))

    return b"\xd9\xd9\xf7" + enc(value)


# --------------------------------------------------------------------------- hostile bodies


def yaml_alias_bomb(levels: int = 9, width: int = 9) -> bytes:
    """Billion laughs: ``width**levels`` scalars from a few hundred bytes."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        refs = ", ".join(f"*a{i - 1}" for _ in range(width))
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"data: *a{levels}")
    return ("\n".join(lines) + "\n").encode()


def yaml_alias_bomb_cm(name: str, levels: int = 9, width: int = 9) -> bytes:
    """The bomb under a ConfigMap's (unknown) field, so only a decoder expands it."""
    body = yaml_alias_bomb(levels, width).decode().replace("\n", "\n  ")
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\nbomb:\n  {body}".encode()


def json_depth_bomb(depth: int) -> bytes:
    return b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"deep"},"x":' + b"[" * depth + b"]" * depth + b"}"


def yaml_depth_bomb(depth: int) -> bytes:
    return b"apiVersion: v1\nkind: DeleteOptions\nx: " + b"[" * depth + b"]" * depth + b"\n"


def invalid_utf8_json(name: str) -> bytes:
    head = b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"' + name.encode()
    return head + b'"},"data":{"k":"\xff\xfe"}}'


def huge_number_json(name: str) -> bytes:
    return (
        b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"'
        + name.encode()
        + b'","generation":1'
        + b"0" * 400
        + b'},"data":{"k":"v"}}'
    )


def duplicate_keys_json(name: str) -> bytes:
    return (
        b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"' + name.encode() + b'"},'
        b'"data":{"k":"v"},"data":{"k":"w"}}'
    )
