"""The clean check as msgspec types: parse and prove "no unknown field" in one C pass.

Most bodies are clean, and for them parsing is the cost: building Python dicts with orjson alone
takes about as long as the per-request goal. Here each schema root is turned, once, into
``msgspec.Struct`` types (``forbid_unknown_fields``, fields renamed to their JSON names, every
field defaulting to ``UNSET``), and the body is decoded straight into them, so the unknown-field
check happens inside the parser. Go accepts ``null`` anywhere, so every type also takes ``None``.

Built-in types follow Go's struct decode: an OBJECT is a Struct, a MAP ``dict[str, T]`` (Go
reports duplicate map keys too), a LIST ``list[T]``, a scalar its strict type (``str``, ``int``,
``bool``, ``int | str``), and what the exact walk never looks inside (ANY, floats, unknown
scalar types) ``msgspec.Raw``, kept verbatim. Custom resources follow the generated key-set check
(``fastcheck``): Structs for checked objects, ``dict``/``list`` only where they hold some, ``Any``
elsewhere (their wrong types are no decode error, and duplicates are looked for everywhere).

Schemas this cannot express exactly (a preserving object with checked properties below it, a
recursive type such as JSONSchemaProps) get no fast path: ``compile_fast`` answers ``None`` and
the body takes the orjson path. A decode that fails for any reason (unknown field, another type,
a syntax error) only means "not proven clean": the caller falls back to the exact path, which
words the apiserver's answer.

Duplicate keys: msgspec keeps the last value of a repeated key, in Structs and dicts alike
(msgspec issue 648), so the body is re-encoded from what was decoded, where nothing is ignored
(unknown fields raise, ``Any`` and ``Raw`` keep everything):

* built-in types: every re-encoded piece is at most as long as the body's text of it (keys and
  strings: msgspec escapes only ``"``, ``\\`` and control characters, never longer than the
  body's own escape: a ``\\uXXXX`` becomes at most 6 bytes; ints are canonical; floats and
  the rest are ``Raw``), and a dropped duplicate removes at least four bytes, so equal lengths
  prove there is none (kubectl and most clients send compact JSON);
* otherwise (white space, custom resources), with no ``\\u`` escape in the body: outside
  strings every ``:`` follows a key and inside strings a ``:`` is a literal ``:`` both ways, so
  equal colon counts prove it (``decode``).

Anything short of equality falls back to the exact path. (The proof also covers fields a Struct
skipped instead of rejecting, those of a built-in preserve-unknown-fields object: they are not
re-encoded either.)

Narrowed Structs: most of a decode's cost is per Struct slot (allocated, filled with ``UNSET``,
skipped when encoding, released), and the wide types (PodSpec, Container, Volume) declare far
more fields than bodies use. So bodies are first decoded into Structs that declare, per object
type, only the fields bodies were seen to set there (learned from the first body decoded into
the full Structs, and again from each body that needed another field). Success there proves
what success with the full Structs proves: every key a narrowed Struct accepts, the full one
accepts with the same type, and the re-encoding is the same. A narrowed failure on an unknown
field that some full Struct declares retries with the full Structs and teaches the narrowed ones
that body's fields; any other failure (an undeclared name, a wrong type, a syntax error) happens
at the same place with the full Structs (everything before it was decoded alike), so it is
final. Learning rebuilds the narrowed types (milliseconds), so it stops after ``_MAX_LESSONS``
bodies: the full Structs are then the only ones, as without narrowing.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import Any

import msgspec

from kproxy.filters.validation.schemanodes import LIST, MAP, OBJECT, SCALAR, Base64, Node

# The type of one decoded body's apiVersion and kind, or None when the fast path cannot tell.
TypeMeta = tuple[str | None, str | None]
FastCheck = Callable[[bytes], TypeMeta | None]

_local = threading.local()
# Invalid UTF-8 is a UnicodeDecodeError; deep nesting a RecursionError (decoding) or a
# TypeError (encoding).
_ERRORS = (msgspec.MsgspecError, ValueError, RecursionError, TypeError)
# Bodies that may teach the narrowed Structs new fields (each rebuilds them) before narrowing stops.
_MAX_LESSONS = 16
_UNKNOWN = "Object contains unknown field `"


# Scalars whose re-encoding is never longer than the body's text (floats are: ``1`` becomes
# ``1.0``), so they stay ``Raw``, copied verbatim.
_SCALARS: dict[frozenset[type], Any] = {
    frozenset({str}): str,
    frozenset({Base64}): str,
    frozenset({int}): int,
    frozenset({bool}): bool,
    frozenset({int, str}): int | str,
}


class _Unsupported(Exception):
    """The schema holds something the Struct types cannot express exactly."""


class _Builder:
    """Struct types for one root: Go's typing for ``builtin`` types, the key-set check's shape
    otherwise (custom resources)."""

    def __init__(self, builtin: bool, used: dict[int, set[str]] | None = None) -> None:
        self.builtin = builtin
        # Narrowed Structs: the fields each object node declares, by ``id(node)`` (None: all).
        self.used = used
        self.done: dict[int, Any] = {}
        self.building: set[int] = set()
        # Each Struct type's node and its (attribute, JSON name) pairs: what ``_Decoders.learn`` reads.
        self.shapes: dict[type, tuple[int, tuple[tuple[str, str], ...]]] = {}

    def type_of(self, node: Node) -> Any:
        """The msgspec type a value of ``node`` decodes into (``None`` is added by the caller)."""
        kind = node.kind
        if kind == OBJECT:
            if node.preserve and not self.builtin:
                if node.containers:
                    raise _Unsupported("properties checked below x-kubernetes-preserve-unknown-fields")
                return Any
            return self.struct(node)
        if self.builtin:
            # Go's struct decode, typed as strictly: a value of another type is not proven clean.
            if kind in (MAP, LIST) and node.item is not None:
                item = self.nullable(node.item)
                return dict[str, item] if kind == MAP else list[item]  # type: ignore[valid-type]
            if kind == SCALAR:
                return _SCALARS.get(node.types, msgspec.Raw)
            return msgspec.Raw
        if kind in (MAP, LIST) and node.item is not None and _holds_checked(node.item):
            item = self.nullable(node.item)
            return dict[str, item] if kind == MAP else list[item]  # type: ignore[valid-type]
        return Any

    def nullable(self, node: Node) -> Any:
        typ = self.type_of(node)
        return typ if typ is Any or typ is msgspec.Raw else typ | None

    def struct(self, node: Node, root: bool = False) -> Any:
        key = id(node)
        found = self.done.get(key)
        if found is not None:
            return found
        if key in self.building:
            raise _Unsupported("recursive schema")
        self.building.add(key)
        fields: list[tuple[str, Any, Any]] = []
        # Unknown fields of a preserving object are skipped, not rejected: narrowing it would
        # skip known ones too, so it keeps them all.
        names = None if node.preserve or self.used is None else self.used.get(key, set())
        # Go's decode of a built-in type knows only the declared properties (an embedded
        # resource's implied metadata is a custom-resource notion). Attribute names number the
        # full list, so narrowed and full Structs name a field alike.
        for i, name in enumerate(sorted(node.props if self.builtin else node.keyset)):
            if names is not None and name not in names and not (root and name in ("apiVersion", "kind")):
                continue
            child = node.meta if node.embedded and name == "metadata" and node.meta is not None else node.props[name]
            if root and name in ("apiVersion", "kind"):
                typ: Any = str | None  # read on the clean path; a wrong type is not proven clean
            else:
                typ = self.nullable(child)
            fields.append((f"f{i}", typ, msgspec.field(default=msgspec.UNSET, name=name)))
        self.building.discard(key)
        # Unknown fields of a preserving object are skipped, so never re-encoded: the length or colon
        # proof then fails, and the exact walk (which looks at declared fields only) decides.
        forbid = not node.preserve
        cls = msgspec.defstruct(f"S{len(self.done)}", fields, forbid_unknown_fields=forbid, gc=False)
        self.done[key] = cls
        self.shapes[cls] = (key, tuple((attr, f.name) for attr, _, f in fields))
        return cls


def _holds_checked(node: Node) -> bool:
    """Whether a value of ``node`` can contain an object whose keys are checked."""
    seen: set[int] = set()
    while node.kind in (MAP, LIST) and node.item is not None and id(node) not in seen:
        seen.add(id(node))
        node = node.item
    return node.kind == OBJECT or id(node) in seen


def _declared(root: Node, builtin: bool) -> frozenset[str]:
    """Every field name some object below ``root`` declares (what the full Structs accept)."""
    names: set[str] = set()
    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if node.kind == OBJECT:
            names.update(node.props if builtin else node.keyset)
            todo.extend(node.props.values())
            if node.meta is not None:
                todo.append(node.meta)
        elif node.item is not None:
            todo.append(node.item)
    return frozenset(names)


def _unknown_name(err: msgspec.ValidationError) -> str | None:
    """The field an "unknown field" error names ("" when it cannot be read), None for any other
    error."""
    msg = str(err)
    if not msg.startswith(_UNKNOWN):
        return None
    name, sep, _ = msg[len(_UNKNOWN) :].rpartition("` - at `")
    return name if sep else ""


class _Decoders:
    """The full Structs' decoder and the narrowed one, with the fields narrowing has learned."""

    def __init__(self, root: Node, builtin: bool, max_lessons: int) -> None:
        self.root = root
        self.builtin = builtin
        self.max_lessons = max_lessons
        builder = _Builder(builtin)
        cls = builder.struct(root, root=True)
        self.full_type = cls
        self.full: Callable[[bytes], Any] = msgspec.json.Decoder(cls).decode
        self.shapes = builder.shapes
        self.narrow: Callable[[bytes], Any] | None = None
        self.declared = _declared(root, builtin)
        self.used: dict[int, set[str]] = {}  # the fields bodies set, by id(node)
        self.lessons = 0  # bodies learned from so far

    def learn(self, obj: Any) -> None:
        """Narrow to the fields ``obj`` (a body decoded into the full Structs) sets, too."""
        self.lessons += 1
        if self.lessons > self.max_lessons:
            self.narrow = None  # the workload keeps using new fields: full Structs only
            return
        used, shapes, unset = self.used, self.shapes, msgspec.UNSET
        grew = False
        todo = [obj]  # (a loop, not recursion: Any values may nest deep)
        while todo:
            value = todo.pop()
            tv = type(value)
            shape = shapes.get(tv)
            if shape is not None:
                fields = used.setdefault(shape[0], set())
                for attr, name in shape[1]:
                    child = getattr(value, attr)
                    if child is not unset:
                        if name not in fields:
                            fields.add(name)
                            grew = True
                        todo.append(child)
            elif tv is list:
                todo.extend(value)
            elif tv is dict:
                todo.extend(value.values())
        if not grew and self.narrow is not None:
            return
        try:
            narrow = msgspec.json.Decoder(_Builder(self.builtin, used).struct(self.root, root=True)).decode
        except (_Unsupported, TypeError, ValueError):  # (the full types built: not expected)
            self.narrow, self.max_lessons = None, 0
            return
        self.narrow = narrow


def _type_meta_of(api_attr: str | None, kind_attr: str | None) -> Callable[[Any], tuple[Any, Any]]:
    """The decoded root's apiVersion and kind attributes (one C call when it declares both)."""
    if api_attr and kind_attr:
        return operator.attrgetter(api_attr, kind_attr)
    return lambda obj: (
        getattr(obj, api_attr) if api_attr else None,
        getattr(obj, kind_attr) if kind_attr else None,
    )


def compile_fast(root: Node, *, custom: bool = False, max_lessons: int = _MAX_LESSONS) -> FastCheck | None:
    """A function decoding a JSON body against ``root``: the body's (apiVersion, kind) when it
    certainly has no unknown and no duplicate field, ``None`` when that is not proven (or no
    such function when the schema cannot be expressed as Structs). ``max_lessons=0``: the full
    Structs only, no narrowing."""
    if root.kind != OBJECT or root.preserve:
        return None
    try:
        decoders = _Decoders(root, not custom, max_lessons)
    except (_Unsupported, TypeError, ValueError):  # (msgspec refusing a type: no fast path either)
        return None
    cls, full, declared = decoders.full_type, decoders.full, decoders.declared
    encode_into = msgspec.json.Encoder().encode_into
    names = {f.encode_name: f.name for f in msgspec.structs.fields(cls)}
    api_attr, kind_attr = names.get("apiVersion"), names.get("kind")
    type_meta = _type_meta_of(api_attr, kind_attr)
    same_length_proves = not custom

    def check(data: bytes) -> TypeMeta | None:
        # The re-encoding goes into a reused buffer (one per thread): a new bytes object per body
        # costs more.
        try:
            out = _local.buffer
        except AttributeError:
            out = _local.buffer = bytearray()
        narrow = decoders.narrow
        try:
            if narrow is None:
                obj = full(data)
                if decoders.lessons == 0:
                    decoders.learn(obj)
            else:
                try:
                    obj = narrow(data)
                except msgspec.ValidationError as err:
                    # Only a name the full Structs declare can make them decide otherwise.
                    name = _unknown_name(err)
                    if name is None or (name and name not in declared):
                        return None
                    obj = full(data)
                    decoders.learn(obj)
            encode_into(obj, out)
        except _ERRORS:
            return None
        # No duplicate: equal lengths prove it for built-in kinds, else equal colon counts, which
        # prove nothing when a ``\\u`` escape could spell a ``:`` (the single-byte search first:
        # memchr is cheaper).
        if not (same_length_proves and len(out) == len(data)) and (
            (b"\\" in data and b"\\u" in data) or data.count(b":") != out.count(b":")
        ):
            return None
        api_version, kind = type_meta(obj)
        return (
            api_version if type(api_version) is str else None,
            kind if type(kind) is str else None,
        )

    return check
