"""Plain YAML scalars as the apiserver reads and writes them, against sigs.k8s.io/yaml itself
(tools/gooracle), scalar for scalar.

A scalar kproxy resolves differently from go-yaml is a body whose meaning to kproxy's policy,
validation and dry-run differs from its meaning to the apiserver, or a list kproxy writes in YAML
that the apiserver would write otherwise. YAML 1.1 (pyyaml's resolver) and go-yaml v2 disagree on
numbers: exponents without a dot, ``0o`` octals, base 60, digits past 64 bits."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from typing import Any

import pytest

from kproxy.codec import to_yaml
from kproxy.gocompat.yaml import GoYAMLError, UnsupportedYAML, yaml_to_json
from kproxy.testing.gooracle import GoOracle, b64


@pytest.fixture(scope="module")
def go() -> Iterator[GoOracle]:
    oracle = GoOracle()
    yield oracle
    oracle.close()


SCALARS = [
    # numbers YAML 1.1 reads otherwise
    "1e5", "1E5", "1.0e5", "1e+5", "-1e-5", "0o17", "0O17", "0o8", "1:20", "-1:20:30.5", "0778", "09",
    "0x_ff", "0x_", "1__0", "_1", "1_", "+0x10", "-0x10", "0b101", "0b", "-0b11", "+0b11", "0B101",
    ".5", ".5_0", "._5", ".5e3", ".e3", "5.", "+.5", "-.5", "1.5.5", "1e", "e5",
    # the edges of 64 bits and of float64
    "9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
    "18446744073709551615", "18446744073709551616", "0x8000000000000000", "0xffffffffffffffff",
    "0x10000000000000000", "-0xffffffffffffffff", "0b" + "1" * 64, "0b" + "1" * 65, "-0b" + "1" * 63,
    "0" + "7" * 21, "0" + "7" * 22, "0" * 400 + "1", "1" * 309, "1" * 310, "1" * 400, "9" * 20000,
    "0x" + "f" * 30, "1e308", "1.8e308", "1e309", "1e-400", "-1e400", "4.9e-324",
    # specials, bools, nulls, timestamps
    ".inf", "-.Inf", "+.INF", ".nan", ".NaN", "~", "null", "Null", "y", "Y", "n", "N", "yes", "On",
    "OFF", "true", "False", "<<", "=", "2001-02-03", "2001-2-3", "2001-02-30", "2000-02-29",
    "2001-02-03T04:05:06Z", "2001-02-03t04:05:06.5+01:00", "2001-02-03 04:05:06", "2001-02-03T25:00:00Z",
    "-", "+", ".", "+-1", "--1", "0", "-0", "+0", "00", "-00", "0.0", "-0.0",
]  # fmt: skip


# Tagged scalars: the non-specific "!", tags go-yaml does not know, and tags it checks.
TAGGED = ["! 5", "! true", "! ~", "!foo 5", "!!str 5", "!!int 5", "!!int 0x_", "!!int 1e5", "!!float 111",
          "!!float 1e400", "!!bool yes", "!!null ~", "!!binary aGk="]  # fmt: skip


def _random_scalars(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    alphabet = "0123456789" * 3 + "+-._eExXoObB:"
    out = []
    for _ in range(count):
        n = rng.choice((1, 2, 3, 4, 6, 10, 20, 21, 23))
        out.append("".join(rng.choice(alphabet) for _ in range(n)))
    return out


ALL = SCALARS + _random_scalars(7, 3000)
READ = ALL + TAGGED


def _kproxy_reads(scalar: str) -> Any:
    try:
        return ("ok", yaml_to_json(f"v: {scalar}\n").value["v"])
    except (GoYAMLError, UnsupportedYAML):
        return ("err", None)


def _same(ours: Any, gos: Any) -> bool:
    if isinstance(ours, bool) or isinstance(gos, bool) or ours is None or gos is None:
        return ours is gos
    if isinstance(ours, str) or isinstance(gos, str):
        return ours == gos
    if isinstance(ours, float) and isinstance(gos, float):  # JSON's "-0" reads back as the int 0
        return ours == gos and math.copysign(1, ours) == math.copysign(1, gos)
    return float(ours) == float(gos)


def test_plain_scalars_read_as_yaml_to_json_reads_them(go: GoOracle) -> None:
    answers = go.ask_many("yamltojson", [f"v: {s}\n" for s in READ])
    wrong = []
    for scalar, answer in zip(READ, answers, strict=True):
        kind, ours = _kproxy_reads(scalar)
        if answer["err"]:
            if kind != "err":
                wrong.append((scalar, "go refuses", ours))
            continue
        gos = json.loads(b64(answer["json"]), parse_int=int, parse_float=float)["v"]
        if kind != "ok" or not _same(ours, gos):
            wrong.append((scalar, gos, ours))
    assert not wrong, wrong[:20]


def test_strings_written_as_the_apiserver_writes_them(go: GoOracle) -> None:
    answers = go.ask_many("yamlstring", ALL)
    wrong = [
        (s, b64(a["out"]), to_yaml({"v": s}))
        for s, a in zip(ALL, answers, strict=True)
        if to_yaml({"v": s}) != b64(a["out"])
    ]
    assert not wrong, wrong[:20]


def test_digits_past_any_limit_stay_linear() -> None:
    # 20,000 digits: Python's int() refuses more than 4,300 (ValueError), and the decimal
    # conversion is quadratic; go-yaml reads a string, quickly.
    assert yaml_to_json("v: " + "1" * 200_000).value == {"v": "1" * 200_000}
    assert to_yaml({"v": "7" * 200_000}) == b"v: " + b"7" * 200_000 + b"\n"
