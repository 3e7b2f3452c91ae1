"""Streaming compression and decompression of async byte streams.

A large list is compressed chunk by chunk as it arrives from the upstream, never held whole. A
watch stream (``flush_each``) is flushed after every chunk the upstream delivers that ends an
event, which is one event or the batch of events one loop pass received (one codec call for the
batch): the client can decode each event as soon as it is written, while the compressor keeps
its window across events (that shared history is where the ratio on small events comes from).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from kproxy.compress.backends import Decoder, Encoder

#: Called with (bytes in, bytes out, CPU seconds in the codec) as a stream progresses.
Account = Callable[[int, int, float], None]

#: Codec calls between two metric updates of a stream (a metric update per watch event would
#: cost a quarter of what compressing the event does).
ACCOUNT_EVERY = 64
#: A watch stream times one codec call in this many with the thread CPU clock (``cpu_timed``)
#: and scales the rest by bytes: reading ``CLOCK_THREAD_CPUTIME_ID`` is a system call (0.5 us in
#: an idle process, 1.5-2 us in a busy kproxy), three per timed call.
TIME_EVERY = 8


def cpu_timed(call: Callable[[Any], bytes], data: Any) -> tuple[bytes, float]:
    """``call(data)`` and the thread CPU seconds it took, less what reading the clock costs.

    Reading ``CLOCK_THREAD_CPUTIME_ID`` is a system call, and an interval between two reads
    includes about one read. Measured inside kproxy serving ten compressed watches that read
    cost 1.5-2 us (0.5 us in an idle process), a third of what a 4.6 KB gzip event costs: so it
    is read once more just before, and that back-to-back interval is taken off."""
    t0 = _clock()
    t1 = _clock()
    out = call(data)
    t2 = _clock()
    return out, max(0.0, (t2 - t1) - (t1 - t0))


_clock = time.thread_time

#: Bytes of a list gathered per codec call: ISA-L gzip on a pod list, 64 KiB calls 1.50 GB/s at
#: ratio 23.4, 256 KiB calls 1.66 GB/s at 25.5 (zstd is indifferent).
COALESCE = 256 * 1024


def encode(
    chunks: AsyncIterator[bytes],
    encoder: Encoder,
    account: Account,
    *,
    flush_each: bool = False,
    newline_framed: bool = False,
    prefix: bytes = b"",
    coalesce: int = COALESCE,
) -> AsyncIterator[bytes]:
    """``prefix`` (bytes already read to decide on compression) then ``chunks``, compressed.

    Without ``flush_each`` (lists), chunks are gathered to ``coalesce`` bytes per codec call:
    the upstream delivers a body in TLS-record-sized pieces, and a gzip call per 16 KiB costs a
    quarter of the throughput and a fifth of the ratio (the compressor holds data back anyway).
    With ``flush_each`` (watches), every chunk is compressed and flushed at once, or, when
    ``newline_framed`` (JSON watch events end with a newline), flushed at every chunk that ends
    an event: an event split over two reads is flushed when it can be decoded whole, and all
    the events one read brought are compressed and flushed in one codec call. Metrics
    are updated every ``ACCOUNT_EVERY`` codec calls and at the end."""
    if flush_each:
        if prefix:
            chunks = _after(prefix, chunks)
        return _encode_flushed(chunks, encoder, account, newline_framed)
    return _encode_coalesced(chunks, encoder, account, prefix, coalesce)


async def _after(prefix: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield prefix
    async for chunk in chunks:
        yield chunk


async def _encode_coalesced(
    chunks: AsyncIterator[bytes], encoder: Encoder, account: Account, prefix: bytes, coalesce: int
) -> AsyncIterator[bytes]:
    clock = time.thread_time
    n_in = n_out = 0
    secs = 0.0
    held: list[bytes] = [prefix] if prefix else []
    size = len(prefix)
    try:
        async for chunk in chunks:
            held.append(chunk)
            size += len(chunk)
            if size < coalesce:
                continue
            chunk = b"".join(held)
            held.clear()
            size = 0
            t = clock()
            out = encoder.compress(chunk)
            secs += clock() - t
            n_in += len(chunk)
            n_out += len(out)
            if out:
                yield out
        t = clock()
        rest = b"".join(held)
        out = encoder.compress(rest) + encoder.finish()
        secs += clock() - t
        n_in += len(rest)
        n_out += len(out)
        if out:
            yield out
    finally:
        account(n_in, n_out, secs)


async def _encode_flushed(
    chunks: AsyncIterator[bytes], encoder: Encoder, account: Account, newline_framed: bool
) -> AsyncIterator[bytes]:
    """The watch loop: one codec call (compress and flush in one where the codec allows) per
    read that completes an event, the clock read on one call in ``TIME_EVERY``, counters.

    A codec call costs a fixed 2-4 us on top of its bytes when the caches are cold, which they
    are in a proxy serving many watches (measured: an empty zstd flush 2.4 us warm, 4.2 us
    after 8 MB of other work; a 4.6 KB event 4.9 and 10.4 us). The apiserver's 4.6 KB pod
    events arrive in reads of about 4 KiB, most of which end one event and start the next, so
    with JSON (``newline_framed``) the bytes after a read's last newline are held here (no
    codec call) and go into the call that completes their event: one call per read that ends
    an event, each complete event flushed in the read it arrived in."""
    clock = time.thread_time
    compress = encoder.compress
    compress_flush = encoder.compress_flush
    n_in = n_out = calls = timed_in = 0
    timed = finish = 0.0
    held: list[bytes | memoryview] = []  # the start of an event that is not complete yet
    held_size = 0
    try:
        async for chunk in chunks:
            if not chunk:
                continue
            data: bytes | memoryview = chunk
            codec = compress_flush
            if newline_framed and chunk[-1] != 10:
                end = chunk.rfind(b"\n") + 1
                if not end and held_size + len(chunk) < COALESCE:
                    held.append(chunk)  # no event ends here: nothing to send yet
                    held_size += len(chunk)
                    continue
                rest: bytes | memoryview = b""
                if end:
                    view = memoryview(chunk)
                    data, rest = view[:end], view[end:]
                else:
                    codec = compress  # a very large event: bound what is held
                if held:
                    held.append(data)
                    data = b"".join(held)
                    held.clear()
                if rest:
                    held.append(rest)
                held_size = len(rest)
            elif held:
                held.append(chunk)
                data = b"".join(held)
                held.clear()
                held_size = 0
            if calls % TIME_EVERY:
                out = codec(data)
            else:
                out, seconds = cpu_timed(codec, data)
                timed += seconds
                timed_in += len(data)
            n_in += len(data)
            n_out += len(out)
            calls += 1
            if calls >= ACCOUNT_EVERY:
                account(n_in, n_out, timed * n_in / timed_in)
                n_in = n_out = calls = timed_in = 0
                timed = 0.0
            if out:
                yield out
        t = clock()
        # The start of an event the stream ended in, then the trailer.
        out = (encoder.compress(b"".join(held)) if held_size else b"") + encoder.finish()
        finish = clock() - t
        n_in += held_size
        n_out += len(out)
        if out:
            yield out
    finally:
        account(n_in, n_out, (timed * n_in / timed_in if timed_in else 0.0) + finish)


async def decode(chunks: AsyncIterator[bytes], decoder: Decoder, account: Account) -> AsyncIterator[bytes]:
    """A compressed stream decoded as it arrives (account gets compressed in, plain out)."""
    clock = time.thread_time
    n_in = n_out = 0
    secs = 0.0
    try:
        async for chunk in chunks:
            t = clock()
            out = decoder.decompress(chunk)
            secs += clock() - t
            n_in += len(chunk)
            n_out += len(out)
            if out:
                yield out
        out = decoder.finish()
        if out:
            yield out
    finally:
        account(n_in, n_out, secs)


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
