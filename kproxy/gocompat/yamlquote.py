"""Which strings go-yaml v2 double-quotes, and what its reader does to a raw NEL: ported from
go.yaml.in/yaml/v2 (``encode.go`` ``stringv``, ``resolve.go`` ``resolve``/``parseTimestamp``,
``scannerc.go`` flow-scalar line folding) and the Go standard library it calls (``strconv``
``ParseInt``/``ParseUint``/``ParseFloat``, ``time.Parse``), which sigs.k8s.io/yaml writes the
apiserver's YAML with.

A string is written plain unless, plain, it would read back as something other than a string:
a bool, null, number or timestamp (go-yaml's ``resolve``), or a YAML 1.1 base-60 float.
"""

from __future__ import annotations

import re

from kproxy.gocompat.yamlresolve import STR, resolve_plain

_HINTS = frozenset("+-0123456789yYnNtTfFoO~.")  # resolve.go resolveTable: the bytes that hint at a non-string
_BASE60_FLOAT = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")


def go_quotes(s: str) -> bool:
    """Whether go-yaml v2 writes this single-line string double-quoted (``stringv``)."""
    if not s:
        return True
    if s[0] not in _HINTS:
        return False  # most strings: a first byte that hints at nothing, and no base-60 float
    if resolve_plain(s)[0] != STR:
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
