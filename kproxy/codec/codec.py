"""ProtobufCodec: Kubernetes protobuf bodies <-> the apiserver's own JSON."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import orjson

from kproxy.gocompat.jsonescape import go_escape
from kproxy.gocompat.utf8 import bytes_default

from .codecerrors import NOT_UTF8, CodecError, not_utf8
from .envelope import Envelope, decode_envelope, encode_envelope, ld, parse_watch_event, short_ld
from .fromjson import MessageBuilder
from .gotypes import SPECIAL
from .schema import Schema, load_schema
from .streams import ListPlan, ListTranscoder, WatchTranscoder, decode_message
from .tojson import JsonGenerator
from .wirejson import WireFiller, WireJsonGenerator, varint_tail

WATCH_EVENT = "k8s.io.apimachinery.pkg.apis.meta.v1.WatchEvent"
LIST_META = "k8s.io.apimachinery.pkg.apis.meta.v1.ListMeta"


Filler = Callable[[Any, dict[str, Any]], dict[str, Any]]
# A kind's message class, its upb-path filler, and its wire filler (None: upb only).
_Kind = tuple[Any, Filler, WireFiller | None]


# How many objects (or batches of list items) the wire reader left to the upb path, in this
# process: damaged input, or encodings the apiserver does not write. A count that grows with
# ordinary traffic means a slow path is being taken (ProtobufCodec.wire_fallbacks).
WIRE_FALLBACKS = [0]


def _fill(cls: Any, fill: Filler, wire: WireFiller | None, api_version: str, kind: str, raw: bytes) -> dict[str, Any]:
    """One object's JSON dict: read from its bytes, or (wire off, or anything the wire reader
    leaves to upb) through a upb message, which also gives every error."""
    return _fill_at(cls, fill, wire, api_version, kind, raw, 0, len(raw))


def _fill_at(
    cls: Any, fill: Filler, wire: WireFiller | None, api_version: str, kind: str, data: bytes, p: int, q: int
) -> dict[str, Any]:
    """_fill of the object in data[p:q], read in place (sliced only for upb)."""
    if wire is not None and type(data) is bytes:
        try:
            return wire(data, p, q, _head(kind, api_version))
        except Exception:  # anything unusual: the upb path decides, and raises its own errors
            WIRE_FALLBACKS[0] += 1
    msg = decode_message(cls, data[p:q] if p or q != len(data) else data, kind)
    return fill(msg, _head(kind, api_version))


def _head(kind: str, api_version: str) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if kind:
        d["kind"] = kind
    if api_version:
        d["apiVersion"] = api_version
    return d


def _wire_items(span: bytes, enc: Callable[[bytes, int, int], Any]) -> list[bytes]:
    """Consecutive list items (field 2, as the list transcoder batches them) -> their JSON."""
    out, used = _wire_prefix(span, enc)
    if used != len(span):
        raise ValueError("not only whole items")
    return out


def _wire_prefix(data: bytes, enc: Callable[[bytes, int, int], Any]) -> tuple[list[bytes], int]:
    """The list items (field 2) that data starts with, up to the first other field, the first
    item not complete in data or the first the wire reader leaves to upb: (their JSON, the
    bytes they span). Not escaped here: the transcoder escapes each batch once."""
    dumps = orjson.dumps
    out: list[bytes] = []
    p = 0
    end = len(data)
    try:
        while p < end and data[p] == 0x12:
            if p + 4 > end:
                break
            n = data[p + 1]
            q = p + 2
            if n > 127:
                n, q = varint_tail(data, q, n)
            if q + n > end:
                break
            out.append(dumps(enc(data, q, q + n), default=bytes_default))
            p = q + n
    except Exception:  # this item is left to the general path (and upb)
        WIRE_FALLBACKS[0] += 1
    return out, p


class ProtobufCodec:
    """Transcodes whole bodies, lists (incrementally) and watch streams.

    One instance per process is enough: the per-type functions are generated on first use of a
    type and cached here. memo_size bounds, per memoised type, how many sub-objects' JSON
    to_json keeps (keyed by their protobuf bytes; 0 turns it off). JSON is read straight from
    the protobuf bytes (wirejson) unless wire is False, which leaves every object to upb (the
    path the wire reader falls back to; kept as an option for comparisons).
    """

    def __init__(self, schema: Schema | None = None, memo_size: int = 512, wire: bool = True) -> None:
        self.schema = schema or load_schema()
        self._frag = JsonGenerator(
            self.schema, fragments=True, envelope_to_obj=self._envelope_to_frag, memo_size=memo_size
        )
        self._obj = JsonGenerator(self.schema, fragments=False, envelope_to_obj=self.to_obj)
        self._wire = WireJsonGenerator(self._frag) if wire else None
        self._builder = MessageBuilder(self.schema)
        self._kinds: dict[tuple[bool, str, str], _Kind] = {}
        self._list_plans: dict[tuple[str, str], ListPlan | None] = {}
        # Watch fast path: event type bytes -> the line's head; typeMeta bytes -> the type.
        self._event_heads: dict[bytes, bytes] = {}
        self._event_learned: set[tuple[str, str]] = set()
        self._event_kinds: dict[bytes, tuple[Any, Filler, WireFiller | None, str, str]] = {}

    # -- kinds --------------------------------------------------------------------------------
    @property
    def wire_fallbacks(self) -> int:
        """Objects (or batches of list items) the wire reader left to the upb path, process-wide."""
        return WIRE_FALLBACKS[0]

    def knows(self, api_version: str, kind: str) -> bool:
        """True for the built-in kinds the schema can encode (not CRs, not aggregated APIs)."""
        return self.schema.lookup_kind(api_version, kind) is not None

    def newer_fields(self, api_version: str, kind: str) -> dict[str, int]:
        """The kind's top-level fields that an older supported minor lacks although Go always
        writes them (``schema.NEWER_FIELDS``): JSON key -> the minor that added it."""
        return {f.json: f.since for f in self.schema.plan(self._message_name(api_version, kind)).fields if f.since}

    def _message_name(self, api_version: str, kind: str) -> str:
        full = self.schema.lookup_kind(api_version, kind)
        if full is None:
            raise CodecError(f'no protobuf schema for kind "{kind}" in version "{api_version}"')
        return full

    # -- protobuf -> JSON -----------------------------------------------------------------------
    def _kind(self, gen: JsonGenerator, api_version: str, kind: str) -> _Kind:
        key = (gen.fragments, api_version, kind)
        found = self._kinds.get(key)
        if found is None:
            full = self._message_name(api_version, kind)
            wire = self._wire.filler(full) if self._wire is not None and gen is self._frag else None
            found = self._kinds[key] = (self.schema.message_class(full), gen.filler(full), wire)
        return found

    def _decode(self, gen: JsonGenerator, api_version: str, kind: str, raw: bytes) -> dict[str, Any]:
        cls, fill, wire = self._kind(gen, api_version, kind)
        return _fill(cls, fill, wire, api_version, kind, raw)

    def to_obj(self, data: bytes) -> dict[str, Any]:
        """A whole envelope -> the apiserver's JSON object as Python objects."""
        env = decode_envelope(data)
        return self._decode(self._obj, env.api_version, env.kind, env.raw)

    def _envelope_to_frag(self, data: bytes) -> dict[str, Any]:
        env = decode_envelope(data)
        return self._decode(self._frag, env.api_version, env.kind, env.raw)

    def to_json(self, data: bytes) -> bytes:
        """A whole envelope (object, list, Status) -> compact JSON bytes (no trailing newline)."""
        try:
            return go_escape(orjson.dumps(self._envelope_to_frag(data), default=bytes_default))
        except NOT_UTF8 as e:
            raise not_utf8(e) from e

    def envelope_to_json(self, env: Envelope) -> bytes:
        """Same as to_json for an already split envelope."""
        try:
            obj = self._decode(self._frag, env.api_version, env.kind, env.raw)
            return go_escape(orjson.dumps(obj, default=bytes_default))
        except NOT_UTF8 as e:
            raise not_utf8(e) from e

    def _raw_to_json(self, api_version: str, kind: str, raw: bytes) -> bytes:
        return go_escape(orjson.dumps(self._decode(self._frag, api_version, kind, raw), default=bytes_default))

    def _list_plan(self, api_version: str, kind: str) -> ListPlan | None:
        """(span of item fields -> their JSON, ListMeta bytes -> dict) for a list kind that
        streams item by item: exactly `metadata` (field 1) and `items` (field 2). None for
        anything else."""
        key = (api_version, kind)
        if key in self._list_plans:
            return self._list_plans[key]
        result = None
        full = self.schema.lookup_kind(api_version, kind)
        if full is not None:
            desc = self.schema.pool.FindMessageTypeByName(full)
            meta = desc.fields_by_number.get(1)
            items = desc.fields_by_number.get(2)
            if (
                len(desc.fields) == 2
                and meta is not None
                and items is not None
                and meta.name == "metadata"
                and items.name == "items"
                and meta.message_type is not None
                and meta.message_type.full_name == LIST_META
                and items.message_type is not None
                # Items that are plain structs (not RawExtension, as metav1.List has).
                and self.schema.go_of_message.get(items.message_type.full_name, "") not in SPECIAL
            ):
                item_full = items.message_type.full_name
                item_enc = self._frag.encoder(item_full)
                list_cls = self.schema.message_class(full)
                meta_cls = self.schema.message_class(LIST_META)
                meta_enc = self._frag.encoder(LIST_META)
                dumps = orjson.dumps
                item_wire = self._wire.encoder(item_full) if self._wire is not None else None
                prefix = functools.partial(_wire_prefix, enc=item_wire) if item_wire is not None else None

                def items_json(span: bytes) -> list[bytes]:
                    # Not escaped here: the transcoder escapes each batch once (go_escape).
                    if item_wire is not None:
                        try:
                            return _wire_items(span, item_wire)
                        except Exception:  # anything unusual: upb decides
                            WIRE_FALLBACKS[0] += 1
                    items = decode_message(list_cls, span, kind).items
                    return [dumps(item_enc(x), default=bytes_default) for x in items]

                def list_meta(b: bytes) -> Any:
                    return meta_enc(decode_message(meta_cls, b, "ListMeta"))

                result = (items_json, list_meta, prefix)
        self._list_plans[key] = result
        return result

    def list_transcoder(self) -> ListTranscoder:
        """Incremental protobuf body (list or not) -> JSON; see ListTranscoder."""
        return ListTranscoder(self)

    # -- watch --------------------------------------------------------------------------------
    def _watch_frame_to_json(self, frame: bytes) -> bytes:
        type_, raw = parse_watch_event(frame)
        env = decode_envelope(raw)  # a protobuf watch carries protobuf objects only
        obj = self._decode(self._frag, env.api_version, env.kind, env.raw)
        self._learn_event(type_, env)
        event = {"type": type_, "object": obj}
        return go_escape(orjson.dumps(event, option=orjson.OPT_APPEND_NEWLINE, default=bytes_default))

    def _watch_event_json(self, data: bytes, start: int, stop: int) -> bytes:
        """One watch frame data[start:stop] -> its JSON line. The layout the apiserver always
        writes (short type, one RawExtension holding a whole envelope with a short typeMeta)
        is read here by plain indexing straight out of the stream's bytes, with the line's
        head cached per event type and the object's type per typeMeta; anything else goes
        through the general parsers (_watch_frame_to_json), which decide the same way."""
        fast = None
        if stop - start > 12 and data[start] == 0x0A and data[start + 1] < 0x80:
            t_end = start + 2 + data[start + 1]
            p, n = short_ld(data, t_end, 0x12, stop)
            if p >= 0 and p + n == stop:
                p, n = short_ld(data, p, 0x0A, stop)
                if p >= 0 and p + n == stop and data[p : p + 5] == b"k8s\x00\x0a" and data[p + 5] < 0x80:
                    tm_end = p + 6 + data[p + 5]
                    q, n = short_ld(data, tm_end, 0x12, stop)
                    if q >= 0 and (q + n == stop or (q + n + 4 == stop and data[q + n : stop] == b"\x1a\x00\x22\x00")):
                        head = self._event_heads.get(data[start + 2 : t_end])
                        kind = self._event_kinds.get(data[p + 6 : tm_end])
                        if head is not None and kind is not None:
                            fast = head, kind, q, q + n
        if fast is None:
            return self._watch_frame_to_json(data[start:stop])
        head, (cls, fill, wire, api_version, kind_name), p, q = fast
        obj = _fill_at(cls, fill, wire, api_version, kind_name, data, p, q)
        return b"".join((head, go_escape(orjson.dumps(obj, default=bytes_default)), b"}\n"))

    def _learn_event(self, type_: str, env: Envelope) -> None:
        """Fill the fast path's caches from an event the general parsers accepted."""
        tb = type_.encode()
        if tb not in self._event_heads and len(self._event_heads) < 64:
            head = go_escape(orjson.dumps({"type": type_, "object": None}))
            self._event_heads[tb] = head[: -len(b"null}")]
        key = (env.api_version, env.kind)
        if env.kind and key not in self._event_learned and len(self._event_learned) < 1024:
            self._event_learned.add(key)
            tm = ld(1, env.api_version.encode()) + ld(2, env.kind.encode())
            self._event_kinds[tm] = (*self._kind(self._frag, *key), *key)

    def watch_transcoder(self) -> WatchTranscoder:
        """Incremental protobuf watch stream -> JSON lines; see WatchTranscoder."""
        return WatchTranscoder(self)

    def encode_watch_event(self, type_: str, obj_json: dict[str, Any]) -> bytes:
        """A JSON watch event -> one length-prefixed protobuf frame, as the apiserver writes it."""
        envelope = self.from_json(obj_json)
        event = ld(1, type_.encode()) + ld(2, ld(1, envelope))  # type, RawExtension{raw}
        return len(event).to_bytes(4, "big") + event

    # -- JSON -> protobuf -----------------------------------------------------------------------
    def from_json(self, obj: bytes | dict[str, Any]) -> bytes:
        """A JSON object with apiVersion/kind -> its envelope; CodecError for an unknown kind or
        for anything protobuf cannot carry (never drops a field silently)."""
        if isinstance(obj, (bytes, bytearray, memoryview, str)):
            try:
                obj = orjson.loads(obj)
            except orjson.JSONDecodeError as e:
                raise CodecError(f"invalid JSON: {e}") from e
        if not isinstance(obj, dict):
            raise CodecError("a JSON object with apiVersion and kind is required")
        api_version = obj.get("apiVersion", "")
        kind = obj.get("kind")
        if not isinstance(kind, str) or not kind:
            raise CodecError("Object 'Kind' is missing in JSON")
        if not isinstance(api_version, str):
            raise CodecError("Object 'apiVersion' is not a string")
        full = self._message_name(api_version, kind)
        raw = self._builder.build(full, obj, top_level=True).SerializeToString(deterministic=True)
        return encode_envelope(api_version, kind, raw)


@functools.cache
def shared_codec() -> ProtobufCodec:
    """The process's one codec, and the one way to reach it: the Status writer
    (``kproxy.core.errorreply``) and the filters (transcode, validation, watchcache) share it."""
    return ProtobufCodec()
