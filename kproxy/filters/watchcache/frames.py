"""Watch frames for the cache's client watches, byte for byte as kube-apiserver writes them.

A frame is the complete bytes of one event on the wire, before HTTP chunking
(``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/watch.go``, ``response.go`` ``watchEncoder``):

- JSON: ``encoding/json``'s Encoder output for ``metav1.WatchEvent``: the compact
  ``{"type":..,"object":..}`` followed by ``\\n``, no other framing.
- Protobuf: a 4-byte big-endian length, then a raw ``metav1.WatchEvent`` message (no ``k8s\\0``):
  field 1 the type, field 2 a RawExtension whose field 1 holds the object's complete ``k8s\\0``
  envelope (``RawSerializer`` + ``LengthDelimitedFramer`` in apimachinery's protobuf serializer).

Bookmarks (``cacher.go``): an otherwise empty object of the watched kind carrying only
``metadata.resourceVersion`` (plus the ``k8s.io/initial-events-end`` annotation for the bookmark
that ends the initial events). For built-in kinds that is Go's zero struct: its protobuf is what
gogo writes for it (every non-pointer field present) and its JSON what ``encoding/json`` writes
(``"spec":{"containers":null}`` for a Pod); both come from the codec, which builds exactly that
zero value. Except that the zero struct the apiserver starts from is its INTERNAL type's, converted
to the watched version: where a conversion fills something in for a zero value, the bookmark
carries it (:data:`_CONVERTED_ZERO`). And the zero value is the upstream's minor's: a field a newer
minor added (``kproxy.codec.schema.NEWER_FIELDS``) is in it only from that minor. Checked against
v1.37.1 for every built-in kind it serves (tests/e2e/test_watchcache_frames_apiserver.py), and
against 1.35 and 1.36 by the compatibility run. Custom resources are unstructured maps, so JSON
with sorted keys.

ERROR events carry a ``metav1.Status`` (JSON as :mod:`kproxy.core.status` renders it; protobuf as the
``v1`` ``Status`` envelope).

Every frame is built once per event and format and then shared by all watchers (the cacher does
the same with its ``cachingObject``), so the hot path here is a single ``bytes.join``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, Final

from kproxy.cacher import CachedObject, Kind
from kproxy.cacher.ingest import item_json_encoder
from kproxy.cacher.objects import JsonEncoder
from kproxy.codec import MAGIC, ProtobufCodec
from kproxy.codec.envelope import encode_varint, ld
from kproxy.core.negotiation import JSON, PROTOBUF, PROTOBUF_WATCH
from kproxy.core.upstreamversion import UpstreamVersion
from kproxy.gocompat.jsonescape import go_json_dumps

from .partial import META_KIND, base_media, partial_media

#: The watch response's Content-Type per media type: JSON gets no ``;stream=watch``.
CONTENT_TYPES: Final[dict[str, str]] = {JSON: JSON, PROTOBUF: PROTOBUF_WATCH}
CONTENT_TYPES.update({partial_media(m): t for m, t in CONTENT_TYPES.items()})  # metadata-only: the same
_DIRECT: Final = frozenset({JSON, PROTOBUF})

#: ``metav1.InitialEventsAnnotationKey``.
INITIAL_EVENTS_END: Final = "k8s.io/initial-events-end"

BOOKMARK: Final = "BOOKMARK"
ERROR: Final = "ERROR"

# What the apiserver's conversions of an internal zero object add to the versioned zero struct
# (pkg/apis/apps/v1/conversion.go and the generated conversions): apps/v1 turns the internal
# non-pointer ``spec.replicas`` into a pointer to 0, and writes the internal DaemonSet's
# ``templateGeneration`` as an annotation. Every other built-in kind of v1.37.1 adds nothing.
_CONVERTED_ZERO: Final[dict[tuple[str, str], dict[str, Any]]] = {
    ("apps/v1", "Deployment"): {"spec": {"replicas": 0}},
    ("apps/v1", "ReplicaSet"): {"spec": {"replicas": 0}},
    ("apps/v1", "StatefulSet"): {"spec": {"replicas": 0}},
    ("apps/v1", "DaemonSet"): {"metadata": {"annotations": {"deprecated.daemonset.template.generation": "0"}}},
}

# What gogo writes after the envelope's raw object: contentEncoding and contentType, both empty.
_ENVELOPE_TAIL: Final = b"\x1a\x00\x22\x00"


class FrameEncoder:
    """Watch frames for one kind, byte for byte as kube-apiserver writes them."""

    __slots__ = (
        "_bookmark_rv",
        "_bookmarks",
        "_codec",
        "_env_head",
        "_json_heads",
        "_newer",
        "_partial",
        "_partial_encode",
        "_proto_heads",
        "_version",
        "kind",
    )

    def __init__(self, kind: Kind, codec: ProtobufCodec, version: UpstreamVersion | None = None) -> None:
        self.kind = kind
        self._codec = codec
        # Fields of the kind's zero value that depend on the upstream's minor (NEWER_FIELDS).
        self._version = version or UpstreamVersion()
        self._newer = codec.newer_fields(kind.api_version, kind.kind) if kind.protobuf else {}
        # Metadata-only watches (:mod:`.partial`): their frames by an encoder of PartialObjectMetadata.
        self._partial: FrameEncoder | None = None
        self._partial_encode: JsonEncoder | None = None
        # The envelope up to the raw object's length: magic, typeMeta {apiVersion, kind}, raw's tag.
        type_meta = ld(1, kind.api_version.encode()) + ld(2, kind.kind.encode())
        self._env_head = MAGIC + ld(1, type_meta) + b"\x12"
        # Per event type: the JSON line's head and the WatchEvent message's type field + object tag.
        self._json_heads: dict[str, bytes] = {}
        self._proto_heads: dict[str, bytes] = {}
        # Bookmarks go to many watchers at the same resource version: kept for the last one only.
        self._bookmark_rv = -1
        self._bookmarks: dict[tuple[str, bool], bytes] = {}

    # -- events -----------------------------------------------------------------------------------
    def event(self, type_: str, obj: CachedObject, media_type: str) -> bytes:
        """The frame of an ADDED / MODIFIED / DELETED event carrying ``obj``."""
        return b"".join(self._parts(type_, obj, media_type))

    def events(self, type_: str, objects: Iterable[CachedObject], media_type: str) -> bytes:
        """The frames of one event type for many objects, joined (the initial events of a watch):
        equal to joining :meth:`event` of each, with one copy of every object instead of two."""
        parts = self._parts
        return b"".join([p for obj in objects for p in parts(type_, obj, media_type)])

    @property
    def partial_encode(self) -> JsonEncoder:
        """The JSON encoder of the objects' metadata-only form (:meth:`CachedObject.partial`), one per
        kind: the cache's lists and gets use it as these frames do."""
        if self._partial_encode is None:
            self._partial_encode = item_json_encoder(self._codec, META_KIND)
        return self._partial_encode

    def _partial_frames(self) -> tuple[FrameEncoder, JsonEncoder]:
        if self._partial is None:
            self._partial = FrameEncoder(META_KIND, self._codec, self._version)
        return self._partial, self.partial_encode

    def _parts(self, type_: str, obj: CachedObject, media_type: str) -> tuple[bytes | memoryview, ...]:
        if media_type not in _DIRECT:
            media_type, partial = base_media(media_type)
            if partial:
                frames, encode = self._partial_frames()
                return frames._parts(type_, obj.partial(encode), media_type)
        if media_type == JSON:
            item = obj.item_json
            kind = self.kind
            head = self._json_heads.get(type_) or self._json_head(type_)
            if not kind.protobuf:
                return (head, item, b"}\n")
            # CachedObject.object_json's layout (type meta, then the item's fields), with the
            # item referenced in place rather than copied into a whole object first.
            if item == b"{}":
                return (head, kind.type_meta_json[:-1], b"}}\n")
            return (head, kind.type_meta_json, memoryview(item)[1:], b"}\n")
        if media_type == PROTOBUF:
            raw = obj.proto
            if raw is None:
                return (self._envelope_frame(type_, self._envelope_of_json(obj.object_json(self.kind))),)
            return self._proto_parts(type_, raw)
        raise ValueError(f"no watch framing for {media_type!r}")

    def _json_head(self, type_: str) -> bytes:
        # Event types are Go constants (ASCII): nothing to escape.
        head = self._json_heads[type_] = b'{"type":"' + type_.encode() + b'","object":'
        return head

    def _json_frame(self, type_: str, obj_json: bytes) -> bytes:
        head = self._json_heads.get(type_) or self._json_head(type_)
        return b"".join((head, obj_json, b"}\n"))

    def _proto_head(self, type_: str) -> bytes:
        head = self._proto_heads.get(type_)
        if head is None:
            head = self._proto_heads[type_] = ld(1, type_.encode()) + b"\x12"
        return head

    def _proto_parts(self, type_: str, raw: bytes) -> tuple[bytes, ...]:
        """The frame around the object's message bytes, with the envelope written in place."""
        head = self._proto_head(type_)
        raw_len = encode_varint(len(raw))
        env_len = len(self._env_head) + len(raw_len) + len(raw) + len(_ENVELOPE_TAIL)
        env_len_b = encode_varint(env_len)
        ext_len = 1 + len(env_len_b) + env_len  # RawExtension {1: raw = the envelope}
        ext_len_b = encode_varint(ext_len)
        event_len = len(head) + len(ext_len_b) + ext_len
        return (
            event_len.to_bytes(4, "big"),
            head,
            ext_len_b,
            b"\x0a",
            env_len_b,
            self._env_head,
            raw_len,
            raw,
            _ENVELOPE_TAIL,
        )

    def _envelope_frame(self, type_: str, envelope: bytes) -> bytes:
        """Frame around an object already in its ``k8s\\0`` envelope."""
        head = self._proto_head(type_)
        env_len_b = encode_varint(len(envelope))
        ext_len = 1 + len(env_len_b) + len(envelope)
        ext_len_b = encode_varint(ext_len)
        event_len = len(head) + len(ext_len_b) + ext_len
        return b"".join((event_len.to_bytes(4, "big"), head, ext_len_b, b"\x0a", env_len_b, envelope))

    def _envelope_of_json(self, obj_json: bytes | dict[str, Any]) -> bytes:
        if not self.kind.protobuf:
            raise ValueError(f"{self.kind.kind} ({self.kind.api_version}) has no protobuf form")
        return self._codec.from_json(obj_json)

    # -- bookmarks --------------------------------------------------------------------------------
    def bookmark(self, rv: int, media_type: str, *, initial_events_end: bool = False) -> bytes:
        """A BOOKMARK at ``rv``; with ``initial_events_end`` the one that ends the initial events."""
        if media_type not in _DIRECT:
            base, partial = base_media(media_type)
            if partial:  # an empty PartialObjectMetadata: what transforming the kind's bookmark gives
                return self._partial_frames()[0].bookmark(rv, base, initial_events_end=initial_events_end)
        if rv != self._bookmark_rv:
            self._bookmarks.clear()
            self._bookmark_rv = rv
        key = (media_type, initial_events_end)
        frame = self._bookmarks.get(key)
        if frame is None:
            frame = self._bookmarks[key] = self._make_bookmark(rv, media_type, initial_events_end)
        return frame

    def _make_bookmark(self, rv: int, media_type: str, initial_events_end: bool) -> bytes:
        obj: dict[str, Any] = {"apiVersion": self.kind.api_version, "kind": self.kind.kind}
        if self.kind.protobuf:
            obj.update(copy.deepcopy(_CONVERTED_ZERO.get((self.kind.api_version, self.kind.kind), {})))
            # A field Go always writes, in the zero value only where the upstream's minor has it.
            obj.update({name: {} for name, since in self._newer.items() if self._version.at_least(since)})
        metadata: dict[str, Any] = obj.setdefault("metadata", {})
        metadata["resourceVersion"] = str(rv)
        if initial_events_end:
            metadata.setdefault("annotations", {})[INITIAL_EVENTS_END] = "true"
        if media_type == PROTOBUF:
            return self._envelope_frame(BOOKMARK, self._envelope_of_json(obj))
        if media_type != JSON:
            raise ValueError(f"no watch framing for {media_type!r}")
        if self.kind.protobuf:
            # Go's zero struct of the kind, as encoding/json writes it: the codec's JSON of the
            # zero message it builds for that struct.
            obj_json = self._codec.to_json(self._codec.from_json(obj))
        else:
            # An unstructured map: encoding/json writes map keys sorted.
            obj_json = go_json_dumps(_sorted(obj))[:-1]
        return self._json_frame(BOOKMARK, obj_json)

    # -- errors -----------------------------------------------------------------------------------
    def error(self, status: dict[str, Any], media_type: str) -> bytes:
        """An ERROR event carrying ``status`` (a ``metav1.Status`` as ``StatusError.to_dict()`` gives);
        a Status is never transformed (``doTransformObject``)."""
        media_type = base_media(media_type)[0]
        if media_type == JSON:
            return self._json_frame(ERROR, go_json_dumps(status)[:-1])
        if media_type == PROTOBUF:
            full = {"kind": "Status", "apiVersion": "v1", **status}
            return self._envelope_frame(ERROR, self._codec.from_json(full))
        raise ValueError(f"no watch framing for {media_type!r}")


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    return value
