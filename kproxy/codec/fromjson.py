"""Kubernetes JSON -> protobuf message, driven by the same Go field plans as tojson.

Per message type a table maps each JSON key (inlined structs' keys included) to a setter built
once. Anything protobuf cannot carry (a key the Go type does not have, a value of the wrong JSON
type) is a CodecError naming the field: the codec never drops data silently.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any

import orjson
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from .codecerrors import CodecError
from .gotypes import SPECIAL, GoType
from .quantity import canonical_quantity
from .schema import FieldPlan, Schema
from .wellknown import parse_duration, parse_time

Setter = Callable[[Message, Any, str], None]
Table = dict[str, tuple[tuple[str, ...], Setter]]

_INT_TYPES = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED32,
    FieldDescriptor.TYPE_SFIXED64,
}
_INT_RANGE = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _bad(path: str, want: str, v: Any) -> CodecError:
    return CodecError(f"{path}: expected {want}, got {_type_name(v)}")


class MessageBuilder:
    """Builds upb messages from decoded JSON for one schema."""

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self._tables: dict[str, Table] = {}
        self._completions: dict[str, list[tuple[int, str, Any]]] = {}
        self._zeros: dict[str, bytes] = {}

    def build(self, full_name: str, obj: dict[str, Any], top_level: bool = False) -> Message:
        msg = self.schema.message_class(full_name)()
        msg.MergeFromString(self.zero(full_name))
        self.fill(msg, obj, "")
        return msg

    def zero(self, full: str) -> bytes:
        """The protobuf of the type's Go zero value as gogo writes it (every non-pointer field
        present, recursively). Each message starts from it and JSON overrides what it sets, so
        the bytes equal the apiserver's own."""
        z = self._zeros.get(full)
        if z is None:
            m = self.schema.message_class(full)()
            self.complete(m)
            z = self._zeros[full] = m.SerializeToString(deterministic=True)
        return z

    def complete(self, msg: Message) -> None:
        """Write what Go's generated (gogo) marshalling always writes: every non-pointer field,
        zero or not, recursively. The bytes then equal the apiserver's own for the same object
        (with deterministic map order), not merely decode to the same Go value."""
        full = msg.DESCRIPTOR.full_name
        actions = self._completions.get(full)
        if actions is None:
            actions = self._completion(full)
        for action, name, arg in actions:
            if action == 0:  # non-pointer scalar
                if not msg.HasField(name):
                    setattr(msg, name, arg)
            elif action == 1:  # non-pointer struct
                sub = getattr(msg, name)
                sub.SetInParent()
                self.complete(sub)
            elif action == 2:  # pointer struct
                if msg.HasField(name):
                    self.complete(getattr(msg, name))
            elif action == 3:  # repeated messages
                for sub in getattr(msg, name):
                    self.complete(sub)
            elif action == 4:  # map of messages
                for sub in getattr(msg, name).values():
                    self.complete(sub)
            elif action == 5:  # metav1.Time / MicroTime: empty when zero, else seconds and nanos
                if msg.ByteSize():
                    msg.seconds = msg.seconds
                    msg.nanos = msg.nanos if arg else 0
            elif action == 6 and not msg.HasField("string"):  # resource.Quantity: "0" when zero
                msg.string = "0"

    def _completion(self, full: str) -> list[tuple[int, str, Any]]:
        actions: list[tuple[int, str, Any]] = []
        self._completions[full] = actions
        special = SPECIAL.get(self.schema.go_of_message.get(full, ""))
        if special in ("time", "microtime"):
            actions.append((5, "", special == "microtime"))
            return actions
        if special == "quantity":
            actions.append((6, "", None))
            return actions
        if special == "duration":
            actions.append((0, "duration", 0))
            return actions
        for fp in self.schema.plan(full).fields:
            fd, go = fp.proto, fp.go
            is_msg = fd.type == FieldDescriptor.TYPE_MESSAGE
            if fd.is_repeated:
                if is_msg and fd.message_type.GetOptions().map_entry:
                    if fd.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE:
                        actions.append((4, fd.name, None))
                elif is_msg:
                    actions.append((3, fd.name, None))
            elif go.kind in ("ptr", "slice", "map"):
                if is_msg:
                    actions.append((2, fd.name, None))
            elif go.kind == "bytes":
                continue
            elif is_msg:
                # A field newer than an older supported minor: completed only when set (NEWER_FIELDS).
                actions.append((2 if fp.since else 1, fd.name, None))
            else:
                actions.append((0, fd.name, fd.default_value))
        return actions

    def fill(self, msg: Message, obj: Any, path: str) -> None:
        if not isinstance(obj, dict):
            raise _bad(path or "<root>", "object", obj)
        full = msg.DESCRIPTOR.full_name
        table = self._tables.get(full)
        if table is None:
            table = self._table(full)
        prefix = f"{path}." if path else ""
        for key, value in obj.items():
            entry = table.get(key)
            if entry is None:
                if key in ("kind", "apiVersion") and self.schema.plan(full).has_type_meta:
                    continue
                raise CodecError(f'unknown field "{prefix}{key}": it cannot be represented in protobuf')
            if value is None:
                continue
            inline, setter = entry
            target = msg
            for name in inline:
                target = getattr(target, name)
                target.SetInParent()
            setter(target, value, prefix + key)

    # -- tables ---------------------------------------------------------------------------------
    def _table(self, full: str) -> Table:
        table: Table = {}
        self._tables[full] = table  # recursive types see the (filling) table
        for fp in self.schema.plan(full).fields:
            if fp.inline:
                sub = fp.proto.message_type
                if sub is None:
                    continue
                sub_table = self._tables.get(sub.full_name) or self._table(sub.full_name)
                for key, (inner, setter) in sub_table.items():
                    table.setdefault(key, ((fp.proto.name, *inner), setter))
                continue
            table[fp.json] = ((), self._setter(fp))
        return table

    def _setter(self, fp: FieldPlan) -> Setter:
        fd, go = fp.proto, fp.go
        name = fd.name
        # A field newer than an older supported minor is written when set, as a pointer is.
        is_ptr = go.kind == "ptr" or (go.kind == "slice" and not fd.is_repeated) or bool(fp.since)
        if go.kind == "ptr" and go.elem is not None:
            go = go.elem
        if fd.is_repeated:
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                return self._map_setter(fd, go)
            elem = go.elem if go.kind == "slice" and go.elem is not None else GoType("other")
            if elem.kind == "ptr" and elem.elem is not None:
                elem = elem.elem
            conv = self._converter(elem, fd)
            is_msg = fd.type == FieldDescriptor.TYPE_MESSAGE
            zero = self.zero(fd.message_type.full_name) if is_msg else b""

            def set_list(m: Message, v: Any, path: str) -> None:
                if not isinstance(v, list):
                    raise _bad(path, "array", v)
                container = getattr(m, name)
                if is_msg:
                    for i, x in enumerate(v):
                        sub = container.add()
                        if zero:
                            sub.MergeFromString(zero)
                        if x is not None:
                            conv(sub, x, f"{path}[{i}]")
                else:
                    container.extend([conv(None, x, f"{path}[{i}]") for i, x in enumerate(v)])

            return set_list
        conv = self._converter(go, fd)
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            # A pointer's message starts from its type's zero value; a non-pointer struct's is
            # already there (its parent started from its own zero value).
            zero = self.zero(fd.message_type.full_name) if is_ptr else b""

            def set_msg(m: Message, v: Any, path: str) -> None:
                sub = getattr(m, name)
                sub.SetInParent()
                if zero:
                    sub.MergeFromString(zero)
                conv(sub, v, path)

            return set_msg

        def set_scalar(m: Message, v: Any, path: str) -> None:
            setattr(m, name, conv(None, v, path))

        return set_scalar

    def _map_setter(self, fd: FieldDescriptor, go: GoType) -> Setter:
        name = fd.name
        val_fd = fd.message_type.fields_by_name["value"]
        elem = go.elem if go.kind == "map" and go.elem is not None else GoType("other")
        conv = self._converter(elem, val_fd)
        is_msg = val_fd.type == FieldDescriptor.TYPE_MESSAGE
        zero = self.zero(val_fd.message_type.full_name) if is_msg else b""

        def set_map(m: Message, v: Any, path: str) -> None:
            if not isinstance(v, dict):
                raise _bad(path, "object", v)
            container = getattr(m, name)
            for k, x in v.items():
                if not isinstance(k, str):
                    raise _bad(path, "string keys", k)
                if is_msg:
                    sub = container[k]
                    sub.SetInParent()
                    if zero:
                        sub.MergeFromString(zero)
                    if x is not None:
                        conv(sub, x, f"{path}.{k}")
                else:
                    container[k] = conv(None, x, f"{path}.{k}")

        return set_map

    def _converter(self, go: GoType, fd: FieldDescriptor) -> Callable[[Any, Any, str], Any]:
        """(sub-message or None, JSON value, path) -> a scalar value, or fills the sub-message."""
        if go.kind == "ptr" and go.elem is not None:
            go = go.elem
        if go.kind == "special":
            return self._special(go.name, fd)
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if go.kind == "slice" and go.elem is not None:
                # A named slice stored as a message of `items`.
                items_fd = fd.message_type.fields_by_name["items"]
                inner = self._converter(go.elem, items_fd)

                def fill_items(m: Any, v: Any, path: str) -> None:
                    if not isinstance(v, list):
                        raise _bad(path, "array", v)
                    m.SetInParent()
                    m.items.extend([inner(None, x, f"{path}[{i}]") for i, x in enumerate(v)])

                return fill_items
            fill = self.fill

            def fill_struct(m: Any, v: Any, path: str) -> None:
                fill(m, v, path)

            return fill_struct
        return self._scalar(fd, go)

    def _scalar(self, fd: FieldDescriptor, go: GoType) -> Callable[[Any, Any, str], Any]:
        t = fd.type
        if t == FieldDescriptor.TYPE_STRING:

            def conv_str(_: Any, v: Any, path: str) -> Any:
                if v is None:
                    return ""
                if not isinstance(v, str):
                    raise _bad(path, "string", v)
                return v

            return conv_str
        if t == FieldDescriptor.TYPE_BYTES:

            def conv_bytes(_: Any, v: Any, path: str) -> Any:
                if v is None:
                    return b""
                if not isinstance(v, str):
                    raise _bad(path, "base64 string", v)
                try:
                    return base64.b64decode(v, validate=True)
                except (binascii.Error, ValueError) as e:
                    raise CodecError(f"{path}: illegal base64 data: {e}") from e

            return conv_bytes
        if t == FieldDescriptor.TYPE_BOOL:

            def conv_bool(_: Any, v: Any, path: str) -> Any:
                if v is None:
                    return False
                if not isinstance(v, bool):
                    raise _bad(path, "bool", v)
                return v

            return conv_bool
        if t in _INT_TYPES:
            lo, hi = _INT_RANGE.get(t, (-(2**63), 2**63 - 1))

            def conv_int(_: Any, v: Any, path: str) -> Any:
                if v is None:
                    return 0
                if isinstance(v, float) and v.is_integer():
                    v = int(v)
                if isinstance(v, bool) or not isinstance(v, int):
                    raise _bad(path, "integer", v)
                if not lo <= v <= hi:
                    raise CodecError(f"{path}: {v} overflows the field's integer type")
                return v

            return conv_int
        if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):

            def conv_float(_: Any, v: Any, path: str) -> Any:
                if v is None:
                    return 0.0
                if isinstance(v, bool) or not isinstance(v, (int, float)):
                    raise _bad(path, "number", v)
                return float(v)

            return conv_float
        raise CodecError(f"unsupported protobuf field type {t} for {fd.full_name}")

    def _special(self, kind: str, fd: FieldDescriptor) -> Callable[[Any, Any, str], Any]:
        if kind in ("time", "microtime"):
            micro = kind == "microtime"

            def conv_time(m: Any, v: Any, path: str) -> None:
                if not isinstance(v, str):
                    raise _bad(path, "RFC 3339 time string", v)
                try:
                    secs, nanos = parse_time(v)
                except CodecError as e:
                    raise CodecError(f"{path}: {e}") from None
                m.seconds = secs
                m.nanos = nanos // 1000 * 1000 if micro else 0  # metav1.Time drops nanos

            return conv_time
        if kind == "duration":

            def conv_duration(m: Any, v: Any, path: str) -> None:
                if not isinstance(v, str):
                    raise _bad(path, "duration string", v)
                try:
                    m.duration = parse_duration(v)
                except CodecError as e:
                    raise CodecError(f"{path}: {e}") from None

            return conv_duration
        if kind == "quantity":

            def conv_quantity(m: Any, v: Any, path: str) -> None:
                if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                    raise _bad(path, "quantity string", v)
                try:
                    m.string = canonical_quantity(v if isinstance(v, str) else orjson.dumps(v).decode())
                except CodecError as e:
                    raise CodecError(f"{path}: {e}") from None

            return conv_quantity
        if kind == "intorstring":

            def conv_ios(m: Any, v: Any, path: str) -> None:
                if isinstance(v, str):
                    m.type, m.intVal, m.strVal = 1, 0, v
                elif isinstance(v, int) and not isinstance(v, bool) and -(2**31) <= v < 2**31:
                    m.type, m.intVal, m.strVal = 0, v, ""
                else:
                    raise _bad(path, "integer or string", v)

            return conv_ios
        if kind in ("rawext", "rawjson"):
            raw = "Raw" if "Raw" in fd.message_type.fields_by_name else "raw"

            def conv_raw(m: Any, v: Any, path: str) -> None:
                setattr(m, raw, orjson.dumps(v))

            return conv_raw
        schema_fd = fd.message_type.fields_by_name["schema"]
        schema_conv = self._converter(GoType("struct"), schema_fd)
        schema_zero = self.zero(schema_fd.message_type.full_name)

        def fill_schema(m: Any, v: Any, path: str) -> None:
            m.SetInParent()
            m.MergeFromString(schema_zero)
            schema_conv(m, v, path)

        if kind == "schemaorbool":

            def conv_sob(m: Any, v: Any, path: str) -> None:
                if isinstance(v, bool):
                    m.allows = v
                elif isinstance(v, dict):
                    m.allows = True
                    fill_schema(m.schema, v, path)
                else:
                    raise _bad(path, "bool or object", v)

            return conv_sob
        if kind == "schemaorarray":

            def conv_soa(m: Any, v: Any, path: str) -> None:
                if isinstance(v, dict):
                    fill_schema(m.schema, v, path)
                elif isinstance(v, list):
                    for i, x in enumerate(v):
                        fill_schema(m.jSONSchemas.add(), x, f"{path}[{i}]")
                else:
                    raise _bad(path, "object or array", v)

            return conv_soa

        def conv_sosa(m: Any, v: Any, path: str) -> None:
            if isinstance(v, dict):
                fill_schema(m.schema, v, path)
            elif isinstance(v, list) and all(isinstance(x, str) for x in v):
                m.property.extend(v)
            else:
                raise _bad(path, "object or array of strings", v)

        return conv_sosa
