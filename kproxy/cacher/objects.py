"""One cached object, held once in the form the upstream sent it, encoded lazily for clients.

An object of a built-in kind arrives in protobuf (the message bytes inside the ``k8s\\0``
envelope) and is kept that way: a protobuf client gets those bytes back untouched, a JSON client
gets the apiserver's JSON, made by the codec the first time somebody asks and then kept (every
later reader shares it). A custom resource arrives in JSON and is kept as those exact bytes.

``labels`` and ``fields`` are what selectors look at, parsed once when the object arrives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol


class JsonEncoder(Protocol):
    """Turns an object's protobuf message bytes into the apiserver's JSON item (no kind/apiVersion)."""

    def __call__(self, raw: bytes) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Kind:
    """What the cache serves for one resource: the kind, its list kind and how items look in JSON.

    ``typed_items``: built-in lists carry items without ``kind``/``apiVersion`` (Go's typed
    structs leave TypeMeta empty inside a list); custom resource items keep theirs.
    """

    api_version: str
    kind: str
    list_kind: str
    protobuf: bool

    @property
    def type_meta_json(self) -> bytes:
        """The head the apiserver writes before a built-in object's fields: ``{"kind":..,"apiVersion":..,``."""
        return b'{"kind":"' + self.kind.encode() + b'","apiVersion":"' + self.api_version.encode() + b'",'


class CachedObject:
    """One object at one resource version. Immutable once made, except for the lazily added JSON."""

    __slots__ = ("_encode", "_json", "_partial", "fields", "key", "labels", "name", "namespace", "proto", "rv")

    def __init__(
        self,
        key: str,
        namespace: str,
        name: str,
        rv: int,
        labels: Mapping[str, str],
        fields: Mapping[str, str],
        *,
        proto: bytes | None = None,
        json: bytes | None = None,
        encode: JsonEncoder | None = None,
    ) -> None:
        if proto is None and json is None:
            raise ValueError("a cached object needs its protobuf or its JSON form")
        self.key = key
        self.namespace = namespace
        self.name = name
        self.rv = rv
        self.labels = labels
        self.fields = fields
        self.proto = proto
        self._json = json
        self._encode = encode
        self._partial: CachedObject | None = None

    @property
    def item_json(self) -> bytes:
        """The object as a JSON list item (for built-in kinds: without kind/apiVersion)."""
        data = self._json
        if data is None:
            assert self.proto is not None and self._encode is not None
            data = self._json = self._encode(self.proto)
        return data

    @property
    def has_json(self) -> bool:
        return self._json is not None

    def at_rv(self, rv: int) -> CachedObject:
        """The same object with ``metadata.resourceVersion`` = ``rv`` (a DELETED event's form)."""
        # lazy: resource_version imports kproxy.codec (protobuf); only DELETED events need it
        from .resource_version import json_with_resource_version, proto_with_resource_version

        if self.proto is not None:
            proto = proto_with_resource_version(self.proto, rv)
            return CachedObject(
                self.key, self.namespace, self.name, rv, self.labels, self.fields, proto=proto, encode=self._encode
            )
        assert self._json is not None
        data = json_with_resource_version(self._json, rv)
        return CachedObject(self.key, self.namespace, self.name, rv, self.labels, self.fields, json=data)

    def partial(self, encode: JsonEncoder) -> CachedObject:
        """The object's metadata alone, as a ``PartialObjectMetadata`` message (a built-in kind's
        field 1, which every top-level kind gives its ``ObjectMeta``: the same bytes Go writes for
        the PartialObjectMetadata the apiserver makes of it); made once, on the first ask.
        ``encode`` is the JSON encoder of that kind."""
        found = self._partial
        if found is None:
            assert self.proto is not None, "a custom resource has no protobuf metadata"
            found = self._partial = CachedObject(
                self.key,
                self.namespace,
                self.name,
                self.rv,
                self.labels,
                self.fields,
                proto=metadata_field(self.proto),
                encode=encode,
            )
        return found

    def object_json(self, kind: Kind) -> bytes:
        """The object as a GET returns it (compact, no trailing newline)."""
        item = self.item_json
        if not kind.protobuf:
            return item
        if item == b"{}":
            return kind.type_meta_json[:-1] + b"}"
        return kind.type_meta_json + item[1:]

    def __repr__(self) -> str:
        return f"CachedObject({self.key!r}, rv={self.rv})"


def object_key(namespace: str, name: str) -> str:
    """The store key, ordered as the apiserver's etcd keys are (``namespace/name``, or ``name``)."""
    return f"{namespace}/{name}" if namespace else name


def metadata_field(message: bytes) -> bytes:
    """Field 1 (``metadata``) of a Kubernetes object's protobuf message, tag and length included:
    the whole of a ``PartialObjectMetadata`` message with that metadata (empty when absent)."""
    from kproxy.codec.envelope import read_varint, skip_field  # lazy, as in at_rv

    pos, end = 0, len(message)
    while pos < end:
        start = pos
        tag, pos = read_varint(message, pos, end)
        if tag == 0x0A:
            n, pos = read_varint(message, pos, end)
            return message[start : pos + n]
        pos = skip_field(message, tag & 7, pos, end)
    return b""
