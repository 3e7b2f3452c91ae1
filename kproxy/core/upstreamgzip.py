"""Decoding a reply the upstream sent gzip-encoded, once, for whoever needs its plain bytes.

With ``upstream_gzip`` the compression filter asks the apiserver for gzip; a filter further down
the chain that must read the body calls ``decode_reply(reply)``: the body becomes the decoded
stream (a body read whole too), ``Content-Encoding`` and ``Content-Length`` go, and a later call (the
compression filter's own) sees a plain body and does nothing more.

The decoded body comes in pieces of at most :data:`PIECE` bytes: deflate reaches a ratio of
1032:1, so one compressed chunk of a few KiB may hold megabytes (a list of objects made of one
repeated byte), and what kproxy holds of a decoded body at once stays what it would hold of the
same body sent plain.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from kproxy.compress import stream
from kproxy.compress.backends import GZIP_WBITS, gzip_module
from kproxy.core.chain import BytesBody, Reply, StreamBody

#: ``Exchange.state`` key set by the compression filter when it asked the upstream for gzip: a
#: filter below that rewrites the request (transcode) keeps ``Accept-Encoding: gzip`` then and
#: decodes the reply with :func:`decode_reply`, instead of asking for an unencoded body.
ASKED = "kproxy.core.upstreamgzip.asked"


#: The most decoded bytes one piece of a body holds (one call into the decoder produces).
PIECE = 256 * 1024


def _ignore(n_in: int, n_out: int, seconds: float) -> None:
    return None


class BoundedGzip:
    """A gzip decoder (multi-member streams included, as the apiserver's watch-list gzip sends)
    whose output comes in pieces of at most ``piece`` bytes, however much one input chunk holds."""

    __slots__ = ("_module", "_obj", "piece")

    def __init__(self, piece: int = PIECE) -> None:
        self._module: Any = gzip_module()
        self._obj: Any = self._module.decompressobj(GZIP_WBITS)
        self.piece = piece

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """The plain bytes of ``data`` (the next compressed chunk), each piece at most ``piece``."""
        obj = self._obj
        while True:
            out = bytes(obj.decompress(data, self.piece))
            if out:
                yield out
            if obj.eof:
                data = obj.unused_data
                if not data:
                    return
                self._obj = obj = self._module.decompressobj(GZIP_WBITS)  # the next member
                continue
            data = obj.unconsumed_tail
            if not data and len(out) < self.piece:
                return  # all input taken and no output pending: the next chunk goes on

    def finish(self) -> Iterator[bytes]:
        """What the decoder still holds at the end of the input (a body cut short: its rest)."""
        yield from self.pieces(b"")
        out = bytes(self._obj.flush())
        for i in range(0, len(out), self.piece):
            yield out[i : i + self.piece]


async def decode_stream(
    chunks: AsyncIterator[bytes], account: stream.Account = _ignore, piece: int = PIECE
) -> AsyncIterator[bytes]:
    """A gzip stream decoded as it arrives, in pieces of at most ``piece`` bytes (account gets
    compressed in, plain out, decoder CPU seconds)."""
    clock = time.thread_time
    dec = BoundedGzip(piece)
    n_in = n_out = 0
    secs = 0.0
    try:
        async for chunk in chunks:
            n_in += len(chunk)
            t = clock()
            for out in dec.pieces(chunk):
                secs += clock() - t
                n_out += len(out)
                yield out
                t = clock()
            secs += clock() - t
        for out in dec.finish():
            n_out += len(out)
            yield out
    finally:
        account(n_in, n_out, secs)


def decode_reply(reply: Reply, account: stream.Account = _ignore) -> bool:
    """Make a gzip-encoded reply body plain; False when it is not gzip (nothing done)."""
    if reply.headers.get("Content-Encoding", "").strip().lower() != "gzip":
        return False
    body = reply.body
    if isinstance(body, BytesBody):
        # A short body read whole (kproxy.server.upstream.READ_WHOLE_LIMIT) may still decode to
        # a thousand times its size: it is decoded as it is read, in pieces, as a stream is.
        reply.body = StreamBody(decode_stream(_once(body.data), account), None, body.media_type)
    elif isinstance(body, StreamBody):
        out = decode_stream(body.chunks(), account)
        reply.body = StreamBody(out, None, body.media_type, on_abort=body.abort, on_end=body.end_cleanly)
    else:
        return False
    reply.headers.popall("Content-Encoding")
    reply.headers.popall("Content-Length", None)
    return True


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data
