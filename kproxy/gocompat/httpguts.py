"""What Go's HTTP/1.1 stack accepts as a header field, ported from ``golang.org/x/net/http/httpguts``
(``httplex.go``: ``ValidHeaderFieldName``, ``ValidHeaderFieldValue``, ``ValidHostHeader``,
``IsTokenRune``) and ``net/textproto`` (``TrimString``).

These are the checks both ends of kproxy's upstream hop apply: Go's ``Transport`` refuses to
send a request whose header breaks them (``net/http/transport.go`` ``validateHeaders``:
``net/http: invalid header field value for "Impersonate-User"``), and the apiserver's
``net/http`` server refuses to read one (``server.go`` ``readRequest``: ``400 Bad Request:
invalid header value``). kproxy's one request-head writer (``kproxy.server.httputil.request_head``)
refuses the same, so no byte that could end a header line (CR, LF) or that Go would not carry
(NUL and the other controls, DEL) is ever written into an upstream request.

Strings here are header text as kproxy holds it: decoded from (and encoded back to) bytes as
UTF-8 with ``surrogateescape`` (``kproxy.server.httputil.HEADER_CHARSET``), so a code point >= 0x80 is
one or more bytes >= 0x80 on the wire -- Go's obs-text, which it allows in values. The checks
are therefore made on the text, code point by code point, with the same verdict as Go's byte by
byte. This module imports nothing from aiohttp.
"""

from __future__ import annotations

import re

#: RFC 7230 ``tchar``: httplex.go's ``isTokenTable`` (ASCII only; ``IsTokenRune`` is false for
#: every rune >= utf8.RuneSelf).
TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")

# isCTL(b) && !isLWS(b): bytes 0x00-0x1f and 0x7f, except SP and HTAB. A code point >= 0x80 is
# never one of them once encoded, whatever its encoding.
_INVALID_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_INVALID_NAME = re.compile(r"[^!#$%&'*+\-.^_`|~0-9A-Za-z]")
# validHostByte: the bytes of RFC 3986's host and port, leniently (httplex.go ValidHostHeader).
_INVALID_HOST = re.compile(r"[^0-9A-Za-z!$%&()*+,\-.:;=\[\]'_~]")
# textproto's isASCIISpace, which TrimString (and the header reader) strip from both ends.
_ASCII_SPACE = " \t\n\r"


def is_token_char(c: str) -> bool:
    """httpguts ``IsTokenRune``."""
    return c in TOKEN_CHARS


def valid_header_field_name(name: str) -> bool:
    """httpguts ``ValidHeaderFieldName``: one or more RFC 7230 token characters."""
    return bool(name) and _INVALID_NAME.search(name) is None


def valid_header_field_value(value: str) -> bool:
    """httpguts ``ValidHeaderFieldValue``: no control byte other than SP and HTAB, no DEL.

    Like Go's, it allows leading or trailing white space; whoever needs a value to arrive
    exactly as written must also check :func:`survives_trimming`."""
    return _INVALID_VALUE.search(value) is None


def valid_host_header(host: str) -> bool:
    """httpguts ``ValidHostHeader``."""
    return _INVALID_HOST.search(host) is None


def survives_trimming(value: str) -> bool:
    """Whether Go's reader sees ``value`` as it was written: ``net/textproto`` (``ReadMIMEHeader``)
    and ``net/http``'s ``Header.Write`` (``textproto.TrimString``) strip leading and trailing
    ASCII space from every value, so ``" alice"`` arrives as ``"alice"``."""
    return not value or (value[0] not in _ASCII_SPACE and value[-1] not in _ASCII_SPACE)


def first_invalid_name(names: list[str]) -> str | None:
    """The first name :func:`valid_header_field_name` refuses, or None (one scan for all)."""
    if all(names) and _INVALID_NAME.search("".join(names)) is None:
        return None
    return next(n for n in names if not valid_header_field_name(n))


def first_invalid_value(values: list[str]) -> int | None:
    """The index of the first value :func:`valid_header_field_value` refuses, or None."""
    if _INVALID_VALUE.search("".join(values)) is None:
        return None
    return next(i for i, v in enumerate(values) if not valid_header_field_value(v))
