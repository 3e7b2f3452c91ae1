"""The line of a list+watch to the apiserver (the watch cache's, and the discovery service's CRD
watch): list, watch and freshness probes over kproxy's own credentials (``ctx.api``), in protobuf
for built-in kinds and JSON for the rest.

Across a slow link (the round trip kproxy measures, ``kproxy.core.upstreamlink``, at least
``GZIP_RTT``) the cache's lists ask for gzip, as ``upstream_gzip: auto`` does for callers'
reads: the apiserver gzips a list of more than 128 KiB (``responsewriters.defaultGzipThresholdBytes``)
and, from 1.37, a streaming list (a watch with ``sendInitialEvents``: its initial events and the
live events after them, one gzip member per flush; ``handlers/watch.go``). A plain watch is never
gzipped, so a resumed watch and a freshness probe ask for nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlencode

import msgspec
import orjson

from kproxy.cacher import (
    BOOKMARK,
    Expired,
    Kind,
    ListPage,
    NotServed,
    StreamingListUnsupported,
    TooLarge,
    UpstreamEvent,
)
from kproxy.cacher.ingest import ObjectFactory, list_meta_rv, split_list
from kproxy.codec import decode_envelope, encode_envelope
from kproxy.codec.envelope import parse_watch_event
from kproxy.compress import stream
from kproxy.compress.backends import gzip_decoder
from kproxy.core.chunkreader import ChunkReader
from kproxy.core.negotiation import PROTOBUF
from kproxy.core.ownapi import OwnApi
from kproxy.core.upstreamlink import MIN_SAMPLES

log = logging.getLogger("kproxy.watchcache.upstream")

# A name no object can have (names are DNS subdomains): a selector that matches nothing.
_NOTHING = "metadata.name=.kproxy-matches-nothing"
_MAX_FRAME = 64 << 20
#: The measured round trip from which the cache's lists ask for gzip: the compression filter's
#: default ``upstream_gzip_rtt`` (a WAN; next to the apiserver the apiserver's CPU costs more
#: than the bytes it saves).
GZIP_RTT = 0.010
# One measurement of the link at a time per upstream (kproxy's own client of it).
_MEASURING: weakref.WeakKeyDictionary[OwnApi, asyncio.Lock] = weakref.WeakKeyDictionary()


class UpstreamError(Exception):
    pass


class ListTarget(Protocol):
    """The resource a lister-watcher follows (the watch cache's ``ResourceSpec`` is one)."""

    @property
    def list_path(self) -> str: ...
    @property
    def kind(self) -> Kind: ...


class _JsonEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw


_decode_event = msgspec.json.Decoder(_JsonEvent).decode


def _status_error(status: int, body: bytes) -> Exception:
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    message = obj.get("message", "") if isinstance(obj, dict) else body[:200].decode("utf-8", "replace")
    if status == 410 or (
        isinstance(obj, dict) and (obj.get("code") == 410 or obj.get("reason") in ("Expired", "Gone"))
    ):
        return Expired(message)
    if status == 404:
        return NotServed(message)
    # storage.NewTooLargeResourceVersionError (apiserver/pkg/storage/errors.go): a Timeout whose
    # cause is ResourceVersionTooLarge, as the HTTP status or a watch's ERROR event.
    causes = ((obj.get("details") or {}).get("causes") or []) if isinstance(obj, dict) else []
    if any(isinstance(c, dict) and c.get("reason") == "ResourceVersionTooLarge" for c in causes) or (
        str(message).startswith("Too large resource version")
    ):
        return TooLarge(message)
    return UpstreamError(f"upstream answered {status}: {message}")


@dataclass(slots=True)
class HttpListerWatcher:
    api: OwnApi
    spec: ListTarget
    factory: ObjectFactory
    watch_timeout: tuple[int, int] = (300, 600)
    #: Ask for gzip from this measured round trip up (None: never).
    gzip_rtt: float | None = GZIP_RTT
    #: Lists (and streaming lists) that asked for gzip, and those the apiserver answered with it.
    gzip_asked: int = 0
    gzip_answered: int = 0

    @property
    def _accept(self) -> str:
        return PROTOBUF if self.spec.kind.protobuf else "application/json"

    async def _measured(self) -> None:
        """Make sure the link is measured before a list decides on gzip: kproxy's first list of
        a resource usually comes before it has sent enough requests for an estimate. A few
        ``/version`` reads (the apiserver's cheapest answer) are samples of the round trip, one
        resource at a time (the others then find the estimate made)."""
        if self.gzip_rtt is None or self.api.rtt is not None:
            return
        lock = _MEASURING.setdefault(self.api, asyncio.Lock())
        async with lock:
            for _ in range(MIN_SAMPLES):
                if self.api.rtt is not None:
                    return
                try:
                    async with self.api.request("GET", "/version", timeout=10.0) as resp:
                        await resp.read()
                except Exception as err:  # the list itself then meets (and reports) the failure
                    log.debug("measuring the link: %s", err)
                    return

    def _list_headers(self) -> dict[str, str]:
        headers = {"Accept": self._accept}
        rtt = self.api.rtt
        if self.gzip_rtt is not None and rtt is not None and rtt >= self.gzip_rtt:
            headers["Accept-Encoding"] = "gzip"
            self.gzip_asked += 1
        return headers

    def _encoding(self, resp: Any, asked: bool) -> bool:
        """Whether the body is gzip (only when asked for: any other coding is an error)."""
        coding = resp.headers.get("Content-Encoding", "").strip().lower()
        if not coding or coding == "identity":
            return False
        if coding == "gzip" and asked:
            self.gzip_answered += 1
            return True
        raise UpstreamError(f"upstream answered with Content-Encoding {coding!r}")

    def _target(self, query: dict[str, str]) -> str:
        return f"{self.spec.list_path}?{urlencode(query)}"

    async def _get_list(self, query: dict[str, str], *, small: bool = False) -> ListPage:
        log.debug("upstream list %s", self._target(query))
        headers = {"Accept": self._accept} if small else self._list_headers()
        async with self.api.request("GET", self._target(query), headers=headers, timeout=120.0) as resp:
            body = await resp.read()
            if self._encoding(resp, "Accept-Encoding" in headers):
                dec = gzip_decoder()
                body = dec.decompress(body) + dec.finish()
            if resp.status != 200:
                raise _status_error(resp.status, body)
            ctype = resp.headers.get("Content-Type", "")
        factory = self.factory
        if ctype.startswith(PROTOBUF):
            meta, items = split_list(decode_envelope(body).raw)
            rv, cont = list_meta_rv(meta)
            return ListPage([factory.from_proto(i) for i in items], rv, cont)
        doc = msgspec.json.decode(body, type=_RawList)  # items kept as their exact bytes
        meta_obj = doc.metadata
        objects = [factory.from_json(bytes(r)) for r in doc.items]
        return ListPage(objects, int(meta_obj.get("resourceVersion") or 0), meta_obj.get("continue") or "")

    async def list(self, *, limit: int, continue_token: str) -> ListPage:
        await self._measured()
        query = {"limit": str(limit)}
        if continue_token:
            query["continue"] = continue_token
        return await self._get_list(query)

    async def current_rv(self) -> int:
        return (await self._get_list({"limit": "1", "fieldSelector": _NOTHING}, small=True)).rv

    async def servable_at(self, rv: int) -> bool:
        """An exact list of one item at ``rv``: the apiserver decides it as it decides a continue
        at ``rv`` (its snapshot, else etcd), so 200 says a token at ``rv`` still works and 410
        that etcd compacted it. Only the status matters; the body is read and dropped."""
        query = {"resourceVersion": str(rv), "resourceVersionMatch": "Exact", "limit": "1"}
        async with self.api.request("GET", self._target(query), headers={"Accept": self._accept}, timeout=30.0) as resp:
            body = await resp.read()
            if resp.status == 200:
                return True
        err = _status_error(resp.status, body)
        if isinstance(err, Expired):
            return False
        raise err

    async def progress_rv(self) -> int:
        query = {
            "watch": "1",
            "sendInitialEvents": "true",
            "resourceVersionMatch": "NotOlderThan",
            "allowWatchBookmarks": "true",
            "fieldSelector": _NOTHING,
            "timeoutSeconds": "10",
        }
        async for ev in self._watch(query):
            if ev.type == BOOKMARK and ev.initial_events_end:
                return ev.rv
        raise UpstreamError("the progress probe ended without its bookmark")

    def watch(self, *, resource_version: str, send_initial_events: bool) -> AsyncIterator[UpstreamEvent]:
        lo, hi = self.watch_timeout
        query = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(random.randint(lo, hi)),
        }
        if send_initial_events:
            query["sendInitialEvents"] = "true"
            query["resourceVersionMatch"] = "NotOlderThan"
            return self._streaming_list(query)
        query["resourceVersion"] = resource_version
        return self._watch(query)

    async def _streaming_list(self, query: dict[str, str]) -> AsyncIterator[UpstreamEvent]:
        await self._measured()
        async for ev in self._watch(query, self._list_headers()):
            yield ev

    async def _watch(
        self, query: dict[str, str], headers: dict[str, str] | None = None
    ) -> AsyncIterator[UpstreamEvent]:
        log.debug("upstream watch %s", self._target(query))
        headers = headers or {"Accept": self._accept}
        async with self.api.request("GET", self._target(query), headers=headers, timeout=None) as resp:
            gzipped = self._encoding(resp, "Accept-Encoding" in headers)
            if resp.status != 200:
                body = await resp.read()
                if gzipped:
                    dec = gzip_decoder()
                    body = dec.decompress(body) + dec.finish()
                if resp.status == 422 and "sendInitialEvents" in query:
                    raise StreamingListUnsupported(body[:300].decode("utf-8", "replace"))
                raise _status_error(resp.status, body)
            content: Any = resp.content
            if gzipped:
                raw = resp.chunks() if hasattr(resp, "chunks") else resp.content.iter_any()
                content = _Gunzipped(raw)
            ctype = resp.headers.get("Content-Type", "")
            if ctype.startswith(PROTOBUF):
                async for ev in self._proto_events(content):
                    yield ev
            else:
                async for line in content:
                    if line.strip():
                        yield self._json_event(line)

    async def _proto_events(self, content: Any) -> AsyncIterator[UpstreamEvent]:
        factory = self.factory
        while True:
            try:
                head = await content.readexactly(4)
            except Exception as err:  # IncompleteReadError at a clean end of stream
                if getattr(err, "partial", None) == b"":
                    return
                raise
            n = int.from_bytes(head, "big")
            if n > _MAX_FRAME:
                raise UpstreamError(f"watch frame of {n} bytes")
            frame = await content.readexactly(n)
            type_, raw = parse_watch_event(frame)
            env = decode_envelope(raw)
            if type_ == "ERROR":
                try:
                    status = factory.codec.to_obj(encode_envelope(env.api_version, env.kind, env.raw))
                except Exception:  # an unreadable Status is still an error
                    status = {"message": "unreadable watch error"}
                raise _status_error(500, orjson.dumps(status))
            if type_ == BOOKMARK:
                rv, end = factory.bookmark_rv_proto(env.raw)
                yield UpstreamEvent(BOOKMARK, rv, None, end)
                continue
            obj = factory.from_proto(env.raw)
            yield UpstreamEvent(type_, obj.rv, obj)

    def _json_event(self, line: bytes) -> UpstreamEvent:
        ev = _decode_event(line)
        raw = bytes(ev.object)
        if ev.type == "ERROR":
            raise _status_error(500, raw)
        if ev.type == BOOKMARK:
            meta = (orjson.loads(raw).get("metadata")) or {}
            end = (meta.get("annotations") or {}).get("k8s.io/initial-events-end") == "true"
            return UpstreamEvent(BOOKMARK, int(meta.get("resourceVersion") or 0), None, end)
        obj = self.factory.from_json(raw)
        return UpstreamEvent(ev.type, obj.rv, obj)


class _RawList(msgspec.Struct):
    metadata: dict[str, Any] = {}
    items: list[msgspec.Raw] = []


def _count(n_in: int, n_out: int, seconds: float) -> None:
    log.debug("gzip stream: %d bytes in, %d out, %.3f s", n_in, n_out, seconds)


class _Gunzipped(ChunkReader):
    """``readexactly`` and line iteration over a gzip body (every member), decoded as it arrives.
    A line longer than a watch frame may be is an error, not a buffer that grows without end."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        super().__init__(
            stream.decode(chunks, gzip_decoder(), _count),
            max_line=_MAX_FRAME,
            too_long=lambda n: UpstreamError(f"watch event of more than {n} bytes"),
        )


