"""Go encoding/json's output details that orjson does not share."""

from __future__ import annotations


def go_escape(b: bytes) -> bytes:
    """Go's encoding/json escapes <, >, & (and U+2028/U+2029) inside strings; orjson does not.
    These bytes can only occur inside JSON strings, so replacing them in the whole output is
    exact (and a scan that finds none costs next to nothing)."""
    if b"<" in b:
        b = b.replace(b"<", b"\\u003c")
    if b">" in b:
        b = b.replace(b">", b"\\u003e")
    if b"&" in b:
        b = b.replace(b"&", b"\\u0026")
    if b"\xe2" in b:  # memchr: a one-byte search is ~15x faster than a two-byte one
        b = b.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
    return b
