"""A write's own event before its answer: the answer to a write of a cached resource waits, a
bounded time, until the cache has written the write's event to its watchers.

Why: the controllers check, before they act on an object again, that their informer has seen the
resource version of their last write to it (``pkg/controller/util/consistency/consistency.go``:
``EnsureReady`` compares the version written with the informer store's
``LastStoreSyncResourceVersion``, which every event and bookmark of the resource advances; when it
is behind, the sync is skipped and retried with backoff, logging ``read version: N is not as new as
written version: M``). Directly, the apiserver's watch cache sends the event about when the write's
answer leaves. Through kproxy both cross one more process, and the event crosses more of its loop
(the upstream read, the cache, the write pass to the watchers) than the answer: under load it comes
behind it, and the controller finds its informer behind its own write several times as often.

kproxy sees both, so it orders them: the answer (its resource version read from the body) is held
until the cache has reached that version and the write pass after it has run. A client watching
the resource through kproxy then has the event on its watch before it has the answer. Bounded:
``write_wait`` seconds at most, and only while the cache's upstream watch is live (a cache that is
relisting or reconnecting would make every write wait the whole bound for nothing). Dry runs
(nothing stored, no event), answers without a resource version (a ``Status``), compressed
answers and subresources that do not store the object itself are passed on at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

from kproxy.cacher.ingest import object_rv
from kproxy.codec import MAGIC, CodecError, decode_envelope
from kproxy.core.chain import BytesBody, Exchange, Reply, StreamBody

from .resource_cache import ResourceCache

#: The verbs that store an object and answer with it.
WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})
#: Subresources whose writes store the object itself, so that its own watch carries the event (a
#: ``binding`` or an ``eviction`` answers with a Status; a ``token`` stores nothing).
OBJECT_SUBRESOURCES = frozenset({"", "status", "scale", "ephemeralcontainers", "resize"})
#: Answers larger than this are passed on as they stream (no object is this large: etcd's limit
#: is 1.5 MiB of protobuf).
MAX_ANSWER = 4 << 20


def written_rv(data: bytes) -> int | None:
    """The resource version of the object in a write's answer (JSON or protobuf), or None."""
    if data.startswith(MAGIC):
        try:
            return object_rv(decode_envelope(data).raw)
        except CodecError:
            return None
    if not data.startswith(b"{"):
        return None  # YAML, or not an object: no wait
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return int(rv) if isinstance(rv, str) and rv.isascii() and rv.isdigit() else None


async def own_event_first(
    rc: ResourceCache, ex: Exchange, reply: Reply, timeout: float, observe: Any | None = None
) -> Reply:
    """``reply`` (the upstream's answer to a write of ``rc``'s resource), once the cache has written
    the write's event to its watchers or ``timeout`` seconds have passed. ``observe(outcome,
    seconds)`` is told how long it waited (outcome ``delivered`` or ``timeout``)."""
    if reply.status not in (200, 201, 202) or timeout <= 0 or "dryRun" in ex.query:
        return reply
    if reply.headers.get("Content-Encoding", "identity").lower() != "identity":
        return reply
    cache = rc.cache
    if not cache.ready or not rc.reflector.live:
        return reply
    data, reply = await _read_bounded(reply)
    if data is None:
        return reply
    rv = written_rv(data)
    if rv is None:
        return reply
    start = time.monotonic()  # not the loop's clock: uvloop's counts whole milliseconds
    reached = cache.rv >= rv or await cache.wait_until(rv, timeout)
    if reached:
        try:
            await asyncio.wait_for(rc.broadcaster.flushed(), max(timeout - (time.monotonic() - start), 0.0))
        except TimeoutError:
            reached = False
    if observe is not None:
        observe("delivered" if reached else "timeout", time.monotonic() - start)
    return reply


async def _read_bounded(reply: Reply) -> tuple[bytes | None, Reply]:
    """The answer's bytes and the reply to pass on (the same bytes); (None, a reply that streams
    as the original would) when it is not a plain body, is larger than :data:`MAX_ANSWER`, or
    breaks off while read."""
    body = reply.body
    if isinstance(body, BytesBody):
        return body.data, reply
    if type(body) is not StreamBody or (body.length is not None and body.length > MAX_ANSWER):
        return None, reply
    chunks = body.chunks()
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in chunks:
            parts.append(chunk)
            size += len(chunk)
            if size > MAX_ANSWER:
                break
        else:
            data = b"".join(parts)
            return data, Reply(reply.status, reply.headers, BytesBody(data, body.media_type), reply.reason)
        rest: Exception | AsyncIterator[bytes] = chunks
    except Exception as err:  # the upstream broke off: the client sees that as it would have
        rest = err
    replay = StreamBody(
        _replay(parts, rest), body.length, body.media_type, on_abort=body.abort, on_end=body.end_cleanly
    )
    return None, Reply(reply.status, reply.headers, replay, reply.reason)


async def _replay(parts: list[bytes], rest: Exception | AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    if isinstance(rest, Exception):
        raise rest
    async for chunk in rest:
        yield chunk
