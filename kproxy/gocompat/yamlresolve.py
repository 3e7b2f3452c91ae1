"""What a plain YAML scalar means to go-yaml v2: a port of go.yaml.in/yaml/v2 ``resolve.go``
(``resolve`` with no tag, ``parseTimestamp``) and the Go standard library it calls (``strconv``
``ParseInt``/``ParseUint``/``ParseFloat``, ``time.Parse``).

The apiserver reads YAML bodies with it (sigs.k8s.io/yaml ``YAMLToJSON``) and writes YAML by
asking it which strings would read back as something else (those are quoted). One resolver serves
both, so kproxy reads and writes a scalar as the apiserver does. It differs from YAML 1.1 (pyyaml's
resolver) in what counts as a number: ``1e5`` and ``0778`` are floats, ``0o17`` an int, ``1:20``
(base 60) a string, and an integer too large for 64 bits a float, or, when a float64 cannot hold it
either (``strconv.ErrRange``), a string.

Work is linear in the scalar's length: a number never reaches ``int()`` with more digits than 64
bits can hold.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["BOOL", "FLOAT", "INT", "NULL", "STR", "TIMESTAMP", "resolve_plain"]

STR, BOOL, NULL, INT, FLOAT, TIMESTAMP = "str", "bool", "null", "int", "float", "timestamp"

# resolve.go resolveMap: the literal spellings of bools, nulls and special floats (its merge key
# "<<" is never looked up: '<' hints at nothing, and the decoder tells a merge key apart itself).
_MAP: dict[str, tuple[str, Any]] = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), (BOOL, True)),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), (BOOL, False)),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), (NULL, None)),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), (FLOAT, math.nan)),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), (FLOAT, math.inf)),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), (FLOAT, -math.inf)),
}
# resolve.go resolveTable: the first byte's hint ('M' is looked up in the map only).
_HINT = {**dict.fromkeys("+-", "S"), **dict.fromkeys("0123456789", "D"), **dict.fromkeys("yYnNtTfFoO~", "M"), ".": "."}
_YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")  # what ParseFloat takes of a string starting with "."
_DIGITS = {b: re.compile(f"[{d}]*") for b, d in ((2, "01"), (8, "0-7"), (10, "0-9"), (16, "0-9a-fA-F"))}
# The most significant digits a value below 2**64 can have in each base: more is a range error.
_MAX_DIGITS = {2: 64, 8: 22, 10: 20, 16: 16}
_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_INT64_MAX = (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1
# time.Parse with resolve.go's allowedTimestampFormats ("2006-1-2T15:4:5.999999999Z07:00", the
# same with "t", "2006-1-2 15:4:5.999999999", "2006-1-2"): getnum takes one or two digits, the
# fraction any number after "." or ",", the zone is "Z" or a sign and two fixed "hh:mm" pairs.
_TIMESTAMP = re.compile(
    r"(?P<y>[0-9]{4})-(?P<mo>[0-9][0-9]?)-(?P<d>[0-9][0-9]?)"
    r"(?:(?:[Tt](?P<h>[0-9][0-9]?):(?P<mi>[0-9][0-9]?):(?P<s>[0-9][0-9]?)(?:[.,][0-9]+)?"
    r"(?:Z|[-+](?P<zh>[0-9]{2}):(?P<zm>[0-9]{2})))"
    r"|(?: (?P<h2>[0-9][0-9]?):(?P<mi2>[0-9][0-9]?):(?P<s2>[0-9][0-9]?)(?:[.,][0-9]+)?))?"
)


def _parse_uint(s: str, base: int) -> int | None:
    """``strconv.ParseUint(s, base, 64)`` (base 0: 0b/0o/0x prefixes, either case, or a leading
    0 for octal) on a string without underscores; None on a syntax or range error."""
    if not s:
        return None
    if base == 0:
        base = 10
        if s[0] == "0":
            prefix = s[1:2].lower()
            if len(s) >= 3 and prefix in ("b", "o", "x"):
                base, s = {"b": 2, "o": 8, "x": 16}[prefix], s[2:]
            else:
                base, s = 8, s[1:]
    if _DIGITS[base].fullmatch(s) is None:
        return None
    significant = s.lstrip("0")
    if len(significant) > _MAX_DIGITS[base]:
        return None  # ErrRange, known without converting
    n = int(significant, base) if significant else 0
    return n if n <= _UINT64_MAX else None


def _parse_int(s: str, base: int) -> int | None:
    """``strconv.ParseInt(s, base, 64)``: an optional sign, then ParseUint, in int64's range."""
    if not s:
        return None
    neg = s[0] == "-"
    if s[0] in "+-":
        s = s[1:]
    n = _parse_uint(s, base)
    if n is None or n > _INT64_MAX + neg:
        return None
    return -n if neg else n


def _parse_float(text: str) -> float | None:
    """``strconv.ParseFloat(text, 64)`` on a decimal string already matched by a float pattern:
    None on ErrRange (it overflows; an underflow is 0 and no error)."""
    value = float(text)
    return value if math.isfinite(value) else None


def _underscores_ok(s: str) -> bool:
    """strconv's ``underscoreOK`` for a decimal literal: each "_" between two digits."""
    return all(0 < i < len(s) - 1 and s[i - 1].isdigit() and s[i + 1].isdigit() for i, c in enumerate(s) if c == "_")


def _timestamp(s: str) -> bool:
    """resolve.go ``parseTimestamp``: one of the allowed layouts, with time.Parse's range checks."""
    m = _TIMESTAMP.fullmatch(s)
    if m is None:
        return False
    year, month, day = int(m["y"]), int(m["mo"]), int(m["d"])
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = 29 if month == 2 and leap else _DAYS[month - 1] if 1 <= month <= 12 else 0
    if not 1 <= day <= days:
        return False
    hour, minute, second = m["h"] or m["h2"], m["mi"] or m["mi2"], m["s"] or m["s2"]
    if hour is not None and (int(hour) >= 24 or int(minute) >= 60 or int(second) >= 60):
        return False
    return m["zh"] is None or (int(m["zh"]) <= 24 and int(m["zm"]) <= 60)


def resolve_plain(s: str) -> tuple[str, Any]:
    """go-yaml v2 ``resolve("", s)`` for a plain (untagged, unquoted) scalar: its tag and value.
    A timestamp's value is the text itself (decoded into ``interface{}``, go-yaml v2 keeps the
    string); ``.nan``/``.inf`` are float values a caller has to refuse as JSON does."""
    hint = _HINT.get(s[0]) if s else "N"
    if hint is None:
        return STR, s  # most strings: a first byte that hints at nothing
    item = _MAP.get(s)
    if item is not None:
        return item
    if hint == ".":
        digits = s.replace("_", "")
        if _DOT_FLOAT.fullmatch(digits) is not None and _underscores_ok(s):
            value = _parse_float(digits)
            if value is not None:
                return FLOAT, value
        return STR, s
    if hint != "D" and hint != "S":
        return STR, s
    if _timestamp(s):
        return TIMESTAMP, s
    plain = s.replace("_", "")
    n = _parse_int(plain, 0)
    if n is None and plain[:1] != "+":
        n = _parse_uint(plain, 0)
    if n is not None:
        return INT, n
    if _YAML_STYLE_FLOAT.fullmatch(plain):
        value = _parse_float(plain)
        if value is not None:
            return FLOAT, value
    if plain.startswith("0b"):
        n = _parse_int(plain[2:], 2)
        if n is None:
            n = _parse_uint(plain[2:], 2)
    elif plain.startswith("-0b"):
        n = _parse_int("-" + plain[3:], 2)
    return (INT, n) if n is not None else (STR, s)
