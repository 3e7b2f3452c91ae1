"""The strict-decoding checks of the apiserver, over compiled schemas.

Built-in types (sigs.k8s.io/json decoding into Go structs): errors come in document order,
``duplicate field "p"`` for a repeated declared field or map key, ``unknown field "p"`` for an
undeclared one (whose value is then skipped unseen); messages are deduplicated and capped at
100. A value of the wrong JSON type is a fatal decode error whose text (Go struct and field
names) kproxy does not reproduce: the outcome is then ``fatal`` and the caller lets the
apiserver answer.

Custom resources (customresource_handler.go): duplicates from the strict JSON decode first
(document order), then unknown fields of the object's ``metadata`` (decoded as ObjectMeta from
a re-marshalled map, so in sorted-key order), then every path pruned by the structural schema,
sorted, then unknown fields of embedded resources' ``metadata``. Wrong types are not decode
errors for custom resources (schema validation reports them later, after strict decoding).

Most bodies are clean, and ``validate_body`` answers those without either walk: the body is
decoded straight into msgspec Structs generated per schema (``structs``), which reject unknown
fields while parsing, and a length or colon comparison with their re-encoding proves there is no
duplicate key. A body that is not proven clean that way (or whose schema has no Structs) is
parsed by orjson, proven free of duplicates by a colon count (``decode``) and of unknown fields
by a key-set check generated per schema (``fastcheck``); only a body that fails those proofs too
is walked as above, which is also where types are looked at (a clean body is forwarded either
way).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any

from kproxy.filters.validation.decode import DecodeError, Pairs, decode_json, decode_yaml
from kproxy.filters.validation.fastcheck import compile_clean
from kproxy.filters.validation.schemanodes import ANY, LIST, MAP, OBJECT, SCALAR, Base64, Node
from kproxy.filters.validation.structs import compile_fast

MAX_ERRORS = 100  # sigs.k8s.io/json saveStrictError


@dataclass(slots=True)
class Outcome:
    """What strict decoding of one body finds.

    ``errors`` are the strict errors as the apiserver words them (one ``Warning`` each);
    ``yaml_errors`` is how many of the first ones came from the YAML conversion (they form one
    ``yaml: unmarshal errors:`` error in a Strict message). ``fatal`` means the apiserver fails
    the decode for another reason (syntax, a wrong type): only it can word that answer.
    """

    errors: list[str] = field(default_factory=list)
    yaml_errors: int = 0
    fatal: str = ""
    api_version: str | None = None  # the body's own apiVersion and kind (None when absent)
    kind: str | None = None

    @property
    def clean(self) -> bool:
        return not self.errors and not self.fatal


class _Errors:
    __slots__ = ("fatal", "items", "seen")

    def __init__(self) -> None:
        self.items: list[str] = []
        self.seen: set[str] = set()
        self.fatal = ""

    def add(self, msg: str) -> None:
        if msg in self.seen or len(self.items) >= MAX_ERRORS:
            return
        self.seen.add(msg)
        self.items.append(msg)


def _join(name: str, key: str) -> str:
    return f"{name}.{key}" if name else key


def _walk_struct(node: Node, value: Any, name: str, out: _Errors) -> None:
    """Go struct decoding of ``value`` at path ``name`` (document order, duplicates seen)."""
    kind = node.kind
    if value is None or kind == ANY:
        return
    if kind == SCALAR:
        if type(value) not in node.types and not _scalar_ok(node, value):
            out.fatal = out.fatal or f"wrong type at {name or '<root>'}"
        return
    if kind == LIST:
        if type(value) is not list:
            out.fatal = out.fatal or f"wrong type at {name or '<root>'}"
            return
        item = node.item
        if item is None or item.kind == ANY:
            return
        for i, elem in enumerate(value):
            _walk_struct(item, elem, f"{name}[{i}]", out)
        return
    tv = type(value)
    if tv is dict:
        items: Any = value.items()
        seen: set[str] | None = None
    elif tv is Pairs:
        items = value
        seen = set()
    else:
        out.fatal = out.fatal or f"wrong type at {name or '<root>'}"
        return
    if kind == MAP:
        item = node.item
        for key, val in items:
            if seen is not None:
                if key in seen:
                    out.add(f'duplicate field "{_join(name, key)}"')
                seen.add(key)
            if item is not None and item.kind != ANY and val is not None:
                _walk_struct(item, val, _join(name, key), out)
        return
    props = node.props
    preserve = node.preserve
    for key, val in items:
        child = props.get(key)
        if child is None:
            if not preserve:
                out.add(f'unknown field "{_join(name, key)}"')
            continue
        if seen is not None:
            if key in seen:
                out.add(f'duplicate field "{_join(name, key)}"')
            seen.add(key)
        if val is None:
            continue
        ck = child.kind
        if ck == SCALAR:
            if type(val) not in child.types and not _scalar_ok(child, val):
                out.fatal = out.fatal or f"wrong type at {_join(name, key)}"
        elif ck != ANY:
            _walk_struct(child, val, _join(name, key), out)


def _scalar_ok(node: Node, value: Any) -> bool:
    """The slow part of a scalar check: base64 for ``[]byte`` fields (Go decodes them)."""
    if Base64 in node.types and type(value) is str:
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            return False
        return True
    return False


def _duplicates(value: Any, name: str, out: _Errors) -> None:
    """Duplicate keys anywhere (decoding into an unstructured map), in document order."""
    tv = type(value)
    if tv is Pairs:
        seen: set[str] = set()
        for key, val in value:
            if key in seen:
                out.add(f'duplicate field "{_join(name, key)}"')
            seen.add(key)
            _duplicates(val, _join(name, key), out)
    elif tv is list:
        for i, elem in enumerate(value):
            _duplicates(elem, f"{name}[{i}]", out)


def _plain(value: Any) -> Any:
    """``Pairs`` trees as the dicts Go's unstructured decode keeps (the last duplicate wins)."""
    tv = type(value)
    if tv is Pairs:
        out: dict[str, Any] = {}
        for k, v in value:
            out[k] = _plain(v)
        return out
    if tv is list:
        return [_plain(v) for v in value]
    return value


def _sorted(value: Any) -> Any:
    if type(value) is dict:
        return {k: _sorted(value[k]) for k in sorted(value)}
    if type(value) is list:
        return [_sorted(v) for v in value]
    return value


def _prune(node: Node, value: Any, name: str, pruned: list[str], embedded: list[tuple[str, Any, Node]]) -> None:
    """Structural-schema pruning: collect the paths it would drop."""
    kind = node.kind
    if kind == ANY or value is None:
        return
    if kind == LIST:
        if type(value) is list and node.item is not None:
            for i, elem in enumerate(value):
                _prune(node.item, elem, f"{name}[{i}]", pruned, embedded)
        return
    if type(value) is not dict:
        return
    if kind == MAP:
        if node.item is not None:
            for key, val in value.items():
                _prune(node.item, val, _join(name, key), pruned, embedded)
        return
    if kind != OBJECT:
        return
    props = node.props
    for key, val in value.items():
        path = _join(name, key)
        if node.embedded and key == "metadata":
            if node.meta is not None:
                embedded.append((path, val, node.meta))
            continue
        child = props.get(key)
        if child is None:
            if not node.preserve:
                pruned.append(path)
            continue
        _prune(child, val, path, pruned, embedded)


def check_builtin(root: Node, value: Any, yaml_errors: list[str] | None = None) -> Outcome:
    out = _Errors()
    for msg in yaml_errors or ():
        out.add(msg)
    if type(value) not in (dict, Pairs):
        return Outcome(fatal="the body is not a JSON object")
    _walk_struct(root, value, "", out)
    return Outcome(out.items, len(yaml_errors or ()), out.fatal)


def check_custom(root: Node, meta: Node | None, value: Any, yaml_errors: list[str] | None = None) -> Outcome:
    out = _Errors()
    for msg in yaml_errors or ():
        out.add(msg)
    if type(value) not in (dict, Pairs):
        return Outcome(fatal="the body is not a JSON object")
    _duplicates(value, "", out)
    obj = _plain(value)
    metadata = obj.get("metadata")
    if meta is not None and metadata is not None:
        if type(metadata) is not dict:
            return Outcome(out.items, len(yaml_errors or ()), "metadata is not an object")
        _walk_struct(meta, _sorted(metadata), "metadata", out)
    pruned: list[str] = []
    embedded: list[tuple[str, Any, Node]] = []
    rest = {k: v for k, v in obj.items() if k != "metadata"}
    _prune(root, rest, "", pruned, embedded)
    for path in sorted(pruned):
        out.add(f'unknown field "{path}"')
    for path, val, meta_node in embedded:
        if type(val) is dict:
            _walk_struct(meta_node, _sorted(val), path, out)
    return Outcome(out.items, len(yaml_errors or ()), out.fatal)


def _clean(node: Node, value: Any) -> bool:
    """Whether ``value`` certainly has no unknown field (the common case, checked at C speed:
    key sets compared per object, descending only into children that hold objects or lists).
    Types are not looked at: without unknown fields there is nothing to report either way."""
    kind = node.kind
    tv = type(value)
    if tv is dict:
        if kind == OBJECT:
            if not node.preserve and not value.keys() <= node.keyset:
                return False
            containers = node.containers
            if containers:
                for key in value.keys() & containers.keys():
                    if not _clean(containers[key], value[key]):
                        return False
        elif kind == MAP:
            item = node.item
            if item is not None and (item.kind == OBJECT or item.containers or item.kind in (MAP, LIST)):
                for val in value.values():
                    if not _clean(item, val):
                        return False
    elif tv is list and kind == LIST:
        item = node.item
        if item is not None and item.kind in (OBJECT, MAP, LIST):
            for val in value:
                if not _clean(item, val):
                    return False
    return True


def validate_body(
    data: bytes, media_type: str, root: Node, *, custom: bool = False, meta: Node | None = None
) -> Outcome:
    """Strict-decode ``data`` (``application/json`` or ``application/yaml``) against ``root``."""
    try:
        if media_type == "application/yaml":
            value, yaml_errors = decode_yaml(data)
        else:
            fast = root.fast
            if fast is None:
                fast = root.fast = compile_fast(root, custom=custom) or _no_proof
            type_meta = fast(data)
            if type_meta is not None:  # (positional: keywords cost more than the check saves)
                return Outcome([], 0, "", type_meta[0], type_meta[1])
            value, maybe_duplicates = decode_json(data)
            yaml_errors = []
            check = root.check
            if check is None:
                check = root.check = compile_clean(root)
            if not maybe_duplicates and type(value) is dict and check(value):
                api_version, kind = _type_meta(value)
                return Outcome(api_version=api_version, kind=kind)
    except DecodeError as err:
        return Outcome(fatal=str(err))
    except RecursionError:  # the fast checks and the walks recurse per level of nesting
        return Outcome(fatal=_TOO_DEEP)
    try:
        outcome = check_custom(root, meta, value, yaml_errors) if custom else check_builtin(root, value, yaml_errors)
    except RecursionError:
        return Outcome(fatal=_TOO_DEEP)
    outcome.api_version, outcome.kind = _type_meta(value)
    return outcome


# A body nested deeper than Python's recursion allows is left to the apiserver (Go's decoder has
# its own depth limit, 10000, whose error kproxy does not reproduce).
_TOO_DEEP = "nested too deep to check locally"


def _no_proof(_data: bytes) -> None:
    """The fast path of a schema that msgspec types cannot express: never a proof."""
    return None


def _type_meta(value: Any) -> tuple[str | None, str | None]:
    """The body's ``apiVersion`` and ``kind`` (the last of duplicates, as the decoder keeps)."""
    found: dict[str, Any] = {}
    if type(value) is dict:
        found = value
    elif type(value) is Pairs:
        found = dict(value)
    api_version, kind = found.get("apiVersion"), found.get("kind")
    return (
        api_version if isinstance(api_version, str) else None,
        kind if isinstance(kind, str) else None,
    )
