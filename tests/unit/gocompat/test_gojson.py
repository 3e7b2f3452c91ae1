"""Go's ``encoding/json`` syntax errors (the texts of Go's own scanner and decode tests)."""

from __future__ import annotations

import json

import pytest

from kproxy.gocompat.jsonsyntax import quote_char, syntax_error


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"{nope", "invalid character 'n' looking for beginning of object key string"),
        (b'{"X": "foo", "Y"}', "invalid character '}' after object key"),
        (b"[1, 2, 3+]", "invalid character '+' after array element"),
        (b'{"X":12x}', "invalid character 'x' after object key:value pair"),
        (b"[2, 3", "unexpected end of JSON input"),
        (b"", "unexpected end of JSON input"),
        (b"{", "unexpected end of JSON input"),
        (b'{"F3": -}', "invalid character '}' in numeric literal"),
        (b"123 456", "invalid character '4' after top-level value"),
        (b"01", "invalid character '1' after top-level value"),
        (b'{"a":1,}', "invalid character '}' looking for beginning of object key string"),
        (b"[1,]", "invalid character ']' looking for beginning of value"),
        (b'"\x01"', "invalid character '\\x01' in string literal"),
        (b'"\\q"', "invalid character 'q' in string escape code"),
        (b'"\\u12g4"', "invalid character 'g' in \\u hexadecimal character escape"),
        (b"trux", "invalid character 'x' in literal true (expecting 'e')"),
        (b"nul", "invalid character ' ' in literal null (expecting 'l')"),
        (b"1.e5", "invalid character 'e' after decimal point in numeric literal"),
        (b"1e+", "invalid character ' ' in exponent of numeric literal"),
        (b"'a'", "invalid character '\\'' looking for beginning of value"),
        (b"\\", "invalid character '\\\\' looking for beginning of value"),
        (b"\xef\xbb\xbf{}", "invalid character '\u00ef' looking for beginning of value"),
        (b"\xa0", "invalid character '\\u00a0' looking for beginning of value"),
        (b"[" * 10001, "invalid character '[' exceeded max depth"),  # as the apiserver answers
    ],
)
def test_go_syntax_errors(data: bytes, message: str) -> None:
    assert syntax_error(data) == message


@pytest.mark.parametrize(
    "data",
    [b"{}", b" [] ", b'{"a":[1,-2.5e+3,true,false,null,"x\\u00e9\\n"],"b":{}}', b"0", b"-0.0E1", b'"\xff"'],
)
def test_valid_json_has_no_error(data: bytes) -> None:
    assert syntax_error(data) is None


def test_python_agrees_on_what_is_valid() -> None:
    """Wherever Python's strict parser and Go's scanner can both judge (ASCII), they agree."""
    samples = [b"{}", b"{nope", b"[1,]", b"1.5", b"1.", b"-", b'{"a":1}', b"[[[]]]", b"tru", b"nullx"]
    for data in samples:
        try:
            json.loads(data)
            valid = True
        except ValueError:
            valid = False
        assert (syntax_error(data) is None) == valid, data


def test_quote_char() -> None:
    assert quote_char(ord("n")) == "'n'"
    assert quote_char(ord('"')) == "'\"'"
    assert quote_char(0) == "'\\x00'"
    assert quote_char(10) == "'\\n'"
    assert quote_char(0x85) == "'\\u0085'"
