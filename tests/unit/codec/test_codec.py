"""kproxy.codec pieces: envelope, bad input, special types (Quantity, Duration, Time), YAML.

Expected values come from the Kubernetes sources and docs (apimachinery's quantity and time
tests, Go's time.Duration.String) or from the apiserver's own answers in codec_fixtures/.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.codec import (
    CodecError,
    ProtobufCodec,
    canonical_quantity,
    decode_envelope,
    encode_envelope,
    from_yaml,
    to_yaml,
)
from kproxy.codec.envelope import Envelope, parse_envelope
from kproxy.codec.quantity import parse_quantity
from kproxy.codec.wellknown import format_duration, format_micro_time, format_time, parse_duration, parse_time

FIXTURES = Path(__file__).parent / "codec_fixtures"


@pytest.fixture(scope="module")
def codec() -> ProtobufCodec:
    return ProtobufCodec()


def _fixture(name: str) -> bytes:
    return (FIXTURES / f"{name}.pb").read_bytes()


# -- envelope -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty data"),
        (b"{}", "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]"),
        (b"k8s", "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]"),
        (b"k8s\x01\x0a\x00", "provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]"),
        (b"k8s\x00", "empty body"),
    ],
)
def test_envelope_errors_are_the_apiservers(data: bytes, message: str) -> None:
    with pytest.raises(CodecError) as e:
        decode_envelope(data)
    assert str(e.value) == message


def test_envelope_round_trip_is_byte_identical_to_the_apiserver() -> None:
    pb = _fixture("pod")
    env = decode_envelope(pb)
    assert (env.api_version, env.kind, env.content_type, env.content_encoding) == ("v1", "Pod", "", "")
    assert encode_envelope(env.api_version, env.kind, env.raw) == pb


@settings(max_examples=300, deadline=None)
@given(
    api_version=st.text(max_size=200),
    kind=st.text(min_size=1, max_size=30),
    raw=st.binary(max_size=300),
    cut=st.integers(0, 600),
)
def test_envelope_fast_path_agrees_with_the_general_parser(api_version: str, kind: str, raw: bytes, cut: int) -> None:
    data = encode_envelope(api_version, kind, raw)
    assert decode_envelope(data) == Envelope(api_version, kind, raw)
    cut_data = data[: max(5, min(cut, len(data)))]
    try:
        general: Envelope | None = parse_envelope(cut_data)
    except CodecError:
        general = None
    try:
        assert decode_envelope(cut_data) == general
    except CodecError:
        assert general is None


def test_envelope_truncated_raw() -> None:
    pb = _fixture("pod")
    with pytest.raises(CodecError, match="cut short"):
        decode_envelope(pb[:100])


def test_unknown_kind(codec: ProtobufCodec) -> None:
    assert codec.knows("v1", "Pod")
    assert codec.knows("apps/v1", "Deployment")
    assert codec.knows("v1", "Status")
    assert not codec.knows("example.com/v1", "Widget")
    assert not codec.knows("v1", "Deployment")
    with pytest.raises(CodecError, match='no protobuf schema for kind "Widget" in version "example.com/v1"'):
        codec.to_json(encode_envelope("example.com/v1", "Widget", b""))
    with pytest.raises(CodecError, match="Widget"):
        codec.from_json({"apiVersion": "example.com/v1", "kind": "Widget"})


# -- bad protobuf input: always a CodecError, never another exception ---------------------


@pytest.mark.parametrize("cut", [5, 9, 20, 50, 200, 1000, 2000, 3000])
def test_truncated_object(codec: ProtobufCodec, cut: int) -> None:
    pb = _fixture("pod")
    with pytest.raises(CodecError):
        codec.to_json(pb[:cut])
    with pytest.raises(CodecError):
        codec.to_obj(pb[:cut])


@pytest.mark.parametrize("cut", [3, 4, 30, 1000, 20000, 51000])
def test_truncated_list_fails_at_finish(codec: ProtobufCodec, cut: int) -> None:
    pb = _fixture("clusterroles")
    t = codec.list_transcoder()
    t.feed(pb[:cut])
    with pytest.raises(CodecError):
        t.finish()


def test_list_transcoder_wrong_magic(codec: ProtobufCodec) -> None:
    with pytest.raises(CodecError, match="expected prefix"):
        codec.list_transcoder().feed(b'{"kind":"PodList"}')


def test_list_transcoder_empty_body(codec: ProtobufCodec) -> None:
    t = codec.list_transcoder()
    assert t.feed(b"") == b""
    with pytest.raises(CodecError, match="empty data"):
        t.finish()


def test_raw_extension_that_is_not_json(codec: ProtobufCodec) -> None:
    """A protobuf client can store any bytes in a RawExtension; Go's JSON encoder refuses them."""
    revision = {"apiVersion": "apps/v1", "kind": "ControllerRevision", "metadata": {"name": "r"}, "data": {"a": 1}}
    good = codec.from_json(revision)
    assert json.loads(codec.to_json(good))["data"] == {"a": 1}
    bad = good.replace(b'{"a":1}', b'{"a":1,')
    with pytest.raises(CodecError, match="not valid JSON"):
        codec.to_json(bad)
    with pytest.raises(CodecError, match="not valid JSON"):
        codec.to_obj(bad)


def test_json_escapes_html_like_go(codec: ProtobufCodec) -> None:
    """Go's encoding/json writes <, >, & and U+2028/9 as \\u escapes; the bytes must match."""
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a&b"}, "data": {"<k>": "x\u2028y\u2029"}}
    out = codec.to_json(codec.from_json(cm))
    assert out == (
        b'{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a\\u0026b"},'
        b'"data":{"\\u003ck\\u003e":"x\\u2028y\\u2029"}}'
    )
    assert json.loads(out) == codec.to_obj(codec.from_json(cm)) == cm


def test_list_transcoder_escapes_like_to_json(codec: ProtobufCodec) -> None:
    items = [{"metadata": {"name": f"cm{i}"}, "data": {"k": "<a>&b\u2028"}} for i in range(50)]
    body = codec.from_json({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {}, "items": items})
    whole = codec.to_json(body)
    assert b"\\u003ca\\u003e\\u0026b\\u2028" in whole and b"<" not in whole
    for chunk in (7, 100, len(body)):
        t = codec.list_transcoder()
        out = b"".join(t.feed(body[i : i + chunk]) for i in range(0, len(body), chunk)) + t.finish()
        assert out == whole


def test_watch_partial_frame_fails_at_finish(codec: ProtobufCodec) -> None:
    pb = _fixture("watch-configmaps")
    t = codec.watch_transcoder()
    out = t.feed(pb[:-3])
    assert out.count(b"\n") == t.events
    with pytest.raises(CodecError, match="truncated watch stream"):
        t.finish()


def test_watch_frame_over_limit(codec: ProtobufCodec) -> None:
    with pytest.raises(CodecError, match="exceeds the limit"):
        codec.watch_transcoder().feed(b"\xff\xff\xff\xff")


def test_watch_frame_whose_object_is_not_protobuf(codec: ProtobufCodec) -> None:
    frame = codec.encode_watch_event("ADDED", {"apiVersion": "v1", "kind": "ConfigMap"}).replace(b"k8s\x00", b"k9s\x00")
    with pytest.raises(CodecError, match="expected prefix"):
        codec.watch_transcoder().feed(frame)


def test_watch_garbage_frame(codec: ProtobufCodec) -> None:
    with pytest.raises(CodecError):
        codec.watch_transcoder().feed(b"\x00\x00\x00\x03\xff\xff\xff")


@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=200))
def test_garbage_after_magic_is_a_clean_error(codec: ProtobufCodec, garbage: bytes) -> None:
    for data in (b"k8s\x00" + garbage, encode_envelope("v1", "Pod", garbage)):
        try:
            codec.to_json(data)
            codec.to_obj(data)
        except CodecError:
            pass
        t = codec.list_transcoder()
        try:
            t.feed(data)
            t.finish()
        except CodecError:
            pass


@settings(max_examples=200, deadline=None)
@given(garbage=st.binary(max_size=100))
def test_garbage_watch_frames_are_a_clean_error(codec: ProtobufCodec, garbage: bytes) -> None:
    t = codec.watch_transcoder()
    try:
        t.feed(len(garbage).to_bytes(4, "big") + garbage)
        t.finish()
    except CodecError:
        pass


# -- JSON -> protobuf errors ------------------------------------------------------------------


def _pod(**spec: object) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": [{"name": "c"}], **spec},
    }


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (_pod(bogus=1), 'unknown field "spec.bogus"'),
        (_pod(containers=[{"name": "c", "imagee": "x"}]), 'unknown field "spec.containers[0].imagee"'),
        (_pod(priority="high"), "spec.priority: expected integer, got string"),
        (_pod(priority=2**40), "spec.priority: 1099511627776 overflows"),
        (_pod(hostNetwork="yes"), "spec.hostNetwork: expected bool, got string"),
        (_pod(containers={"name": "c"}), "spec.containers: expected array, got object"),
        (_pod(nodeSelector=["a"]), "spec.nodeSelector: expected object, got array"),
        (_pod(overhead={"cpu": "1ki"}), "spec.overhead.cpu: unable to parse quantity's suffix"),
        (_pod(overhead={"cpu": "abc"}), "spec.overhead.cpu: quantities must match the regular expression"),
        ({"apiVersion": "v1", "kind": "Secret", "data": {"k": "%%%"}}, "data.k: illegal base64 data"),
        (
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"creationTimestamp": "yesterday"}},
            "metadata.creationTimestamp",
        ),
        ({"apiVersion": "v1", "kind": "Pod"} | {"metadata": "x"}, "metadata: expected object, got string"),
        ({"apiVersion": "v1"}, "Object 'Kind' is missing"),
        ({"apiVersion": 1, "kind": "Pod"}, "'apiVersion' is not a string"),
        ([1, 2], "a JSON object with apiVersion and kind is required"),
    ],
)
def test_from_json_rejects_what_protobuf_cannot_carry(codec: ProtobufCodec, obj: object, message: str) -> None:
    with pytest.raises(CodecError) as e:
        codec.from_json(obj)  # type: ignore[arg-type]
    assert message in str(e.value)


def test_from_json_invalid_json_bytes(codec: ProtobufCodec) -> None:
    with pytest.raises(CodecError, match="invalid JSON"):
        codec.from_json(b"{not json")


def test_from_json_nulls_are_go_zero_values(codec: ProtobufCodec) -> None:
    obj = codec.to_obj(codec.from_json({"apiVersion": "v1", "kind": "ConfigMap", "metadata": None, "data": None}))
    assert obj == {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {}}


def test_from_json_canonicalises_quantities_like_the_apiserver(codec: ProtobufCodec) -> None:
    # The fixture pod was created with cpu 100m / 1.5 and memory 1Gi / 1536Mi.
    pod = json.loads((FIXTURES / "pod.json").read_bytes())
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"cpu": "1500m", "memory": "1536Mi"}, "requests": {"cpu": "100m", "memory": "1Gi"}}
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"cpu": "1.5", "memory": "1.5Gi"},
        "requests": {"cpu": 0.1, "memory": "1024Mi"},
    }
    assert codec.to_obj(codec.from_json(pod))["spec"]["containers"][0]["resources"] == resources


# -- Quantity -----------------------------------------------------------------------------------

# From k8s.io/apimachinery/pkg/api/resource (quantity_test.go, the Quantity docs) and the
# apiserver's own answers.
QUANTITIES = [
    ("0", "0"),
    ("0m", "0"),
    ("1", "1"),
    ("1000m", "1"),
    ("1.5", "1500m"),
    ("0.5", "500m"),
    ("100m", "100m"),
    ("0.1m", "100u"),
    ("1n", "1n"),
    ("0.0000000001", "1n"),
    ("0.0000000011", "2n"),
    ("-0.0000000011", "-2n"),
    ("1000", "1k"),
    ("1k", "1k"),
    ("1024Ki", "1Mi"),
    ("1Mi", "1Mi"),
    ("1.5Gi", "1536Mi"),
    ("0.5Gi", "512Mi"),
    ("1.5Ki", "1536"),
    ("1023Ki", "1023Ki"),
    ("128974848", "128974848"),
    ("129e6", "129e6"),
    ("129M", "129M"),
    ("123Mi", "123Mi"),
    ("1e3", "1e3"),
    ("1E3", "1e3"),
    ("12e-3", "12e-3"),
    ("2E", "2E"),
    ("-1000m", "-1"),
    ("+5Gi", "5Gi"),
    (" 5Gi ", "5Gi"),
    ("0.5Ki", "512"),
    ("100Ki", "100Ki"),
    ("1.1", "1100m"),
]


@pytest.mark.parametrize(("text", "canonical"), QUANTITIES)
def test_quantity_canonical_form(text: str, canonical: str) -> None:
    assert canonical_quantity(text) == canonical


@pytest.mark.parametrize("bad", ["", "abc", "1.2.3", "1Zi", "--1", ".", "1 Gi", "e3"])
def test_quantity_errors(bad: str) -> None:
    with pytest.raises(CodecError):
        canonical_quantity(bad)


quantity_text = st.builds(
    lambda sign, whole, frac, suffix: f"{sign}{whole}{'.' + frac if frac else ''}{suffix}",
    st.sampled_from(["", "-", "+"]),
    st.integers(0, 10**12).map(str),
    st.one_of(st.just(""), st.text("0123456789", min_size=1, max_size=12)),
    st.sampled_from(
        ["", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "e3", "e-6", "E9"]
    ),
)


@given(quantity_text)
def test_quantity_canonical_is_idempotent_and_keeps_the_value(text: str) -> None:
    canonical = canonical_quantity(text)
    assert canonical_quantity(canonical) == canonical
    value, _ = parse_quantity(text)
    again, _ = parse_quantity(canonical)
    if abs(value) < 2**63 - 1:  # BinarySI values above int64 are capped, as in Go
        assert again == value
    assert abs(again * 10**9 - round(again * 10**9)) == Fraction(0)


# -- Duration, Time -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (0, "0s"),
        (1, "1ns"),
        (1100, "1.1µs"),
        (2_200_000, "2.2ms"),
        (3_300_000_000, "3.3s"),
        (4 * 60 * 10**9 + 5 * 10**9, "4m5s"),
        (4 * 60 * 10**9 + 5_001_000_000, "4m5.001s"),
        (5 * 3600 * 10**9 + 6 * 60 * 10**9 + 7_001_000_000, "5h6m7.001s"),
        (3600 * 10**9, "1h0m0s"),
        (-1_500_000_000, "-1.5s"),
        (8 * 3600 * 10**9 + 1, "8h0m0.000000001s"),
    ],
)
def test_duration_is_go_duration_string(ns: int, text: str) -> None:
    assert format_duration(ns) == text
    assert parse_duration(text) == ns


@given(st.integers(-(2**62), 2**62))
def test_duration_round_trip(ns: int) -> None:
    assert parse_duration(format_duration(ns)) == ns


@pytest.mark.parametrize("bad", ["", "5", "1x", "h", "1.s.", "--1s"])
def test_duration_errors(bad: str) -> None:
    with pytest.raises(CodecError):
        parse_duration(bad)


def test_time_formats() -> None:
    assert format_time(0) == "1970-01-01T00:00:00Z"
    assert format_time(1704164645) == "2024-01-02T03:04:05Z"
    assert format_micro_time(1704164645, 123456789) == "2024-01-02T03:04:05.123456Z"
    assert parse_time("2024-01-02T03:04:05Z") == (1704164645, 0)
    assert parse_time("2024-01-02T04:04:05.5+01:00") == (1704164645, 500_000_000)


@given(st.integers(0, 253402300799))
def test_time_round_trip(seconds: int) -> None:
    assert parse_time(format_time(seconds)) == (seconds, 0)


def test_lease_micro_time_from_the_apiserver(codec: ProtobufCodec) -> None:
    lease = codec.to_obj(_fixture("leases"))["items"][0]
    assert lease["spec"]["acquireTime"] == "2024-01-02T03:04:05.123456Z"
    assert lease["spec"]["renewTime"] == "2024-01-02T03:04:06.000001Z"


# -- YAML -----------------------------------------------------------------------------------------


def test_yaml_is_sorted_block_style_and_round_trips(codec: ProtobufCodec) -> None:
    obj = codec.to_obj(_fixture("pod"))
    text = to_yaml(obj)
    assert text.startswith(b"apiVersion: v1\nkind: Pod\nmetadata:\n")
    # Keys sorted, sequences not indented under their key: as the apiserver's YAML.
    assert b"\nspec:\n  containers:\n  - env:\n    - name: A\n" in text
    assert from_yaml(text) == obj


def test_yaml_equals_the_apiservers_yaml(codec: ProtobufCodec) -> None:
    apiserver_yaml = (FIXTURES / "pod.yaml").read_bytes()
    ours = to_yaml(codec.to_obj(_fixture("pod")))
    assert from_yaml(ours) == from_yaml(apiserver_yaml)
    assert ours == apiserver_yaml  # byte for byte: go-yaml's key order, quoting, literal blocks


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("1", '"1"'),
        ("", '""'),
        ("y", '"y"'),
        ("No", '"No"'),
        ("null", '"null"'),
        ("1.5", '"1.5"'),
        ("0x1F", '"0x1F"'),
        ("1:20", '"1:20"'),
        ("2026-11-21T00:52:02Z", '"2026-11-21T00:52:02Z"'),
        ("nginx", "nginx"),
        ("a: b", "'a: b'"),
        ("- x", "'- x'"),
        ("two\nlines", "|-\n  two\n  lines"),
    ],
)
def test_yaml_string_styles_are_go_yamls(value: str, text: str) -> None:
    assert to_yaml({"k": value}) == f"k: {text}\n".encode()


def test_yaml_key_order_is_go_yamls() -> None:
    keys = ['k:{"port":80}', 'k:{"port":443}', "a10", "a9", "b", "A", "_x", "a09"]
    dumped = to_yaml(dict.fromkeys(keys, 1)).decode().splitlines()
    # Non-letters before letters, digit runs by value (a9 < a09 < a10), as sorter.go.
    assert [line.rsplit(":", 1)[0].strip("'") for line in dumped] == [
        "_x",
        "A",
        "a9",
        "a09",
        "a10",
        "b",
        'k:{"port":80}',
        'k:{"port":443}',
    ]


def test_yaml_errors() -> None:
    with pytest.raises(CodecError, match="error converting YAML to JSON"):
        from_yaml(b"a: [1, 2\n")


@pytest.mark.parametrize("wire", [True, False])
def test_a_field_newer_than_the_sender_is_printed_only_when_sent(wire: bool) -> None:
    """CSINode.status came in 1.37, a struct Go always writes: a 1.37 apiserver sends it (``{}`` in
    JSON when empty), a 1.36 one never does, and each one's JSON is kept as it wrote it."""
    codec = ProtobufCodec(wire=wire)
    head = {"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {"name": "n"}, "spec": {}}
    older = codec.from_json(head)
    newer = codec.from_json({**head, "status": {}})
    assert len(newer) == len(older) + 2  # field 3, empty
    assert b'"status"' not in codec.to_json(older)
    assert codec.to_json(newer).endswith(b',"status":{}}')
    assert "status" not in codec.to_obj(older) and codec.to_obj(newer)["status"] == {}
