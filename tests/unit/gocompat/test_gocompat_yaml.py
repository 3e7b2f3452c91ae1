"""kproxy.gocompat.yaml against what sigs.k8s.io/yaml v1.6.0 over go.yaml.in/yaml/v2 v2.4.4 answers
(each expectation was produced by Go's ``YAMLToJSON``/``YAMLToJSONStrict`` on the same bytes), and
its bounds: refusals in milliseconds, no recursion whatever the nesting."""

from __future__ import annotations

import time

import pytest

from kproxy.gocompat.jsondepth import nesting_error
from kproxy.gocompat.yaml import GoYAMLError, allowed_alias_ratio, yaml_to_json


def laughs(levels: int, width: int = 9) -> bytes:
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join(f"*a{i - 1}" for _ in range(width)) + "]")
    lines.append(f"data: *a{levels}")
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize(
    ("data", "error"),
    [
        # go-yaml's limit_test.go
        (b"{a: &a [{a}" + b",{a}" * (1000 * 1024 // 4 - 100) + b"], b: &b [*a" + b",*a" * 99 + b"]}",
         "yaml: document contains excessive aliasing"),
        (b"[" * (1000 * 1024), "yaml: exceeded max depth of 10000"),
        (b"x: " + b"{" * (1000 * 1024), "yaml: exceeded max depth of 10000"),
        (b"- " * (1000 * 1024), "yaml: exceeded max depth of 10000"),
        (b"x: \n  " + b"[" * 10001, "yaml: line 2: exceeded max depth of 10000"),
        (laughs(3), "yaml: document contains excessive aliasing"),
        (laughs(9), "yaml: document contains excessive aliasing"),
        (b"a: &x [*x]\n", "yaml: anchor 'x' value contains itself"),
        (b"a: *nope\n", "yaml: unknown anchor 'nope' referenced"),
        (b"a: [\n", "yaml: line 1: did not find expected node content"),
        (b"a: 'unterminated\n", "yaml: line 2: found unexpected end of stream"),
        (b"<<: [1]\n", "yaml: map merge requires map or sequence of maps as the value"),
        (b"n: .nan\n", "json: unsupported value: NaN"),
    ],
)  # fmt: skip
def test_refused_as_go_refuses(data: bytes, error: str) -> None:
    started = time.perf_counter()
    with pytest.raises(GoYAMLError) as err:
        yaml_to_json(data)
    assert str(err.value) == error
    if len(data) < 1024:  # a few hundred bytes of aliases: refused at once, never expanded
        assert time.perf_counter() - started < 0.05


@pytest.mark.parametrize(
    ("data", "value", "duplicates"),
    [
        (b"a: 1\nb: [1, 2]\nc: {x: y}\n", {"a": 1, "b": [1, 2], "c": {"x": True}}, []),
        (b"k: y\nn: N\non: off\n", {"false": False, "k": True, "true": False}, []),
        (b"a:\n  b: 1\n  b: 2\nc: 3\nc:\n  d: 1\n", {"a": {"b": 2}, "c": {"d": 1}},
         ['line 3: key "b" already set in map', 'line 6: key "c" already set in map']),
        (b"m:\n  <<: {a: 1}\n  a: 2\n  <<: {a: 3}\n", {"m": {"a": 3}},
         ['line 3: key "a" already set in map', 'line 4: key "a" already set in map']),
        (b"m:\n  z: 3\n  <<: [{z: 4, w: 5}, {w: 6}]\n", {"m": {"w": 5, "z": 4}},
         ['line 3: key "z" already set in map', 'line 3: key "w" already set in map']),
        (b"a: &a 1\nb: *a\n", {"a": 1, "b": 1}, []),
        (b"x: !!binary aGVsbG8=\nv: !foo bar\n", {"v": "bar", "x": "hello"}, []),
        (b"", None, []),
        (b"a: 1\n---\nb: [\n", {"a": 1}, []),  # one document: the rest is never read
    ],
)  # fmt: skip
def test_converted_as_go_converts(data: bytes, value: object, duplicates: list[str]) -> None:
    decoded = yaml_to_json(data)
    assert decoded.value == value
    assert decoded.duplicates == duplicates


def test_nesting_within_limits_is_built_without_recursion() -> None:
    """10000 flow levels inside 10000 indentations: go-yaml accepts it; the JSON decoder after it
    refuses the 10001st level."""
    decoded = yaml_to_json(b"- " * 10000 + b"[" * 10000 + b"]" * 10000)
    assert decoded.depth == 20000
    assert nesting_error(decoded.value, decoded.depth) == "invalid character '[' exceeded max depth"
    assert nesting_error(*_depth(yaml_to_json(b"[" * 10000 + b"]" * 10000))) is None


def _depth(decoded: object) -> tuple[object, int]:
    return decoded.value, decoded.depth  # type: ignore[attr-defined]


def test_aliases_are_shared_not_copied() -> None:
    """Within the budget, an alias's value is the anchor's own object (no expansion in memory)."""
    decoded = yaml_to_json(b"a: &a [1, 2, 3]\nb: [*a, *a, *a]\n")
    assert all(item is decoded.value["a"] for item in decoded.value["b"])


def test_alias_ratio_scale() -> None:
    assert allowed_alias_ratio(400_000) == 0.99
    assert allowed_alias_ratio(4_000_000) == 0.10
    assert allowed_alias_ratio(2_200_000) == pytest.approx(0.545)
