"""Go strings that are not valid UTF-8, read from protobuf and written as Go writes them.

A Go ``string`` is any bytes: gogo-protobuf's generated ``Unmarshal`` copies a string field's
bytes without checking them, so the apiserver stores and serves whatever a protobuf client sent.
Go never fails to print such a string; it replaces what is not UTF-8 when it writes JSON:

- ``encoding/json`` (``encode.go`` ``appendString``) runs ``utf8.DecodeRuneInString`` over the
  string and writes the six characters ``\\ufffd`` for every ``(RuneError, 1)`` it returns, i.e.
  one replacement per byte that does not start a valid sequence (``unicode/utf8/utf8.go``
  ``decodeRuneSlow``: a bad lead byte, a truncated sequence, an overlong form, a surrogate
  ``ED A0 80``... each answers width 1, so a truncated three-byte sequence ``E2 82`` is two
  replacements). A valid U+FFFD in the string is written as its raw UTF-8 bytes, not escaped.
- YAML (``sigs.k8s.io/yaml``) is made from that JSON, so it holds the character U+FFFD.

Python's ``errors="replace"`` is a different rule (one U+FFFD per *maximal subpart*, so ``E2 82``
is one). Its ``surrogateescape`` handler, though, maps every byte of each invalid range to one
code point U+DC80+byte, and an invalid range is exactly a run of bytes that Go's decoder answers
``(RuneError, 1)`` for, one by one (its first byte cannot start a valid sequence there, the rest
are continuation bytes, which never can). So a string decoded with ``surrogateescape`` holds one
lone surrogate where Go writes one ``\\ufffd``, keeps the bytes, and cannot be confused with
text: a strict decode never yields a surrogate. That is the form kproxy gives such a string
everywhere (the URL and request-target parsers do the same).

Valid UTF-8, the normal case, costs one strict ``decode`` and nothing else.
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import orjson

#: Every lone surrogate (no str decoded from bytes holds any other kind).
_SURROGATE = re.compile("[\ud800-\udfff]")
_TO_REPLACEMENT = {c: "\ufffd" for c in range(0xD800, 0xE000)}


def go_string(raw: bytes) -> str:
    """Bytes of a Go string -> str: the text, or (not UTF-8) the text with each byte Go would
    replace kept as a ``surrogateescape`` code point."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw.decode("utf-8", "surrogateescape")


def has_invalid(s: str) -> bool:
    """True when ``s`` holds bytes that were not UTF-8 (lone surrogates)."""
    return _SURROGATE.search(s) is not None


def replaced(s: str) -> str:
    """``s`` as Go holds it once its JSON is read back (YAML is made that way): U+FFFD for each
    byte that was not UTF-8."""
    return s.translate(_TO_REPLACEMENT) if _SURROGATE.search(s) is not None else s


def raw_bytes(s: str) -> bytes:
    """The Go string's bytes (what Go sorts map keys by)."""
    return s.encode("utf-8", "surrogateescape")


def json_string(raw: bytes | str) -> bytes:
    """A Go string (its bytes, or a str from :func:`go_string`) as ``encoding/json`` writes it:
    quoted, ``\\ufffd`` for every byte that is not UTF-8. Escaping as orjson does otherwise;
    Go's HTML escapes (``<``, ``>``, ``&``, U+2028, U+2029) are left to the caller, which applies
    them to the whole document as for everything orjson writes."""
    s = go_string(raw) if isinstance(raw, bytes) else raw
    if _SURROGATE.search(s) is None:
        return orjson.dumps(s)
    # A lone surrogate that no bytes decode to (U+D800-U+DC7F, U+DD00-U+DFFF) is not text
    # either; Go cannot hold one, so each is written as one replacement too.
    parts = _SURROGATE.split(s)
    return b'"' + b"\\ufffd".join(orjson.dumps(p)[1:-1] for p in parts) + b'"'


def fragment(raw: bytes | str) -> Any:
    """:func:`json_string` as an ``orjson.Fragment``, to put in a document orjson writes."""
    return orjson.Fragment(json_string(raw))


def bytes_default(obj: Any) -> Any:
    """orjson's ``default`` for documents whose strings may be bytes: the protobuf runtime
    (upb) hands a string field that is not UTF-8 over as ``bytes`` (a Go ``[]byte`` field is
    base64 text by then, so bytes can only be such a string)."""
    if type(obj) is bytes:
        return orjson.Fragment(json_string(obj))
    raise TypeError(f"Type is not JSON serializable: {type(obj).__name__}")


def dumps_go(obj: Any, option: int = 0) -> bytes:
    """orjson.dumps of Python objects whose strings may hold :func:`go_string`'s surrogates,
    written as Go writes those strings (``\\ufffd`` for each), in values and in map keys alike.
    Keys stay apart even where Go's output repeats one (two keys that differ only in bytes that
    are not UTF-8 both print as ``"\\ufffd"``, as in Go). Plain text costs one orjson call."""
    try:
        return orjson.dumps(obj, option=option, default=bytes_default)
    except TypeError:
        pass
    keys: dict[str, bytes] = {}
    out = orjson.dumps(_marked(obj, keys), option=option, default=bytes_default)
    for token, quoted in keys.items():
        out = out.replace(orjson.dumps(token), quoted, 1)
    return out


def _marked(obj: Any, keys: dict[str, bytes]) -> Any:
    """A copy with surrogate-holding strings as fragments, and surrogate-holding map keys as
    unique placeholder keys (``keys``: placeholder -> the key's JSON) that are put back after."""
    if isinstance(obj, str):
        return orjson.Fragment(json_string(obj)) if _SURROGATE.search(obj) is not None else obj
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if isinstance(k, str) and _SURROGATE.search(k) is not None:
                token = _token(keys)
                keys[token] = json_string(k)
                k = token
            out[k] = _marked(v, keys)
        return out
    if isinstance(obj, (list, tuple)):
        return [_marked(x, keys) for x in obj]
    return obj


def _token(keys: dict[str, bytes]) -> str:
    # Surrogate-free and made of characters orjson writes as they are; unique per document
    # because it carries a counter and a private-use character text seldom holds.
    return f"\ue000kproxy-{secrets.token_hex(8)}-{len(keys)}\ue000"


__all__ = [
    "bytes_default",
    "dumps_go",
    "fragment",
    "go_string",
    "has_invalid",
    "json_string",
    "raw_bytes",
    "replaced",
]
