"""YAML as go-yaml v2 writes it where libyaml/pyyaml would differ: floats, plain = and <<, a
trailing Unicode line break in a single-quoted scalar (each seen from kube-apiserver v1.37.1)."""

from __future__ import annotations

import pytest

from kproxy.codec import to_yaml
from kproxy.gocompat.floatfmt import format_float_g


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e21, "1e+21"),
        (1234567.5, "1.2345675e+06"),
        (100000.0, "100000"),
        (1000000.0, "1e+06"),
        (0.5, "0.5"),
        (1.0, "1"),
        (-1e-7, "-1e-07"),
        (0.0001, "0.0001"),
        (0.00001, "1e-05"),
        (float("inf"), "+Inf"),
        (float("nan"), "NaN"),
    ],
)
def test_format_float_g(value: float, text: str) -> None:
    assert format_float_g(value) == text


def test_yaml_floats_plain_as_go_yaml_writes_them() -> None:
    assert to_yaml({"a": 1e21, "b": 1.0, "c": float("inf"), "d": float("-inf"), "e": 0.25}) == (
        b"a: 1e+21\nb: 1\nc: .inf\nd: -.inf\ne: 0.25\n"
    )


def test_yaml_strings_pyyaml_reads_otherwise_stay_plain() -> None:
    assert to_yaml({"k": "=", "m": "<<", "q": "?q", "y": "y", "n": "1e5"}) == (
        b'k: =\nm: <<\n"n": "1e5"\nq: ?q\n"y": "y"\n'
    )


def test_trailing_unicode_line_break_is_not_followed_by_indentation() -> None:
    assert to_yaml({"data": {"v": "日本\u2028"}}) == "data:\n  v: '日本\u2028'\n".encode()
    assert to_yaml({"v": "a\u2029"}) == "v: 'a\u2029'\n".encode()
