"""Request bodies decoded the way the apiserver's strict decoders see them.

JSON: the apiserver's decoder (sigs.k8s.io/json) reports every duplicate key, so duplicates
must be seen. orjson (fast) keeps only the last value of a duplicated key; the stdlib decoder
with ``object_pairs_hook`` keeps them all (slow). The fast path is taken when a cheap, sound
check proves the body has no duplicate: outside strings every ``:`` of a JSON text follows a
key, and with no ``\\u`` escape in the body a ``:`` inside a string is a literal ``:`` both in
the body and in orjson's re-encoding of what it parsed. So the body has as many ``:`` as
orjson's output exactly when it has no key twice in one object; any difference sends it to the
slow decoder, which decides exactly.

YAML: sigs.k8s.io/yaml converts YAML to JSON through go-yaml v2, whose strict mode reports
``line N: key "x" already set in map`` (1-based line of the repeated key, Go ``%#v`` of the key)
for every duplicate, in document order. The JSON it produces is marshalled from Go maps, so its
keys come out sorted; the struct decode that follows sees that order.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import yaml


class Pairs(list[tuple[str, Any]]):
    """A JSON object with its keys in document order, duplicates kept."""

    __slots__ = ()


class DecodeError(ValueError):
    """The body is not what the apiserver could decode: it will answer with its own error."""


def decode_json(data: bytes) -> tuple[Any, bool]:
    """The parsed body and whether it may hold duplicate keys (then objects are ``Pairs``)."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise DecodeError(str(err)) from None
    # (A single-byte search first: backslashes are rare and memchr is far cheaper than "\\u".)
    try:
        if (b"\\" not in data or b"\\u" not in data) and data.count(b":") == orjson.dumps(value).count(b":"):
            return value, False
    except TypeError:  # orjson.dumps nests less deep (254) than orjson.loads (1024)
        pass
    try:
        return json.loads(data, object_pairs_hook=Pairs), True
    except ValueError as err:  # pragma: no cover - orjson accepted it already
        raise DecodeError(str(err)) from None


class _Loader(yaml.CSafeLoader if hasattr(yaml, "CSafeLoader") else yaml.SafeLoader):  # type: ignore[misc]
    """Safe loading that records duplicate keys (go-yaml's wording) and keeps timestamps as strings."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in out:
                # go-yaml names the line of the repeated entry's value node (where a nested block starts).
                line = value_node.start_mark.line + 1
                self.duplicates.append(f"line {line}: key {_go_repr(key)} already set in map")
            out[key] = self.construct_object(value_node, deep=True)
        return out


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _Loader.construct_yaml_str)
_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_mapping)


def _go_repr(key: Any) -> str:
    """Go's ``%#v`` for the scalar keys YAML produces."""
    if isinstance(key, str):
        return orjson.dumps(key).decode()
    if isinstance(key, bool):
        return "true" if key else "false"
    if key is None:
        return "interface {}(nil)"
    return str(key)


def decode_yaml(data: bytes) -> tuple[Any, list[str]]:
    """The body converted as sigs.k8s.io/yaml converts it to JSON (keys sorted, as strings) and
    go-yaml's duplicate-key errors."""
    try:
        loader = _Loader(data)
        try:
            value = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise DecodeError(str(err)) from None
    return _to_json(value), loader.duplicates


def _to_json(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for k in sorted(value, key=_json_key):
            out[_json_key(k)] = _to_json(value[k])
        return dict(sorted(out.items()))
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    if isinstance(value, bytes):
        raise DecodeError("binary YAML values are not checked locally")
    return value


def _json_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    raise DecodeError(f"YAML key {key!r} is not checked locally")
