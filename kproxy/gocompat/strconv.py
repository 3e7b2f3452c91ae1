"""Go's ``strconv.Quote`` (``%q``), the quoting apimachinery uses in its error messages."""

from __future__ import annotations

import unicodedata

_QUOTE_SIMPLE_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    '"': '\\"',
    "\\": "\\\\",
}


def go_quote(s: str) -> str:
    """Go ``strconv.Quote`` / ``%q``: double-quoted, Go escapes, printable Unicode kept as is.

    Non-printable runes (not in categories L, M, N, P, S and not ASCII space) become ``\\xHH``,
    ``\\uHHHH`` or ``\\UHHHHHHHH``; bytes that were not UTF-8 (``surrogateescape``) become ``\\xHH``.
    """
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'
    out = ['"']
    for c in s:
        esc = _QUOTE_SIMPLE_ESCAPES.get(c)
        if esc is not None:
            out.append(esc)
            continue
        o = ord(c)
        if o < 0x80:
            out.append(c if 0x20 <= o < 0x7F else f"\\x{o:02x}")
        elif 0xDC80 <= o <= 0xDCFF:  # a raw non-UTF-8 byte preserved by surrogateescape
            out.append(f"\\x{o - 0xDC00:02x}")
        elif 0xD800 <= o <= 0xDFFF:  # would be invalid UTF-8 in Go: one \x per byte
            out.extend(f"\\x{b:02x}" for b in c.encode("utf-8", "surrogatepass"))
        elif unicodedata.category(c)[0] in "LMNPS":
            out.append(c)
        elif o < 0x10000:
            out.append(f"\\u{o:04x}")
        else:
            out.append(f"\\U{o:08x}")
    out.append('"')
    return "".join(out)
