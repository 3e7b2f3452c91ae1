"""Go's string functions where the apiserver applies them to bytes a caller controls: who the
caller is (``Authorization``, ``Sec-WebSocket-Protocol``) and whether a request is an upgrade
(``Connection``, ``Upgrade``). Python's ``str.strip``, ``str.lower`` and ``str.casefold`` are other
functions (another white-space set, full and context-dependent case mappings, another Unicode
version), and each difference is a spelling that names one caller to kproxy and another to the
apiserver.

Strings are header text as kproxy holds it: decoded from bytes as UTF-8 with ``surrogateescape``
(``kproxy.server.httputil.HEADER_CHARSET``), so each byte that is not UTF-8 is one lone surrogate.
That is exactly where Go's decoder answers ``(utf8.RuneError, 1)`` (see ``kproxy.gocompat.utf8``),
so working code point by code point gives Go's answer byte for byte:

- ``strings.TrimSpace`` (``strings/strings.go``): trims ``unicode.IsSpace`` runes from both ends;
  a byte that is not UTF-8 is ``RuneError``, which is not white space, so trimming stops there.
- ``strings.ToLower``: ``unicode.ToLower`` (simple mappings, no context) per rune through
  ``strings.Map``, which writes U+FFFD for each byte that is not UTF-8.
- ``strings.EqualFold``: runes equal under ``unicode.SimpleFold`` (simple case folding: U+017F
  LATIN SMALL LETTER LONG S is ``s``, U+212A KELVIN SIGN is ``k``; U+0130 and U+0131, the Turkish
  dotted and dotless I, are not ``i``); every byte that is not
  UTF-8 is ``RuneError``, so it equals any other such byte and U+FFFD itself.
- ``base64.RawURLEncoding.DecodeString`` (``encoding/base64/base64.go``).
- ``httpguts.HeaderValuesContainsToken`` (``golang.org/x/net/http/httpguts/httplex.go``).

``strings.Split(s, sep)`` and ``strings.SplitN(s, sep, n)`` with an ASCII ``sep`` are Python's
``s.split(sep)`` and ``s.split(sep, n - 1)``: they need no port.

The ``unicode`` tables are the Go toolchain's own (``kproxy.gocompat._unicodetables``, generated
from it and checked against it). This module imports nothing from aiohttp.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable

from kproxy.gocompat._unicodetables import FOLD, LOWER, SPACE

__all__ = [
    "GO_SPACE",
    "equal_fold",
    "header_values_contain_token",
    "is_space",
    "raw_url_decode",
    "simple_fold",
    "to_lower",
    "trim_space",
]

#: ``unicode.IsSpace``: U+0009-U+000D, U+0020, U+0085, U+00A0 and Unicode's White_Space beyond
#: Latin-1 (U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000).
GO_SPACE = "".join(map(chr, SPACE))


def _expand(runs: tuple[tuple[int, int, int, int], ...]) -> dict[int, int]:
    return {r: r + delta for first, last, stride, delta in runs for r in range(first, last + 1, stride)}


_LOWER_MAP = _expand(LOWER)
_FOLD_MAP = _expand(FOLD)
#: ``str.translate`` table for ``strings.ToLower``: Go's mappings, and U+FFFD for each byte that
#: is not UTF-8 (a lone surrogate here).
_LOWER_TABLE: dict[int, int] = {**_LOWER_MAP, **{c: 0xFFFD for c in range(0xD800, 0xE000)}}
_SURROGATES = re.compile("[\ud800-\udfff]")
_RAW_URL = re.compile(r"[A-Za-z0-9_-]*")


def is_space(c: str) -> bool:
    """``unicode.IsSpace`` for one code point (a lone surrogate, a byte that is not UTF-8, is not)."""
    return c in GO_SPACE


def trim_space(s: str) -> str:
    """``strings.TrimSpace``."""
    return s.strip(GO_SPACE)


def to_lower(s: str) -> str:
    """``strings.ToLower``: ``unicode.ToLower`` rune by rune; U+FFFD for a byte that is not UTF-8."""
    if s.isascii():
        return s.lower()
    return s.translate(_LOWER_TABLE)


def simple_fold(r: int) -> int:
    """``unicode.SimpleFold``: the next rune of ``r``'s case-folding orbit (``r`` when none)."""
    return _FOLD_MAP.get(r, r)


def equal_fold(s: str, t: str) -> bool:
    """``strings.EqualFold``: equal rune by rune under simple Unicode case folding."""
    if s.isascii() and t.isascii():
        return len(s) == len(t) and s.lower() == t.lower()
    # Each byte that is not UTF-8 is utf8.RuneError (U+FFFD) to Go's range loop and DecodeRune.
    s = _SURROGATES.sub("\ufffd", s)
    t = _SURROGATES.sub("\ufffd", t)
    if len(s) != len(t):
        return False
    for a, b in zip(s, t, strict=True):
        sr, tr = ord(a), ord(b)
        if sr == tr:
            continue
        if tr < sr:
            sr, tr = tr, sr
        if tr < 0x80:  # ASCII only, A-Z vs a-z
            if 0x41 <= sr <= 0x5A and tr == sr + 0x20:
                continue
            return False
        # SimpleFold(x) is the next equivalent rune > x, or wraps around to smaller values.
        r = simple_fold(sr)
        while r != sr and r < tr:
            r = simple_fold(r)
        if r != tr:
            return False
    return True


def raw_url_decode(s: str) -> bytes | None:
    """``base64.RawURLEncoding.DecodeString``: the bytes, or None where Go answers an error.

    The URL alphabet only (``-`` and ``_``, never ``+`` or ``/``), no padding (``=`` is an
    error), CR and LF skipped wherever they are, a length of 4n+1 an error; the unused bits of
    the last character are not checked (the encoding is not ``Strict``)."""
    s = s.replace("\r", "").replace("\n", "")
    if len(s) % 4 == 1 or _RAW_URL.fullmatch(s) is None:
        return None
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def _trim_ows(v: str) -> str:
    return v.strip(" \t")  # httplex.go trimOWS: SP and HTAB only


def _token_equal(t1: str, t2: str) -> bool:
    """httplex.go ``tokenEqual``: ASCII case-insensitive; any non-ASCII byte is never equal."""
    return len(t1) == len(t2) and t1.isascii() and t1.lower() == t2.lower()


def header_values_contain_token(values: Iterable[str], token: str) -> bool:
    """``httpguts.HeaderValuesContainsToken``: some comma-separated element of some value, with
    SP and HTAB trimmed, equals ``token`` in ASCII case only (``upgrade`` but not ``upgrade``
    with a U+212A or a U+3000 beside it). ``token`` is ASCII."""
    return any(_token_equal(_trim_ows(e), token) for v in values for e in v.split(","))
