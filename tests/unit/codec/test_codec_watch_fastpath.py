"""The watch transcoder's fast path (frames in the apiserver's own layout read by indexing)
against the general parsers it stands in for: same JSON line or the same CodecError, for the
apiserver's layout, for other valid layouts, and for damaged frames."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.codec import CodecError, ProtobufCodec
from kproxy.codec.codecerrors import NOT_UTF8
from kproxy.codec.envelope import MAGIC
from kproxy.codec.envelope import ld as _ld

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "<b>&"}},
    "spec": {"containers": [{"name": "c", "image": "busybox"}]},
}


def _frame(event: bytes) -> bytes:
    return len(event).to_bytes(4, "big") + event


@pytest.fixture()
def codec() -> ProtobufCodec:
    """A fresh codec per test: the fast path's caches start empty."""
    return ProtobufCodec()


def _general(codec: ProtobufCodec, frame: bytes) -> bytes | str:
    """The general parsers on one frame (NOT_UTF8: the transcoders turn it into a CodecError, tested
    below)."""
    try:
        return codec._watch_frame_to_json(frame[4:])
    except (CodecError, *NOT_UTF8) as e:
        return f"error: {e}"


def _fast(codec: ProtobufCodec, frame: bytes) -> bytes | str:
    try:
        return codec._watch_event_json(frame, 4, len(frame))
    except (CodecError, *NOT_UTF8) as e:
        return f"error: {e}"


def _warm(codec: ProtobufCodec) -> bytes:
    """A canonical frame, transcoded once so the fast path knows its type and kind."""
    frame = codec.encode_watch_event("ADDED", POD)
    codec.watch_transcoder().feed(frame)
    return frame


def test_canonical_frames_take_the_fast_path_and_match(codec: ProtobufCodec) -> None:
    frame = _warm(codec)
    assert codec._event_heads and codec._event_kinds, "the first frame taught the fast path nothing"
    modified = codec.encode_watch_event("MODIFIED", POD)
    t = codec.watch_transcoder()
    out = t.feed(frame + modified + frame)
    assert out == _general(codec, frame) + _general(codec, modified) + _general(codec, frame)
    assert out.startswith(b'{"type":"ADDED","object":{"kind":"Pod","apiVersion":"v1","metadata"')
    assert b"\\u003cb\\u003e\\u0026" in out and t.events == 3


def _other_layouts(codec: ProtobufCodec) -> list[bytes]:
    """Valid frames the fast path does not read itself: each must fall back, same JSON."""
    raw = codec.from_json(POD)[4:]  # runtime.Unknown after the magic
    obj = raw[2 + raw[1] :]  # after the (short) typeMeta: field 2 (raw) and the two empty strings
    tm_swapped = _ld(2, b"Pod") + _ld(1, b"v1")
    env_swapped = MAGIC + _ld(1, tm_swapped) + obj
    assert raw.endswith(b"\x1a\x00\x22\x00")
    env_no_trailer = MAGIC + raw[:-4]
    env_extra = MAGIC + raw + _ld(3, b"")
    canonical = codec.from_json(POD)
    return [
        _frame(_ld(1, b"ADDED") + _ld(2, _ld(1, env_swapped))),
        _frame(_ld(1, b"ADDED") + _ld(2, _ld(1, env_no_trailer))),
        _frame(_ld(1, b"ADDED") + _ld(2, _ld(1, env_extra))),
        _frame(_ld(2, _ld(1, canonical)) + _ld(1, b"ADDED")),  # object before type
        _frame(_ld(1, b"ADDED") + b"\x18\x07" + _ld(2, _ld(1, canonical))),  # unknown varint field
        _frame(_ld(1, b"A" * 200) + _ld(2, _ld(1, canonical))),  # long type
    ]


@pytest.mark.parametrize("warm", [False, True])
def test_other_valid_layouts_fall_back_with_the_same_json(codec: ProtobufCodec, warm: bool) -> None:
    if warm:
        _warm(codec)
    for frame in _other_layouts(codec):
        general = _general(codec, frame)
        assert isinstance(general, bytes), general
        t = codec.watch_transcoder()
        assert t.feed(frame) == general
        assert _fast(codec, frame) == general


def test_known_header_with_a_damaged_object_is_a_codec_error(codec: ProtobufCodec) -> None:
    frame = bytearray(_warm(codec))
    frame[-10:-4] = b"\xff" * 6  # inside the Pod's bytes, envelope and lengths intact
    with pytest.raises(CodecError, match="invalid protobuf data for Pod"):
        codec.watch_transcoder().feed(bytes(frame))


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_damaged_frames_give_what_the_general_parsers_give(data: st.DataObject) -> None:
    codec = ProtobufCodec()
    frame = bytearray(_warm(codec))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(4, len(frame) - 1))
        frame[at] = data.draw(st.integers(0, 255))
    assert _fast(codec, bytes(frame)) == _general(codec, bytes(frame))


def test_frames_split_anywhere_give_the_same_stream(codec: ProtobufCodec) -> None:
    frames = b"".join(codec.encode_watch_event(t, POD) for t in ("ADDED", "MODIFIED", "DELETED"))
    whole = codec.watch_transcoder().feed(frames)
    for chunk in (1, 5, 37):
        t = codec.watch_transcoder()
        out = b"".join(t.feed(frames[i : i + chunk]) for i in range(0, len(frames), chunk)) + t.finish()
        assert out == whole and t.events == 3


def test_a_string_that_is_not_utf8_is_written_as_go_writes_it(codec: ProtobufCodec) -> None:
    """Go's encoding/json writes \\ufffd for each byte that is not UTF-8 (kproxy.gocompat.utf8),
    in watch events, objects and list items alike."""
    frame = _warm(codec)
    bad = frame.replace(b"busybox", b"\x80usybox")
    assert bad != frame
    good_line = codec.watch_transcoder().feed(frame)
    assert codec.watch_transcoder().feed(bad) == good_line.replace(b"busybox", b"\\ufffdusybox")
    body = codec.from_json(POD)
    assert codec.to_json(body.replace(b"busybox", b"\x80usybox")) == codec.to_json(body).replace(
        b"busybox", b"\\ufffdusybox"
    )
    items = {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [POD, POD]}
    body = codec.from_json(items)
    bad_body = body.replace(b"busybox", b"\x80usybox", 1)
    t = codec.list_transcoder()
    out = t.feed(bad_body) + t.finish()
    good = codec.list_transcoder()
    assert out == (good.feed(body) + good.finish()).replace(b"busybox", b"\\ufffdusybox", 1)


def test_good_frames_before_a_bad_one_in_the_same_chunk_are_returned_first(codec: ProtobufCodec) -> None:
    """The apiserver's events that one read brought before a frame kproxy cannot read go out
    before the error: ``feed`` returns them and ``raise_error`` (then ``feed``, ``finish``) raises."""
    good = codec.encode_watch_event("ADDED", POD)
    bad = _frame(_ld(1, b"ADDED") + _ld(2, _ld(1, b"k9s\x00" + b"\x00" * 20)))
    t = codec.watch_transcoder()
    out = t.feed(good + good + bad + good)
    assert out == _general(codec, good) * 2 and t.events == 2
    with pytest.raises(CodecError):
        t.raise_error()
    with pytest.raises(CodecError):
        t.feed(good)
    with pytest.raises(CodecError):
        t.finish()
    alone = codec.watch_transcoder()
    with pytest.raises(CodecError):
        alone.feed(bad + good)  # nothing good before it: raised at once
