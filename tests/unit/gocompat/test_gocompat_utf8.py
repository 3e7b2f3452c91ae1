"""kproxy.gocompat.utf8 against Go: encoding/json's output for strings that are not UTF-8, and
the codec, YAML and JSON writers that use it.

The reference values come from Go 1.26 (``json.Marshal(string(b))``); the digest covers every
byte string of length 0-3 over an alphabet of UTF-8 edge bytes (lead bytes of each length, their
bounds, continuation bytes, never-valid bytes, the surrogate lead ED), made by this program::

    alpha := []byte{0x00, 0x41, 0x3c, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0, 0xc1, 0xc2,
        0xdf, 0xe0, 0xe1, 0xed, 0xee, 0xef, 0xf0, 0xf1, 0xf4, 0xf5, 0xff}
    // for n := 0..3, every string of n bytes over alpha in lexicographic order:
    //     out, _ := json.Marshal(string(s)); h.Write(out); h.Write([]byte{'\\n'})
    fmt.Printf("%d %x\\n", count, h.Sum(nil))
"""

from __future__ import annotations

import hashlib
import itertools

import orjson
import pytest

from kproxy.codec import ProtobufCodec, to_yaml
from kproxy.codec.envelope import encode_envelope, ld
from kproxy.codec.yamlcodec import go_yaml_error
from kproxy.gocompat.jsonescape import go_escape
from kproxy.gocompat.utf8 import dumps_go, go_string, json_string, replaced

ALPHABET = bytes.fromhex("00 41 3c 7f 80 8f 90 9f a0 bf c0 c1 c2 df e0 e1 ed ee ef f0 f1 f4 f5 ff")
GO_COUNT = 14425
GO_DIGEST = "e676551a3d7e030e8e1c02fa46e7e06815f9705b119a9bfe065a2516e4c3f3f5"

# (bytes, Go's json.Marshal of string(bytes))
GO_CASES = [
    (b"\xff\xfe", rb'"\ufffd\ufffd"'),
    (b"\xe2\x82", rb'"\ufffd\ufffd"'),  # a truncated 3-byte sequence: one per byte (Python's "replace": one)
    (b"\xe2\x82A", rb'"\ufffd\ufffdA"'),
    (b"\xed\xa0\x80", rb'"\ufffd\ufffd\ufffd"'),  # a surrogate, UTF-8 encoded
    (b"\xc0\x80", rb'"\ufffd\ufffd"'),  # overlong NUL
    (b"\xe0\x80\x80", rb'"\ufffd\ufffd\ufffd"'),  # overlong
    (b"\xf0\x9f\x98", rb'"\ufffd\ufffd\ufffd"'),  # a truncated 4-byte sequence
    (b"\xf4\x90\x80\x80", rb'"\ufffd\ufffd\ufffd\ufffd"'),  # above U+10FFFF
    (b"\xf0\x9f\x98\x80", '"😀"'.encode()),
    (b"\xef\xbf\xbd", '"\ufffd"'.encode()),  # a real U+FFFD is written as it is, not escaped
    (b"a<b\xff", rb'"a\u003cb\ufffd"'),
    ("\u2028".encode() + b"\xff", rb'"\u2028\ufffd"'),
]


@pytest.mark.parametrize(("raw", "go"), GO_CASES)
def test_json_string_is_go_encoding_json(raw: bytes, go: bytes) -> None:
    assert go_escape(json_string(raw)) == go
    assert go_escape(json_string(go_string(raw))) == go  # the same from the surrogateescape form


def test_every_short_byte_string_is_written_as_go_writes_it() -> None:
    h = hashlib.sha256()
    count = 0
    for n in range(4):
        for t in itertools.product(ALPHABET, repeat=n):
            h.update(go_escape(json_string(bytes(t))) + b"\n")
            count += 1
    assert (count, h.hexdigest()) == (GO_COUNT, GO_DIGEST)


def test_go_string_is_lossless_and_plain_text_unchanged() -> None:
    assert go_string(b"plain \xc3\xa9") == "plain é"
    s = go_string(b"a\xe2\x82b")
    assert s == "a\udce2\udc82b" and s.encode("utf-8", "surrogateescape") == b"a\xe2\x82b"
    assert replaced(s) == "a\ufffd\ufffdb"  # what YAML (made from Go's JSON) holds


def test_dumps_go_writes_keys_and_values_as_go() -> None:
    doc = {"a": go_string(b"\xff"), go_string(b"k\xfe"): 1, go_string(b"k\xff"): [go_string(b"<\xe2\x82")]}
    assert go_escape(dumps_go(doc)) == rb'{"a":"\ufffd","k\ufffd":1,"k\ufffd":["\u003c\ufffd\ufffd"]}'
    assert dumps_go({"a": "b"}) == orjson.dumps({"a": "b"})


def _configmap(data: dict[bytes, bytes], annotations: dict[bytes, bytes] | None = None) -> bytes:
    meta = ld(1, b"cm") + b"".join(ld(12, ld(1, k) + ld(2, v)) for k, v in (annotations or {}).items())
    return encode_envelope(
        "v1", "ConfigMap", ld(1, meta) + b"".join(ld(2, ld(1, k) + ld(2, v)) for k, v in data.items())
    )


@pytest.mark.parametrize("wire", [True, False], ids=["wire-reader", "upb"])
def test_codec_writes_bad_strings_map_values_and_map_keys_as_go(wire: bool) -> None:
    """Go sorts map keys by their bytes and writes each bad byte as \\ufffd, keys included (two
    keys that differ only there both print)."""
    codec = ProtobufCodec(wire=wire)
    env = _configmap(
        {b"b": b"\xff\xfe", b"\xff": b"x", b"\xfe": b"y", b"a": "\ufffd".encode()}, {b"note": b"<\xe2\x82"}
    )
    assert codec.to_json(env) == (
        b'{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm","annotations":{"note":"\\u003c\\ufffd\\ufffd"}},'
        b'"data":{"a":"\xef\xbf\xbd","b":"\\ufffd\\ufffd","\\ufffd":"y","\\ufffd":"x"}}'
    )
    obj = codec.to_obj(env)
    assert list(obj["data"]) == ["a", "b", "\udcfe", "\udcff"]
    # YAML is Go's JSON read back by go-yaml: U+FFFD, and of equal keys the last one's value.
    # go-yaml sorts U+FFFD (not a letter) before letters.
    assert to_yaml(obj).decode() == (
        "apiVersion: v1\ndata:\n  \ufffd: x\n  a: \ufffd\n  b: \ufffd\ufffd\nkind: ConfigMap\n"
        "metadata:\n  annotations:\n    note: <\ufffd\ufffd\n  name: cm\n"
    )
    assert go_yaml_error(obj) is None


def test_list_and_watch_keep_every_item() -> None:
    codec = ProtobufCodec()
    good = codec.from_json({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "g"}, "data": {"k": "vv"}})
    bad = good.replace(b"vv", b"\xff\xfe")
    event_good = codec.encode_watch_event("ADDED", orjson.loads(codec.to_json(good)))
    event_bad = event_good.replace(b"vv", b"\xff\xfe")
    t = codec.watch_transcoder()
    lines = t.feed(event_good + event_bad + event_good).splitlines()
    assert lines[1] == lines[0].replace(b"vv", rb"\ufffd\ufffd") and lines[2] == lines[0]
    assert codec.to_json(bad) == codec.to_json(good).replace(b"vv", rb"\ufffd\ufffd")


def test_go_indent_is_marshal_indent_and_keeps_go_escapes() -> None:
    """kproxy.gocompat.jsonindent: Go's json.Indent of compact bytes (MarshalIndent's second half)
    equals orjson's 2-space indent, and keeps \\ufffd escapes and repeated keys as they are."""
    from kproxy.gocompat.jsonindent import indent

    for doc in ({"a": [1, {}, [], {"b": 'x,:{"[\\'}], "c": None, "d": 1.5e300}, [], {}, "s", [[[]]]):
        assert indent(orjson.dumps(doc)) == orjson.dumps(doc, option=orjson.OPT_INDENT_2)
    assert indent(rb'{"\ufffd":"\ufffd","\ufffd":[]}') == b'{\n  "\\ufffd": "\\ufffd",\n  "\\ufffd": []\n}'
