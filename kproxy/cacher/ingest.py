"""From the upstream's bytes to CachedObjects: protobuf messages for built-in kinds, JSON otherwise.

Parsing happens once per object as it arrives: its key, resource version, labels and the fields
its resource can be selected by. The JSON a client sees is made later, lazily, by the codec.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from kproxy.cacher import CachedObject, Kind, object_key
from kproxy.cacher.fields import SelectableFields
from kproxy.cacher.objects import JsonEncoder
from kproxy.codec import CodecError, Envelope, ProtobufCodec
from kproxy.codec.envelope import iter_fields

_MAX_SHARED = 1 << 16


class ObjectError(ValueError):
    """The upstream sent something that is not an object of this kind."""


def _rv(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ObjectError(f"resourceVersion {text!r} is not a number") from None


def item_json_encoder(codec: ProtobufCodec, kind: Kind) -> JsonEncoder:
    """The apiserver's JSON of a message of ``kind`` as a list item (without kind and apiVersion),
    made by the codec: what :class:`CachedObject` makes lazily for a JSON reader."""
    head = kind.type_meta_json
    bare = head[:-1] + b"}"

    def encode(raw: bytes) -> bytes:
        data = codec.envelope_to_json(Envelope(kind.api_version, kind.kind, raw))
        if not data.startswith(head):
            if data == bare:
                return b"{}"
            raise ObjectError("unexpected JSON head from the codec")
        return b"{" + data[len(head) :]

    return encode


@dataclass
class ObjectFactory:
    kind: Kind
    fields: SelectableFields
    codec: ProtobufCodec

    def __post_init__(self) -> None:
        if self.kind.protobuf:
            full = self.codec.schema.lookup_kind(self.kind.api_version, self.kind.kind)
            if full is None:
                raise ObjectError(f"no protobuf schema for {self.kind.kind} {self.kind.api_version}")
            self._cls: Any = self.codec.schema.message_class(full)
            self._encode = item_json_encoder(self.codec, self.kind)
        # Equal label sets are held once (replicas share them). Field values are not: every
        # object's include its own name (``metadata.name``), so no two are equal.
        self._shared: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}

    def _share(self, d: dict[str, str]) -> dict[str, str]:
        key = tuple(d.items())
        found = self._shared.get(key)
        if found is not None:
            return found
        if len(self._shared) >= _MAX_SHARED:
            self._shared.clear()
        self._shared[key] = d
        return d

    def from_proto(self, raw: bytes) -> CachedObject:
        """A protobuf message (no envelope) of the kind."""
        msg = self._cls.FromString(raw)
        meta = msg.metadata
        ns, name = meta.namespace, meta.name
        return CachedObject(
            object_key(ns, name),
            ns,
            name,
            _rv(meta.resourceVersion),
            self._share(dict(meta.labels)),
            self.fields.from_message(msg),
            proto=raw,
            encode=self._encode,
        )

    def from_json(self, raw: bytes, obj: dict[str, Any] | None = None) -> CachedObject:
        """A JSON object exactly as the upstream encoded it (kept byte for byte)."""
        if obj is None:
            obj = orjson.loads(raw)
        if not isinstance(obj, dict):
            raise ObjectError("not a JSON object")
        meta = obj.get("metadata") or {}
        ns, name = meta.get("namespace") or "", meta.get("name") or ""
        labels = self._share(meta.get("labels") or {})
        return CachedObject(
            object_key(ns, name),
            ns,
            name,
            _rv(meta.get("resourceVersion") or "0"),
            labels,
            self.fields.from_dict(obj),
            json=bytes(raw),
        )

    def restore(
        self,
        ns: str,
        name: str,
        rv: int,
        labels: dict[str, str],
        fields: dict[str, str],
        proto: bytes | None,
        json: bytes | None,
    ) -> CachedObject:
        """An object as :mod:`kproxy.cacher.persist` stored it: what :meth:`from_proto` or
        :meth:`from_json` parsed when it arrived, kept beside its bytes (nothing is parsed again).
        ObjectError when it was stored in another form or with other selectable fields (a state
        written by another kproxy version: listed again)."""
        if (proto is not None) != self.kind.protobuf or (proto is None and json is None):
            raise ObjectError("persisted in another form than the resource's")
        if fields.keys() != self.fields.names:
            raise ObjectError("persisted with other selectable fields")
        return CachedObject(
            object_key(ns, name),
            ns,
            name,
            rv,
            self._share(labels),
            fields,
            proto=proto,
            json=json,
            encode=self._encode if proto is not None else None,
        )

    def bookmark_rv_proto(self, raw: bytes) -> tuple[int, bool]:
        """(resource version, initial-events-end) of a protobuf BOOKMARK object."""
        meta = self._cls.FromString(raw).metadata
        end = meta.annotations.get("k8s.io/initial-events-end") == "true"
        return _rv(meta.resourceVersion), end


def split_list(raw: bytes) -> tuple[bytes, list[bytes]]:
    """A protobuf list message -> (ListMeta bytes, each item's message bytes).

    Every Kubernetes list is ``metadata = 1`` (ListMeta) and ``items = 2`` (repeated)."""
    meta = b""
    items: list[bytes] = []
    for num, start, end in _fields(raw):
        if num == 1:
            meta = raw[start:end]
        elif num == 2:
            items.append(raw[start:end])
    return meta, items


def _fields(raw: bytes) -> Iterator[tuple[int, int, int]]:
    """Each length-delimited field: (number, payload start, payload end)."""
    for num, wire, _, start, end in iter_fields(raw):
        if wire == 2:
            yield num, start, end


def object_rv(raw: bytes) -> int | None:
    """``metadata.resourceVersion`` of an object's protobuf message (no envelope), or None when it
    has none or it is not a number. Every Kubernetes object is ``metadata = 1`` (ObjectMeta), and
    ObjectMeta's ``resourceVersion`` is field 6."""
    try:
        for num, wire, _, start, end in iter_fields(raw):
            if num == 1 and wire == 2:
                for num2, wire2, _, start2, end2 in iter_fields(raw, start, end):
                    if num2 == 6 and wire2 == 2:
                        text = raw[start2:end2]
                        return int(text) if text.isdigit() else None
                return None
    except CodecError:  # not a protobuf message after all
        return None
    return None


def list_meta_rv(meta: bytes) -> tuple[int, str]:
    """(resourceVersion, continue) of ListMeta bytes (fields 2 and 3)."""
    rv, cont = 0, ""
    for num, start, end in _fields(meta):
        if num == 2:
            rv = _rv(meta[start:end].decode())
        elif num == 3:
            cont = meta[start:end].decode()
    return rv, cont
