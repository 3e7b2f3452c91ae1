"""Incremental protobuf -> JSON for lists and watch streams.

A long list is transcoded item by item as its bytes arrive (the apiserver streams its protobuf
lists too), so kproxy never holds a whole 100 MB list as Python objects and the client sees the
first items early. A watch stream is a sequence of 4-byte big-endian length-prefixed
metav1.WatchEvent frames (k8s.io/apimachinery/pkg/util/framer); each complete frame becomes one
JSON line at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson
from google.protobuf.message import DecodeError, Message

from kproxy.gocompat.jsonescape import go_escape
from kproxy.gocompat.utf8 import bytes_default

from .codecerrors import NOT_UTF8, CodecError, not_utf8
from .envelope import MAGIC, check_magic, parse_type_meta, read_varint, skip_field

# (span of item fields -> each item's JSON, ListMeta bytes -> its JSON object, and the wire
# reader's walk over the complete items at the start of some bytes -> (their JSON, bytes used))
ListPlan = tuple[
    Callable[[bytes], list[bytes]], Callable[[bytes], Any], Callable[[bytes], tuple[list[bytes], int]] | None
]


class MessageSource(Protocol):
    """What the stream transcoders need of the codec (``kproxy.codec.codec.ProtobufCodec`` is one)."""

    def _list_plan(self, api_version: str, kind: str) -> ListPlan | None: ...
    def _raw_to_json(self, api_version: str, kind: str, raw: bytes) -> bytes: ...
    def _watch_event_json(self, data: bytes, start: int, stop: int) -> bytes: ...

DEFAULT_MAX_FRAME = 64 * 1024 * 1024


class _NeedMore(Exception):
    """Internal: the buffer ends inside the next field."""


class ListTranscoder:
    """One protobuf body (a list, or any object) -> JSON, fed chunk by chunk."""

    def __init__(self, codec: MessageSource) -> None:
        self._codec = codec
        self._buf = bytearray()
        self._pos = 0
        self._state = "magic"  # magic | outer | items | whole
        self._api_version = ""
        self._kind = ""
        self._raw_end = 0  # absolute buffer offset where raw ends (items state)
        self._raw_left = 0  # bytes of raw still to come (whole state)
        self._raw_parts: list[bytes] = []
        self._header: dict[str, Any] = {}
        self._started = False
        self._count = 0
        self._items: Callable[[bytes], list[bytes]] | None = None
        self._meta: Callable[[bytes], Any] | None = None
        self._prefix: Callable[[bytes], tuple[list[bytes], int]] | None = None
        self._out: list[bytes] = []

    @property
    def items(self) -> int:
        """How many list items were emitted so far."""
        return self._count

    def feed(self, chunk: bytes) -> bytes:
        """JSON produced by this chunk (possibly b""): items are emitted as soon as complete."""
        if chunk:
            self._buf += chunk
        try:
            self._run()
        except NOT_UTF8 as e:
            raise not_utf8(e) from e
        out = b"".join(self._out)
        self._out.clear()
        # Drop consumed bytes now and then (cheap amortised compaction).
        if self._pos > 1 << 20 and self._pos > len(self._buf) // 2:
            del self._buf[: self._pos]
            self._raw_end -= self._pos
            self._pos = 0
        return out

    def finish(self) -> bytes:
        """The rest of the JSON; CodecError if the body was cut short."""
        try:
            self._run()
        except NOT_UTF8 as e:
            raise not_utf8(e) from e
        if self._state == "magic":
            check_magic(bytes(self._buf))
        if self._state in ("outer",) and not self._kind:
            raise CodecError("truncated protobuf data: no object in the envelope")
        if self._state in ("items", "whole") or (self._state == "outer" and self._pos != len(self._buf)):
            raise CodecError("truncated protobuf data: the list is cut short")
        if self._state == "outer" and not self._started and self._kind:
            # An envelope whose raw field never came: an empty object of that kind.
            self._emit_whole(b"")
        out = b"".join(self._out)
        self._out.clear()
        return out

    # -- internals ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                if self._state == "magic":
                    if len(self._buf) < 4:
                        return
                    if self._buf[:4] != MAGIC:
                        check_magic(bytes(self._buf[:4]) + b"\x00")
                    self._pos = 4
                    self._state = "outer"
                elif self._state == "outer":
                    if not self._outer_field():
                        return
                elif self._state == "items":
                    if not self._list_field():
                        return
                elif self._state == "whole":
                    if not self._whole():
                        return
                else:
                    return
        except _NeedMore:
            return

    def _read_ld(self, end: int) -> tuple[int, int, int]:
        """(field number, payload start, payload end) of the next length-delimited field that
        must end by `end`; other wire types are skipped (start == end == -1). _NeedMore if the
        buffer stops inside it."""
        buf = self._buf
        pos = self._pos
        limit = min(end, len(buf))
        # Fast path: a one-byte tag 0x12 (list items) and a length of at most three bytes.
        if pos + 4 <= limit and buf[pos] == 0x12:
            b1 = buf[pos + 1]
            if b1 < 0x80:
                n, p = b1, pos + 2
            else:
                b2 = buf[pos + 2]
                if b2 < 0x80:
                    n, p = (b1 & 0x7F) | b2 << 7, pos + 3
                else:
                    b3 = buf[pos + 3]
                    n, p = ((b1 & 0x7F) | (b2 & 0x7F) << 7 | b3 << 14, pos + 4) if b3 < 0x80 else (-1, 0)
            if n >= 0:
                if p + n > end:
                    raise CodecError("invalid protobuf data: field runs past its message")
                if p + n > len(buf):
                    raise _NeedMore
                return 2, p, p + n
        try:
            tag, p = read_varint(buf, pos, limit)
            wire = tag & 7
            if wire != 2:
                self._pos = skip_field(buf, wire, p, limit)
                return tag >> 3, -1, -1
            n, p = read_varint(buf, p, limit)
        except CodecError:
            if limit < end:
                raise _NeedMore from None
            raise
        if p + n > end:
            raise CodecError("invalid protobuf data: field runs past its message")
        if p + n > len(buf):
            raise _NeedMore
        return tag >> 3, p, p + n

    def _outer_field(self) -> bool:
        buf = self._buf
        pos = self._pos
        if pos >= len(buf):
            return False
        try:
            tag, p = read_varint(buf, pos, len(buf))
            if tag & 7 != 2:
                self._pos = skip_field(buf, tag & 7, p, len(buf))
                return True
            n, p = read_varint(buf, p, len(buf))
        except CodecError:
            return False
        num = tag >> 3
        if num == 2:
            if not self._kind:
                raise CodecError("invalid protobuf data: raw before typeMeta in the envelope")
            self._pos = p
            self._begin_raw(p, n)
            return True
        if p + n > len(buf):
            return False
        if num == 1:
            self._api_version, self._kind = parse_type_meta(bytes(buf[p : p + n]), 0, n)
        self._pos = p + n
        return True

    def _begin_raw(self, start: int, n: int) -> None:
        plan = self._codec._list_plan(self._api_version, self._kind)
        if plan is None:
            self._state = "whole"
            self._raw_left = n
            return
        self._items, self._meta, self._prefix = plan
        self._state = "items"
        self._raw_end = start + n
        self._header = {"kind": self._kind, "apiVersion": self._api_version} if self._kind else {}

    def _whole(self) -> bool:
        take = min(self._raw_left, len(self._buf) - self._pos)
        if take:
            self._raw_parts.append(bytes(self._buf[self._pos : self._pos + take]))
            self._pos += take
            self._raw_left -= take
        if self._raw_left:
            return False
        self._emit_whole(b"".join(self._raw_parts))
        self._raw_parts.clear()
        self._state = "outer"
        self._started = True
        return True

    def _emit_whole(self, raw: bytes) -> None:
        self._out.append(self._codec._raw_to_json(self._api_version, self._kind, raw))

    def _list_field(self) -> bool:
        """Consume every complete field in the buffer. Consecutive items are parsed together
        (one upb parse of the span as a list message is cheaper than one parse per item) and
        emitted at once; metadata is kept for the list's header."""
        batch_start = -1
        batch_end = -1
        try:
            while self._pos < self._raw_end:
                if self._prefix is not None and batch_start < 0 and self._fast_items():
                    continue
                at = self._pos
                num, start, stop = self._read_ld(self._raw_end)
                if start < 0 or num != 2:
                    if batch_start >= 0:
                        self._emit_items(batch_start, batch_end)
                        batch_start = -1
                    if start < 0:
                        continue
                    self._pos = stop
                    if num == 1:
                        if self._started:
                            raise CodecError("invalid protobuf data: list metadata after its items")
                        assert self._meta is not None
                        self._header["metadata"] = self._meta(bytes(self._buf[start:stop]))
                    continue
                if batch_start < 0:
                    batch_start = at
                batch_end = stop
                self._pos = stop
        except _NeedMore:
            if batch_start >= 0:
                self._emit_items(batch_start, batch_end)
            return False
        if batch_start >= 0:
            self._emit_items(batch_start, batch_end)
        if self._pos > self._raw_end:
            raise CodecError("invalid protobuf data: list fields run past the object")
        self._close_list()
        self._state = "outer"
        return True

    def _fast_items(self) -> bool:
        """The complete items at the buffer's position read by the wire reader in one walk (no
        per-item parse of their tags here); False when it read none (another field, an item
        not complete yet, or one it leaves to upb: the general path takes it)."""
        buf = self._buf
        pos = self._pos
        end = min(len(buf), self._raw_end)
        if pos >= end or buf[pos] != 0x12:
            return False
        with memoryview(buf) as view, view[pos:end] as part:
            data = bytes(part)
        assert self._prefix is not None
        items, used = self._prefix(data)
        if not used:
            return False
        self._pos = pos + used
        self._emit_json(items)
        return True

    def _emit_items(self, start: int, end: int) -> None:
        """Items whose fields (tags included) span buf[start:end]."""
        assert self._items is not None
        with memoryview(self._buf) as view, view[start:end] as part:
            span = bytes(part)
        self._emit_json(self._items(span))

    def _emit_json(self, items: list[bytes]) -> None:
        """The JSON of consecutive items, not escaped yet."""
        if not self._started:
            self._open_list()
        if items:
            if self._count:
                self._out.append(b",")
            self._out.append(go_escape(b",".join(items)))  # one scan per batch
            self._count += len(items)

    def _open_list(self) -> None:
        self._header.setdefault("metadata", {})
        head = go_escape(orjson.dumps(self._header, default=bytes_default))
        self._out.append(head[:-1] + b',"items":[')
        self._started = True

    def _close_list(self) -> None:
        if not self._started:
            self._open_list()
        self._out.append(b"]}")


class WatchTranscoder:
    """Length-prefixed protobuf WatchEvent frames -> newline-terminated JSON events."""

    def __init__(self, codec: MessageSource, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._codec = codec
        self._buf = bytearray()
        self._max = max_frame
        self.events = 0
        #: the error of a frame that followed good ones in the same chunk (see ``feed``)
        self._error: ValueError | None = None

    def feed(self, chunk: bytes) -> bytes:
        """One JSON line per frame completed by this chunk; nothing held back.

        Frames are read in place from one bytes object: the chunk itself when nothing is
        pending (no copy at all), else the pending bytes and the chunk joined once a frame
        is complete. Only an incomplete last frame is kept.

        A frame that cannot be read raises CodecError; when good frames came before it in the
        same chunk, their events are returned first and the error is raised by ``raise_error``
        (which the caller calls after sending them), by the next ``feed`` or by ``finish``:
        the events the apiserver sent before the bad frame reach the client."""
        self.raise_error()
        buf = self._buf
        if buf:
            buf += chunk
            if len(buf) >= 4:
                n = int.from_bytes(buf[:4], "big")
                if n <= self._max and len(buf) - 4 < n:
                    return b""  # the pending frame is still incomplete
            data = bytes(buf)
            buf.clear()
        else:
            data = bytes(chunk)
        out: list[bytes] = []
        frame_json = self._codec._watch_event_json
        size = len(data)
        pos = 0
        try:
            try:
                while size - pos >= 4:
                    n = int.from_bytes(data[pos : pos + 4], "big")
                    if n > self._max:
                        raise CodecError(f"watch event frame of {n} bytes exceeds the limit of {self._max}")
                    if size - pos - 4 < n:
                        break
                    out.append(frame_json(data, pos + 4, pos + 4 + n))
                    self.events += 1
                    pos += 4 + n
            except NOT_UTF8 as e:
                raise not_utf8(e) from e
        except ValueError as e:  # CodecError, or what the protobuf runtime raises
            if not out:
                raise
            self._error = e
            return b"".join(out)
        if pos < size:
            buf += memoryview(data)[pos:]
        return b"".join(out)

    def finish(self) -> bytes:
        """b"" at a frame boundary; CodecError if the stream ended inside a frame."""
        self.raise_error()
        if self._buf:
            raise CodecError(f"truncated watch stream: {len(self._buf)} bytes of an incomplete frame")
        return b""

    def raise_error(self) -> None:
        """Raise the error of a bad frame whose chunk also completed good ones, if there was one."""
        if self._error is not None:
            raise self._error


def decode_message(cls: type[Message], data: bytes, what: str) -> Message:
    """Parse with upb; any parse failure becomes a CodecError naming the type."""
    try:
        return cls.FromString(data)
    except DecodeError as e:
        raise CodecError(f"invalid protobuf data for {what}: {e}") from e


__all__ = ["ListTranscoder", "WatchTranscoder", "decode_message"]
