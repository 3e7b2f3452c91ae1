"""The `k8s\\x00` + runtime.Unknown envelope around every Kubernetes protobuf body.

Wire layout (k8s.io/apimachinery/pkg/runtime/serializer/protobuf/protobuf.go): the 4-byte magic
then a runtime.Unknown message: 1 typeMeta {1 apiVersion, 2 kind}, 2 raw (the object's own
message), 3 contentEncoding, 4 contentType. Written by hand (a few varints) so that the
envelope costs nothing next to the object, and so that streams can be parsed incrementally.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .codecerrors import CodecError

MAGIC = b"k8s\x00"


@dataclass(slots=True)
class Envelope:
    """A decoded envelope: the type and the still-encoded object bytes."""

    api_version: str
    kind: str
    raw: bytes
    content_encoding: str = ""
    content_type: str = ""


def read_varint(data: bytes | bytearray | memoryview, pos: int, end: int) -> tuple[int, int]:
    """A base-128 varint at data[pos:end] -> (value, next position); CodecError if cut short."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise CodecError("truncated protobuf data: varint runs past the end")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise CodecError("invalid protobuf data: varint too long")


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def ld(num: int, payload: bytes) -> bytes:
    """The one writer of a length-delimited protobuf field: its key (``num``, wire type 2), the
    payload's length as a varint, the payload."""
    key = num << 3 | 2
    return (bytes((key,)) if key < 0x80 else encode_varint(key)) + encode_varint(len(payload)) + payload


def iter_fields(data: bytes, pos: int = 0, end: int | None = None) -> Iterator[tuple[int, int, int, int, int]]:
    """The one reader of a protobuf message's fields, in wire order: ``(number, wire type, start,
    value start, end)``. ``data[start:end]`` is the whole field; for a length-delimited field
    ``data[value start:end]`` is its payload. CodecError for a truncated field or an unknown
    wire type (the field number is the caller's to check: Go refuses 0)."""
    end = len(data) if end is None else end
    while pos < end:
        start = pos
        key, pos = read_varint(data, pos, end)
        wire = key & 7
        if wire == 2:
            n, pos = read_varint(data, pos, end)
            value = pos
            pos += n
            if pos > end:
                raise CodecError("truncated protobuf data: field runs past the end")
        else:
            value = pos
            pos = skip_field(data, wire, pos, end)
        yield key >> 3, wire, start, value, pos


def skip_field(data: bytes | bytearray | memoryview, wire: int, pos: int, end: int) -> int:
    """Skip one field's value of the given wire type; returns the next position."""
    if wire == 0:
        return read_varint(data, pos, end)[1]
    if wire == 2:
        n, pos = read_varint(data, pos, end)
        pos += n
    elif wire == 1:
        pos += 8
    elif wire == 5:
        pos += 4
    else:
        raise CodecError(f"invalid protobuf data: unsupported wire type {wire}")
    if pos > end:
        raise CodecError("truncated protobuf data: field runs past the end")
    return pos


def _string(data: bytes, pos: int, end: int, what: str) -> str:
    try:
        return data[pos:end].decode("utf-8")
    except UnicodeDecodeError as e:
        raise CodecError(f"invalid protobuf data: {what} is not valid UTF-8") from e


def parse_type_meta(data: bytes, pos: int, end: int) -> tuple[str, str]:
    """runtime.TypeMeta {1 apiVersion, 2 kind} in data[pos:end]."""
    api_version = kind = ""
    while pos < end:
        tag, pos = read_varint(data, pos, end)
        num, wire = tag >> 3, tag & 7
        if wire == 2 and num in (1, 2):
            n, pos = read_varint(data, pos, end)
            if pos + n > end:
                raise CodecError("truncated protobuf data: typeMeta runs past the end")
            if num == 1:
                api_version = _string(data, pos, pos + n, "apiVersion")
            else:
                kind = _string(data, pos, pos + n, "kind")
            pos += n
        else:
            pos = skip_field(data, wire, pos, end)
    return api_version, kind


def check_magic(data: bytes | bytearray) -> None:
    """The checks (and messages) of the apiserver's protobuf decoder."""
    if len(data) == 0:
        raise CodecError("empty data")
    if len(data) < 4 or data[:4] != MAGIC:
        raise CodecError("provided data does not appear to be a protobuf message, expected prefix [107 56 115 0]")
    if len(data) == 4:
        raise CodecError("empty body")


def short_ld(data: bytes, pos: int, tag: int, end: int) -> tuple[int, int]:
    """(payload start, length) of a length-delimited field with this one-byte tag at data[pos]
    whose length is a varint of at most three bytes and whose payload ends by `end`; (-1, 0)
    for anything else (the caller then takes the general parser)."""
    if pos + 2 > end or data[pos] != tag:
        return -1, 0
    b1 = data[pos + 1]
    if b1 < 0x80:
        n, p = b1, pos + 2
    elif pos + 3 <= end and data[pos + 2] < 0x80:
        n, p = (b1 & 0x7F) | data[pos + 2] << 7, pos + 3
    elif pos + 4 <= end and data[pos + 2] >= 0x80 and data[pos + 3] < 0x80:
        n, p = (b1 & 0x7F) | (data[pos + 2] & 0x7F) << 7 | data[pos + 3] << 14, pos + 4
    else:
        return -1, 0
    if p + n > end:
        return -1, 0
    return p, n


def _fast_envelope(data: bytes) -> Envelope | None:
    """The layout the apiserver always writes (short typeMeta first, then raw, then the two
    empty strings), read with plain indexing; None for anything else (the general parser)."""
    end = len(data)
    if end < 8 or data[4] != 0x0A:
        return None
    tm_len = data[5]
    tm_end = 6 + tm_len
    if tm_len >= 0x80 or tm_end > end or data[6] != 0x0A:
        return None
    av_len = data[7]
    av_end = 8 + av_len
    if av_len >= 0x80 or av_end + 2 > tm_end or data[av_end] != 0x12:
        return None
    kind_len = data[av_end + 1]
    if kind_len >= 0x80 or av_end + 2 + kind_len != tm_end or tm_end >= end or data[tm_end] != 0x12:
        return None
    pos = tm_end + 1
    n = 0
    shift = 0
    while True:
        if pos >= end or shift > 35:
            return None
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    stop = pos + n
    if stop > end or data[stop:] not in (b"\x1a\x00\x22\x00", b""):
        return None
    try:
        return Envelope(data[8:av_end].decode(), data[av_end + 2 : tm_end].decode(), data[pos:stop])
    except UnicodeDecodeError:
        return None


def decode_envelope(data: bytes) -> Envelope:
    """Split a whole `k8s\\x00` body into its type and raw object; CodecError on anything else."""
    if isinstance(data, (bytearray, memoryview)):
        data = bytes(data)
    check_magic(data)
    fast = _fast_envelope(data)
    if fast is not None and fast.kind:
        return fast
    return parse_envelope(data)


def parse_envelope(data: bytes) -> Envelope:
    """The general envelope parser (any field order, unknown fields skipped)."""
    env = Envelope("", "", b"")
    pos, end = 4, len(data)
    while pos < end:
        tag, pos = read_varint(data, pos, end)
        num, wire = tag >> 3, tag & 7
        if wire != 2:
            pos = skip_field(data, wire, pos, end)
            continue
        n, pos = read_varint(data, pos, end)
        stop = pos + n
        if stop > end:
            raise CodecError("truncated protobuf data: the object is cut short")
        if num == 1:
            env.api_version, env.kind = parse_type_meta(data, pos, stop)
        elif num == 2:
            env.raw = data[pos:stop]
        elif num == 3:
            env.content_encoding = _string(data, pos, stop, "contentEncoding")
        elif num == 4:
            env.content_type = _string(data, pos, stop, "contentType")
        pos = stop
    if not env.kind:
        raise CodecError("invalid protobuf data: the envelope has no kind")
    return env


def parse_watch_event(frame: bytes) -> tuple[str, bytes]:
    """metav1.WatchEvent {1 type, 2 object: RawExtension {1 raw}} -> (type, raw object bytes)."""
    type_ = ""
    raw = b""
    pos, end = 0, len(frame)
    while pos < end:
        tag, pos = read_varint(frame, pos, end)
        if tag & 7 != 2:
            pos = skip_field(frame, tag & 7, pos, end)
            continue
        n, pos = read_varint(frame, pos, end)
        stop = pos + n
        if stop > end:
            raise CodecError("truncated protobuf data: the watch event is cut short")
        if tag == 0x0A:
            type_ = _string(frame, pos, stop, "the event type")
        elif tag == 0x12:
            inner = pos
            while inner < stop:
                itag, inner = read_varint(frame, inner, stop)
                if itag & 7 != 2:
                    inner = skip_field(frame, itag & 7, inner, stop)
                    continue
                m, inner = read_varint(frame, inner, stop)
                if inner + m > stop:
                    raise CodecError("truncated protobuf data: the watch event's object is cut short")
                if itag == 0x0A:
                    raw = frame[inner : inner + m]
                inner += m
        pos = stop
    return type_, raw


def encode_envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    """The envelope as the apiserver writes it (typeMeta, raw, then the two empty strings)."""
    type_meta = ld(1, api_version.encode()) + ld(2, kind.encode())
    return MAGIC + ld(1, type_meta) + ld(2, raw) + b"\x1a\x00\x22\x00"
