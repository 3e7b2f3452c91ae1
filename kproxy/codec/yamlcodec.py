"""YAML as the apiserver writes and reads it (sigs.k8s.io/yaml over go-yaml v2).

The apiserver's YAML is its JSON converted to YAML: map keys sorted, block style, sequences not
indented under their key. pyyaml's C dumper/loader (libyaml) does that at C speed.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import yaml

from .errors import CodecError
from .gofloat import format_float_g

try:
    _Base: Any = yaml.CSafeDumper
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - pyyaml built without libyaml
    _Base = yaml.SafeDumper
    _Loader = yaml.SafeLoader


class _Dumper(_Base):  # type: ignore[misc]
    """libyaml's emitter with go-yaml v2's string styles (sigs.k8s.io/yaml writes with it)."""


# go-yaml v2 (resolve.go): plain strings that would read back as something else.
_GO_SPECIAL = frozenset(
    {
        *("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"),
        *("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"),
        *("~", "null", "Null", "NULL", ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF"),
        *("+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF"),
    }
)
_GO_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_GO_BASE60 = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
_GO_INT = re.compile(r"^[-+]?(0[xX][0-9a-fA-F_]+|0[oO]?[0-7_]+|0[bB][01_]+|[0-9][0-9_]*)$")
_GO_TIME = re.compile(
    r"^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}"
    r"([Tt ][0-9]{1,2}:[0-9]{1,2}:[0-9]{1,2}(\.[0-9]*)?(Z|[-+][0-9]{1,2}(:[0-9]{2})?)?)?$"
)


def _go_quotes(value: str) -> bool:
    """Whether go-yaml v2 double-quotes the string: when, written plain, it would resolve to a
    bool, null, number or timestamp (or is a base-60 float)."""
    if value == "" or value in _GO_SPECIAL:
        return True
    c = value[0]
    if c.isdigit() or c in "+-.":
        return bool(_GO_FLOAT.match(value) or _GO_INT.match(value) or _GO_BASE60.match(value) or _GO_TIME.match(value))
    return False


def _str(dumper: Any, value: str) -> Any:
    if "\n" in value:
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    if _go_quotes(value):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
    # Plain for go-yaml, but maybe not a string to pyyaml's YAML 1.1 resolver ("=", "<<", some
    # timestamps): tagged as what pyyaml reads, so its emitter leaves it plain and untagged too.
    return dumper.represent_scalar(dumper.resolve(yaml.ScalarNode, value, (True, False)), value)


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


def _go_sorted(obj: Any) -> Any:
    """A copy with every mapping's keys in go-yaml's order."""
    if isinstance(obj, dict):
        return {k: _go_sorted(obj[k]) for k in sorted(obj, key=_go_key)}
    if isinstance(obj, list):
        return [_go_sorted(x) for x in obj]
    return obj


def to_yaml(obj: Any) -> bytes:
    """Python objects (e.g. ProtobufCodec.to_obj) -> YAML bytes as the apiserver writes them:
    go-yaml's key order and string styles, libyaml's emitter, width 80."""
    out: bytes = yaml.dump(
        _go_sorted(obj),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        allow_unicode=True,
        width=80,  # go-yaml v2's best width: long scalars fold the same way
        encoding="utf-8",
    )
    if any(b.encode() in out for b in _BREAKS):
        out = _TRAILING_BREAK.sub("\\1'", out.decode()).encode()
    return out


def from_yaml(data: bytes | str) -> Any:
    """One YAML document -> Python objects; CodecError for malformed YAML."""
    try:
        return yaml.load(data, Loader=_Loader)
    except yaml.YAMLError as e:
        raise CodecError(f"error converting YAML to JSON: {e}") from e
