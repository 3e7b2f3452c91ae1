"""Streaming compression and decompression of async byte streams.

A large list is compressed chunk by chunk as it arrives from the upstream, never held whole. A
watch stream (``flush_each``) is flushed after every chunk the upstream delivers, which is one
event or the batch of events one loop pass received: the client can decode each event as soon
as it is written, while the compressor keeps its window across events (that shared history is
where the ratio on small events comes from).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable

from kproxy.compress.backends import Decoder, Encoder

#: Called with (bytes in, bytes out, CPU seconds) as a stream progresses.
Account = Callable[[int, int, float], None]


async def encode(
    chunks: AsyncIterator[bytes],
    encoder: Encoder,
    account: Account,
    *,
    flush_each: bool = False,
    prefix: bytes = b"",
) -> AsyncIterator[bytes]:
    """``prefix`` (bytes already read to decide on compression) then ``chunks``, compressed."""
    clock = time.thread_time
    if prefix:
        t = clock()
        out = encoder.compress(prefix)
        if flush_each:
            out += encoder.flush()
        account(len(prefix), len(out), clock() - t)
        if out:
            yield out
    async for chunk in chunks:
        if not chunk:
            continue
        t = clock()
        out = encoder.compress(chunk)
        if flush_each:
            out += encoder.flush()
        account(len(chunk), len(out), clock() - t)
        if out:
            yield out
    t = clock()
    out = encoder.finish()
    account(0, len(out), clock() - t)
    if out:
        yield out


async def decode(chunks: AsyncIterator[bytes], decoder: Decoder, account: Account) -> AsyncIterator[bytes]:
    """A compressed stream decoded as it arrives (account gets compressed in, plain out)."""
    clock = time.thread_time
    async for chunk in chunks:
        t = clock()
        out = decoder.decompress(chunk)
        account(len(chunk), len(out), clock() - t)
        if out:
            yield out
    out = decoder.finish()
    if out:
        yield out


async def peek(chunks: AsyncIterator[bytes], size: int) -> tuple[bytes, bool]:
    """Read until more than ``size`` bytes arrived or the stream ended: (bytes read, ended).

    This is how a body of unknown length is measured against the threshold: the response head
    (which says whether the body is compressed) waits for at most ``size`` bytes."""
    parts: list[bytes] = []
    total = 0
    async for chunk in chunks:
        parts.append(chunk)
        total += len(chunk)
        if total > size:
            return b"".join(parts), False
    return b"".join(parts), True
