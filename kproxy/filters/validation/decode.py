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
keys come out sorted; the struct decode that follows sees that order. The one YAML decoder with
go-yaml's limits is :mod:`kproxy.gocompat.yaml`.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from kproxy.gocompat.jsondepth import nesting_error
from kproxy.gocompat.yaml import GoYAMLError, UnsupportedYAML, yaml_to_json


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


def decode_yaml(data: bytes) -> tuple[Any, list[str]]:
    """The body converted as sigs.k8s.io/yaml converts it to JSON (keys sorted, as strings) and
    go-yaml's duplicate-key errors, within go-yaml's limits (``kproxy.gocompat.yaml``). A body the
    apiserver's decoder refuses (go-yaml's depth or alias limits, its JSON decoder's nesting limit)
    or that kproxy does not convert is a :class:`DecodeError`: the apiserver answers it."""
    try:
        decoded = yaml_to_json(data)
    except (GoYAMLError, UnsupportedYAML) as err:
        raise DecodeError(str(err)) from None
    too_deep = nesting_error(decoded.value, decoded.depth)
    if too_deep is not None:
        raise DecodeError(too_deep)
    return decoded.value, decoded.duplicates
