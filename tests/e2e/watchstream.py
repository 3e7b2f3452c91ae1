"""A watch read byte by byte over a raw socket, the way a client that asked for a content coding
sees it: HTTP/1.1 chunked framing undone, then the coding, then the events.

A compressed watch may be one zstd frame (gzip member) flushed after every batch of events, or a
sequence of complete frames (members): RFC 8878 and RFC 1952 both allow several, and a client
decodes each as it comes. ``Inflater`` decodes either, so the tests that use it hold for any
layout the server chooses, and can still tell that the stream ended on a frame boundary.
"""

from __future__ import annotations

import json
import socket
import zlib
from collections.abc import Callable
from typing import Any, Protocol

from backports.zstd import ZstdDecompressor

from kproxy.testing.proxyproc import RunningProxy


def open_raw(rp: RunningProxy, path: str, *headers: str) -> socket.socket:
    host, port = rp.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    extra = "".join(f"{h}\r\n" for h in headers)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
    sock.settimeout(20)
    return sock


def read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    buf = b""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        assert data, buf
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def split_chunks(buf: bytes) -> tuple[list[bytes], bytes]:
    """Complete HTTP chunks in ``buf`` and what is left."""
    out = []
    while True:
        line, sep, rest = buf.partition(b"\r\n")
        if not sep:
            return out, buf
        size = int(line, 16)
        if len(rest) < size + 2:
            return out, buf
        out.append(rest[:size])
        buf = rest[size + 2 :]


class _Decompressor(Protocol):
    eof: bool
    unused_data: bytes

    def decompress(self, data: bytes) -> bytes: ...


class Inflater:
    """Decodes ``coding`` (``zstd``, ``gzip`` or None) incrementally across frame (member) ends."""

    def __init__(self, coding: str | None) -> None:
        self.coding = coding
        self.frames = 0  # frames (members) started
        self._d: _Decompressor | None = None

    def _new(self) -> _Decompressor:
        self.frames += 1
        if self.coding == "zstd":
            return ZstdDecompressor()  # type: ignore[return-value]
        assert self.coding == "gzip", self.coding
        return zlib.decompressobj(wbits=31)  # type: ignore[return-value]

    def feed(self, data: bytes) -> bytes:
        if self.coding is None:
            return data
        out = []
        while data:
            if self._d is None or self._d.eof:
                self._d = self._new()
            out.append(self._d.decompress(data))
            data = self._d.unused_data if self._d.eof else b""
        return b"".join(out)

    @property
    def complete(self) -> bool:
        """The last frame (member) ended and nothing came after its end."""
        if self.coding is None:
            return True
        return self._d is not None and self._d.eof and not self._d.unused_data


class RawWatch:
    """One watch on ``rp`` with exactly these ``Accept`` and ``Accept-Encoding`` headers.

    ``events`` holds the JSON events decoded so far (``frames`` the protobuf frames: a 4-byte
    big-endian length, then the message); ``ended`` is set by the chunked terminator."""

    def __init__(self, rp: RunningProxy, path: str, coding: str | None, accept: str = "application/json") -> None:
        self.path = path
        self.sock = open_raw(rp, path, f"Accept: {accept}", f"Accept-Encoding: {coding or 'identity'}")
        head, self._wire = read_head(self.sock)
        assert head.startswith(b"HTTP/1.1 200"), head
        fields = dict(line.split(b":", 1) for line in head.split(b"\r\n")[1:])
        headers = {k.strip().lower().decode(): v.strip().decode() for k, v in fields.items()}
        assert headers.get("content-encoding") == coding, head
        assert headers.get("transfer-encoding") == "chunked", head
        self.content_type = headers.get("content-type", "")
        self.protobuf = accept.startswith("application/vnd.kubernetes.protobuf")
        self.inflater = Inflater(coding)
        self.events: list[dict[str, Any]] = []
        self.frames: list[bytes] = []
        self.decoded = b""  # everything decoded, for byte comparisons
        self._partial = b""  # decoded bytes of an event not complete yet
        self.ended = False
        self.after_end = b""  # bytes after the chunked terminator (there must be none)

    def _absorb(self) -> None:
        chunks, self._wire = split_chunks(self._wire)
        for chunk in chunks:
            if self.ended:
                self.after_end += chunk or b"<0>"
                continue
            if not chunk:
                self.ended = True
                self.after_end, self._wire = self._wire, b""
                continue
            data = self.inflater.feed(chunk)
            self.decoded += data
            self._partial += data
        if self.protobuf:
            buf = self._partial
            while len(buf) >= 4 and len(buf) >= 4 + (n := int.from_bytes(buf[:4], "big")):
                self.frames.append(buf[4 : 4 + n])
                buf = buf[4 + n :]
            self._partial = buf
        else:
            *lines, self._partial = self._partial.split(b"\n")
            self.events.extend(json.loads(line) for line in lines)

    def until(self, cond: Callable[[], bool], what: str) -> None:
        """Read (each ``recv`` bounded by the socket's 20 s timeout) until ``cond()`` holds."""
        self._absorb()
        while not cond():
            assert not self.ended, f"{self.path}: the stream ended before {what}"
            data = self.sock.recv(65536)
            assert data, f"{self.path}: the connection closed before {what}"
            self._wire += data
            self._absorb()

    def objects(self) -> list[dict[str, Any]]:
        """The events that are not bookmarks."""
        return [e for e in self.events if e["type"] != "BOOKMARK"]

    def bookmarks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == "BOOKMARK"]

    @property
    def pending(self) -> bytes:
        """Decoded bytes that are not a complete event yet."""
        return self._partial

    def close(self) -> None:
        self.sock.close()
