"""A watch served from the cache: wait until the cache may answer, then the event stream.

Errors the apiserver reports inside the stream
(staging/src/k8s.io/apiserver/pkg/endpoints/handlers/watch.go) are reported the same way here: a
``200``, one ``ERROR`` event carrying the Status, and the end of the stream: a resource version
older than the history (``410 Expired``, ``too old resource version: N (M)``), or one the cache does
not reach in time for initial events (``504``, ``Too large resource version``).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

from multidict import CIMultiDict

from kproxy.cacher import ADDED, CachedObject
from kproxy.cacher.broadcaster import Selection
from kproxy.compress.backends import gzip_codec
from kproxy.compress.shared import WatchCoding
from kproxy.core.chain import Reply
from kproxy.core.eventstream import EventStreamBody, Starter
from kproxy.core.status import StatusCause, StatusError, resource_expired, timeout

from .frames import CONTENT_TYPES
from .partial import base_media
from .resource_cache import ResourceCache
from .watch_plan import WatchRead

log = logging.getLogger("kproxy.watchcache")
_MAX_BODIES = 64  # bodies kept per resource (shared with whole lists)


#: The apiserver's watch-list gzip (1.37's ``WatchListCompression``): every write is one complete
#: member (``WatchCoding.solo``: laid out as Go's gzip writer leaves it after ``Flush`` then
#: ``Close``, so that client-go's reader hands the events over at the sync point), at level 1 as
#: the apiserver's ``gzipContentEncodingLevel``.
WATCH_LIST_GZIP = WatchCoding(gzip_codec(1), shared=False)


def too_large_rv(want: int, current: int) -> StatusError:
    """``storage.NewTooLargeResourceVersionError`` as the cacher returns it (retry after 1 s)."""
    return timeout(
        f"Too large resource version: {want}, current: {current}",
        retry_after_seconds=1,
        causes=[StatusCause("ResourceVersionTooLarge", "Too large resource version")],
    )


def too_old_rv(want: int, bound: int) -> StatusError:
    """The watch cache's ``too old resource version`` (``watch_cache_history.go``)."""
    return resource_expired(f"too old resource version: {want} ({bound})")


async def open_watch(rc: ResourceCache, read: WatchRead, *, wait: float, min_timeout: float) -> Reply | None:
    """The reply to a watch the cache serves, or None when the upstream should answer it (the
    cache cannot confirm a consistent state in time, or is catching up after a break)."""
    cache = rc.cache
    error: StatusError | None = None
    if read.consistency == "consistent":
        try:
            want = await rc.reflector.current_rv()  # a state loaded from disk is compared first
        except Exception as err:
            log.debug("watchcache: %s: consistent watch probe failed: %s", rc.spec.label, err)
            return None
        # Loaded from disk and not yet answered by the resumed watch: maybe ahead of the apiserver.
        if not rc.confirmed or not await rc.fresh(want, wait):
            return None
    elif read.consistency == "min" and not await rc.fresh(read.rv, wait):
        if not rc.reflector.live:
            return None
        error = too_large_rv(read.rv, cache.rv)
    seconds = read.timeout_seconds or random.uniform(min_timeout, 2 * min_timeout)
    headers = CIMultiDict({"Cache-Control": "no-cache, private", "Content-Type": CONTENT_TYPES[read.media_type]})
    if read.gzip:
        headers["Content-Encoding"] = "gzip"
        headers["Vary"] = "Accept-Encoding"
    return Reply(200, headers, EventStreamBody(base_media(read.media_type)[0], _starter(rc, read, seconds, error)))


def _starter(rc: ResourceCache, read: WatchRead, seconds: float, error: StatusError | None) -> Starter:
    """What runs when the stream is attached to its client: the watcher is registered at that
    moment, in one step with what it gets first, so no event falls in between."""

    def start(sink: Any, coding: WatchCoding | None) -> Callable[[], None]:
        cache, frames, media = rc.cache, rc.frames, read.media_type
        if coding is None and read.gzip:
            coding = WATCH_LIST_GZIP
        compress = coding.solo if coding is not None else None
        if not cache.ready:
            # The resource stopped being served since the watch was planned (its CRD deleted):
            # the apiserver ends its watches then, without an event; so does this one.
            sink.close()
            return _nothing
        failure = error
        if failure is None and read.consistency == "since" and not cache.history.covers(read.rv):
            failure = too_old_rv(read.rv, cache.history.too_old_bound())
        if failure is not None:
            frame = frames.error(failure.to_dict(), media)
            sink.write(compress(frame) if compress is not None else frame)
            sink.close()
            return _nothing
        labels, fields = read.labels, read.fields
        predicate = None
        if labels is not None or fields is not None:

            def predicate(o: CachedObject) -> bool:
                return (labels is None or labels.matches(o.labels)) and (fields is None or fields.matches(o.fields))

        selection = Selection(read.namespace, predicate, (read.namespace, read.label_text, read.field_text))
        bc = rc.broadcaster
        if read.initial:
            # Any complete frame of the coding decodes, whatever its level: the name is the key.
            key = ("watch", media, coding.name if coding else "", read.namespace, read.label_text, read.field_text)

            def initial_body(objects: Sequence[CachedObject]) -> bytes | None:
                found = cache.bodies.get(key)
                if not isinstance(found, bytes):
                    try:
                        found = frames.events(ADDED, objects, media)
                    except Exception:  # an object that cannot be encoded: the broadcaster
                        return None  # makes the events one by one and ends this watch at it
                    if compress is not None and found:
                        # Never an empty member: client-go's gzip reader stops at one (the
                        # apiserver's first member is the end bookmark when there is no object).
                        found = compress(found)
                    if len(cache.bodies) >= _MAX_BODIES:
                        cache.bodies.clear()
                    cache.bodies[key] = found
                return found

            w = bc.watch_initial(
                sink,
                selection,
                media,
                bookmarks=read.bookmarks,
                initial_events_end=read.initial_events_end,
                timeout=seconds,
                initial_body=initial_body,
                coding=coding,
            )
        else:
            since = read.rv if read.consistency == "since" else cache.rv
            w = bc.watch_since(
                sink, selection, media, bookmarks=read.bookmarks, timeout=seconds, rv=since, coding=coding
            )
        return lambda: bc.close(w)

    return start


def _nothing() -> None:
    pass
