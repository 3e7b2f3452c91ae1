"""Protobuf message -> Kubernetes JSON, by functions generated per message type.

Why generated code: a generic walk over descriptors decides, for every field of every object,
what kind of field it is, and measured 16-28 MB/s. Here each message type gets two small Python
functions, compiled once from the schema, that read exactly its fields in Go declaration order
with the JSON rule of each field baked in (`fill_<n>(m, d)` writes into a dict, so embedded
",inline" structs share their parent's dict; `enc_<n>(m)` returns a new dict). Values are read
from upb messages, and the dicts go to orjson.

Two flavours exist: to_json embeds raw JSON (FieldsV1, RawExtension, apiextensions JSON) as
orjson.Fragment without parsing it; to_obj parses it into Python objects.

A string field that is not UTF-8 (the apiserver stores what a protobuf client sent) comes from upb
as bytes: to_json writes it as Go's encoding/json does, ``\ufffd`` per bad byte (orjson calls
``bytes_default`` for it, so valid text costs nothing); to_obj holds it as a surrogateescape str
(``kproxy.gocompat.utf8``). A map key that is not UTF-8 is one upb cannot look up: such a map is
read from its entries instead (``_entries``), keys in Go's byte order.
"""

from __future__ import annotations

import base64
import keyword
from collections.abc import Callable
from typing import Any

import orjson
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from kproxy.codegen import generate
from kproxy.gocompat.utf8 import bytes_default, go_string, json_string

from .codecerrors import CodecError
from .envelope import read_varint, skip_field
from .gotypes import GoType
from .jsonkinds import MEMO_TYPES, NESTED_TYPE_META, is_list_kind
from .schema import FieldPlan, Schema
from .wellknown import GO_ZERO_UNIX, format_duration, format_micro_time, format_time
from .wirejson import TypeIds

MAGIC = b"k8s\x00"

Encoder = Callable[[Message], dict[str, Any]]


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _time(t: Message) -> str | None:
    """A metav1.Time submessage: an empty message is Go's zero time (JSON null). Only a
    seconds of 0 can come from an empty message, so ByteSize (one more upb call) is asked
    for that case alone."""
    s: int = t.seconds
    if s == GO_ZERO_UNIX or (s == 0 and not t.ByteSize()):
        return None
    return format_time(s)


def _micro(t: Message) -> str | None:
    s: int = t.seconds
    n: int = t.nanos
    if (s == GO_ZERO_UNIX and n == 0) or (s == 0 and not t.ByteSize()):
        return None
    return format_micro_time(s, n)


def _s(v: str | bytes) -> str:
    """A string field for to_obj: upb's bytes (not UTF-8) as a surrogateescape str."""
    return v if v.__class__ is str else go_string(v)  # type: ignore[arg-type]


def _ios_obj(m: Message) -> int | str:
    value = _ios(m)
    return _s(value) if isinstance(value, (str, bytes)) else value


# What reading a upb map raises when one of its keys is not UTF-8: its keys come as a mix of str
# and bytes (which do not sort together), and a bytes key cannot be looked up (upb decodes it).
BAD_MAP_KEY = (TypeError, UnicodeDecodeError)


def _entries(m: Message, number: int, entry_cls: type[Message]) -> list[Message]:
    """The entries of map field `number` of m, as entry messages (key and value as upb reads
    them), in the order they were written."""
    raw = m.SerializeToString()
    out = []
    pos, end = 0, len(raw)
    while pos < end:
        tag, pos = read_varint(raw, pos, end)
        if tag & 7 == 2:
            n, pos = read_varint(raw, pos, end)
            if tag >> 3 == number:
                out.append(entry_cls.FromString(raw[pos : pos + n]))
            pos += n
        else:
            pos = skip_field(raw, tag & 7, pos, end)
    return out


def _by_key(pairs: list[tuple[str | bytes, Any]]) -> list[tuple[bytes, Any]]:
    """Map entries -> (key bytes, value) in Go's order for its JSON (keys sorted as bytes); a
    key written twice keeps its last value, as gogo's Unmarshal does."""
    by: dict[bytes, Any] = {}
    for k, v in pairs:
        by[k if isinstance(k, bytes) else k.encode()] = v
    return sorted(by.items())


def _map_fragment(pairs: list[tuple[str | bytes, Any]]) -> Any:
    """A map whose keys are not all UTF-8, as Go's JSON writes it (each key quoted as Go does;
    two keys that differ only in bad bytes both print, as in Go)."""
    body = b",".join(json_string(k) + b":" + orjson.dumps(v, default=bytes_default) for k, v in _by_key(pairs))
    return orjson.Fragment(b"{" + body + b"}")


def _map_obj(pairs: list[tuple[str | bytes, Any]]) -> dict[str, Any]:
    return {go_string(k): v for k, v in _by_key(pairs)}


def _float(v: float) -> float | int:
    """Go's encoding/json prints a whole float64 without ".0" (10, not 10.0)."""
    return int(v) if v.is_integer() and abs(v) < 1e21 else v


def _ios(m: Message) -> int | str:
    value: int | str = m.strVal if m.type == 1 else m.intVal
    return value


def _attr(name: str) -> str:
    """Attribute access for a proto field (`not`, `from`... are Python keywords)."""
    return f"getattr(m, {name!r})" if keyword.iskeyword(name) else f"m.{name}"


class JsonGenerator(TypeIds):
    """Compiles and caches the per-message functions for one schema and one flavour."""

    def __init__(
        self, schema: Schema, fragments: bool, envelope_to_obj: Callable[[bytes], Any], memo_size: int = 0
    ) -> None:
        self.schema = schema
        self.fragments = fragments
        self.memo_size = memo_size if fragments else 0
        TypeIds.__init__(self)
        self._helpers: set[str] = set()
        self._extra: list[str] = []
        self.ns: dict[str, Any] = {
            "_b64": _b64,
            "_time": _time,
            "_micro": _micro,
            "_ios": _ios if fragments else _ios_obj,
            "_s": _s,
            "_bd": bytes_default,
            "_BADKEY": BAD_MAP_KEY,
            "_entries": _entries,
            "_gomap": _map_fragment if fragments else _map_obj,
            "_float": _float,
            "_dur": format_duration,
            "_raw": self._raw_fragment if fragments else self._raw_obj,
            "_rawf": self._rawf_fragment if fragments else self._rawf_obj,
            "_rawv": self._rawv_fragment if fragments else self._rawf_obj,
            "_sorted": sorted,
            "_fragment": orjson.Fragment,
            "_dumps": orjson.dumps,
        }
        self._envelope_to_obj = envelope_to_obj

    # -- raw JSON payloads ------------------------------------------------------------------
    def _raw_fragment(self, b: bytes) -> Any:
        if b[:4] == MAGIC:
            return self._envelope_to_obj(b)
        return orjson.Fragment(b)

    def _rawf_fragment(self, b: bytes) -> Any:
        """Raw JSON bytes of a FieldsV1 (which the apiserver writes itself): null when empty,
        else embedded unparsed."""
        if not b:
            return None
        if b[:4] == MAGIC:
            return self._envelope_to_obj(b)
        return orjson.Fragment(b)

    def _rawv_fragment(self, b: bytes) -> Any:
        """Raw bytes of a RawExtension/JSON, which a protobuf client may have filled with
        anything: checked to be JSON (Go's json.Marshal fails on invalid raw JSON too)."""
        if not b:
            return None
        if b[:4] == MAGIC:
            return self._envelope_to_obj(b)
        try:
            orjson.loads(b)
        except orjson.JSONDecodeError as e:
            raise CodecError(f"embedded raw JSON is not valid JSON: {e}") from e
        return orjson.Fragment(b)

    def _rawf_obj(self, b: bytes) -> Any:
        return self._raw_obj(b) if b else None

    def _raw_obj(self, b: bytes) -> Any:
        if b[:4] == MAGIC:
            return self._envelope_to_obj(b)
        try:
            return orjson.loads(b)
        except orjson.JSONDecodeError as e:
            raise CodecError(f"embedded raw JSON is not valid JSON: {e}") from e

    # -- public -----------------------------------------------------------------------------
    def filler(self, full_name: str) -> Callable[[Message, dict[str, Any]], dict[str, Any]]:
        """fill_<n> for a message: writes its JSON fields into the given dict, returns it."""
        idx = self._ensure(full_name)
        fn: Callable[[Message, dict[str, Any]], dict[str, Any]] = self.ns[f"fill_{idx}"]
        return fn

    def encoder(self, full_name: str) -> Encoder:
        """enc_<n> for a message: message -> dict (Kubernetes JSON, no kind/apiVersion)."""
        idx = self._ensure(full_name)
        fn: Encoder = self.ns[f"enc_{idx}"]
        return fn

    # -- generation -------------------------------------------------------------------------
    def _ensure(self, full_name: str) -> int:
        idx = self._ids.get(full_name)
        if idx is not None:
            return idx
        # Generate this message and, transitively, every message it refers to; one module.
        idx = self._ref(full_name)
        self.flush(full_name)
        return idx

    def flush(self, root: str, suffix: str = "") -> None:
        """Generate (one module, named after the message ``root`` whose use asked for it, and
        ``suffix``) every message referred to and not generated yet."""
        sources: list[str] = []
        done: set[str] = set()
        while self._pending:
            name = self._pending.pop()
            if name in done:
                continue
            done.add(name)
            sources.append(f"# {name}\n{self._generate(name)}")
        sources += self._extra
        self._extra = []
        if sources:
            flavour = "fragments" if self.fragments else "obj"
            generate(f"kproxy.codec.tojson.{flavour}:{root}{suffix}", sources, self.ns)

    def _generate(self, full_name: str) -> str:
        idx = self._ids[full_name]
        plan = self.schema.plan(full_name)
        lines = [f"def fill_{idx}(m, d):"]
        for fp in plan.fields:
            lines.extend("    " + line for line in self.field_lines(full_name, fp))
        if any("h(" in line for line in lines):
            lines.insert(1, "    h = m.HasField")
        lines.append("    return d")
        if self.memo_size and full_name.rsplit(".", 1)[-1] in MEMO_TYPES:
            # Replicas repeat the same sub-objects (containers, probes, tolerations, managed
            # fields entries...): their JSON is kept, keyed by their protobuf bytes.
            lines += [
                f"_memo_{idx} = {{}}",
                f"def enc_{idx}(m):",
                "    k = m.SerializeToString()",
                f"    r = _memo_{idx}.get(k)",
                "    if r is None:",
                f"        if len(_memo_{idx}) >= {self.memo_size}:",
                f"            _memo_{idx}.clear()",
                f"        r = _memo_{idx}[k] = _fragment(_dumps(fill_{idx}(m, {{}}), default=_bd))",
                "    return r",
            ]
        else:
            # The same body with its own dict: one Python call per message instead of two.
            body = lines[1:]
            lines += [f"def enc_{idx}(m):", "    d = {}", *body]
        return "\n".join(lines) + "\n"

    def field_lines(self, full_name: str, fp: FieldPlan) -> list[str]:
        """The lines of fill_<n> that write one field of message full_name from `m` into `d`
        (`h` is m.HasField); what they call is generated by the next flush()."""
        nested = NESTED_TYPE_META.get((full_name, fp.json))
        if nested is not None:
            conv = self._value(fp.go.elem or GoType("other"), fp.proto, "x")
            kind, api_version = nested
            return [
                f"v = {_attr(fp.proto.name)}",
                "if v:",
                f"    d[{fp.json!r}] = [{{'kind': {kind!r}, 'apiVersion': {api_version!r}, **{conv}}} for x in v]",
            ]
        if fp.json == "items" and fp.proto.is_repeated and is_list_kind(self.schema.plan(full_name)):
            # A list kind's items are `[]` when empty: the apiserver's (streaming) list encoder
            # writes the array itself instead of marshalling a nil slice as null.
            conv = self._value(fp.go.elem or GoType("other"), fp.proto, "x")
            if self.fragments:
                # Each item serialised on its own: the whole list never exists as one tree
                # of dicts (less memory, far less garbage-collector work on long lists).
                conv = f"_fragment(_dumps({conv}, default=_bd))"
            return [f"d['items'] = [{conv} for x in {_attr(fp.proto.name)}]"]
        return self._field(fp)

    def _msg(self, fd: FieldDescriptor) -> int:
        return self._ref(fd.message_type.full_name)

    def _value(self, go: GoType, fd: FieldDescriptor, v: str) -> str:
        """Expression converting one present singular value `v` (not a list/map) to JSON."""
        if go.kind == "special":
            return self._special(go.name, fd, v)
        if go.kind == "bytes":
            return f"_b64({v})"
        if go.kind == "struct" or (go.kind == "other" and fd.type == FieldDescriptor.TYPE_MESSAGE):
            return f"enc_{self._msg(fd)}({v})"
        if go.kind == "slice" and fd.type == FieldDescriptor.TYPE_MESSAGE and not self._is_repeated(fd):
            # A named slice type (ExtraValue, Verbs...) whose .proto is a message of `items`.
            items = fd.message_type.fields_by_name["items"]
            assert go.elem is not None
            return f"[{self._value(go.elem, items, 'x')} for x in {v}.items]"
        if go.kind == "ptr":
            assert go.elem is not None
            return self._value(go.elem, fd, v)
        if fd.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            return f"_float({v})"
        if fd.type == FieldDescriptor.TYPE_STRING and not self.fragments:
            return f"_s({v})"  # to_json needs no call: orjson's default takes upb's bytes
        return v

    @staticmethod
    def _is_repeated(fd: FieldDescriptor) -> bool:
        return bool(fd.is_repeated)

    def _special(self, kind: str, fd: FieldDescriptor, v: str) -> str:
        if kind == "time":
            return f"_time({v})"
        if kind == "microtime":
            return f"_micro({v})"
        if kind == "duration":
            return f"_dur({v}.duration)"
        if kind == "quantity":
            return f"({v}.string or '0')"
        if kind == "intorstring":
            return f"_ios({v})"
        if kind in ("rawext", "rawjson"):
            fn = "_rawf" if fd.message_type.name == "FieldsV1" else "_rawv"
            return f"{fn}({v}.Raw)" if "Raw" in fd.message_type.fields_by_name else f"{fn}({v}.raw)"
        sch = self._ref(fd.message_type.fields_by_name["schema"].message_type.full_name)
        helper = f"_{kind}_{sch}"
        if helper not in self._helpers:
            self._helpers.add(helper)
            if kind == "schemaorbool":
                body = [f"    return enc_{sch}(v.schema) if v.HasField('schema') else v.allows"]
            elif kind == "schemaorarray":
                body = [
                    "    a = v.jSONSchemas",
                    f"    if len(a): return [enc_{sch}(x) for x in a]",
                    f"    return enc_{sch}(v.schema) if v.HasField('schema') else None",
                ]
            else:
                body = [
                    "    a = v.property",
                    "    if len(a): return list(a)" if self.fragments else "    if len(a): return [_s(x) for x in a]",
                    f"    return enc_{sch}(v.schema) if v.HasField('schema') else None",
                ]
            self._extra.append("\n".join([f"def {helper}(v):", *body]) + "\n")
        return f"{helper}({v})"

    def _field(self, fp: FieldPlan) -> list[str]:
        fd, go, key = fp.proto, fp.go, fp.json
        get = _attr(fd.name)
        has = f"h({fd.name!r})"
        null = [] if fp.omitempty else [f"d[{key!r}] = None"]
        repeated = self._is_repeated(fd)
        if fp.inline:
            if fd.type != FieldDescriptor.TYPE_MESSAGE:
                return []
            fill = f"fill_{self._msg(fd)}({get}, d)"
            return [f"if {has}:", f"    {fill}"] if go.kind == "ptr" else [fill]
        if repeated and fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            assert go.elem is not None or go.kind != "map"
            val_fd = fd.message_type.fields_by_name["value"]
            elem = go.elem if go.kind == "map" and go.elem is not None else GoType("other")
            conv = self._value(elem, val_fd, "v[k]")
            body = f"{{k: {conv} for k in _sorted(v)}}"
            entry = self.schema.message_class(fd.message_type.full_name)
            helper = "_ent_" + fd.message_type.full_name.replace(".", "_")
            self.ns[helper] = entry
            by_value = self._value(elem, val_fd, "e.value")
            by_entry = f"_gomap([(e.key, {by_value}) for e in _entries(m, {fd.number}, {helper})])"
            lines = [
                f"v = {get}",
                "if v:",
                "    try:",
                f"        d[{key!r}] = {body}",
                "    except _BADKEY:",  # a key that is not UTF-8
                f"        d[{key!r}] = {by_entry}",
            ]
            if null:
                lines += ["else:", "    " + null[0]]
            return lines
        if repeated:
            elem = go.elem if go.kind in ("slice", "ptr") and go.elem is not None else GoType("other")
            if elem.kind == "ptr" and elem.elem is not None:
                elem = elem.elem
            conv = self._value(elem, fd, "x")
            body = "list(v)" if conv == "x" else f"[{conv} for x in v]"
            lines = [f"v = {get}", "if v:", f"    d[{key!r}] = {body}"]
            if null:
                lines += ["else:", "    " + null[0]]
            return lines
        if go.kind == "ptr":
            conv = self._value(go.elem or GoType("other"), fd, get)
            lines = [f"if {has}:", f"    d[{key!r}] = {conv}"]
            if null:
                lines += ["else:", "    " + null[0]]
            return lines
        if go.kind == "bytes":
            if fp.omitempty:
                return [f"v = {get}", "if v:", f"    d[{key!r}] = _b64(v)"]
            return [f"if {has}:", f"    d[{key!r}] = _b64({get})", "else:", f"    d[{key!r}] = None"]
        if go.kind in ("slice", "map"):
            # A named slice stored as a wrapper message: absent is Go's nil.
            conv = self._value(go, fd, get)
            if fp.omitempty:
                return [f"if {has} and len({get}.items):", f"    d[{key!r}] = {conv}"]
            return [f"if {has}:", f"    d[{key!r}] = {conv}", "else:", f"    d[{key!r}] = None"]
        if go.kind == "special":
            conv = self._value(go, fd, get)
            if go.name in ("time", "microtime") and fp.omitzero:
                return [f"v = {conv}", "if v is not None:", f"    d[{key!r}] = v"]
            return [f"d[{key!r}] = {conv}"]
        if go.kind == "scalar" or fd.type != FieldDescriptor.TYPE_MESSAGE:
            conv = self._value(GoType("scalar"), fd, "v")
            if fp.omitempty or fp.omitzero:
                return [f"v = {get}", "if v:", f"    d[{key!r}] = {conv}"]
            return [f"v = {get}", f"d[{key!r}] = {conv}"] if conv != "v" else [f"d[{key!r}] = {get}"]
        # A non-pointer struct: always printed (omitempty has no effect on Go structs).
        conv = self._value(go, fd, get)
        if fp.omitzero:
            return [f"if {has} and {get}.ByteSize():", f"    d[{key!r}] = {conv}"]
        if fp.since:  # newer than an older supported minor: printed when the sender wrote it
            return [f"if {has}:", f"    d[{key!r}] = {conv}"]
        return [f"d[{key!r}] = {conv}"]
