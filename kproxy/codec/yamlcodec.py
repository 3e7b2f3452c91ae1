"""YAML as the apiserver writes and reads it (sigs.k8s.io/yaml over go-yaml v2).

The apiserver's YAML is its JSON converted to YAML: map keys sorted, block style, sequences not
indented under their key. pyyaml's C dumper/loader (libyaml) does that at C speed.
"""

from __future__ import annotations

import functools
import re
import secrets
from typing import Any

import yaml

from kproxy.gocompat.floatfmt import format_float_g
from kproxy.gocompat.jsonescape import go_escape
from kproxy.gocompat.utf8 import dumps_go, replaced
from kproxy.gocompat.yaml import GoYAMLError, UnsupportedYAML, yaml_to_json
from kproxy.gocompat.yamlquote import fold_nel, go_bom_quoted, go_quotes

from .codecerrors import CodecError

try:
    _Base: Any = yaml.CSafeDumper
except AttributeError:  # pragma: no cover - pyyaml built without libyaml
    _Base = yaml.SafeDumper


class _Dumper(_Base):  # type: ignore[misc]
    """libyaml's emitter with go-yaml v2's string styles (sigs.k8s.io/yaml writes with it)."""


_DOC_ONLY_TAG = "tag:yaml.org,2002:yaml"


def _str(dumper: Any, value: str) -> Any:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    if go_quotes(value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    # Plain for go-yaml, but maybe not a string to pyyaml's YAML 1.1 resolver ("=", "<<", some
    # timestamps): tagged as what pyyaml reads, so its emitter leaves it plain and untagged too.
    tag = dumper.resolve(yaml.ScalarNode, value, (True, False))
    if tag == _DOC_ONLY_TAG:
        # "!", "&" and "*" alone: pyyaml's documentation-only resolver. They are never plain;
        # as strings the emitter single-quotes them untagged ('*'), as go-yaml does.
        tag = "tag:yaml.org,2002:str"
    return dumper.represent_scalar(tag, value)


_Dumper.add_representer(str, _str)

_GO_FLOAT_SPECIAL = {"+Inf": ".inf", "-Inf": "-.inf", "NaN": ".nan"}


def _float(dumper: Any, value: float) -> Any:
    """go-yaml v2's floatv: ``strconv.FormatFloat(f, 'g', -1, 64)``, plain (``1e+21``, not pyyaml's
    ``1.0e+21``; ``1.2345675e+06``, not ``1234567.5``)."""
    text = _GO_FLOAT_SPECIAL.get(format_float_g(value), format_float_g(value))
    # Tagged as what pyyaml itself reads the text as (1 is an int, 1e+21 a string to YAML 1.1's
    # resolver), so that the emitter writes it plain and untagged, as go-yaml does.
    return dumper.represent_scalar(dumper.resolve(yaml.ScalarNode, text, (True, False)), text)


_Dumper.add_representer(float, _float)

# A single-quoted scalar that ends in a Unicode line break (NEL, LS, PS): libyaml writes the
# indentation after it before the closing quote, go-yaml v2 does not.
_TRAILING_BREAK = re.compile("([\u0085\u2028\u2029]) +'(?!')")
_BREAKS = ("\u0085", "\u2028", "\u2029")
_BREAKS_ALL = ("\n", "\r", *_BREAKS)
_BREAKS_UTF8 = tuple(b.encode() for b in _BREAKS_ALL)


_BLOCK_HEADER = re.compile(r"( *)((?:[-?:] )*)(.*?)\|[1-9]?[-+]?")


def _closing_quotes_after_breaks(text: str) -> str:
    """Single-quoted scalars ending in a Unicode line break: libyaml writes the indentation
    before the closing quote, go-yaml does not (_TRAILING_BREAK). Lines of literal block
    scalars are content, where both write it, and are left alone."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _BLOCK_HEADER.fullmatch(lines[i])
        if m is not None and (not m.group(3) or m.group(3).endswith(": ")):
            # The content sits best_indent (2) right of the node's key, or of its last "- "/"? ".
            column = len(m.group(1)) + len(m.group(2)) - (0 if m.group(3) else 2)
            pad = " " * (column + 2)
            i += 1
            while i < len(lines) and (not lines[i] or lines[i].startswith((pad, "\u2028", "\u2029"))):
                i += 1
            continue
        lines[i] = _TRAILING_BREAK.sub("\\1'", lines[i])
        i += 1
    return "\n".join(lines)


def _go_key_less(a: str, b: str) -> bool:
    """go-yaml v2's map key order (sorter.go keyList.Less): runs of digits compare as numbers,
    non-letters sort before letters."""
    for i in range(min(len(a), len(b))):
        ca, cb = a[i], b[i]
        if ca == cb:
            continue
        al, bl = ca.isalpha(), cb.isalpha()
        if al and bl:
            return ca < cb
        if al or bl:
            return bl
        an = bn = 0
        if ca == "0" or cb == "0":
            j = i - 1
            while j >= 0 and a[j].isdigit():
                if a[j] != "0":
                    an = bn = 1
                    break
                j -= 1
        ai = i
        while ai < len(a) and a[ai].isdigit():
            an = an * 10 + int(a[ai])
            ai += 1
        bi = i
        while bi < len(b) and b[bi].isdigit():
            bn = bn * 10 + int(b[bi])
            bi += 1
        if an != bn:
            return an < bn
        if ai != bi:
            return ai < bi
        return ca < cb
    return len(a) < len(b)


def _go_cmp(a: str, b: str) -> int:
    return -1 if _go_key_less(a, b) else (1 if _go_key_less(b, a) else 0)


_go_key = functools.cmp_to_key(_go_cmp)


class _BomStrings:
    """Strings that start with a BOM (U+FEFF), which go-yaml writes double-quoted with every
    character escaped (its ``is_bom`` looks at the string's first bytes, whatever the position):
    each goes through libyaml as a plain placeholder as wide as that text (so that the columns
    after it, and for a key the choice of the "? " form, come out the same) and is put in
    afterwards (``go_bom_quoted``)."""

    def __init__(self) -> None:
        self.nonce = secrets.token_hex(2)  # short: a token is no wider than the shortest text
        self.quoted: dict[str, str] = {}

    def token(self, s: str, key: bool = False) -> str:
        if not s.startswith("\ufeff"):
            return s
        quoted = go_bom_quoted(s)
        width = len(quoted)  # where the line goes on after it
        if key:
            # A key is written "? key" unless it is simple: one line, at most 128 bytes (emitterc.go
            # yaml_emitter_check_simple_key, on the string itself, not its escaped form).
            simple = len(s.encode()) <= 128 and not any(b in s for b in _BREAKS_ALL)
            width = min(width, 128) if simple else max(width, 129)
        token = f"q{self.nonce}{len(self.quoted)}z"
        token += "z" * (width - len(token))
        self.quoted[token] = quoted
        return token


def _go_sorted(obj: Any, bom: _BomStrings) -> Any:
    """A copy with every mapping's keys in go-yaml's order, strings as go-yaml reads them from
    the JSON (``fold_nel``)."""
    if isinstance(obj, dict):
        keys = "".join(obj)
        if "\x85" not in keys and "\ufeff" not in keys:  # nearly always: keys as they are
            return {k: _go_sorted(obj[k], bom) for k in sorted(obj, key=_go_key)}
        folded = {fold_nel(k): _go_sorted(v, bom) for k, v in obj.items()}
        return {bom.token(k, key=True): folded[k] for k in sorted(folded, key=_go_key)}
    if isinstance(obj, list):
        return [_go_sorted(x, bom) for x in obj]
    if isinstance(obj, str) and ("\x85" in obj or obj[:1] == "\ufeff"):
        return bom.token(fold_nel(obj))
    return obj


def _read_back(obj: Any) -> Any:
    """Strings that were not UTF-8 (surrogateescape, kproxy.gocompat.utf8) as go-yaml reads
    them from the apiserver's JSON: U+FFFD for each bad byte. Keys that become equal keep the
    last value, as go-yaml v2 decoding a mapping into a Go map does (the JSON has them in byte
    order)."""
    if isinstance(obj, str):
        return replaced(obj)
    if isinstance(obj, dict):
        return {replaced(k): _read_back(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_read_back(x) for x in obj]
    return obj


def to_yaml(obj: Any) -> bytes:
    """Python objects (e.g. ProtobufCodec.to_obj) -> YAML bytes as the apiserver writes them:
    go-yaml's key order and string styles, libyaml's emitter, width 80."""
    try:
        return _to_yaml(obj)
    except UnicodeEncodeError:  # surrogates: strings that were not UTF-8; rare, so looked for only now
        return _to_yaml(_read_back(obj))


def _to_yaml(obj: Any) -> bytes:
    while True:
        bom = _BomStrings()
        out: bytes = yaml.dump(
            _go_sorted(obj, bom),
            Dumper=_Dumper,
            sort_keys=False,
            default_flow_style=False,
            allow_unicode=True,
            width=80,  # go-yaml v2's best width: long scalars fold the same way
            encoding="utf-8",
        )
        if all(out.count(token.encode()) == 1 for token in bom.quoted):
            break  # else some text held a placeholder: again, with another nonce
    if any(b.encode() in out for b in _BREAKS):
        out = _closing_quotes_after_breaks(out.decode()).encode()
    for token, quoted in bom.quoted.items():
        out = out.replace(token.encode(), quoted.encode(), 1)
    if out.endswith(b"...\n") and out[:-4].endswith(_BREAKS_UTF8):
        # libyaml ends the stream with a document-end marker once a "|+" block scalar was written
        # (it stays "open ended"); go-yaml ends a mapping's document without one.
        out = out[:-4]
    return out


# go-yaml v2's reader (readerc.go) accepts only #x9, #xA, #xD, #x20-#x7E, #x85, #xA0-#xD7FF,
# #xE000-#xFFFD and #x10000-#x10FFFF. sigs.k8s.io/yaml makes YAML by reading the object's JSON as
# YAML; Go's JSON escapes the C0 controls but writes DEL, the other C1 controls, U+FFFE and U+FFFF
# as they are, so the reader stops on them (in UTF-8 here, as orjson writes them).
_GO_YAML_UNREADABLE = re.compile(rb"\x7f|\xc2[\x80-\x84\x86-\x9f]|\xef\xbf[\xbe\xbf]")
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"(:?)')
_NEL = b"\xc2\x85"


def go_yaml_error(obj: Any) -> str | None:
    """The error the apiserver's YAML writer (sigs.k8s.io/yaml) fails with on ``obj``, which it
    answers as a 500 Status without a reason; None when it writes it. Two cases: a character
    go-yaml's reader refuses, and a map key holding a raw NEL (U+0085, which Go's JSON does not
    escape): to go-yaml a line break, which a flow mapping's key may not span. The parser stops
    at the ``:`` after such a key; the reader, which decodes 512-byte chunks as the scanner needs
    them, at the first chunk holding a refused character."""
    data = go_escape(dumps_go(obj))  # the apiserver's JSON bytes: positions matter below
    bad = _GO_YAML_UNREADABLE.search(data)
    key_at = -1
    if _NEL in data:
        for m in _JSON_STRING.finditer(data):
            if m.group(1) and _NEL in m.group():
                key_at = m.end(1) - 1
                break
    if bad is not None and (key_at < 0 or bad.start() < _decoded_by(data, key_at)):
        return "yaml: control characters are not allowed"
    if key_at >= 0:
        # problem_mark.line: zero-based, i.e. the line breaks (NELs) before the ':'.
        return f"yaml: line {data.count(_NEL, 0, key_at)}: did not find expected ',' or '}}'"
    return None


_RAW_CHUNK = 512  # go-yaml's input_raw_buffer_size


def _decoded_by(data: bytes, at: int) -> int:
    """How far go-yaml's reader has decoded ``data`` once its scanner looks at the four
    characters from ``at`` (``yaml_parser_update_buffer(parser, 4)`` when it fetches a token):
    whole raw chunks, each ending at the last complete UTF-8 character of its 512 bytes."""
    need = at
    for _ in range(4):
        if need >= len(data):
            break
        lead = data[need]
        need += 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    done = 0
    while done < min(need, len(data)):
        done = min(done + _RAW_CHUNK, len(data))
        while done < len(data) and 0x80 <= data[done] < 0xC0:
            done -= 1
    return done


def from_yaml(data: bytes | str) -> Any:
    """One YAML document -> Python objects as sigs.k8s.io/yaml converts it to JSON, within
    go-yaml's limits (``kproxy.gocompat.yaml``, the one YAML decoder); CodecError when refused."""
    try:
        return yaml_to_json(data).value
    except (GoYAMLError, UnsupportedYAML) as e:
        raise CodecError(f"error converting YAML to JSON: {e}") from e
