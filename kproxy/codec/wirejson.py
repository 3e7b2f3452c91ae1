"""Protobuf wire bytes -> Kubernetes JSON, read straight from the bytes (no upb message).

Why: the upb-based functions of tojson.py read every field the schema declares, present or not,
and each read of a upb attribute costs a few hundred ns (a repeated field builds a container
object even when empty). A Kubernetes object sets a fraction of its fields, and replicas repeat
whole sub-objects byte for byte. The functions generated here walk the message bytes once, touch
only the fields that are present, and look the repeated sub-objects up by their bytes (a slice of
the input: no parse and no re-serialisation to build the key).

Exactness: the result must be what the upb path gives. Each generated `wfill_<n>` handles the
field shapes Kubernetes uses (strings, integers, bools, doubles, bytes, nested messages, string
maps, Time, Quantity, IntOrString...). Fields of any other shape are collected as raw bytes and
handed to upb and to the upb path's own code for that field. Anything the walk does not read the
way upb would (a singular message repeated, which upb merges; a packed or otherwise unexpected
encoding of a known field; a 10-byte varint out of range; a tag of three bytes; anything that
raises) makes the whole object fall back to the upb path, which then answers or fails exactly as
before. The unit tests compare both paths on the apiserver's fixtures and on mutated bytes.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from typing import Any, Protocol

from google.protobuf.descriptor import FieldDescriptor

from kproxy.codegen import generate

from .gotypes import GoType
from .jsonkinds import MEMO_TYPES, NESTED_TYPE_META, is_list_kind
from .schema import FieldPlan, Schema
from .wellknown import GO_ZERO_UNIX, format_duration, format_micro_time, format_time


class FragmentSource(Protocol):
    """What the wire path needs of the upb path's generator (``kproxy.codec.tojson.JsonGenerator``
    is one): its schema and settings, and the fill functions of fields it leaves to upb."""

    schema: Schema
    fragments: bool
    memo_size: int
    ns: dict[str, Any]

    def flush(self, root: str, suffix: str = "") -> None: ...
    def field_lines(self, full_name: str, fp: FieldPlan) -> list[str]: ...


WireFiller = Callable[[bytes, int, int, dict[str, Any]], dict[str, Any]]


class Fallback(Exception):
    """Internal: this message is not read here the way upb would read it; use the upb path."""


class _Unset:
    """The value of a singular field that did not occur (a message's JSON may be None)."""

    __slots__ = ()


UNSET = _Unset()


def varint_tail(b: bytes, p: int, v: int) -> tuple[int, int]:
    """The rest of a varint whose first byte v (>= 0x80) was read; (value mod 2**64, next)."""
    v &= 0x7F
    s = 7
    while True:
        c = b[p]
        p += 1
        if s == 63:
            if c > 1:
                raise Fallback  # more than 64 bits: left to upb's own rule
            return v | c << 63, p
        v |= (c & 0x7F) << s
        if c < 0x80:
            return v, p
        s += 7


def int32(v: int) -> int:
    """A varint (mod 2**64) read into an int32 field: upb truncates to 32 bits."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v


def int64(v: int) -> int:
    return v - (1 << 64) if v & (1 << 63) else v


def skip(b: bytes, p: int, t: int, known: frozenset[int]) -> int:
    """Skip an unknown field whose tag t was read; Fallback for a known field number met with
    another wire type (packed repeated scalars, or a mismatch upb would keep as unknown)."""
    num = t >> 3
    if num == 0 or num in known:
        raise Fallback
    wire = t & 7
    if wire == 0:
        c = b[p]
        p += 1
        if c > 127:
            _, p = varint_tail(b, p, c)
        return p
    if wire == 2:
        n = b[p]
        p += 1
        if n > 127:
            n, p = varint_tail(b, p, n)
        return p + n
    if wire == 1:
        return p + 8
    if wire == 5:
        return p + 4
    raise Fallback


def small_fields(data: bytes, expect: dict[int, int]) -> dict[int, Any]:
    """The fields of a small scalar-only message (Time, Quantity, IntOrString...): field number
    -> last value (int for varints, bytes for length-delimited). expect: number -> wire type."""
    out: dict[int, Any] = {}
    p = 0
    end = len(data)
    known = frozenset(expect)
    while p < end:
        t = data[p]
        p += 1
        if t > 127:
            t, p = varint_tail(data, p, t)
        num = t >> 3
        wire = expect.get(num)
        if wire is None or wire != t & 7:
            p = skip(data, p, t, known)
            continue
        if wire == 0:
            v = data[p]
            p += 1
            if v > 127:
                v, p = varint_tail(data, p, v)
            out[num] = v
        else:
            n = data[p]
            p += 1
            if n > 127:
                n, p = varint_tail(data, p, n)
            out[num] = data[p : p + n]
            p += n
    if p != end:
        raise Fallback
    return out


# The JSON of small leaf messages by their bytes (replicas share timestamps, quantities, ports).
_CACHE_MAX = 8192
_TIME = {1: 0, 2: 0}
_times: dict[bytes, str | None] = {}
_micros: dict[bytes, str | None] = {}
_quantities: dict[bytes, str] = {}
_ioss: dict[bytes, int | str] = {}


def _cached(cache: dict[bytes, Any], k: bytes, compute: Callable[[bytes], Any]) -> Any:
    r = cache.get(k, UNSET)
    if r is UNSET:
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        r = cache[k] = compute(k)
    return r


def _time_of(k: bytes) -> str | None:
    f = small_fields(k, _TIME)
    s = int64(f.get(1, 0))
    return None if s == GO_ZERO_UNIX else format_time(s)


def _micro_of(k: bytes) -> str | None:
    f = small_fields(k, _TIME)
    s = int64(f.get(1, 0))
    n = int32(f.get(2, 0))
    return None if s == GO_ZERO_UNIX and n == 0 else format_micro_time(s, n)


def wtime(b: bytes, p: int, q: int) -> str | None:
    """metav1.Time from its bytes: empty is Go's zero time (null), as tojson._time decides."""
    if p == q:
        return None
    return _cached(_times, b[p:q], _time_of)  # type: ignore[no-any-return]


def wmicro(b: bytes, p: int, q: int) -> str | None:
    if p == q:
        return None
    return _cached(_micros, b[p:q], _micro_of)  # type: ignore[no-any-return]


def _quantity_of(k: bytes) -> str:
    s: bytes = small_fields(k, {1: 2}).get(1, b"")
    return s.decode() or "0"


def wquantity(b: bytes, p: int, q: int) -> str:
    if p == q:
        return "0"
    return _cached(_quantities, b[p:q], _quantity_of)  # type: ignore[no-any-return]


def _ios_of(k: bytes) -> int | str:
    f = small_fields(k, {1: 0, 2: 0, 3: 2})
    if int64(f.get(1, 0)) == 1:
        s: bytes = f.get(3, b"")
        return s.decode()
    return int32(f.get(2, 0))


def wios(b: bytes, p: int, q: int) -> int | str:
    if p == q:
        return 0
    return _cached(_ioss, b[p:q], _ios_of)  # type: ignore[no-any-return]


def wduration(b: bytes, p: int, q: int) -> str:
    return format_duration(int64(small_fields(b[p:q], {1: 0}).get(1, 0)))


def wraw(b: bytes, p: int, q: int) -> bytes:
    """Field 1 (Raw/raw bytes) of FieldsV1, RawExtension, JSON, runtime.Unknown's raw."""
    if p == q:
        return b""
    r: bytes = small_fields(b[p:q], {1: 2}).get(1, b"")
    return r


def map_entry(b: bytes, p: int, q: int) -> tuple[str, int, int]:
    """A map<string, message|bytes|string> entry: (key, value start, value end); an absent
    value is the empty range (q, q). Any other field in the entry: Fallback."""
    k = ""
    vp = vq = q
    while p < q:
        t = b[p]
        p += 1
        if t == 0x0A or t == 0x12:
            n = b[p]
            p += 1
            if n > 127:
                n, p = varint_tail(b, p, n)
            if t == 0x0A:
                k = b[p : p + n].decode()
            else:
                vp, vq = p, p + n
            p += n
        else:
            raise Fallback  # upb keeps an entry with other fields out of the map
    if p != q or vq > q:
        raise Fallback
    return k, vp, vq


def wb64(v: bytes) -> str:
    return base64.b64encode(v).decode("ascii")


HELPERS: dict[str, Any] = {
    "_Fallback": Fallback,
    "_U": UNSET,
    "_vt": varint_tail,
    "_i32": int32,
    "_i64": int64,
    "_skip": skip,
    "_wtime": wtime,
    "_tc": _times,
    "_qc": _quantities,
    "_wmicro": wmicro,
    "_wq": wquantity,
    "_wios": wios,
    "_wdur": wduration,
    "_wraw": wraw,
    "_went": map_entry,
    "_wb64": wb64,
    "_dbl": struct.Struct("<d").unpack_from,
    "_join": b"".join,
    "_nok": frozenset(),
}

# Field kinds read natively: how the value is read ("ld" length-delimited, "varint", "fixed64").
_SCALAR_WIRE = {
    FieldDescriptor.TYPE_STRING: 2,
    FieldDescriptor.TYPE_BYTES: 2,
    FieldDescriptor.TYPE_MESSAGE: 2,
    FieldDescriptor.TYPE_INT32: 0,
    FieldDescriptor.TYPE_INT64: 0,
    FieldDescriptor.TYPE_BOOL: 0,
    FieldDescriptor.TYPE_DOUBLE: 1,
}
_SPECIAL_FN = {
    "time": "_wtime",
    "microtime": "_wmicro",
    "duration": "_wdur",
    "quantity": "_wq",
    "intorstring": "_wios",
}
# JSON of an absent (non-pointer) special field: the conversion of an empty message.
_SPECIAL_EMPTY = {"time": "None", "microtime": "None", "duration": "'0s'", "quantity": "'0'", "intorstring": "0"}


class _Field:
    """One field's generated code: its slot, its tag, its reader (run with the tag consumed),
    whether it repeats, and its JSON emission."""

    def __init__(
        self, slot: str, tag: int, read: list[str], init: str, emit: list[str], repeats: bool, more: str = ""
    ) -> None:
        self.slot = slot
        self.tag = tag
        self.read = read
        self.init = init
        self.emit = emit
        self.repeats = repeats
        self.more = more  # other locals to set before the fields are read


# Reading a length-delimited field's payload bounds (p: after the tag -> p: payload, q: its end).
_LD = ["n = b[p]", "p += 1", "if n > 127:", "    n, p = _vt(b, p, n)", "q = p + n"]
_VARINT = ["v = b[p]", "p += 1", "if v > 127:", "    v, p = _vt(b, p, v)"]


def _append(slot: str, val: str) -> list[str]:
    return [f"if {slot} is None:", f"    {slot} = [{val}]", "else:", f"    {slot}.append({val})"]


class TypeIds:
    """A number per message type for the generated functions' names (``fill_<n>``...); a type
    referred to but not yet generated waits in ``_pending``."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._pending: list[str] = []

    def _ref(self, full_name: str) -> int:
        idx = self._ids.get(full_name)
        if idx is None:
            idx = len(self._ids)
            self._ids[full_name] = idx
            self._pending.append(full_name)
        return idx


class WireJsonGenerator(TypeIds):
    """Generates wfill_<n>/wenc_<n> into the fragments JsonGenerator's namespace, so that a
    field left to upb runs that generator's own code (enc_<n>, fill_<n>...) unchanged.

    A wfill reads the fields in field-number order first, in straight-line code (one compare
    per field: the order in which Go's marshaller writes them), then loops over whatever is
    left (other orders, repeats, unknown fields) with a binary search over the tags."""

    def __init__(self, gen: FragmentSource) -> None:
        self.gen = gen
        self.ns = gen.ns
        self.ns.update(HELPERS)
        TypeIds.__init__(self)

    def filler(self, full_name: str) -> WireFiller:
        idx = self._ensure(full_name)
        fn: WireFiller = self.ns[f"wfill_{idx}"]
        return fn

    def encoder(self, full_name: str) -> Callable[[bytes, int, int], Any]:
        idx = self._ensure(full_name)
        fn: Callable[[bytes, int, int], Any] = self.ns[f"wenc_{idx}"]
        return fn

    # -- generation -------------------------------------------------------------------------
    def _ensure(self, full_name: str) -> int:
        idx = self._ids.get(full_name)
        if idx is not None:
            return idx
        self._pending = []
        idx = self._ref(full_name)
        sources: list[str] = []
        done: set[str] = set()
        while self._pending:
            name = self._pending.pop()
            if name in done:
                continue
            done.add(name)
            sources.append(f"# {name}\n{self._generate(name)}")
        # The upb path's functions that fields left to upb call (generated first: same namespace).
        self.gen.flush(full_name, "+wire")
        generate(f"kproxy.codec.wirejson:{full_name}", sources, self.ns)
        return idx

    def _memoised(self, full_name: str) -> bool:
        return bool(self.gen.memo_size) and full_name.rsplit(".", 1)[-1] in MEMO_TYPES

    def _assign(self, go: GoType, fd: FieldDescriptor, target: str) -> list[str] | None:
        """Lines setting target to the JSON of a present message value in b[p:q]: the lookups
        of memoised types and cached leaves written inline (no call when they hit)."""
        expr = self._message_value(go, fd)
        if expr is None:
            return None
        while go.kind == "ptr" and go.elem is not None:
            go = go.elem
        if go.kind in ("struct", "other") and self._memoised(fd.message_type.full_name):
            idx = self._ref(fd.message_type.full_name)
            get = f"{target} = _wmemo_{idx}.get(k)"
            return ["k = b[p:q]", get, f"if {target} is None:", f"    {target} = _wmiss_{idx}(k)"]
        if go.kind == "special" and go.name in ("time", "quantity"):
            cache, miss = ("_tc", "_U") if go.name == "time" else ("_qc", "None")
            return [f"{target} = {cache}.get(b[p:q], {miss})", f"if {target} is {miss}:", f"    {target} = {expr}"]
        return [f"{target} = {expr}"]

    def _wenc(self, fd: FieldDescriptor) -> str:
        return f"wenc_{self._ref(fd.message_type.full_name)}"

    def _generate(self, full_name: str) -> str:
        idx = self._ids[full_name]
        schema = self.gen.schema
        plan = schema.plan(full_name)
        is_list = is_list_kind(plan)
        fields: list[_Field] = []
        upb_lines: list[str] = []
        emit: list[str] = []
        for i, fp in enumerate(plan.fields):
            f = None
            if (full_name, fp.json) not in NESTED_TYPE_META:
                f = self._native(fp, f"f{i}", is_list and fp.json == "items" and fp.proto.is_repeated)
            if f is None:
                field_lines = self.gen.field_lines(full_name, fp)
                upb_lines += field_lines
                emit += field_lines
                f = _Field("r", self._tag(fp.proto), self._read_upb(), "None", [], True)
            else:
                emit += f.emit
            fields.append(f)
        has_upb = bool(upb_lines) or any(f.slot == "r" for f in fields)
        self.ns[f"_known_{idx}"] = frozenset(fp.proto.number for fp in plan.fields)
        by_tag = {f.tag: f for f in fields}
        lines = [f"def wfill_{idx}(b, p, end, d):"]
        inits = sorted({f.slot for f in fields if f.init == "None"})
        if inits:
            lines.append("    " + " = ".join(inits) + " = None")
        lines += [f"    {f.slot} = {f.init}" for f in fields if f.init != "None"]
        lines += [f"    {f.more}" for f in fields if f.more]
        # The straight pass, in field-number order.
        for tag in sorted(by_tag):
            f = by_tag[tag]
            size = 1 if tag < 128 else 2
            if size == 1:
                cond = f"p < end and b[p] == {tag}"
            else:
                cond = f"p < end and b[p] == {tag & 127 | 128} and b[p + 1] == {tag >> 7}"
            read = [f"p += {size}", *f.read]
            if f.slot == "r":
                read = ["s = p", f"p += {size}", f"t = {tag}", *f.read]
            elif f.read[:2] in (_LD[:2], _VARINT[:2]):
                # The tag and the first byte of the length (or value) read together.
                var = f.read[0][0]
                read = [f"{var} = b[p + {size}]", f"p += {size + 1}", *f.read[2:]]
            lines.append(f"    {'while' if f.repeats else 'if'} {cond}:")
            lines += ["        " + line for line in read]
        # Anything left: the general loop.
        lines += [
            "    while p < end:",
            *(["        s = p"] if has_upb else []),
            "        t = b[p]",
            "        p += 1",
            "        if t > 127:",
            "            c = b[p]",
            "            p += 1",
            "            if c > 127:",
            "                raise _Fallback",
            "            t = (t & 127) | c << 7",
        ]
        handlers = {t: f.read for t, f in by_tag.items()}
        lines += ["        " + line for line in self._tree(sorted(handlers), handlers, idx)]
        lines += ["    if p != end:", "        raise _Fallback"]
        if has_upb:
            cls = schema.message_class(full_name)
            self.ns[f"_cls_{idx}"] = cls
            self.ns[f"_empty_{idx}"] = cls()
            lines.append(f"    m = _cls_{idx}.FromString(_join(r)) if r is not None else _empty_{idx}")
            if any("h(" in line for line in upb_lines):
                lines.append("    h = m.HasField")
        lines += ["    " + line for line in emit]
        lines.append("    return d")
        memo = self.gen.memo_size
        if self._memoised(full_name):
            lines += [
                f"_wmemo_{idx} = {{}}",
                f"def wenc_{idx}(b, p, q):",
                "    k = b[p:q]",
                f"    r = _wmemo_{idx}.get(k)",
                "    if r is None:",
                f"        r = _wmiss_{idx}(k)",
                "    return r",
                f"def _wmiss_{idx}(k):",
                f"    if len(_wmemo_{idx}) >= {memo}:",
                f"        _wmemo_{idx}.clear()",
                f"    r = _wmemo_{idx}[k] = _fragment(_dumps(wfill_{idx}(k, 0, len(k), {{}}), default=_bd))",
                "    return r",
            ]
        else:
            lines += [f"def wenc_{idx}(b, p, end):", "    d = {}", *lines[1:-1], "    return d"]
        return "\n".join(lines) + "\n"

    def _tree(self, tags: list[int], handlers: dict[int, list[str]], idx: int) -> list[str]:
        """A binary search over the tags (a chain of a few compares at the leaves)."""
        if len(tags) <= 3:
            out: list[str] = []
            for j, t in enumerate(tags):
                out.append(f"{'if' if j == 0 else 'elif'} t == {t}:")
                out += ["    " + line for line in handlers[t]]
            fallback = f"p = _skip(b, p, t, _known_{idx})"
            if out:
                out += ["else:", "    " + fallback]
            else:
                out = [fallback]
            return out
        mid = len(tags) // 2
        return [
            f"if t < {tags[mid]}:",
            *("    " + line for line in self._tree(tags[:mid], handlers, idx)),
            "else:",
            *("    " + line for line in self._tree(tags[mid:], handlers, idx)),
        ]

    @staticmethod
    def _tag(fd: FieldDescriptor) -> int:
        wire = _SCALAR_WIRE.get(fd.type, 2)
        return int(fd.number) << 3 | wire

    @staticmethod
    def _read_upb() -> list[str]:
        """A field left to upb: its whole encoding (tag included, from s) kept for one upb parse."""
        return ["p = _skip(b, p, t, _nok)", *_append("r", "b[s:p]")]

    # -- native fields ----------------------------------------------------------------------
    def _scalar(self, fd: FieldDescriptor, target: str, skip_empty: bool) -> list[str] | None:
        """Lines reading a scalar field (tag consumed) into `target`."""
        t = fd.type
        if t == FieldDescriptor.TYPE_STRING:
            if skip_empty:
                # An empty value is not decoded, but still replaces an earlier one (last wins).
                return [*_LD, "if n:", f"    {target} = b[p:q].decode()", "else:", f"    {target} = ''", "p = q"]
            return [*_LD, f"{target} = b[p:q].decode()", "p = q"]
        if t == FieldDescriptor.TYPE_INT32:
            return [*_VARINT, "if v > 0x7FFFFFFF:", "    v = _i32(v)", f"{target} = v"]
        if t == FieldDescriptor.TYPE_INT64:
            return [*_VARINT, "if v > 0x7FFFFFFFFFFFFFFF:", "    v = _i64(v)", f"{target} = v"]
        if t == FieldDescriptor.TYPE_BOOL:
            return [*_VARINT, f"{target} = v != 0"]
        if t == FieldDescriptor.TYPE_DOUBLE:
            return [
                "v = _dbl(b, p)[0]",
                "p += 8",
                "if v.is_integer() and abs(v) < 1e21:",
                "    v = int(v)",
                f"{target} = v",
            ]
        return None

    def _message_value(self, go: GoType, fd: FieldDescriptor, p: str = "p", q: str = "q") -> str | None:
        """Expression of a present message value in b[p:q], or None if left to upb."""
        if go.kind == "ptr" and go.elem is not None:
            return self._message_value(go.elem, fd, p, q)
        if go.kind == "special":
            fn = _SPECIAL_FN.get(go.name)
            if fn is not None:
                return f"{fn}(b, {p}, {q})"
            if go.name in ("rawext", "rawjson"):
                mt = fd.message_type
                raw = mt.fields_by_name.get("Raw") or mt.fields_by_name.get("raw")
                if raw is None or raw.number != 1 or raw.type != FieldDescriptor.TYPE_BYTES or len(mt.fields) != 1:
                    return None
                fn = "_rawf" if mt.name == "FieldsV1" else "_rawv"
                return f"{fn}(_wraw(b, {p}, {q}))"
            return None
        if go.kind == "struct" or go.kind == "other":
            return f"{self._wenc(fd)}(b, {p}, {q})"
        return None

    def _native(self, fp: FieldPlan, slot: str, list_items: bool) -> _Field | None:
        fd, go, key = fp.proto, fp.go, fp.json
        tag = self._tag(fd)
        if fd.type not in _SCALAR_WIRE:
            return None
        null = [] if fp.omitempty else ["else:", f"    d[{key!r}] = None"]
        is_msg = fd.type == FieldDescriptor.TYPE_MESSAGE
        if fp.inline:
            if not is_msg or fd.is_repeated:
                return None
            fill = f"wfill_{self._ref(fd.message_type.full_name)}"
            read = [*_LD, f"if {slot} is not None:", "    raise _Fallback", f"{slot} = (p, q)", "p = q"]
            emit = [f"if {slot} is not None:", f"    {fill}(b, {slot}[0], {slot}[1], d)"]
            if go.kind != "ptr":
                emit += ["else:", f"    {fill}(b, 0, 0, d)"]
            return _Field(slot, tag, read, "None", emit, False)
        if fd.is_repeated and is_msg and fd.message_type.GetOptions().map_entry:
            return self._map(fp, slot, tag, null)
        if fd.is_repeated:
            elem = go.elem if go.kind in ("slice", "ptr") and go.elem is not None else GoType("other")
            if elem.kind == "ptr" and elem.elem is not None:
                elem = elem.elem
            if is_msg:
                expr = self._message_value(elem, fd)
                if expr is None:
                    return None
                if list_items and self.gen.fragments:
                    read = [*_LD, f"x = _fragment(_dumps({expr}, default=_bd))", "p = q"]
                else:
                    assign = self._assign(elem, fd, "x")
                    assert assign is not None
                    read = [*_LD, *assign, "p = q"]
            elif elem.kind == "bytes" and fd.type == FieldDescriptor.TYPE_BYTES:
                read = [*_LD, "x = _wb64(b[p:q])", "p = q"]
            elif elem.kind in ("scalar", "other"):
                sr = self._scalar(fd, "x", False)
                if sr is None:
                    return None
                read = sr
            else:
                return None
            read = [*read, *_append(slot, "x")]
            if list_items:
                emit = [f"d[{key!r}] = {slot} if {slot} is not None else []"]
            else:
                emit = [f"if {slot}:", f"    d[{key!r}] = {slot}", *null]
            return _Field(slot, tag, read, "None", emit, True)
        if is_msg:
            if go.kind in ("slice", "map"):
                return None  # a named slice/map kept in a wrapper message: left to upb
            expr = self._message_value(go, fd)
            if expr is None:
                return None
            check = [f"if {slot} is not _U:", "    raise _Fallback"]
            assign = self._assign(go, fd, slot)
            assert assign is not None
            read = [*_LD, *check, *assign, "p = q"]
            if go.kind == "ptr":
                emit = [f"if {slot} is not _U:", f"    d[{key!r}] = {slot}", *null]
            elif go.kind == "special":
                empty = _SPECIAL_EMPTY.get(go.name, "None")
                if go.name in ("time", "microtime") and fp.omitzero:
                    emit = [f"if {slot} is not _U and {slot} is not None:", f"    d[{key!r}] = {slot}"]
                else:
                    emit = [f"d[{key!r}] = {slot} if {slot} is not _U else {empty}"]
            elif fp.omitzero:
                # Printed when present with a non-empty encoding (tojson: HasField and ByteSize).
                read = [*_LD, *check, f"{slot} = {expr} if q > p else None", "p = q"]
                emit = [f"if {slot} is not _U and {slot} is not None:", f"    d[{key!r}] = {slot}"]
            elif fp.since:  # newer than an older supported minor: printed when the sender wrote it
                emit = [f"if {slot} is not _U:", f"    d[{key!r}] = {slot}"]
            else:
                empty_expr = self._message_value(go, fd, "0", "0")
                emit = [f"d[{key!r}] = {slot} if {slot} is not _U else {empty_expr}"]
            return _Field(slot, tag, read, "_U", emit, False)
        if fd.type == FieldDescriptor.TYPE_BYTES:
            if go.kind != "bytes":
                return None
            read = [*_LD, f"{slot} = b[p:q]", "p = q"]
            if fp.omitempty:
                emit = [f"if {slot}:", f"    d[{key!r}] = _wb64({slot})"]
            else:
                emit = [f"d[{key!r}] = _wb64({slot}) if {slot} is not None else None"]
            return _Field(slot, tag, read, "None", emit, False)
        if go.kind == "ptr":
            sr = self._scalar(fd, slot, False)
            if sr is None:
                return None
            emit = [f"if {slot} is not None:", f"    d[{key!r}] = {slot}", *null]
            return _Field(slot, tag, sr, "None", emit, False)
        if go.kind not in ("scalar", "other"):
            return None
        # A non-pointer scalar starts at its zero value; an empty string need not be decoded.
        sr = self._scalar(fd, slot, True)
        if sr is None:
            return None
        default = {
            FieldDescriptor.TYPE_STRING: "''",
            FieldDescriptor.TYPE_BOOL: "False",
            FieldDescriptor.TYPE_DOUBLE: "0",
        }.get(fd.type, "0")
        omit = fp.omitempty or fp.omitzero
        emit = [f"if {slot}:", f"    d[{key!r}] = {slot}"] if omit else [f"d[{key!r}] = {slot}"]
        return _Field(slot, tag, sr, default, emit, False)

    def _map(self, fp: FieldPlan, slot: str, tag: int, null: list[str]) -> _Field | None:
        """A map with string keys. The entry layout Go writes (key, then value, each with a
        one-byte length) is read inline; any other layout through map_entry."""
        fd, go, key = fp.proto, fp.go, fp.json
        if go.kind != "map" or go.elem is None:
            return None
        key_fd = fd.message_type.fields_by_name["key"]
        val_fd = fd.message_type.fields_by_name["value"]
        if key_fd.type != FieldDescriptor.TYPE_STRING or key_fd.number != 1 or val_fd.number != 2:
            return None
        elem = go.elem
        if val_fd.type == FieldDescriptor.TYPE_STRING and elem.kind == "scalar":
            conv = "b[{p}:{q}].decode()"
        elif val_fd.type == FieldDescriptor.TYPE_BYTES and elem.kind == "bytes":
            conv = "_wb64(b[{p}:{q}])"
        elif val_fd.type == FieldDescriptor.TYPE_MESSAGE:
            expr = self._message_value(elem, val_fd, "{p}", "{q}")
            if expr is None:
                return None
            conv = expr
        else:
            return None
        fast = conv.format(p="vt + 2", q="q")
        slow = conv.format(p="vp", q="vq")
        fast_lines = [f"x = {fast}"]
        if conv == "_wq(b, {p}, {q})":  # resource lists: the Quantity cache looked up inline
            fast_lines = ["x = _qc.get(b[vt + 2 : q])", "if x is None:", f"    x = {fast}"]
        read = [
            *_LD,
            "kl = b[p + 1]",
            "vt = p + 2 + kl",
            "if b[p] == 10 and kl < 128 and b[vt] == 18 and b[vt + 1] < 128 and vt + 2 + b[vt + 1] == q:",
            "    k = b[p + 2 : vt].decode()",
            *("    " + line for line in fast_lines),
            "else:",
            "    k, vp, vq = _went(b, p, q)",
            f"    x = {slow}",
            # Go writes the keys sorted, as its JSON wants them: sorted again only if not.
            f"if {slot} is None:",
            f"    {slot} = {{k: x}}",
            f"elif k > {slot}l:",
            f"    {slot}[k] = x",
            "else:",
            f"    {slot}[k] = x",
            f"    {slot}s = True",
            f"{slot}l = k",
            "p = q",
        ]
        emit = [
            f"if {slot}:",
            f"    d[{key!r}] = {{k: {slot}[k] for k in _sorted({slot})}} if {slot}s else {slot}",
            *null,
        ]
        return _Field(slot, tag, read, "None", emit, True, more=f"{slot}s = False")


__all__ = ["Fallback", "WireFiller", "WireJsonGenerator"]
