"""Bodies of what the cache serves, byte for byte as the apiserver writes them.

JSON: ``encoding/json``'s Encoder output (compact, trailing newline) with ListMeta's fields in Go
order; built-in list items without kind/apiVersion (metadata-only lists' items with theirs:
:mod:`.partial`). Protobuf: the ``k8s\\0`` envelope around the
list message, ListMeta written as gogo-protobuf writes it (every string field, even empty, then
``remainingItemCount`` only when set), items as the upstream's own message bytes. YAML and pretty
JSON are made from the JSON.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from kproxy import gctuning
from kproxy.cacher import CachedObject, Kind
from kproxy.cacher.objects import JsonEncoder
from kproxy.codec import MAGIC, encode_envelope
from kproxy.codec.envelope import encode_varint, ld
from kproxy.core.negotiation import JSON, PROTOBUF, YAML
from kproxy.core.status import generic
from kproxy.gocompat.jsonescape import go_json_dumps
from kproxy.gocompat.jsonindent import indent as go_indent

from .partial import META_KIND, base_media, partial_media


def list_meta_json(rv: int, cont: str, remaining: int | None) -> bytes:
    out = b'{"resourceVersion":"' + str(rv).encode() + b'"'
    if cont:
        out += b',"continue":"' + cont.encode() + b'"'  # base64url: nothing to escape
    if remaining is not None:
        out += b',"remainingItemCount":' + str(remaining).encode()
    return out + b"}"


def list_meta_proto(rv: int, cont: str, remaining: int | None) -> bytes:
    out = b"\x0a\x00" + ld(2, str(rv).encode()) + ld(3, cont.encode())
    if remaining is not None:
        out += b"\x20" + encode_varint(remaining & 0xFFFFFFFFFFFFFFFF)
    return out


def items_part(
    kind: Kind, items: Sequence[CachedObject], media_type: str, partial_encode: JsonEncoder | None = None
) -> bytes:
    """The items of a list, encoded and joined: what does not depend on the list's resource
    version or continue token, so it can be kept while only the resource version moves.
    A metadata-only list's items (``partial_encode``: the JSON encoder of their kind) are the
    objects' ``PartialObjectMetadata``, which in JSON carry their kind and apiVersion."""
    media_type, partial = base_media(media_type)
    if partial:
        assert partial_encode is not None
        items = [o.partial(partial_encode) for o in items]
        if media_type != PROTOBUF:
            return b",".join([o.object_json(META_KIND) for o in items])
    if media_type == PROTOBUF:
        parts = []
        for o in items:
            assert o.proto is not None
            parts.append(b"\x12" + encode_varint(len(o.proto)))
            parts.append(o.proto)
        return b"".join(parts)
    return b",".join([o.item_json for o in items])


def list_body(
    kind: Kind,
    items: Sequence[CachedObject],
    rv: int,
    cont: str,
    remaining: int | None,
    media_type: str,
    pretty: bool,
    partial_encode: JsonEncoder | None = None,
) -> bytes:
    items_data = items_part(kind, items, media_type, partial_encode)
    return assemble(kind, items_data, rv, cont, remaining, media_type, pretty)


def assemble(
    kind: Kind, items: bytes, rv: int, cont: str, remaining: int | None, media_type: str, pretty: bool
) -> bytes:
    """A whole list body around an :func:`items_part` (one copy of the items)."""
    media_type, partial = base_media(media_type)
    if partial:
        kind = META_KIND
    if media_type == PROTOBUF:
        meta = ld(1, list_meta_proto(rv, cont, remaining))
        raw_len = len(meta) + len(items)
        type_meta = ld(1, kind.api_version.encode()) + ld(2, kind.list_kind.encode())
        # encode_envelope's layout, without first joining the list message on its own.
        return b"".join(
            (
                MAGIC,
                ld(1, type_meta),
                b"\x12",
                encode_varint(raw_len),
                meta,
                items,
                b"\x1a\x00\x22\x00",
            )
        )
    if not kind.protobuf:
        return _reshape(_unstructured_list(kind, items, rv, cont, remaining), media_type, pretty)
    # A transformed list's items are appended one by one to a nil slice: none is ``null``
    # (asPartialObjectMetadataList), where the apiserver sets an empty list's items to ``[]``.
    items_json = (b"[", items, b"]") if items or not partial else (b"null",)
    data = b"".join(
        (
            b'{"kind":"',
            kind.list_kind.encode(),
            b'","apiVersion":"',
            kind.api_version.encode(),
            b'","metadata":',
            list_meta_json(rv, cont, remaining),
            b',"items":',
            *items_json,
            b"}\n",
        )
    )
    return _reshape(data, media_type, pretty)


def _unstructured_list(kind: Kind, items: bytes, rv: int, cont: str, remaining: int | None) -> bytes:
    """A custom resource list as the apiserver encodes an unstructured list: a Go map, so keys in
    sorted order, and ``continue`` always present (empty when the list is complete)."""
    meta = b'{"continue":"' + cont.encode() + b'"'
    if remaining is not None:
        meta += b',"remainingItemCount":' + str(remaining).encode()
    meta += b',"resourceVersion":"' + str(rv).encode() + b'"}'
    return b"".join(
        (
            b'{"apiVersion":"',
            kind.api_version.encode(),
            b'","items":[',
            items,
            b'],"kind":"',
            kind.list_kind.encode(),
            b'","metadata":',
            meta,
            b"}\n",
        )
    )


def object_body(
    kind: Kind, obj: CachedObject, media_type: str, pretty: bool, partial_encode: JsonEncoder | None = None
) -> bytes:
    media_type, partial = base_media(media_type)
    if partial:
        assert partial_encode is not None
        kind, obj = META_KIND, obj.partial(partial_encode)
    if media_type == PROTOBUF:
        assert obj.proto is not None
        return encode_envelope(kind.api_version, kind.kind, obj.proto)
    return _reshape(obj.object_json(kind) + b"\n", media_type, pretty)


#: Bytes without which go-yaml's reader cannot refuse a JSON document (DEL, C1 controls, U+FFFE/F).
_YAML_SUSPECTS = (b"\x7f", b"\xc2", b"\xef\xbf")


def _reshape(data: bytes, media_type: str, pretty: bool) -> bytes:
    """YAML or pretty JSON from the JSON. Where the apiserver's YAML writer fails (a character
    go-yaml refuses), its 500 Status (a plain Go error: no reason), raised as the apiserver's
    ``SerializeObject`` answers it."""
    if media_type != YAML and not pretty:
        return data
    if media_type != YAML and b"\\ufffd" in data:
        # Go's escapes for bytes that were not UTF-8 (kproxy.gocompat.utf8), which Python objects
        # cannot tell from a real U+FFFD: MarshalIndent is Indent of the compact bytes.
        return go_indent(data.rstrip(b"\n"))
    # A whole list as Python objects, briefly: no collection walks them (kproxy.gctuning).
    with gctuning.paused():
        obj = orjson.loads(data)
        if media_type != YAML:
            return go_json_dumps(obj, pretty=True)
        # lazy: YAML's encoder loads with the first YAML answer, not before kproxy listens
        from kproxy.codec.yamlcodec import go_yaml_error, to_yaml

        if any(b in data for b in _YAML_SUSPECTS):
            failure = go_yaml_error(obj)
            if failure is not None:
                raise generic(500, "", failure)
        return to_yaml(obj)


CONTENT_TYPES = {JSON: "application/json", YAML: "application/yaml", PROTOBUF: PROTOBUF}
CONTENT_TYPES.update({partial_media(m): t for m, t in CONTENT_TYPES.items()})  # the same, as the apiserver's
