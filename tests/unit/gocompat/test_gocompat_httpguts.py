"""kproxy.gocompat.httpguts against Go's tables, and the one request-head writer built on it
(kproxy.server.httputil.request_head): what it writes, and what it refuses to write."""

from __future__ import annotations

import pytest

from kproxy.gocompat import httpguts
from kproxy.server.httputil import InvalidRequestHead, request_head

# golang.org/x/net/http/httpguts/httplex.go isTokenTable, spelled out.
GO_TOKEN_TABLE = (
    set("!#$%&'*+-.^_`|~")
    | {chr(c) for c in range(0x30, 0x3A)}
    | set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
)


def go_valid_header_field_value(raw: bytes) -> bool:
    """httplex.go ValidHeaderFieldValue, byte for byte: isCTL(b) && !isLWS(b) refuses."""
    return not any((b < 0x20 or b == 0x7F) and b not in (0x20, 0x09) for b in raw)


def test_token_table_is_gos() -> None:
    assert set(httpguts.TOKEN_CHARS) == GO_TOKEN_TABLE
    for c in map(chr, range(0x100)):
        assert httpguts.is_token_char(c) == (c in GO_TOKEN_TABLE)
    assert not httpguts.is_token_char("é")  # IsTokenRune: false for every rune >= utf8.RuneSelf


@pytest.mark.parametrize("byte", range(0x100))
def test_value_verdict_is_gos_for_every_byte(byte: int) -> None:
    """Text as kproxy holds it (UTF-8 with surrogateescape) gets Go's verdict on its bytes."""
    raw = b"a" + bytes([byte]) + b"b"
    text = raw.decode("utf-8", "surrogateescape")
    assert httpguts.valid_header_field_value(text) == go_valid_header_field_value(raw)
    assert httpguts.first_invalid_value(["ok", text]) == (None if go_valid_header_field_value(raw) else 1)


def test_value_edges() -> None:
    assert httpguts.valid_header_field_value("")
    assert httpguts.valid_header_field_value(" a\tb ")  # Go allows LWS anywhere (and trims on read)
    assert httpguts.valid_header_field_value("ü ☃ \U0001f600")  # obs-text once encoded
    for bad in ("a\r\nX-Injected: 1", "a\n", "\r", "a\x00", "\x1b[0m", "\x7f", "a\x0bb", "a\x0cb"):
        assert not httpguts.valid_header_field_value(bad), repr(bad)


def test_names() -> None:
    for good in ("Impersonate-User", "Impersonate-Extra-a%2Fb", "x", "!#$%&'*+-.^_`|~09AZaz"):
        assert httpguts.valid_header_field_name(good)
    for bad in ("", "X A", "X:", "X\r\nY", "é", "X\x00", "(x)", "a/b", "x@y", "[x]"):
        assert not httpguts.valid_header_field_name(bad), repr(bad)
    assert httpguts.first_invalid_name(["A", "B"]) is None
    assert httpguts.first_invalid_name(["A", "", "C"]) == ""
    assert httpguts.first_invalid_name(["A", "B C"]) == "B C"


def test_host_and_trimming() -> None:
    assert httpguts.valid_host_header("127.0.0.1:6443")
    assert httpguts.valid_host_header("[::1]:443")
    assert not httpguts.valid_host_header("a b")
    assert not httpguts.valid_host_header("a/b")
    assert not httpguts.valid_host_header("a\r\nX: y")
    # textproto.TrimString strips ASCII space (SP, HTAB, CR, LF) from both ends.
    assert httpguts.survives_trimming("a b\tc")
    assert httpguts.survives_trimming("")
    for trimmed in (" a", "a ", "\ta", "a\t", "a\n"):
        assert not httpguts.survives_trimming(trimmed)


def test_request_head_writes_bytes_as_they_came() -> None:
    """UTF-8 and bytes that are not UTF-8 (read with surrogateescape) go out unchanged."""
    value = b"\xc3\xbc \xff\x80 \t!".decode("utf-8", "surrogateescape")
    head = request_head("GET", "/api?x=%20", "127.0.0.1:6443", [("Accept", "a/b"), ("X-Raw", value)])
    assert head == (
        b"GET /api?x=%20 HTTP/1.1\r\nHost: 127.0.0.1:6443\r\nAccept: a/b\r\nX-Raw: \xc3\xbc \xff\x80 \t!\r\n\r\n"
    )
    assert request_head("HEAD", "/", "h", iter([])) == b"HEAD / HTTP/1.1\r\nHost: h\r\n\r\n"


BAD_VALUES = [
    "eve\r\nImpersonate-Group: system:masters",
    "eve\nImpersonate-Group: system:masters",
    "eve\rX",
    "eve\x00",
    "eve\x01",
    "eve\x7f",
    "\x1b",
    "\r\n",
]


@pytest.mark.parametrize("value", BAD_VALUES)
def test_request_head_refuses_control_bytes_in_values(value: str) -> None:
    ok = [("Accept", "*/*"), ("Impersonate-User", "alice")]
    with pytest.raises(InvalidRequestHead) as err:
        request_head("GET", "/api", "h", [*ok, ("Impersonate-Group", value)])
    # Go's words, naming the field, never quoting the value (it may be a credential).
    assert str(err.value) == 'net/http: invalid header field value for "Impersonate-Group"'
    assert err.value.status().code == 400


@pytest.mark.parametrize("name", ["", "X A", "X\r\nY", "X:", "é", "X\x00"])
def test_request_head_refuses_invalid_names(name: str) -> None:
    with pytest.raises(InvalidRequestHead, match="invalid header field name"):
        request_head("GET", "/api", "h", [("Accept", "*/*"), (name, "v")])


def test_request_head_refuses_a_broken_request_line_host_or_encoding() -> None:
    for method in ("", "GET /x HTTP/1.1\r\nX:", "G T", "GÉT"):
        with pytest.raises(InvalidRequestHead, match="invalid method"):
            request_head(method, "/api", "h", [])
    for target in ("", "/a b", "/a\r\nX: y", "/a\x00", "/a\x7f"):
        with pytest.raises(InvalidRequestHead, match="invalid request target"):
            request_head("GET", target, "h", [])
    for host in ("h\r\nX: y", "a b", "a/b"):
        with pytest.raises(InvalidRequestHead, match="invalid Host header"):
            request_head("GET", "/", host, [])
    # A lone surrogate that no byte was read as (outside surrogateescape's range) has no bytes.
    with pytest.raises(InvalidRequestHead, match='value for "X-A"'):
        request_head("GET", "/", "h", [("X-A", "a\ud800")])
