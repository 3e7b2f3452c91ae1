# ruff: noqa: E501 -- schema documents and bodies are data, one per line
"""The validation engine's pure logic: duplicate detection, YAML wording, schema compilation,
the two walkers and their ordering, the fast clean check, messages and the schema cache."""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import orjson
import pytest

from kproxy.filters.validation import fastcheck
from kproxy.filters.validation.decode import Pairs, decode_json, decode_yaml
from kproxy.filters.validation.fastcheck import compile_clean
from kproxy.filters.validation.levels import Level, parse_level
from kproxy.filters.validation.messages import create_update_error, warning_value, warning_values
from kproxy.filters.validation.openapi import SchemaCache
from kproxy.filters.validation.schemanodes import ANY, LIST, MAP, OBJECT, SCALAR, load_group_version
from kproxy.filters.validation.structs import compile_fast
from kproxy.filters.validation.validator import (
    MAX_ERRORS,
    _clean,
    _type_meta,
    check_builtin,
    check_custom,
    validate_body,
)

REF = "#/components/schemas/"


def doc(custom: bool = False) -> dict[str, Any]:
    """A small OpenAPI v3 group-version document shaped like the apiserver's."""
    schemas: dict[str, Any] = {
        "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string", "default": ""}},
                "managedFields": {"type": "array", "items": {"allOf": [{"$ref": REF + "io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry"}]}},
            },
        },
        "io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry": {
            "type": "object",
            "properties": {"manager": {"type": "string"}, "fieldsV1": {"allOf": [{"$ref": REF + "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1"}]}},
        },
        "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1": {"type": "object"},
        "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
        "io.k8s.apimachinery.pkg.api.resource.Quantity": {"oneOf": [{"type": "string"}, {"type": "number"}]},
        "test.Props": {  # recursive, like JSONSchemaProps
            "type": "object",
            "properties": {"type": {"type": "string"}, "properties": {"type": "object", "additionalProperties": {"$ref": REF + "test.Props"}}},
        },
        "test.Thing": {
            "type": "object",
            "x-kubernetes-group-version-kind": [{"group": "test", "version": "v1", "kind": "Thing"}],
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"default": {}, "allOf": [{"$ref": REF + "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]},
                "spec": {
                    "type": "object",
                    "properties": {
                        "count": {"type": "integer", "format": "int32"},
                        "port": {"allOf": [{"$ref": REF + "io.k8s.apimachinery.pkg.util.intstr.IntOrString"}]},
                        "cpu": {"$ref": REF + "io.k8s.apimachinery.pkg.api.resource.Quantity"},
                        "data": {"type": "string", "format": "byte"},
                        "items": {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "string"}}}},
                        "names": {"type": "array", "items": {"type": "string"}},
                        "schema": {"allOf": [{"$ref": REF + "test.Props"}]},
                        "raw": {"type": "object"},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                 "properties": {"known": {"type": "object", "properties": {"x": {"type": "string"}}}}},
                        "embedded": {"type": "object", "x-kubernetes-embedded-resource": True,
                                     "properties": {"spec": {"type": "object", "properties": {"q": {"type": "string"}}}}},
                    },
                },
            },
        },
    }  # fmt: skip
    path = {
        "post": {
            "x-kubernetes-group-version-kind": {"group": "test", "version": "v1", "kind": "Thing"},
            "requestBody": {"content": {"*/*": {"schema": {"$ref": REF + "test.Thing"}}}},
        }
    }
    return {
        "info": {"title": "Kubernetes CRD Swagger" if custom else "Kubernetes", "version": "x"},
        "paths": {
            "/apis/test/v1/namespaces/{namespace}/things": path,
            "/apis/test/v1/namespaces/{namespace}/things/{name}": {"put": path["post"]},
            "/apis/test/v1/namespaces/{namespace}/things/{name}/status": {"put": path["post"]},
        },
        "components": {"schemas": schemas},
    }


def thing(custom: bool = False) -> Any:
    gv = load_group_version(doc(custom))
    ep = gv.endpoint("things")
    assert ep is not None and ep.kind == "Thing" and ep.api_version == "test/v1"
    return gv, gv.node(ep.ref)


def check(body: str | bytes, custom: bool = False, media: str = "application/json") -> Any:
    gv, root = thing(custom)
    data = body.encode() if isinstance(body, str) else body
    return validate_body(data, media, root, custom=custom, meta=gv.object_meta() if custom else None)


# ---------------------------------------------------------------- levels


def test_levels() -> None:
    assert parse_level(None) is Level.WARN and parse_level("") is Level.WARN
    assert parse_level("Strict") is Level.STRICT and parse_level("Ignore") is Level.IGNORE
    assert parse_level("strict") is None  # case-sensitive, the apiserver rejects it
    assert max(Level.IGNORE, Level.STRICT).wire == "Strict"


# ---------------------------------------------------------------- decoding


def _has_duplicates(value: Any) -> bool:
    if isinstance(value, Pairs):
        keys = [k for k, _ in value]
        return len(keys) != len(set(keys)) or any(_has_duplicates(v) for _, v in value)
    if isinstance(value, list):
        return any(_has_duplicates(v) for v in value)
    return False


def _random_json(rng: random.Random, depth: int = 0) -> str:
    """JSON text with duplicate keys, odd white space and strings full of quotes and colons."""
    ws = lambda: rng.choice(["", "", " ", "\n", "\t "])  # noqa: E731
    if depth > 3 or rng.random() < 0.3:
        return rng.choice(['"a:b"', '"\\":"', '"x\\" : y"', "1", "null", '"\\\\"', '"::"', "true", "[1,2]"])
    if rng.random() < 0.2:
        return "[" + ",".join(_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    keys = [rng.choice(["a", "b", "c", "a:b", 'q\\"', "d"]) for _ in range(rng.randint(0, 4))]
    members = [f'{ws()}"{k}"{ws()}:{ws()}{_random_json(rng, depth + 1)}{ws()}' for k in keys]
    return "{" + ",".join(members) + "}"


def test_duplicate_proof_is_sound() -> None:
    """The fast path never misses a duplicate, whatever the white space and string contents."""
    rng = random.Random(7)
    fast = 0
    for _ in range(3000):
        text = "{" + f'"root":{_random_json(rng)}' + "}"
        value, maybe = decode_json(text.encode())
        exact = json.loads(text, object_pairs_hook=Pairs)
        if not maybe:
            fast += 1
            assert not _has_duplicates(exact), text
            assert value == json.loads(text)
        else:
            assert value == exact  # the slow path keeps every pair
    assert fast > 500  # the fast path is really taken


def test_unicode_escapes_take_the_exact_decoder() -> None:
    value, maybe = decode_json(b'{"k\\u0022":1,"k\\"":2}')
    assert maybe and value == Pairs([('k"', 1), ('k"', 2)])


def test_yaml_duplicates_are_worded_like_go_yaml() -> None:
    value, dups = decode_yaml(b"a: 1\nb:\n  c: 1\n  c: 2\na:\n  x: 1\n1: one\n1: uno\nt: 2024-01-01\n")
    assert dups == [
        'line 4: key "c" already set in map',
        'line 6: key "a" already set in map',  # the value's line: where the nested block starts
        "line 8: key 1 already set in map",
    ]
    assert value == {"1": "uno", "a": {"x": 1}, "b": {"c": 2}, "t": "2024-01-01"}
    assert list(value) == sorted(value)  # keys come out sorted, as from Go maps


# ---------------------------------------------------------------- schema compilation


def test_compiled_shapes() -> None:
    gv, root = thing()
    spec = root.props["spec"]
    assert root.kind == OBJECT and spec.kind == OBJECT
    assert spec.props["port"].kind == SCALAR and spec.props["port"].types == frozenset({int, str})
    assert spec.props["cpu"].types == frozenset({int, float, str})
    assert spec.props["items"].kind == LIST and spec.props["names"].item is not None
    assert spec.props["raw"].kind == ANY  # a Go struct without fields here: RawExtension-like
    props = spec.props["schema"]
    assert props.props["properties"].kind == MAP and props.props["properties"].item is props  # recursion shared
    assert root.props["metadata"].props["labels"].kind == MAP
    # The clean check descends only where objects can be: not into labels (a map of strings).
    assert "labels" not in root.props["metadata"].containers and "managedFields" in root.props["metadata"].containers
    assert gv.endpoint("things", "status") is not None and gv.endpoint("things", "scale") is None


def test_custom_resource_documents_prune_objects_without_properties() -> None:
    _gv, root = thing(custom=True)
    assert root.props["spec"].props["raw"].kind == OBJECT  # pruned empty
    # ...but the apiserver's own types inside (ObjectMeta, FieldsV1) stay Go structs.
    fields = root.props["metadata"].props["managedFields"].item
    assert fields is not None and fields.props["fieldsV1"].kind == ANY


# ---------------------------------------------------------------- the walkers


def test_builtin_errors_in_document_order_deduplicated() -> None:
    out = check('{"zz":1,"apiVersion":"test/v1","kind":"Thing","metadata":{"name":"a","name":"b","x":1},'
                '"spec":{"items":[{"a":"1","b":2},{"b":3}],"count":1,"count":2,"raw":{"any":1}},"zz":2}')  # fmt: skip
    assert out.errors == [
        'unknown field "zz"',
        'duplicate field "metadata.name"',
        'unknown field "metadata.x"',
        'unknown field "spec.items[0].b"',
        'unknown field "spec.items[1].b"',
        'duplicate field "spec.count"',
    ]
    assert not out.fatal and (out.api_version, out.kind) == ("test/v1", "Thing")


def test_builtin_type_errors_are_fatal() -> None:
    """Types are looked at only when there is something to report (a clean body is forwarded
    either way); then a wrong one means the apiserver answers with its own decode error."""
    assert check('{"spec":{"count":"3","zz":1}}').fatal
    assert check('{"spec":{"count":1.5},"zz":1}').fatal
    assert check('{"spec":{"port":true},"zz":1}').fatal
    assert check('{"spec":{"data":"!!"},"zz":1}').fatal  # []byte fields are base64
    assert not check('{"spec":{"data":"aGk=","port":"http","cpu":0.5,"count":null},"zz":1}').fatal
    assert check('{"spec":{"items":{"a":"1"}},"zz":1}').fatal
    assert check("[1]").fatal and check("{").fatal
    assert check('{"spec":{"count":"3"}}').clean  # nothing to report: not even looked at


def test_builtin_error_cap() -> None:
    body = "{" + ",".join(f'"u{i}":1' for i in range(150)) + "}"
    assert len(check(body).errors) == MAX_ERRORS


def test_custom_resource_order_and_pruning() -> None:
    out = check(
        '{"apiVersion":"test/v1","kind":"Thing","metadata":{"name":"w","zeta":1,"alpha":2},"top":1,'
        '"spec":{"count":1,"count":2,"zz":1,"aa":2,"items":[{"a":"x","b":1}],"raw":{"r":1},'
        '"free":{"u":1,"known":{"x":"1","y":2}},'
        '"embedded":{"apiVersion":"v1","kind":"X","metadata":{"name":"e","bad":1},"spec":{"q":"1","r":2}}}}',
        custom=True,
    )
    assert out.errors == [
        'duplicate field "spec.count"',
        'unknown field "metadata.alpha"',
        'unknown field "metadata.zeta"',
        'unknown field "spec.aa"',
        'unknown field "spec.embedded.spec.r"',
        'unknown field "spec.free.known.y"',
        'unknown field "spec.items[0].b"',
        'unknown field "spec.raw.r"',
        'unknown field "spec.zz"',
        'unknown field "top"',
        'unknown field "spec.embedded.metadata.bad"',
    ]
    assert not check('{"spec":{"count":"x"}}', custom=True).fatal  # types are checked later by the apiserver


def test_yaml_bodies_sorted_after_duplicates() -> None:
    out = check(b"zz: 1\nmetadata:\n  name: a\n  name: b\n  x: 1\naa: 2\n", media="application/yaml")
    assert out.yaml_errors == 1
    assert out.errors == [
        'line 4: key "name" already set in map',
        'unknown field "aa"',
        'unknown field "metadata.x"',
        'unknown field "zz"',
    ]


@pytest.mark.parametrize("intersect_above", [6, 0])
@pytest.mark.parametrize("custom", [False, True])
def test_clean_check_agrees_with_the_full_walk(
    custom: bool, intersect_above: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast checks (generic and compiled, both ways of visiting children) say clean exactly
    when the full walk finds no unknown field."""
    monkeypatch.setattr(fastcheck, "_INTERSECT_ABOVE", intersect_above)
    gv, root = thing(custom)
    rng = random.Random(3)
    names = ["apiVersion", "kind", "metadata", "spec", "count", "items", "a", "b", "free", "known", "x", "y",
             "embedded", "schema", "properties", "type", "labels", "raw", "zz", "name", "managedFields", "fieldsV1"]  # fmt: skip

    def gen(depth: int) -> Any:
        if depth > 4 or rng.random() < 0.25:
            return rng.choice([1, "s", None, True])
        if rng.random() < 0.2:
            return [gen(depth + 1) for _ in range(rng.randint(0, 2))]
        return {rng.choice(names): gen(depth + 1) for _ in range(rng.randint(0, 4))}

    compiled = compile_clean(root)
    seen = {True: 0, False: 0}
    for _ in range(3000):
        body = {"spec": gen(1), "metadata": gen(1)} if rng.random() < 0.7 else gen(0)
        if not isinstance(body, dict):
            continue
        full = validate_body(orjson.dumps(body) + b" ", "application/json", root, custom=custom, meta=gv.object_meta())
        unknown = any(e.startswith("unknown") for e in full.errors)
        assert _clean(root, body) is not unknown or full.fatal, body
        assert compiled(body) is _clean(root, body), body
        seen[unknown] += 1
    assert seen[True] > 100 and seen[False] > 100


def fast_thing(custom: bool) -> Any:
    """The test document without what the msgspec path does not express (the recursive type,
    checked properties below preserve-unknown-fields), so that every body gets a fast verdict."""
    d = doc(custom)
    spec = d["components"]["schemas"]["test.Thing"]["properties"]["spec"]["properties"]
    del spec["schema"]
    spec["free"]["properties"] = {"known": {"type": "string"}}
    gv = load_group_version(d)
    ep = gv.endpoint("things")
    assert ep is not None
    return gv, gv.node(ep.ref)


def test_fast_path_is_refused_for_what_structs_cannot_express() -> None:
    for custom in (False, True):
        _gv, root = thing(custom)  # test.Props is recursive; "free" has checked properties
        assert compile_fast(root, custom=custom) is None
        out = check('{"spec":{"count":1,"schema":{"properties":{"a":{"type":"x"}}}}}', custom=custom)
        assert out.clean  # ...and the orjson path still answers
    _gv, root = fast_thing(False)
    assert compile_fast(root) is not None


@pytest.mark.parametrize(
    ("body", "proven"),
    [
        ('{"apiVersion":"test/v1","kind":"Thing","spec":{"count":1,"port":"http","cpu":0.5}}', True),
        ('{ "spec" : { "count" : 1 } , "metadata" : { "labels" : { "a:b" : "c:d" } } }', True),  # colon count
        ('{"metadata":{"name":"a","labels":{"x":"1","x":"1"}}}', False),  # duplicate map key
        ('{"metadata":{"name":"a","name":"a"}}', False),  # duplicate field
        ('{ "metadata" : { "name" : "a" , "name" : "a" } }', False),  # ...with white space
        ('{"spec":{"raw":{"a":1,"a":1}}}', True),  # inside RawExtension-like: Go does not look
        ('{"spec":{"items":[{"a":"x","b":"y"}]}}', False),  # unknown field in a list
        ('{"spec":{"count":"1"}}', False),  # a wrong type: the apiserver's own decode error
        ('{"spec":{"count":1.0}}', False),
        ('{"metadata":{"name":"a\\/b","labels":{"k\\/":"\\"v\\""}}}', True),  # shorter escapes
        ('{"metadata":{"name":"\\u0061","nam\\u0065":"b"}}', False),  # a duplicate spelled with \\u
        ('{"metadata":{"name":"\\u0001"}}', True),  # re-encoded as long: the length proof holds
        ('{"metadata":{"name":"\\u003c"}}', False),  # shorter re-encoded, and \\u: no colon proof
        ('{"spec":{"data":"aGk=","names":["a",null],"embedded":{"kind":"X","spec":{"q":"n"}}}}', True),
        ('{"spec":{"embedded":{"metadata":{"name":"n"}}}}', False),  # Go structs know no implied metadata
        ('{"metadata":null,"spec":null}', True),
        ('{"spec":{"free":{"known":"k"}}}', True),
        ('{"spec":{"free":{"other":1}}}', False),  # kept by preserve-unknown-fields: left to the exact walk
        ("[]", False),
        ('{"spec":', False),
    ],
)
def test_fast_path_verdicts(body: str, proven: bool) -> None:
    _gv, root = fast_thing(False)
    fast = compile_fast(root)
    assert fast is not None
    verdict = fast(body.encode())
    assert (verdict is not None) is proven, body
    if proven:
        value, _ = decode_json(body.encode())
        assert verdict == _type_meta(value)
        assert check_builtin(root, value).errors == []


@pytest.mark.parametrize("custom", [False, True])
@pytest.mark.parametrize("depth", [300, 600, 1000, 5000])
def test_deep_nesting_is_left_to_the_apiserver_never_a_traceback(custom: bool, depth: int) -> None:
    """orjson.dumps nests less deep than orjson.loads, msgspec and the walks recurse: a deep body
    is a ``fatal`` outcome (forwarded), never an exception, on every path."""
    gv, root = fast_thing(custom)
    for body in (
        b'{"spec":{"raw":' + b"[" * depth + b"]" * depth + b"}}",  # where Go does not look (RawExtension)
        b'{"metadata":{"labels":' + b"[" * depth + b"]" * depth + b"}}",  # a wrong type
        b'{"spec":{"free":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}}",  # below preserve-unknown-fields
    ):
        out = validate_body(body, "application/json", root, custom=custom, meta=gv.object_meta())
        assert out.fatal or out.clean or out.errors


def _random_body(rng: random.Random, names: list[str], depth: int = 0) -> str:
    """JSON text over the schema's own names: duplicates, white space, escapes, every scalar."""
    ws = lambda: rng.choice(["", "", "", "", " ", "\n  "])  # noqa: E731
    if depth > 4 or rng.random() < 0.3:
        return rng.choice(
            ['"s"', '"a:b"', '"x\\/y"', '"q\\"t"', '"\\u00e9"', "1", "-0", "0.5", "1e2", "true", "null", '"aGk="']
        )
    if rng.random() < 0.2:
        return "[" + ",".join(_random_body(rng, names, depth + 1) for _ in range(rng.randint(0, 2))) + "]"
    count = rng.randint(0, 4)
    keys = [rng.choice(names) for _ in range(count)]  # with replacement: duplicates happen
    if rng.random() < 0.7:  # mostly distinct, like real bodies
        keys = list(dict.fromkeys(keys))
    members = [f'{ws()}"{k}"{ws()}:{ws()}{_random_body(rng, names, depth + 1)}' for k in keys]
    return "{" + ",".join(members) + "}"


@pytest.mark.parametrize("custom", [False, True])
def test_fast_path_never_calls_clean_what_the_exact_path_flags(custom: bool) -> None:
    """The msgspec verdict against the exact walk on random bodies: a body it proves clean has
    no error there (a wrong type, which only the apiserver words, may remain: both are
    forwarded), and ``validate_body`` answers what the exact walk answers."""
    gv, root = fast_thing(custom)
    meta = gv.object_meta()
    fast = compile_fast(root, custom=custom)
    assert fast is not None
    rng = random.Random(11 + custom)
    names = ["apiVersion", "kind", "metadata", "spec", "count", "items", "a", "b", "free", "known", "name",
             "labels", "raw", "embedded", "names", "port", "cpu", "data", "managedFields", "fieldsV1", "manager", "zz", "nam\\u0065", "l\\u0061bels"]  # fmt: skip
    seen = {"proven": 0, "flagged": 0, "clean but not proven": 0}
    for _ in range(4000):
        if rng.random() < 0.8:
            text = (
                "{"
                + ",".join(
                    f'"{k}":{_random_body(rng, names, 1)}'
                    for k in rng.sample(["apiVersion", "metadata", "spec"], rng.randint(1, 3))
                )
                + "}"
            )
        else:
            text = _random_body(rng, names)
        data = text.encode()
        try:
            value, _ = decode_json(data)
        except ValueError:
            assert fast(data) is None or not custom  # a syntax error is never proven clean
            continue
        exact = check_custom(root, meta, value) if custom else check_builtin(root, value)
        verdict = fast(data)
        if verdict is not None:
            seen["proven"] += 1
            assert exact.errors == [], text
            assert verdict == _type_meta(value), text
        elif exact.clean:
            seen["clean but not proven"] += 1
        if exact.errors:
            seen["flagged"] += 1
            assert validate_body(data, "application/json", root, custom=custom, meta=meta).errors == exact.errors
    assert seen["proven"] > 200 and seen["flagged"] > 300, seen


# ---------------------------------------------------------------- messages


def test_messages() -> None:
    assert warning_value('unknown field "a\\b"') == '299 - "unknown field \\"a\\\\b\\""'
    assert warning_values(["x", "y", "x"]) == ['299 - "x"', '299 - "y"']
    long = [f"{i}" * 300 for i in range(20)]
    bounded = warning_values(long)
    assert all(len(v) <= 256 + 8 for v in bounded) and sum(len(v) - 8 for v in bounded) <= 4096
    out = check(b"metadata:\n  name: a\n  name: b\nzz: 1\n", media="application/yaml")
    err = create_update_error("Thing", "v1", out)
    assert err.http_status == 400
    assert json.loads(err.body())["message"] == (
        'Thing in version "v1" cannot be handled as a Thing: strict decoding error: yaml: unmarshal errors:\n'
        '  line 3: key "name" already set in map, unknown field "zz"'
    )


# ---------------------------------------------------------------- the schema cache


def test_schema_cache_loads_once_per_hash_and_unsettles_groups() -> None:
    calls: list[str] = []
    state = {"hash": "1"}

    async def fetch(path: str, etag: str | None) -> tuple[int, bytes, str | None]:
        calls.append(path)
        if path == "/openapi/v3":
            index = {"paths": {"apis/test/v1": {"serverRelativeURL": f"/openapi/v3/apis/test/v1?hash={state['hash']}"}}}
            return 200, orjson.dumps(index), None
        return 200, orjson.dumps(doc()), None

    async def run() -> None:
        cache = SchemaCache(fetch, settle_seconds=60, refresh_seconds=3600)
        first = await cache.resolve("test", "v1", "things", "")
        again = await cache.resolve("test", "v1", "things", "")
        assert first is not None and again is not None and first.root is again.root
        assert calls.count("/openapi/v3") == 1 and cache.document_loads == 1
        assert await cache.resolve("test", "v1", "nothings", "") is None
        assert await cache.resolve("other", "v1", "things", "") is None  # unknown group-version
        cache.unsettle("test")  # a CRD of the group changed: the apiserver validates alone for a while
        assert await cache.resolve("test", "v1", "things", "") is None
        cache._unsettled["test"] = 0.0  # the settle time is over
        state["hash"] = "2"
        third = await cache.resolve("test", "v1", "things", "")
        assert third is not None and cache.document_loads == 2  # the new hash was fetched

    asyncio.run(run())
