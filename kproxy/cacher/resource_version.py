"""An object's own bytes with another ``metadata.resourceVersion``.

The apiserver's DELETED events carry the object's last state at the deletion's resource version
(``cacher.go``/``cache_watcher.go``: ``updateResourceVersion``), and so does the DELETED a watcher
gets when an object stops matching its selector. The cache holds objects as the upstream's bytes,
so these events are made by changing that one field in the bytes: in the protobuf message (every
top-level Kubernetes kind has ``ObjectMeta metadata = 1`` and ``resourceVersion = 6`` in it) or in
a custom resource's JSON.
"""

from __future__ import annotations

import orjson

from kproxy.codec.envelope import ld, read_varint, skip_field
from kproxy.gocompat.jsonescape import go_json_dumps

_METADATA = 1
_RESOURCE_VERSION = 6


def _replace_field(msg: bytes, num: int, payload: bytes, *, first: bool) -> tuple[bytes, bytes | None]:
    """``msg`` with length-delimited field ``num`` replaced by ``payload`` (added at its place in
    field order when absent), and the old value (None when absent)."""
    pos, end = 0, len(msg)
    out: list[bytes] = []
    old: bytes | None = None
    placed = False
    while pos < end:
        start = pos
        tag, pos = read_varint(msg, pos, end)
        field, wire = tag >> 3, tag & 7
        if not placed and field > num:
            out.append(ld(num, payload))
            placed = True
        if field == num and wire == 2:
            n, vpos = read_varint(msg, pos, end)
            old = msg[vpos : vpos + n]
            pos = vpos + n
            if not placed:
                out.append(ld(num, payload))
                placed = True
            continue
        pos = skip_field(msg, wire, pos, end)
        out.append(msg[start:pos])
    if not placed:
        if first:
            out.insert(0, ld(num, payload))
        else:
            out.append(ld(num, payload))
    return b"".join(out), old


def proto_with_resource_version(message: bytes, rv: int) -> bytes:
    """A Kubernetes object's protobuf message bytes with ``metadata.resourceVersion`` = ``rv``."""
    meta = b""
    pos, end = 0, len(message)
    while pos < end:
        tag, pos = read_varint(message, pos, end)
        if tag == (_METADATA << 3 | 2):
            n, pos = read_varint(message, pos, end)
            meta = message[pos : pos + n]
            break
        pos = skip_field(message, tag & 7, pos, end)
    new_meta, _ = _replace_field(meta, _RESOURCE_VERSION, str(rv).encode(), first=False)
    out, _ = _replace_field(message, _METADATA, new_meta, first=True)
    return out


def json_with_resource_version(data: bytes, rv: int) -> bytes:
    """A JSON object's bytes with ``metadata.resourceVersion`` = ``rv``: key order kept, strings
    escaped as Go escapes them (the bytes are the apiserver's ``encoding/json`` output)."""
    obj = orjson.loads(data)
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        meta = obj["metadata"] = {}
    meta["resourceVersion"] = str(rv)
    return go_json_dumps(obj)[:-1]
