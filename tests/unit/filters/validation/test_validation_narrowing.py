"""Narrowed Structs (``kproxy.filters.validation.structs``): the msgspec clean check first decodes into
Structs declaring only the fields bodies were seen to set, learns from bodies that need more,
and must give exactly the verdicts the full Structs give."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
from test_validation_engine import _random_body, fast_thing

from kproxy.filters.validation.structs import _Decoders, compile_fast

NAMES = ["apiVersion", "kind", "metadata", "spec", "count", "items", "a", "b", "free", "known", "name",
         "labels", "raw", "embedded", "names", "port", "cpu", "data", "managedFields", "fieldsV1", "manager",
         "zz", "nam\\u0065", "l\\u0061bels"]  # fmt: skip


def _bodies(rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        if rng.random() < 0.8:
            keys = rng.sample(["apiVersion", "metadata", "spec"], rng.randint(1, 3))
            out.append(("{" + ",".join(f'"{k}":{_random_body(rng, NAMES, 1)}' for k in keys) + "}").encode())
        else:
            out.append(_random_body(rng, NAMES).encode())
    return out


@pytest.mark.parametrize("custom", [False, True])
@pytest.mark.parametrize("max_lessons", [3, 10**6])
def test_narrowed_verdicts_are_the_full_structs_verdicts(custom: bool, max_lessons: int) -> None:
    """Random bodies over the schema's names (duplicates, misplaced and unknown fields, wrong
    types, escapes, white space): the narrowing check, learning as it goes, answers every body
    exactly as the full Structs do."""
    _gv, root = fast_thing(custom)
    narrowing = compile_fast(root, custom=custom, max_lessons=max_lessons)
    full = compile_fast(root, custom=custom, max_lessons=0)
    assert narrowing is not None and full is not None
    proven = 0
    for data in _bodies(random.Random(5 + custom), 4000):
        verdict = full(data)
        assert narrowing(data) == verdict, data
        proven += verdict is not None
    assert proven > 200


def _body(**spec: Any) -> bytes:
    return msgspec.json.encode({"apiVersion": "test/v1", "kind": "Thing", "spec": spec})


def test_narrowed_structs_declare_only_the_fields_bodies_set() -> None:
    _gv, root = fast_thing(False)
    decoders = _Decoders(root, True, 16)
    decoders.learn(decoders.full(_body(count=1, names=["a"])))
    assert decoders.narrow is not None
    narrow, full = decoders.narrow(_body(count=2)), decoders.full(_body(count=2))
    assert len(type(narrow).__struct_fields__) == 3  # apiVersion and kind always, spec
    assert len(type(narrow.f3).__struct_fields__) == 2  # count and names: what was set
    assert len(type(full.f3).__struct_fields__) > 5
    with pytest.raises(msgspec.ValidationError, match="unknown field `port`"):
        decoders.narrow(_body(port="http"))
    # Learning a body with another field widens only what it set.
    decoders.learn(decoders.full(_body(port="http")))
    assert len(type(decoders.narrow(_body(port=1)).f3).__struct_fields__) == 3


def test_a_body_needing_another_declared_field_is_proven_and_teaches_it() -> None:
    _gv, root = fast_thing(False)
    fast = compile_fast(root)
    assert fast is not None
    assert fast(_body(count=1)) == ("test/v1", "Thing")
    # "port" is not in the narrowed spec yet: the full Structs decide, and teach it.
    assert fast(_body(count=1, port="http")) == ("test/v1", "Thing")
    assert fast(_body(port=8080, cpu="1")) == ("test/v1", "Thing")
    # Never proven: an undeclared field, a field declared elsewhere only (misplaced), a
    # duplicate of a learned field, a wrong type.
    assert fast(_body(count=1, zz=1)) is None
    assert fast(_body(count=1, manager="m")) is None
    assert fast(b'{"apiVersion":"test/v1","kind":"Thing","spec":{"count":1,"count":1}}') is None
    assert fast(_body(count="1")) is None
    assert fast(b'{"spec":{"port":') is None


def test_learning_stops_after_max_lessons() -> None:
    """Each lesson rebuilds the narrowed types: a workload that keeps setting new fields ends
    on the full Structs alone, with the same verdicts."""
    _gv, root = fast_thing(False)
    fast = compile_fast(root, max_lessons=2)
    assert fast is not None
    bodies = [_body(count=1), _body(port="p"), _body(cpu="1"), _body(data="aGk="), _body(names=["x"])]
    for body in bodies + bodies:
        assert fast(body) == ("test/v1", "Thing")
    assert fast(_body(count=1, zz=1)) is None
