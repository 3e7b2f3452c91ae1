"""Which strings go-yaml v2 double-quotes, and what its reader does to a raw NEL: ported from
go.yaml.in/yaml/v2 (``encode.go`` ``stringv``, ``resolve.go`` ``resolve``/``parseTimestamp``,
``scannerc.go`` flow-scalar line folding) and the Go standard library it calls (``strconv``
``ParseInt``/``ParseUint``/``ParseFloat``, ``time.Parse``), which sigs.k8s.io/yaml writes the
apiserver's YAML with.

A string is written plain unless, plain, it would read back as something other than a string:
a bool, null, number or timestamp (go-yaml's ``resolve``), or a YAML 1.1 base-60 float.
"""

from __future__ import annotations

import math
import re

# resolve.go resolveMap: the literal spellings of bools, nulls, special floats and the merge key.
_MAP = frozenset(
    {
        *("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"),
        *("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"),
        *("", "~", "null", "Null", "NULL", ".nan", ".NaN", ".NAN", ".inf", ".Inf", ".INF"),
        *("+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF", "<<"),
    }
)
# resolve.go resolveTable: the first byte's hint ('M' is looked up in the map only).
_HINT = {**dict.fromkeys("+-", "S"), **dict.fromkeys("0123456789", "D"), **dict.fromkeys("yYnNtTfFoO~", "M"), ".": "."}
_YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_DOT_FLOAT = re.compile(r"\.[0-9]+([eE][-+]?[0-9]+)?")  # what ParseFloat takes of a string starting with "."
_BASE60_FLOAT = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_DIGITS = {b: re.compile(f"[{d}]*") for b, d in ((2, "01"), (8, "0-7"), (10, "0-9"), (16, "0-9a-fA-F"))}
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
    n = int(s, base) if s else 0
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
    return n


def _finite(text: str) -> bool:
    """``strconv.ParseFloat`` on a decimal string: an error (ErrRange) only when it overflows."""
    return math.isfinite(float(text))


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


def _resolves_non_str(s: str) -> bool:
    """go-yaml v2 ``resolve("", s)`` gives a tag other than ``!!str``."""
    hint = _HINT.get(s[0]) if s else "N"
    if hint is None:
        return False
    if s in _MAP or hint in ("M", "N"):
        return s in _MAP
    if hint == ".":
        digits = s.replace("_", "")
        return _DOT_FLOAT.fullmatch(digits) is not None and _underscores_ok(s) and _finite(digits)
    if _timestamp(s):
        return True
    plain = s.replace("_", "")
    if _parse_int(plain, 0) is not None or (plain[:1] != "+" and _parse_uint(plain, 0) is not None):
        return True
    if _YAML_STYLE_FLOAT.fullmatch(plain) and _finite(plain):
        return True
    if plain.startswith("0b"):
        return _parse_int(plain[2:], 2) is not None or _parse_uint(plain[2:], 2) is not None
    if plain.startswith("-0b"):
        return _parse_int("-" + plain[3:], 2) is not None
    return False


def go_quotes(s: str) -> bool:
    """Whether go-yaml v2 writes this single-line string double-quoted (``stringv``)."""
    if not s:
        return True
    if s[0] not in _HINT:
        return False  # most strings: a first byte that hints at nothing, and no base-60 float
    if s.isdigit() and s.isascii():
        return True  # an int, or (08, too long for 64 bits) a float: never a string
    if _resolves_non_str(s):
        return True
    # isBase60Float: quoted for other parsers' sake, though go-yaml itself reads it as a string.
    return (s[0] in "+-" or "0" <= s[0] <= "9") and ":" in s and _BASE60_FLOAT.fullmatch(s) is not None


_NEL_RUN = re.compile("[ ]*\x85[ \x85]*")


def _fold(m: re.Match[str]) -> str:
    breaks = m.group().count("\x85")
    return " " if breaks == 1 else "\n" * (breaks - 1)


def fold_nel(s: str) -> str:
    """A string as go-yaml reads it back from the double-quoted JSON string sigs.k8s.io/yaml
    hands it: Go's JSON writes U+0085 (NEL) raw, and to YAML's scanner that is a line break. In
    a flow scalar the blanks around a run of breaks go, a single break folds to a space and each
    further one is a newline ("a\\x85b" becomes "a b")."""
    return _NEL_RUN.sub(_fold, s) if "\x85" in s else s


# emitterc.go yaml_emitter_write_double_quoted_scalar's named escapes.
_NAMED_ESCAPES = {
    0x00: "0", 0x07: "a", 0x08: "b", 0x09: "t", 0x0A: "n", 0x0B: "v", 0x0C: "f", 0x0D: "r", 0x1B: "e",
    0x22: '"', 0x5C: "\\", 0x85: "N", 0xA0: "_", 0x2028: "L", 0x2029: "P",
}  # fmt: skip


def go_bom_quoted(s: str) -> str:
    """How go-yaml v2 writes a string that starts with U+FEFF: double-quoted, every character
    escaped (its ``is_bom(value, i)`` tests ``value[0:3]``), on one line (spaces are escaped too,
    so there is nowhere to fold)."""
    out = ['"']
    for ch in s:
        v = ord(ch)
        named = _NAMED_ESCAPES.get(v)
        if named is not None:
            out.append("\\" + named)
        elif v <= 0xFF:
            out.append(f"\\x{v:02X}")
        elif v <= 0xFFFF:
            out.append(f"\\u{v:04X}")
        else:
            out.append(f"\\U{v:08X}")
    out.append('"')
    return "".join(out)
