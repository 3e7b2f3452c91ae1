"""Doubles for driving kproxy's upstream HTTP/2 client (``kproxy.server.http2.client.H2Conn``) in
memory: the pool settings a connection reads, a transport that negotiated ``h2``, and frames."""

from __future__ import annotations

from typing import Any


class FakeH2Pool:
    """What an ``H2Conn`` reads of its pool (kproxy's defaults)."""

    read_idle_timeout = 30.0
    ping_timeout = 15.0
    idle_timeout = 90.0
    connection_window = 1 << 30

    def retire(self, conn: Any) -> None:
        pass


class _Alpn:
    def selected_alpn_protocol(self) -> str:
        return "h2"


class MemoryTransport:
    """A TLS transport that chose ``h2`` by ALPN; what is written is kept in ``written`` (or
    dropped, ``keep=False``)."""

    def __init__(self, keep: bool = True) -> None:
        self.written = bytearray()
        self._keep = keep

    def get_extra_info(self, key: str, default: Any = None) -> Any:
        return _Alpn() if key == "ssl_object" else default

    def write(self, data: bytes) -> None:
        if self._keep:
            self.written += data

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


def frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    """An HTTP/2 frame: its 9-byte head, then ``payload``."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload
