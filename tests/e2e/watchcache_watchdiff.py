"""Differential harness for watches: the same watch straight to the apiserver and through kproxy,
opened at the same moment while a writer changes objects, and every difference named.

How a comparison works:

* :class:`WatchStream` holds one open watch and parses its frames as they arrive (JSON lines, or
  4-byte length-prefixed protobuf ``WatchEvent`` frames), keeping each frame's exact bytes.
* A *recorder* (a direct, unfiltered, cluster-wide watch from the resourceVersion of a list taken
  just before) sees every change with its resourceVersion. From it and the list, the
  :class:`Oracle` derives what each watch request must deliver: the initial ``ADDED`` events in
  storage-key order, then the cacher's selector transitions (stops matching -> ``DELETED`` with
  the old content, starts matching -> ``ADDED``). The oracle says when a stream has everything
  (no fixed sleeps) and checks the harness itself: the apiserver's own stream must agree with it.
* :func:`compare_streams` then compares kproxy's stream with the apiserver's: status, headers,
  and event by event the type, the parsed object and the frame's bytes. Bookmarks are timed by
  each server's own clock, so periodic ones are checked for shape and order rather than matched
  one to one; the initial-events-end bookmark is compared in place with its resourceVersion
  masked (it names the state the initial events showed, which each server picks) and checked
  against what the request allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from corpus.compare import JSON, PROTOBUF, Sides
from watchcache_diff import Mismatches, codec, pb_fields, query_path

from kproxy.localcluster.envtest import ControlPlaneInfo
from kproxy.testing.proxyproc import RunningProxy

__all__ = [
    "JSON_WATCH",
    "PB_CLIENT_GO",
    "PB_WATCH",
    "BearerWatchSides",
    "Event",
    "Oracle",
    "Res",
    "Spec",
    "WatchSides",
    "WatchStream",
    "compare_streams",
    "watch_reads",
]

JSON_WATCH = JSON
PB_WATCH = f"{PROTOBUF};stream=watch"
#: What client-go sends for a built-in resource: protobuf first, JSON as the fallback.
PB_CLIENT_GO = f"{PROTOBUF}, {JSON}"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"

_JSON_RV = re.compile(rb'"resourceVersion":"\d*"')
_TOO_OLD = re.compile(r"^too old resource version: (\d+) \((\d+)\)$")
_TOO_LARGE = re.compile(r"^Timeout: Too large resource version: (\d+), current: (\d+)$")


# --------------------------------------------------------------------------- resources


@dataclass(frozen=True)
class Res:
    """A watched resource: where it lives and how kproxy's metrics name it."""

    label: str  # kproxy_watchcache_* "resource" label: pods, configmaps, gizmos.wcwatch.example.com
    prefix: str  # /api/v1 or /apis/GROUP/VERSION
    plural: str
    kind: str

    def path(self, namespace: str | None = None) -> str:
        if namespace is None:
            return f"{self.prefix}/{self.plural}"
        return f"{self.prefix}/namespaces/{namespace}/{self.plural}"

    def item(self, namespace: str | None, name: str) -> str:
        return f"{self.path(namespace)}/{name}"


def key_of(obj: Mapping[str, Any]) -> str:
    """The object's storage key below the resource prefix: what the cacher sorts initial events by."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))


def rv_of(obj: Mapping[str, Any]) -> int | None:
    value = (obj.get("metadata") or {}).get("resourceVersion")
    return int(value) if isinstance(value, str) and value.isdigit() else None


# --------------------------------------------------------------------------- one open watch


@dataclass
class Event:
    type: str
    obj: dict[str, Any]
    #: The frame exactly as written: a JSON line with its newline, or a protobuf frame with its
    #: 4-byte length prefix.
    raw: bytes
    at: float  # time.monotonic() of arrival

    @property
    def rv(self) -> int | None:
        return rv_of(self.obj)

    @property
    def key(self) -> str:
        return key_of(self.obj)

    @property
    def is_initial_end(self) -> bool:
        annotations = (self.obj.get("metadata") or {}).get("annotations") or {}
        return self.type == "BOOKMARK" and annotations.get(INITIAL_EVENTS_END) == "true"

    def short(self) -> str:
        return f"{self.type} {self.key} rv={self.rv}"


def _decode_pb_frame(frame: bytes) -> tuple[str, dict[str, Any]]:
    """A protobuf WatchEvent (without its length prefix) -> (type, object as JSON-like dict)."""
    fields = {n: v for n, _, v in pb_fields(frame)}
    type_, ext = fields.get(1, b""), fields.get(2, b"")
    assert isinstance(type_, bytes) and isinstance(ext, bytes), frame[:80]
    raw = next((v for n, _, v in pb_fields(ext) if n == 1), b"")
    assert isinstance(raw, bytes)
    return type_.decode(), codec().to_obj(raw)


class WatchStream:
    """One watch request: its status and headers, then every frame as it arrives (read in the
    background until the server ends the stream or the test closes it)."""

    def __init__(self, label: str, url: str) -> None:
        self.label = label
        self.url = url
        self.status = 0
        self.headers: Mapping[str, str] = {}
        self.body = b""  # the whole body of a non-200 answer
        self.events: list[Event] = []
        self.opened_at = 0.0
        self.ended_at: float | None = None  # the server ended the body cleanly
        self.failure: str | None = None  # the body was cut short, or could not be parsed
        self._resp: aiohttp.ClientResponse | None = None
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._protobuf = False
        self._gunzip: Any = None  # a zlib decompressor when the body is gzip-encoded

    @classmethod
    async def open(
        cls,
        session: aiohttp.ClientSession,
        url: str,
        *,
        accept: str | None,
        label: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> WatchStream:
        """Send the request and return once the status line and headers are in (for a 200 the
        server has registered the watch by then: both answer only after that)."""
        stream = cls(label or url, url)
        hdrs = dict(headers or {})
        if accept is not None:
            hdrs["Accept"] = accept
        stream.opened_at = time.monotonic()
        resp = await session.get(url, headers=hdrs, timeout=aiohttp.ClientTimeout(total=None, sock_read=None))
        stream._resp = resp
        stream.status = resp.status
        stream.headers = resp.headers
        if resp.status != 200:
            stream.body = await resp.read()
            stream.ended_at = time.monotonic()
            resp.release()
            return stream
        stream._protobuf = resp.headers.get("Content-Type", "").startswith(PROTOBUF)
        if resp.headers.get("Content-Encoding") == "gzip":  # the apiserver gzips watch-list streams
            stream._gunzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
        stream._task = asyncio.create_task(stream._pump(resp))
        return stream

    async def _pump(self, resp: aiohttp.ClientResponse) -> None:
        buf = bytearray()
        try:
            async for chunk in resp.content.iter_any():
                buf += self._inflate(chunk) if self._gunzip is not None else chunk
                self._parse(buf)
                self._changed.set()
            if buf:
                self.failure = f"stream ended inside a frame ({len(buf)} bytes left: {bytes(buf[:80])!r})"
            self.ended_at = time.monotonic()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as err:
            self.failure = f"stream cut short: {type(err).__name__}: {err}"
        except Exception as err:  # a frame that does not parse is a finding, not a harness crash
            self.failure = f"unparsable frame: {type(err).__name__}: {err}"
        finally:
            self._changed.set()

    def _inflate(self, data: bytes) -> bytes:
        """gzip, where each flush of the apiserver's writer ends a gzip member and starts another
        (``perFlushGzipWriter``): decompress member after member."""
        out = b""
        while data:
            out += self._gunzip.decompress(data)
            if not self._gunzip.eof:
                break
            data = self._gunzip.unused_data
            self._gunzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
        return out

    def _parse(self, buf: bytearray) -> None:
        now = time.monotonic()
        if self._protobuf:
            while len(buf) >= 4:
                n = int.from_bytes(buf[:4], "big")
                if len(buf) < 4 + n:
                    return
                frame = bytes(buf[: 4 + n])
                del buf[: 4 + n]
                type_, obj = _decode_pb_frame(frame[4:])
                self.events.append(Event(type_, obj, frame, now))
        else:
            while (nl := buf.find(b"\n")) >= 0:
                line = bytes(buf[: nl + 1])
                del buf[: nl + 1]
                doc = json.loads(line)
                self.events.append(Event(doc["type"], doc["object"], line, now))

    @property
    def done(self) -> bool:
        return self.ended_at is not None or self.failure is not None

    def content(self) -> list[Event]:
        """The events that are not periodic bookmarks (what two servers must send alike)."""
        return [e for e in self.events if e.type != "BOOKMARK" or e.is_initial_end]

    async def wait_for(self, cond: Callable[[WatchStream], bool], timeout: float) -> bool:
        """Wait (bounded) until ``cond`` holds or the stream is over; whether it holds."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not cond(self):
            if self.done:
                return cond(self)
            left = end - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return cond(self)
        return True

    async def wait_end(self, timeout: float) -> bool:
        return await self.wait_for(lambda s: s.done, timeout)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._resp is not None:
            self._resp.close()


# --------------------------------------------------------------------------- both sides


class WatchSides(Sides):
    """:class:`Sides` with connection pools that do not cap the number of open watches."""

    def __init__(self, cp: ControlPlaneInfo, proxy_url: str) -> None:
        super().__init__(cp, proxy_url)
        skip = ("Accept", "Accept-Encoding", "User-Agent")
        self._direct_w = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=cp.ssl_context(), limit=0), auto_decompress=False, skip_auto_headers=skip
        )
        self._proxy_w = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), auto_decompress=False, skip_auto_headers=skip
        )

    def session(self, via_proxy: bool) -> aiohttp.ClientSession:
        return self._proxy_w if via_proxy else self._direct_w

    async def close(self) -> None:
        await self._direct_w.close()
        await self._proxy_w.close()
        await super().close()

    async def watch(
        self,
        path: str,
        params: Sequence[tuple[str, str]],
        *,
        via_proxy: bool,
        accept: str | None = JSON,
        label: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> WatchStream:
        # ``watch`` is added unless the request spells it itself (or uses the /watch/ path form).
        spelled = any(k == "watch" for k, _ in params) or "/watch/" in path
        full = query_path(path, list(params) if spelled else [("watch", "true"), *params])
        side = "kproxy" if via_proxy else "apiserver"
        return await WatchStream.open(
            self.session(via_proxy),
            self.url(full, via_proxy),
            accept=accept,
            label=f"{side}: {label or full}",
            headers=headers,
        )

    async def pair(
        self,
        path: str,
        params: Sequence[tuple[str, str]],
        *,
        accept: str | None = JSON,
        label: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> tuple[WatchStream, WatchStream]:
        """The same watch opened on both sides at the same moment: (apiserver, kproxy)."""
        direct, proxied = await asyncio.gather(
            self.watch(path, params, via_proxy=False, accept=accept, label=label, headers=headers),
            self.watch(path, params, via_proxy=True, accept=accept, label=label, headers=headers),
        )
        return direct, proxied

    async def get_json(self, path: str, *, via_proxy: bool = False) -> tuple[int, Any]:
        answer = await self.request("GET", path, via_proxy=via_proxy)
        try:
            return answer.status, json.loads(answer.body)
        except ValueError:
            return answer.status, None


class BearerWatchSides(WatchSides):
    """Both sides authenticated by a bearer token only (no client certificate), as the caller of a
    ``credentials: forward`` kproxy is."""

    def __init__(self, cp: ControlPlaneInfo, rp: RunningProxy, token: str) -> None:
        super().__init__(cp, rp.url)
        assert rp.ca_file is not None
        skip = ("Accept", "Accept-Encoding", "User-Agent")
        auth = {"Authorization": f"Bearer {token}"}
        self._direct_b = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=cp.ssl_context(client_cert=False), limit=0),
            auto_decompress=False,
            skip_auto_headers=skip,
            headers=auth,
        )
        self._proxy_b = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl.create_default_context(cafile=str(rp.ca_file)), limit=0),
            auto_decompress=False,
            skip_auto_headers=skip,
            headers=auth,
        )

    def session(self, via_proxy: bool) -> aiohttp.ClientSession:
        return self._proxy_b if via_proxy else self._direct_b

    async def close(self) -> None:
        await self._direct_b.close()
        await self._proxy_b.close()
        await super().close()


# --------------------------------------------------------------------------- what a watch must deliver


Predicate = Callable[[Mapping[str, Any]], bool]


def labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


@dataclass(frozen=True)
class Spec:
    """One watch request and what it means: ``matches`` is its selector (namespace included)
    written out in Python, so the oracle does not lean on any selector code under test."""

    label: str
    res: Res
    namespace: str | None
    params: tuple[tuple[str, str], ...]
    matches: Predicate
    accept: str = JSON
    #: Another spelling of the collection's path (the deprecated ``/watch/`` prefix).
    raw_path: str | None = None
    #: Request headers besides Accept (e.g. Accept-Encoding).
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def path(self) -> str:
        return self.raw_path or self.res.path(self.namespace)

    def values(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for k, v in self.params:
            out.setdefault(k, v)
        return out

    def bookmarks(self) -> bool:
        return _truthy(self.values().get("allowWatchBookmarks"))

    def mode(self) -> str:
        """'initial' (current state as ADDED, then live), 'since' (events after RV N) or 'now'."""
        v = self.values()
        rv = v.get("resourceVersion", "")
        sie = v.get("sendInitialEvents")
        if sie is None:
            return "initial" if rv in ("", "0") else "since"
        if _truthy(sie):
            return "initial"
        return "now" if rv in ("", "0") else "since"

    def since(self) -> int:
        return int(self.values()["resourceVersion"])


def _truthy(value: str | None) -> bool:
    """The apiserver's boolean query parameters: absent, "0" and "false" are false."""
    return value is not None and value.lower() not in ("0", "false")


@dataclass(frozen=True)
class Expected:
    type: str
    key: str
    rv: int | None

    def short(self) -> str:
        return f"{self.type} {self.key} rv={self.rv}"


@dataclass
class Oracle:
    """The resource's whole state at ``list_rv`` and every change after it, in order (from the
    recorder), from which each request's events follow."""

    list_rv: int
    initial: dict[str, dict[str, Any]]
    changes: list[Event] = field(default_factory=list)

    def state_at(self, rv: int) -> dict[str, dict[str, Any]]:
        state = dict(self.initial)
        for e in self.changes:
            if (e.rv or 0) > rv:
                break
            _apply(state, e)
        return state

    def last_rv(self) -> int:
        return max([self.list_rv] + [e.rv or 0 for e in self.changes])

    def expected(self, spec: Spec, opened_at_rv: int) -> list[Expected]:
        """What ``spec`` must deliver when opened while the state was at ``opened_at_rv``."""
        mode = spec.mode()
        start = spec.since() if mode == "since" else opened_at_rv
        state = self.state_at(start)
        out: list[Expected] = []
        if mode == "initial":
            for key in sorted(state, key=lambda k: k.encode()):
                if spec.matches(state[key]):
                    out.append(Expected("ADDED", key, rv_of(state[key])))
            if spec.bookmarks():
                out.append(Expected("BOOKMARK", INITIAL_EVENTS_END, None))
        for e in self.changes:
            if (e.rv or 0) <= start:
                continue
            prev = state.get(e.key)
            _apply(state, e)
            old_m = prev is not None and spec.matches(prev)
            new_m = e.type != "DELETED" and spec.matches(e.obj)
            if e.type == "DELETED":
                if old_m:
                    out.append(Expected("DELETED", e.key, e.rv))
            elif old_m and new_m:
                out.append(Expected("MODIFIED", e.key, e.rv))
            elif new_m:
                out.append(Expected("ADDED", e.key, e.rv))
            elif old_m:
                out.append(Expected("DELETED", e.key, e.rv))
        return out

    def final(self, spec: Spec) -> dict[str, int | None]:
        state = self.state_at(self.last_rv())
        return {k: rv_of(o) for k, o in state.items() if spec.matches(o)}


def _apply(state: dict[str, dict[str, Any]], e: Event) -> None:
    if e.type == "DELETED":
        state.pop(e.key, None)
    elif e.type in ("ADDED", "MODIFIED"):
        state[e.key] = e.obj


def as_expected(events: Iterable[Event]) -> list[Expected]:
    return [
        Expected(e.type, INITIAL_EVENTS_END if e.is_initial_end else e.key, None if e.is_initial_end else e.rv)
        for e in events
    ]


def local_state(events: Iterable[Event]) -> dict[str, int | None]:
    """What a client keeping a local copy from these events ends with (key -> resourceVersion)."""
    state: dict[str, int | None] = {}
    for e in events:
        if e.type in ("ADDED", "MODIFIED"):
            state[e.key] = e.rv
        elif e.type == "DELETED":
            state.pop(e.key, None)
    return state


# --------------------------------------------------------------------------- comparing two streams


def _mask_rv(raw: bytes, rv: int | None, other: int | None) -> bytes:
    """A bookmark frame with its resourceVersion replaced by ``other``'s (JSON: any digits;
    protobuf: the same length-prefixed string, so only RVs of equal length compare byte-wise)."""
    if raw.startswith(b"{"):
        return _JSON_RV.sub(b'"resourceVersion":"RV"', raw)
    if rv is None or other is None or len(str(rv)) != len(str(other)):
        return raw
    a, b = str(rv).encode(), str(other).encode()
    return raw.replace(b"\x32" + bytes([len(a)]) + a, b"\x32" + bytes([len(b)]) + b, 1)


def _first_difference(a: bytes, b: bytes) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    lo, hi = max(0, n - 60), n + 100
    return f"first difference at byte {n} of {len(a)}/{len(b)}: apiserver ...{a[lo:hi]!r} kproxy ...{b[lo:hi]!r}"


def _without_rv(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"}
    return {**obj, "metadata": meta}


def check_order(label: str, events: Sequence[Event], *, initial: bool) -> Mismatches:
    """Resource versions a client can resume from: after the initial events (which come in key
    order), every event is newer than the one before; a bookmark is not older than what came
    before it and every event after a bookmark is newer than it."""
    out = Mismatches()
    seen_end = not initial
    last = 0
    for i, e in enumerate(events):
        if e.type == "ERROR":
            continue
        rv = e.rv
        if rv is None:
            out.add(label, f"event #{i} {e.type} has no numeric resourceVersion", "", e.raw[:200])
            continue
        if not seen_end:
            if e.is_initial_end:
                if rv < last:
                    out.add(label, f"initial-events-end bookmark at {rv} older than an initial object", last, rv)
                seen_end, last = True, rv
            elif e.type == "ADDED":
                last = max(last, rv)
                continue
            else:
                seen_end = True  # no end marker (bookmarks not asked): live events from here
        if e.type == "BOOKMARK":
            if rv < last:
                out.add(label, f"event #{i} bookmark goes back in resourceVersion", last, rv)
            last = max(last, rv)
        elif rv <= last and seen_end and not e.is_initial_end:
            out.add(label, f"event #{i} {e.short()} not newer than the event or bookmark before it", last, rv)
        else:
            last = rv
    return out


def compare_streams(
    label: str,
    direct: WatchStream,
    proxied: WatchStream,
    *,
    bookmarks_asked: bool,
    initial: bool,
    min_end_rv: int = 0,
) -> Mismatches:
    """kproxy's stream against the apiserver's: status, headers, then event by event (types, parsed
    objects, frame bytes). ``min_end_rv``: the least resourceVersion the initial-events-end bookmark
    may carry (a consistent start must not be older than what the test saw just before)."""
    out = Mismatches()
    if direct.status != proxied.status:
        out.add(label, "status", direct.status, proxied.status)
        out.add(label, "body", direct.body[:300], proxied.body[:300])
        return out
    for header in ("Content-Type", "Cache-Control", "Content-Encoding", "Vary"):
        if direct.headers.get(header) != proxied.headers.get(header):
            out.add(label, f"header {header}", direct.headers.get(header), proxied.headers.get(header))
    if direct.status != 200:
        if direct.body != proxied.body:
            out.add(label, f"Status body ({_first_difference(direct.body, proxied.body)})", direct.body, proxied.body)
        return out
    for side in (direct, proxied):
        if side.headers.get("Transfer-Encoding", "").lower() != "chunked" or "Content-Length" in side.headers:
            who = "kproxy" if side is proxied else "apiserver"
            out.add(label, f"{who}: not a chunked body", "chunked", dict(side.headers))
    if proxied.failure:
        out.add(label, "kproxy's stream", "", proxied.failure)
    if direct.failure:
        out.add(label, "harness: the apiserver's stream", direct.failure, "")
    if not bookmarks_asked:
        marks = [e.short() for e in proxied.events if e.type == "BOOKMARK"]
        if marks:
            out.add(label, "bookmarks sent without allowWatchBookmarks", [], marks)
    d, p = direct.content(), proxied.content()
    if [e.type for e in d] != [e.type for e in p] or [e.key for e in d] != [e.key for e in p]:
        out.add(label, f"event sequence ({len(d)} vs {len(p)} events)", [e.short() for e in d], [e.short() for e in p])
    for i, (a, b) in enumerate(zip(d, p, strict=False)):
        if a.type != b.type or a.key != b.key:
            break  # reported above as a whole
        what = f"event #{i} {a.type} {a.key}"
        if a.is_initial_end:
            if b.rv is None or b.rv < min_end_rv:
                out.add(label, f"{what}: resourceVersion older than the state before the watch", min_end_rv, b.rv)
            if _without_rv(a.obj) != _without_rv(b.obj):
                out.add(label, f"{what}: bookmark object", a.obj, b.obj)
            ma, mb = _mask_rv(a.raw, a.rv, b.rv), _mask_rv(b.raw, b.rv, b.rv)
            if (a.raw.startswith(b"{") or len(str(a.rv)) == len(str(b.rv))) and ma != mb:
                out.add(label, f"{what}: bookmark bytes ({_first_difference(ma, mb)})", "", "")
            continue
        if a.type == "ERROR":
            out.extend(compare_error_events(label, a, b))
            continue
        if a.obj != b.obj:
            out.add(label, f"{what}: object", a.obj, b.obj)
        elif a.raw != b.raw:
            out.add(label, f"{what}: frame bytes ({_first_difference(a.raw, b.raw)})", "", "")
    out.extend(check_order(f"{label} [kproxy]", proxied.events, initial=initial))
    return out


def periodic_bookmarks(stream: WatchStream) -> list[Event]:
    return [e for e in stream.events if e.type == "BOOKMARK" and not e.is_initial_end]


def compare_bookmarks(label: str, direct: WatchStream, proxied: WatchStream) -> Mismatches:
    """kproxy's periodic bookmarks against the apiserver's: the same otherwise empty object of the
    watched kind (only the resourceVersion set), the same frame bytes once the resourceVersion is
    masked; and when the apiserver sent one in the time both streams were open, kproxy did too."""
    out = Mismatches()
    theirs, ours = periodic_bookmarks(direct), periodic_bookmarks(proxied)
    if theirs and not ours:
        out.add(label, "periodic bookmarks (count)", len(theirs), 0)
    if not theirs:
        return out
    ref = theirs[0]
    for i, b in enumerate(ours):
        if _without_rv(b.obj) != _without_rv(ref.obj):
            out.add(label, f"bookmark #{i} object", ref.obj, b.obj)
            continue
        ma, mb = _mask_rv(ref.raw, ref.rv, b.rv), _mask_rv(b.raw, b.rv, b.rv)
        if (ref.raw.startswith(b"{") or len(str(ref.rv)) == len(str(b.rv))) and ma != mb:
            out.add(label, f"bookmark #{i} bytes ({_first_difference(ma, mb)})", "", "")
    return out


def _error_numbers(e: Event) -> tuple[str, list[int]]:
    message = str(e.obj.get("message", ""))
    for pattern in (_TOO_OLD, _TOO_LARGE):
        if m := pattern.match(message):
            return pattern.pattern, [int(x) for x in m.groups()]
    return message, []


def compare_error_events(label: str, a: Event, b: Event, *, same_request: bool = True) -> Mismatches:
    """Two ERROR events: byte-equal once the numbers a cache picks itself are masked (the M of
    "too old resource version: N (M)" and "current: M"); with ``same_request`` the requested N too
    must be equal."""
    out = Mismatches()
    (ta, na), (tb, nb) = _error_numbers(a), _error_numbers(b)
    if ta != tb:
        out.add(label, "ERROR message", a.obj.get("message"), b.obj.get("message"))
        return out
    if same_request and na[:1] != nb[:1]:
        out.add(label, "ERROR message: the requested resourceVersion", na[:1], nb[:1])
    same_format = a.raw.startswith(b"{") == b.raw.startswith(b"{")
    masked = [_mask_numbers(x.raw if same_format else b"", x.obj) for x in (a, b)]
    if masked[0] != masked[1]:
        out.add(label, f"ERROR frame ({_first_difference(masked[0], masked[1])})", "", "")
    return out


def _mask_numbers(raw: bytes, obj: Mapping[str, Any]) -> bytes:
    if raw.startswith(b"{"):
        raw = re.sub(rb"too old resource version: \d+ \(\d+\)", b"too old resource version: N (M)", raw)
        return re.sub(
            rb"Too large resource version: \d+, current: \d+", b"Too large resource version: N, current: M", raw
        )
    # Protobuf: lengths change with the digits; compare the decoded object instead.
    text = json.dumps(obj, sort_keys=True)
    text = re.sub(r"too old resource version: \d+ \(\d+\)", "too old resource version: N (M)", text)
    text = re.sub(r"Too large resource version: \d+, current: \d+", "Too large resource version: N, current: M", text)
    return text.encode()


def error_numbers(e: Event) -> list[int]:
    return _error_numbers(e)[1]


# --------------------------------------------------------------------------- kproxy's metrics


def watch_reads(rp: RunningProxy, resource: str, served: str = "cache", *, answers: bool = False) -> float:
    """Watches on ``resource`` counted as ``served``; without ``answers``, not those the cache
    refused with a Status of its own (reason ``status NNN``, e.g. a denied caller's 403)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(rp.metrics()):
        for s in family.samples:
            lb = s.labels
            if (
                s.name == "kproxy_watchcache_reads_total"
                and lb.get("resource") == resource
                and lb.get("verb") == "watch"
                and lb.get("served") == served
                and (answers or not lb.get("reason", "").startswith("status "))
            ):
                total += s.value
    return total


def upstream_reasons(rp: RunningProxy, resource: str) -> dict[str, float]:
    """Why watches on ``resource`` went to the apiserver (for failure messages)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(rp.metrics()):
        for s in family.samples:
            lb = s.labels
            if (
                s.name == "kproxy_watchcache_reads_total"
                and lb.get("resource") == resource
                and lb.get("verb") == "watch"
                and lb.get("served") == "upstream"
            ):
                out[lb.get("reason", "")] = s.value
    return out


# --------------------------------------------------------------------------- writing


class Writer:
    """Changes made straight on the apiserver (as admin), each returning its resourceVersion
    (``None`` for a delete answered with a Status, as configmaps are)."""

    def __init__(self, sides: WatchSides) -> None:
        self.sides = sides
        self.last_rv = 0

    async def _call(self, method: str, path: str, body: Any, content_type: str = "application/json") -> int | None:
        data = json.dumps(body).encode() if body is not None else None
        answer = await self.sides.request(
            method, path, via_proxy=False, data=data, headers={"Content-Type": content_type}
        )
        if answer.status not in (200, 201, 202):
            raise AssertionError(f"{method} {path}: HTTP {answer.status}: {answer.body[:300]!r}")
        doc = answer.json()
        rv = rv_of(doc) if doc.get("kind") != "Status" else None
        if rv is not None:
            self.last_rv = max(self.last_rv, rv)
        return rv

    async def create(self, res: Res, namespace: str | None, obj: dict[str, Any]) -> int | None:
        return await self._call("POST", res.path(namespace), obj)

    async def patch(
        self, res: Res, namespace: str | None, name: str, patch: dict[str, Any], *, status: bool = False
    ) -> int | None:
        path = res.item(namespace, name) + ("/status" if status else "")
        return await self._call("PATCH", path, patch, "application/merge-patch+json")

    async def delete(self, res: Res, namespace: str | None, name: str, *, graceful: bool = False) -> int | None:
        """Deleted at once, or (``graceful``) with the default grace period: a pod bound to a node
        is then only marked (MODIFIED, deletionTimestamp set) and stays, with no kubelet to end it."""
        body = {} if graceful else {"gracePeriodSeconds": 0}
        return await self._call("DELETE", res.item(namespace, name), body)


# --------------------------------------------------------------------------- a whole differential run


@dataclass
class Opened:
    spec: Spec
    direct: WatchStream
    proxied: WatchStream
    #: The last change of the resource before the watch was opened (the state it starts from).
    at_rv: int


class Scenario:
    """One resource: the state listed, a recorder watching every change, watch pairs opened in
    waves between writes, then each pair waited for and compared."""

    def __init__(self, sides: WatchSides, res: Res, *, watcher: WatchSides | None = None) -> None:
        self.sides = sides  # lists, the recorder, kproxy's catching up: as admin
        self.watcher = watcher or sides  # who opens the watches under test
        self.res = res
        self.oracle: Oracle | None = None
        self.recorder: WatchStream | None = None
        self.opened: list[Opened] = []
        #: Events the apiserver delivered over all the pairs (so a test can tell it compared something).
        self.compared = 0

    async def start(self, *, settle_timeout: float = 60.0) -> None:
        """kproxy's cache caught up, the state listed, the recorder watching from there."""
        await self.proxy_caught_up(settle_timeout)
        status, doc = await self.sides.get_json(self.res.path())
        assert status == 200, doc
        list_rv = int(doc["metadata"]["resourceVersion"])
        self.oracle = Oracle(list_rv, {key_of(o): o for o in doc["items"]})
        self.recorder = await self.sides.watch(
            self.res.path(), [("resourceVersion", str(list_rv))], via_proxy=False, label=f"recorder {self.res.label}"
        )
        assert self.recorder.status == 200, self.recorder.body

    async def proxy_caught_up(self, timeout: float) -> None:
        await caught_up(self.sides, self.res, timeout)

    def current_rv(self) -> int:
        assert self.oracle is not None and self.recorder is not None
        rvs = [e.rv or 0 for e in self.recorder.events if e.type != "BOOKMARK"]
        return max([self.oracle.list_rv, *rvs])

    async def seen(self, rv: int, timeout: float = 30.0) -> None:
        """Wait until the recorder has seen the change at ``rv``."""
        assert self.recorder is not None
        ok = await self.recorder.wait_for(
            lambda s: any((e.rv or 0) >= rv for e in s.events if e.type != "BOOKMARK"), timeout
        )
        assert ok, f"the recorder never saw resourceVersion {rv} (failure: {self.recorder.failure})"

    async def open(self, specs: Sequence[Spec]) -> list[Opened]:
        """Open every spec on both sides at once; returns when every answer's headers are in."""
        at = self.current_rv()
        pairs = await asyncio.gather(
            *(
                self.watcher.pair(s.path, s.params, accept=s.accept or None, label=s.label, headers=dict(s.headers))
                for s in specs
            )
        )
        opened = [Opened(s, d, p, at) for s, (d, p) in zip(specs, pairs, strict=True)]
        self.opened += opened
        return opened

    async def finish(self, *, timeout: float = 90.0) -> Mismatches:
        """Wait for every pair to deliver what the oracle says, then compare all of them."""
        assert self.oracle is not None and self.recorder is not None
        self.oracle.changes = [e for e in self.recorder.events if e.type != "BOOKMARK"]
        plans = [(o, self.oracle.expected(o.spec, o.at_rv)) for o in self.opened]

        async def wait(o: Opened, want: list[Expected]) -> None:
            if o.direct.status != 200:
                return
            n = len(want)
            await asyncio.gather(
                o.direct.wait_for(lambda s: len(s.content()) >= n, timeout),
                o.proxied.wait_for(lambda s: len(s.content()) >= n, timeout),
            )

        await asyncio.gather(*(wait(o, want) for o, want in plans))
        out = Mismatches()
        for o, want in plans:
            out.extend(self._check(o, want))
            self.compared += len(o.direct.events)
        return out

    def _check(self, o: Opened, want: list[Expected]) -> Mismatches:
        assert self.oracle is not None
        spec = o.spec
        label = f"{spec.label} [{spec.accept}] {query_path(spec.path, [('watch', 'true'), *spec.params])}"
        out = Mismatches()
        if o.direct.status == 200:
            got = as_expected(o.direct.content())
            if got != want:
                out.add(
                    label,
                    "harness: the apiserver's events differ from what the recorder predicts",
                    [e.short() for e in want],
                    [e.short() for e in got],
                )
        mode = spec.mode()
        rv = spec.values().get("resourceVersion", "")
        min_end = o.at_rv if rv == "" else (int(rv) if rv.isdigit() else 0)
        out.extend(
            compare_streams(
                label,
                o.direct,
                o.proxied,
                bookmarks_asked=spec.bookmarks(),
                initial=mode == "initial",
                min_end_rv=min_end,
            )
        )
        if mode == "initial" and o.proxied.status == 200:
            final = self.oracle.final(spec)
            have = local_state(o.proxied.content())
            if have != final:
                out.add(label, "final state of a client keeping a copy from kproxy's events", final, have)
        return out

    async def close(self) -> None:
        streams = [s for o in self.opened for s in (o.direct, o.proxied)]
        if self.recorder is not None:
            streams.append(self.recorder)
        await asyncio.gather(*(s.close() for s in streams))


async def caught_up(sides: WatchSides, res: Res, timeout: float = 60.0) -> None:
    """Wait (bounded) until a consistent list through kproxy equals the apiserver's (the cache
    waits for the upstream's current resourceVersion before answering one)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    last: Any = None
    while loop.time() < end:
        (sd, dd), (sp, dp) = await asyncio.gather(
            sides.get_json(res.path()), sides.get_json(res.path(), via_proxy=True)
        )
        if sd == sp == 200 and _names(dd) == _names(dp):
            return
        last = (sd, sp, _names(dd)[:5], _names(dp)[:5] if sp == 200 else dp)
        await asyncio.sleep(0.1)
    raise AssertionError(f"kproxy's {res.label} never caught up with the apiserver: {last}")


def _names(doc: Any) -> list[tuple[str, str, str]]:
    if not isinstance(doc, dict):
        return []
    return [
        (i["metadata"].get("namespace", ""), i["metadata"]["name"], i["metadata"].get("resourceVersion", ""))
        for i in doc.get("items") or []
    ]
