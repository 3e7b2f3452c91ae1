"""YAML request bodies read as the apiserver reads them, with go-yaml's limits.

The apiserver turns a YAML body into JSON with sigs.k8s.io/yaml ``YAMLToJSON`` (v1.6.0;
``YAMLToJSONStrict`` for strict field validation), which unmarshals the YAML into Go values with
go.yaml.in/yaml/v2 (v2.4.4) and marshals them as JSON (apimachinery
``runtime/serializer/json/json.go`` ``Decode``/``unmarshal``). go-yaml bounds that work, and so
does this port, with the same rules and the same error texts:

* depth -- the scanner refuses a 10001st nested flow collection (``max_flow_level``) or a
  10001st pushed block indentation (``max_indents``): ``yaml: exceeded max depth of 10000``,
  with ``line N: `` before it when the offending token is not on the first line
  (scannerc.go ``yaml_parser_increase_flow_level``, ``yaml_parser_roll_indent``; yaml.go
  ``parser.fail``);
* aliases -- every node the decoder visits counts (``decodeCount``), and every node visited
  inside an alias expansion counts as an alias too (``aliasCount``); once more than 100 of more
  than 1000 come from aliases and their share exceeds ``allowedAliasRatio`` (99% up to 400,000
  nodes, falling to 10% at 4,000,000): ``yaml: document contains excessive aliasing``; an alias
  inside its own anchor: ``yaml: anchor 'a' value contains itself`` (decode.go ``unmarshal``,
  ``alias``);
* only the first document is read (yaml.go ``unmarshal``: one ``parser.parse``).

Bounded here means: libyaml (pyyaml's C parser) hands out events in a flat loop, values are
built with an explicit stack (no recursion, whatever the nesting), and an alias is never
expanded: its value is the anchor's own value, shared, and its cost is what go-yaml's expansion
would count (the anchor's expanded size, known once the anchor is complete). A document go-yaml
refuses is refused after work linear in its length, and a value that go-yaml accepts holds at
most the ~400,000 alias-expanded nodes its budget allows. Values may therefore be shared between
places in the result: callers must not mutate them.

Go decodes the whole node tree before it unmarshals, so a parse error anywhere wins over an
aliasing error: after a decode error the rest of the document is still parsed (not built).

Merge keys follow go-yaml v2 (decode.go ``mapping``/``merge``): the merged mapping's entries are
set in place, in order (an earlier key is overwritten, a later one overwrites), a sequence of
mappings is merged from its last element to its first. Strict mode's ``line N: key "x" already
set in map`` (``setMapIndex``) names the line of the value node of the repeated entry.

The result is what ``convertToJSONableObject`` makes of it (sigs.k8s.io/yaml yaml.go): map keys
become strings (ints in decimal, booleans as ``true``/``false``), mappings come out with their
keys sorted as Go's JSON encoder writes them. Plain scalars are resolved as go-yaml v2 resolves
them (:mod:`kproxy.gocompat.yamlresolve`), not as YAML 1.1 would; explicitly tagged ones by pyyaml's
constructors. Timestamps stay strings, as go-yaml v2 leaves them when decoding into
``interface{}``, and so do scalars with a tag it does not know. What kproxy does not convert
(float or null keys, malformed tagged scalars) is :class:`UnsupportedYAML`: the apiserver's answer
to it is left to the apiserver.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass, field
from typing import Any

import yaml

from kproxy.gocompat.yamlresolve import FLOAT, resolve_plain

__all__ = [
    "ALIAS_RATIO_RANGE_HIGH",
    "ALIAS_RATIO_RANGE_LOW",
    "MAX_DEPTH",
    "Decoded",
    "GoYAMLError",
    "UnsupportedYAML",
    "allowed_alias_ratio",
    "yaml_to_json",
]

#: scannerc.go ``max_flow_level`` and ``max_indents``.
MAX_DEPTH = 10000
#: decode.go ``alias_ratio_range_low`` / ``alias_ratio_range_high``.
ALIAS_RATIO_RANGE_LOW = 400_000
ALIAS_RATIO_RANGE_HIGH = 4_000_000
_ALIAS_RATIO_RANGE = float(ALIAS_RATIO_RANGE_HIGH - ALIAS_RATIO_RANGE_LOW)

_MERGE_TAG = "tag:yaml.org,2002:merge"
_MISSING = object()
_PLAIN_CACHE = 4096
_INT64_MIN, _UINT64_MAX = -(2**63), 2**64 - 1


class GoYAMLError(ValueError):
    """The body is one go-yaml (or the JSON step of sigs.k8s.io/yaml) refuses; ``str()`` is the
    error text the apiserver's decoder returns for it."""


class UnsupportedYAML(ValueError):
    """YAML kproxy does not convert (the apiserver may or may not accept it)."""


@dataclass(slots=True)
class Decoded:
    """``value``: the JSON-able result; ``duplicates``: strict mode's duplicate-key errors, in
    order; ``depth``: the nesting of ``value`` as JSON (the apiserver's JSON decoder allows 10000)."""

    value: Any
    duplicates: list[str] = field(default_factory=list)
    depth: int = 0


def allowed_alias_ratio(decode_count: int) -> float:
    """decode.go ``allowedAliasRatio``."""
    if decode_count <= ALIAS_RATIO_RANGE_LOW:
        return 0.99
    if decode_count >= ALIAS_RATIO_RANGE_HIGH:
        return 0.10
    return 0.99 - 0.89 * ((decode_count - ALIAS_RATIO_RANGE_LOW) / _ALIAS_RATIO_RANGE)


_Base: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Base):  # type: ignore[misc]
    """libyaml's parser with pyyaml's safe scalar constructors; timestamps stay strings."""


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_str)


def _lift_libyaml_nesting_limit() -> None:
    """libyaml 0.2.6 (inside pyyaml's C extension) refuses nesting beyond 1000 levels of
    collections (``yaml_set_max_nest_level``), where go-yaml allows 10000 flow levels plus 10000
    indentations: the parser's limit is raised above both, once per process, so that go-yaml's
    limits (checked in this module) are the ones that apply. pyyaml does not expose the setter;
    the extension exports it. Without it (an older libyaml has no limit) nothing is needed."""
    module = getattr(yaml, "_yaml", None)
    path = getattr(module, "__file__", None)
    if path is None:
        return
    try:
        lib = ctypes.CDLL(path)
        setter, getter = lib.yaml_set_max_nest_level, lib.yaml_get_max_nest_level
    except (OSError, AttributeError):
        return
    setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
    if getter() < 2 * MAX_DEPTH + 2:
        setter(2 * MAX_DEPTH + 2)


_lift_libyaml_nesting_limit()


class _Anchor:
    """What an alias to a node needs: its value, go-yaml's count of its expansion, its JSON
    depth, and for a mapping the entries a merge replays (key, go key, value, line)."""

    __slots__ = ("complete", "depth", "entries", "size", "value")

    def __init__(self) -> None:
        self.complete = False
        self.value: Any = None
        self.size = 0
        self.depth = 0
        self.entries: list[tuple[str, Any, Any, int]] | None = None


class _Frame:
    """An open mapping or sequence."""

    __slots__ = (
        "anchor",
        "block_indent",
        "depth",
        "entries",
        "flow",
        "indent",
        "is_map",
        "key",
        "line",
        "merge",
        "merged",
        "present",
        "pushes",
        "size",
        "value",
    )

    def __init__(self, is_map: bool, flow: bool, pushes: bool, indent: int, line: int) -> None:
        self.is_map = is_map
        self.flow = flow
        self.pushes = pushes  # a block collection that pushed an indentation level
        self.indent = indent  # the innermost pushed block indentation (-1 at the top)
        self.line = line
        self.size = 1
        self.depth = 1
        self.anchor: _Anchor | None = None
        self.value: Any = [] if not is_map else None
        # Mappings: every set attempt in order (merges replay it), the keys present (by Go
        # identity), the pending key, and whether the pending value is a merge.
        self.entries: list[tuple[str, Any, Any, int]] = []
        self.present: dict[Any, str] = {}
        self.key: tuple[str, Any] | None = None
        self.merge = False
        # A sequence that is a merge value: its elements' entries, merged when it closes.
        self.merged: list[list[tuple[str, Any, Any, int]]] | None = None
        self.block_indent = indent


def _go_key(value: Any) -> Any:
    """A mapping key as Go's ``map[interface{}]interface{}`` tells keys apart (1, 1.0, true and
    "1" are four keys)."""
    return (type(value), value)


def _json_key(value: Any) -> str:
    """``convertToJSONableObject``'s key conversion."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    raise UnsupportedYAML(f"map key {value!r} is not converted")


def _go_repr(key: Any) -> str:
    """Go's ``%#v`` of a scalar key."""
    if isinstance(key, str):
        out = ['"']
        for ch in key:
            if ch in '"\\':
                out.append("\\" + ch)
            elif ch == "\n":
                out.append("\\n")
            elif ch == "\t":
                out.append("\\t")
            elif ch == "\r":
                out.append("\\r")
            elif not ch.isprintable():
                out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x80 else f"\\u{ord(ch):04x}")
            else:
                out.append(ch)
        out.append('"')
        return "".join(out)
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "interface {}(nil)"
    return str(key)


def _go_line(err: yaml.MarkedYAMLError) -> str:
    """``parser.fail``'s ``line N: `` prefix for a libyaml error."""
    problem = err.problem_mark.line if err.problem_mark is not None else 0
    context = err.context_mark.line if err.context_mark is not None else 0
    if problem:
        return f"line {problem + 1 if isinstance(err, yaml.scanner.ScannerError) else problem}: "
    if context:
        return f"line {context}: "
    return ""


def _want_map() -> GoYAMLError:
    """decode.go ``failWantMap``."""
    return GoYAMLError("yaml: map merge requires map or sequence of maps as the value")


def _depth_error(line: int) -> GoYAMLError:
    where = f"line {line + 1}: " if line else ""
    return GoYAMLError(f"yaml: {where}exceeded max depth of {MAX_DEPTH}")


def _json_float(value: float) -> None:
    """json.Marshal in YAMLToJSON refuses what JSON cannot write: "json: unsupported value: NaN"
    (FormatFloat 'g')."""
    if math.isnan(value) or math.isinf(value):
        text = "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
        raise GoYAMLError(f"json: unsupported value: {text}")


class _Decoder:
    """One document, event by event (see the module docstring)."""

    def __init__(self, data: bytes | str) -> None:
        self.loader = _Loader(data)
        self.constructors = self.loader.yaml_constructors
        self.anchors: dict[str, _Anchor] = {}
        self.duplicates: list[str] = []
        self.decode_count = 1  # the document node
        self.alias_count = 0
        self.error: GoYAMLError | UnsupportedYAML | None = None
        self.plain: dict[str, Any] = {}

    # -- go-yaml's budget
    def count(self, nodes: int, aliased: bool) -> None:
        self.decode_count += nodes
        if aliased:
            self.alias_count += nodes
        d, a = self.decode_count, self.alias_count
        if a > 100 and d > 1000 and a / d > allowed_alias_ratio(d):
            raise GoYAMLError("yaml: document contains excessive aliasing")

    # -- scalars
    def scalar(self, event: yaml.ScalarEvent) -> Any:
        if event.tag is None and event.implicit[0]:
            # Plain scalars repeat (the same numbers, booleans, names): resolved once each.
            cached = self.plain.get(event.value, _MISSING)
            if cached is not _MISSING:
                return cached
            value = self._scalar_value(event)
            if len(self.plain) < _PLAIN_CACHE:
                self.plain[event.value] = value
            return value
        return self._scalar_value(event)

    def _scalar_value(self, event: yaml.ScalarEvent) -> Any:
        tag = event.tag
        if tag is None and event.implicit[0]:
            kind, value = resolve_plain(event.value)  # go-yaml's resolve, not YAML 1.1's
            if kind == FLOAT:
                _json_float(value)
            return value
        if tag == "!":
            return event.value  # resolve.go: "!" is not a tag it resolves, so the text stays a string
        if tag is None:
            tag = self.loader.resolve(yaml.ScalarNode, event.value, event.implicit)
        node = yaml.ScalarNode(tag, event.value, None, None, event.style)
        construct = self.constructors.get(tag)
        if construct is None:
            return event.value  # resolve.go: a tag it does not know leaves the text a string
        try:
            value = construct(self.loader, node)
        except (yaml.constructor.ConstructorError, ValueError, OverflowError) as err:
            # A tagged scalar pyyaml cannot build ("!!int 0x_", 20,000 digits): go-yaml refuses
            # it too, and the apiserver's own answer is the one to give.
            raise UnsupportedYAML(str(err)) from None
        if isinstance(value, bytes):
            # decode.go scalar: binary data decoded into interface{} is a Go string of its bytes,
            # which JSON writes with U+FFFD for what is not UTF-8.
            return value.decode("utf-8", "replace")
        if type(value) is int and not _INT64_MIN <= value <= _UINT64_MAX:
            value = float(value)  # go-yaml's resolve: neither int64 nor uint64, so float64
        if type(value) is float:
            _json_float(value)
        return value

    # -- the document
    def run(self) -> Decoded:
        try:
            return self._run()
        except yaml.MarkedYAMLError as err:
            problem = err.problem or "unknown problem parsing YAML content"
            raise GoYAMLError(f"yaml: {_go_line(err)}{problem}") from None
        except yaml.YAMLError as err:
            raise GoYAMLError(f"yaml: {err}") from None
        finally:
            self.loader.dispose()

    def _run(self) -> Decoded:
        """Parse the first document; build its value unless a decode error was met (Go parses
        the whole node tree before it decodes, so a later parse error still wins)."""
        get_event = self.loader.get_event
        stack: list[_Frame] = []
        levels = [0, 0]  # flow collections open, block indentations pushed
        out: list[Any] = [None, 0]  # the document's value and depth
        started = False
        while True:
            event = get_event()
            kind = type(event)
            if kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
                frame = self._open(stack, event, kind is yaml.MappingStartEvent, levels)
                stack.append(frame)
                if self.error is None:
                    try:
                        self._start(stack, frame, event)
                    except (GoYAMLError, UnsupportedYAML) as err:
                        self.error = err
            elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
                frame = stack.pop()
                if frame.flow:
                    levels[0] -= 1
                elif frame.pushes:
                    levels[1] -= 1
                if self.error is None:
                    try:
                        self._end(stack, frame, out)
                    except (GoYAMLError, UnsupportedYAML) as err:
                        self.error = err
            elif kind is yaml.ScalarEvent:
                anchor = None
                if event.anchor is not None:
                    anchor = self.anchors[event.anchor] = _Anchor()
                if self.error is None:
                    try:
                        self._scalar(stack, event, anchor, out)
                    except (GoYAMLError, UnsupportedYAML) as err:
                        self.error = err
            elif kind is yaml.AliasEvent:
                found = self.anchors.get(event.anchor)
                if found is None:  # the parser's own error (yaml.go parser.alias)
                    raise GoYAMLError(f"yaml: unknown anchor '{event.anchor}' referenced")
                if self.error is None:
                    try:
                        self._alias(stack, event, found, out)
                    except (GoYAMLError, UnsupportedYAML) as err:
                        self.error = err
            elif kind is yaml.DocumentStartEvent:
                started = True
            elif kind is yaml.DocumentEndEvent or kind is yaml.StreamEndEvent:
                if self.error is not None:
                    raise self.error
                return Decoded(out[0] if started else None, self.duplicates, out[1] if started else 0)

    def _open(self, stack: list[_Frame], event: Any, is_map: bool, levels: list[int]) -> _Frame:
        """The scanner's depth limits, for a collection that starts here."""
        indent = stack[-1].block_indent if stack else -1
        pushes = False
        if event.flow_style:
            levels[0] += 1
            if levels[0] > MAX_DEPTH:
                raise _depth_error(event.start_mark.line)
        elif event.start_mark.column > indent:
            pushes = True
            levels[1] += 1
            if levels[1] > MAX_DEPTH:
                raise _depth_error(event.start_mark.line)
            indent = event.start_mark.column
        frame = _Frame(is_map, bool(event.flow_style), pushes, indent, event.start_mark.line)
        if event.anchor is not None:
            frame.anchor = self.anchors[event.anchor] = _Anchor()
        return frame

    @staticmethod
    def _is_key(top: _Frame) -> bool:
        return top.is_map and top.key is None and not top.merge

    def _start(self, stack: list[_Frame], frame: _Frame, event: Any) -> None:
        parent = stack[-2] if len(stack) > 1 else None
        if frame.is_map:
            frame.value = {}
        if parent is not None and self._is_key(parent):
            raise GoYAMLError("yaml: invalid map key: a " + ("map" if frame.is_map else "slice"))
        if parent is not None and parent.merge and not frame.is_map:
            frame.merged = []  # a merge's sequence: not unmarshalled itself, its mappings are merged
            frame.size = 0
            return
        if parent is not None and parent.merged is not None and not frame.is_map:
            raise _want_map()
        self.count(1, False)

    def _end(self, stack: list[_Frame], frame: _Frame, out: list[Any]) -> None:
        parent = stack[-1] if stack else None
        if frame.merged is not None:
            assert parent is not None
            parent.merge = False
            for entries in reversed(frame.merged):  # go-yaml merges from the last to the first
                self._replay(parent, entries)
            parent.size += frame.size
            parent.depth = max(parent.depth, frame.depth)
            return
        value = self._finish(frame)
        entries = frame.entries if frame.is_map else None
        if frame.anchor is not None:
            a = frame.anchor
            a.value, a.size, a.depth, a.entries, a.complete = value, frame.size, frame.depth, entries, True
        self._put(stack, value, frame.size, frame.depth, frame.line, entries, out)

    def _scalar(self, stack: list[_Frame], event: Any, anchor: _Anchor | None, out: list[Any]) -> None:
        top = stack[-1] if stack else None
        if (
            top is not None
            and self._is_key(top)
            and event.value == "<<"
            and (event.implicit[0] or event.tag == _MERGE_TAG)
        ):
            top.merge = True  # decode.go isMerge: the key itself is not unmarshalled
            return
        value = self.scalar(event)
        self.count(1, False)
        if anchor is not None:
            anchor.value, anchor.size, anchor.complete = value, 1, True
        if top is not None and self._is_key(top):
            top.key = (_go_key(value), value)
            return
        self._put(stack, value, 1, 0, event.start_mark.line, None, out)

    def _alias(self, stack: list[_Frame], event: Any, anchor: _Anchor, out: list[Any]) -> None:
        if not anchor.complete:
            raise GoYAMLError(f"yaml: anchor '{event.anchor}' value contains itself")
        self.count(1, False)  # the alias node itself
        self.count(anchor.size, True)  # every node of its expansion, as aliases
        top = stack[-1] if stack else None
        if top is not None and self._is_key(top):
            if anchor.entries is not None or isinstance(anchor.value, list):
                raise GoYAMLError("yaml: invalid map key: a " + ("map" if anchor.entries is not None else "slice"))
            top.key = (_go_key(anchor.value), anchor.value)
            return
        self._put(stack, anchor.value, 1 + anchor.size, anchor.depth, event.start_mark.line, anchor.entries, out)

    def _put(
        self,
        stack: list[_Frame],
        value: Any,
        size: int,
        depth: int,
        line: int,
        entries: list[tuple[str, Any, Any, int]] | None,
        out: list[Any],
    ) -> None:
        """A finished value into the open collection (or a merge), or as the document's."""
        if not stack:
            out[0], out[1] = value, depth
            return
        top = stack[-1]
        if top.merge or top.merged is not None:
            if entries is None:
                raise _want_map()
            top.size += size
            top.depth = max(top.depth, depth)
            if top.merge:
                top.merge = False
                self._replay(top, entries)
            else:
                assert top.merged is not None
                top.merged.append(entries)
            return
        top.size += size
        if depth + 1 > top.depth:
            top.depth = depth + 1
        if not top.is_map:
            top.value.append(value)
            return
        key = top.key
        assert key is not None
        top.key = None
        self._set(top, _json_key(key[1]), key[0], key[1], value, line)

    def _set(self, top: _Frame, json_key: str, go_key: Any, key: Any, value: Any, line: int) -> None:
        """decode.go ``setMapIndex``: strict mode reports a key already present."""
        if go_key in top.present:
            self.duplicates.append(f"line {line + 1}: key {_go_repr(key)} already set in map")
        else:
            top.present[go_key] = json_key
        top.value[json_key] = value
        top.entries.append((json_key, go_key, value, line))

    def _replay(self, top: _Frame, entries: list[tuple[str, Any, Any, int]]) -> None:
        for json_key, go_key, value, line in entries:
            key = go_key[1]
            self._set(top, json_key, go_key, key, value, line)

    @staticmethod
    def _finish(frame: _Frame) -> Any:
        if frame.is_map:
            value = frame.value
            return dict(sorted(value.items())) if len(value) > 1 else value
        return frame.value


def yaml_to_json(data: bytes | str) -> Decoded:
    """The first YAML document of ``data`` as ``YAMLToJSON`` makes it (and ``YAMLToJSONStrict``'s
    duplicate-key errors), within go-yaml's limits. Raises :class:`GoYAMLError` with the
    apiserver decoder's error text, or :class:`UnsupportedYAML`."""
    return _Decoder(data).run()
