"""The ``compression`` filter: zstd or gzip responses for every client that asks, watches included.

The apiserver gzips only bodies over 128 KiB, only for the exact token ``gzip`` and never watch
streams. This filter negotiates ``Accept-Encoding`` properly (``kproxy.compress.negotiate``),
compresses with the fastest installed backends, streams large lists through the compressor as
they arrive, and (``watch: true``) compresses watch streams with a flush after every batch of
events: a watch passed through to the apiserver with a compressor of its own, a watch served
from the watch cache where it is fanned out, with one compressor for all the watchers in step
(``kproxy.cacher.shared_stream``). The apiserver does no compression work: for a request this
filter will encode, the upstream request carries no ``Accept-Encoding`` (or ``gzip`` when ``upstream_gzip`` says the
upstream link is the expensive part, in which case a gzip body is passed through untouched to a
gzip client and decoded once otherwise). ``upstream_gzip: auto`` (the default) asks for gzip on
reads (GET, not watches or followed logs) while the round trip kproxy measures to the upstream
(``kproxy.core.upstreamlink``) is at least ``upstream_gzip_rtt``: across a WAN the transfer is the
cost and the apiserver's gzip passed through saves most of it; next to the apiserver its gzip
would only move compression work onto it.

Place it first in the chain (outermost): every other filter then sees plain bodies, and what it
sends back is what gets compressed. A filter below it that needs the body of a reply the
upstream gzipped calls ``kproxy.core.upstreamgzip.decode_reply`` (decodes once).

Package: this module is the filter (``kproxy.core.upstreamgzip`` decodes a gzip reply once for any filter).
May import: ``kproxy.core``, ``kproxy.identity``, the engines and ``kproxy.config``;
never another filter nor ``kproxy.server``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from typing import ClassVar, Literal

from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, ConfigDict, Field, field_validator

from kproxy.compress import stream
from kproxy.compress.backends import Codec, codec, gzip_library
from kproxy.compress.headers import mark_encoded, no_transform
from kproxy.compress.negotiate import Negotiated, negotiate
from kproxy.compress.shared import WatchCoding
from kproxy.config import Duration
from kproxy.core.chain import BytesBody, Exchange, FilterBase, Handler, Reply, StreamBody, UpgradeBody
from kproxy.core.context import FilterContext, ServiceKey
from kproxy.core.eventstream import EventStreamBody
from kproxy.core.requestinfo import param_bool
from kproxy.core.upstreamgzip import ASKED, decode_reply
from kproxy.core.upstreamlink import UPSTREAM_LINK, UpstreamLink

Coding = Literal["zstd", "gzip"]

#: Bodies held whole above this size are compressed on a worker thread (both backends release
#: the GIL), so a large BytesBody some filter produced does not stall the event loop.
THREAD_ABOVE = 1 << 20
#: zstd state for watch streams: a 64 KiB window and 2 Ki-entry hash table instead of level 1's
#: 512 KiB and 16 Ki. A passed-through watch's compressor (one per watcher; a cached watch
#: shares one per selection) stays small (memory, and what each event touches
#: in the CPU caches: with ten watchers interleaved, compressing cost twice the isolated figure
#: with the full state) while holding a dozen recent events to match against. Smaller still
#: (16 KiB, 2^10) is cheaper in the codec benchmark with 1 MB of other work between a watcher's
#: events (19.5 vs 28.3 us), but not inside kproxy serving ten watches (13.2 vs 13.0 us per
#: event, two processes taking turns: the state is cold either way there) and costs 27% more
#: bytes per event (205 vs 161), so this stays the default (``watch_zstd_window_log``/``hash_log``).
WATCH_WINDOW_LOG = 16
WATCH_HASH_LOG = 11
#: zstd level for watch streams. Measured on the apiserver's 4.6 KB pod events, ten encoders in
#: turn (benchmarks/compression.py): level -1 with a 2^11 hash is 160 bytes per event against
#: level 1's 137 (both far past the 3x of docs/performance.md#compression), and 15-20% less CPU with the caches cold (in
#: every run: 16.5 vs 21.1, 19.2 vs 22.9, 36.3 vs 46.9 us), which is how a proxy serving many
#: watches finds them; warm, the two are within noise. The bound that binds is CPU per event.
WATCH_ZSTD_LEVEL = -1


def _default_encodings() -> list[Coding]:
    # zstd first: at level 1 it beats gzip's ratio at gzip's speed (see config.example.yaml).
    return ["zstd", "gzip"]


class CompressionSettings(BaseModel):
    """``filters: [{name: compression, ...}]`` — see config.example.yaml for the measurements."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Codings offered, in preference order (breaks q-value ties).
    encodings: list[Coding] = Field(default_factory=_default_encodings, min_length=1)
    #: Bodies smaller than this go uncompressed (unknown lengths: once they pass it).
    min_size: int = Field(default=1024, ge=0)
    #: gzip level on the backend's scale (ISA-L 0-3; zlib-ng/zlib 1-9). None: 1.
    gzip_level: int | None = None
    #: zstd level (-7..22). None: 1.
    zstd_level: int | None = None
    #: gzip level for watch streams (flushed per event). None: 0 with ISA-L (5 us per 4.5 KB
    #: event against 11 us at level 1, still 12x smaller), else gzip_level.
    watch_gzip_level: int | None = None
    #: zstd level for watch streams (flushed per event). None: -1 (WATCH_ZSTD_LEVEL).
    watch_zstd_level: int | None = None
    #: log2 of a watch stream's zstd window (per watcher state). None: 16 (WATCH_WINDOW_LOG).
    watch_zstd_window_log: int | None = Field(default=None, ge=10, le=27)
    #: log2 of a watch stream's zstd hash table entries. None: 11 (WATCH_HASH_LOG).
    watch_zstd_hash_log: int | None = Field(default=None, ge=6, le=26)
    #: Compress watch streams (and followed logs), flushed after every batch of events.
    watch: bool = False
    #: Ask the upstream for gzip: gzip clients get its body untouched, others get it decoded once.
    #: auto: for reads (not watches), while the measured round trip to it is upstream_gzip_rtt or more.
    upstream_gzip: bool | Literal["auto"] = "auto"
    #: upstream_gzip: auto asks for gzip from this round trip up (time to a response head, the
    #: smallest in the last minute or two). "10ms": a link leaving the data centre.
    upstream_gzip_rtt: Duration = 0.010

    @field_validator("encodings")
    @classmethod
    def _unique(cls, v: list[Coding]) -> list[Coding]:
        if len(set(v)) != len(v):
            raise ValueError("each encoding may be listed once")
        return v


_METRICS_KEY: ServiceKey[_Metrics] = ServiceKey(f"{__name__}.metrics")
_RTT_KEY: ServiceKey[Gauge] = ServiceKey(f"{__name__}.upstream_round_trip")


def _round_trip_gauge(registry: CollectorRegistry, link: UpstreamLink) -> Gauge:
    gauge = Gauge(
        "kproxy_upstream_round_trip_seconds",
        "The smallest time from sending a request upstream to its response head in the last one to two "
        "minutes (NaN before any); upstream_gzip: auto asks for gzip from upstream_gzip_rtt",
        registry=registry,
    )
    gauge.set_function(lambda: math.nan if link.rtt is None else link.rtt)
    return gauge


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.bytes_in = Counter(
            "kproxy_compression_input_bytes_total",
            "Bytes given to the compressor, by encoding",
            ["encoding"],
            registry=registry,
        )
        self.bytes_out = Counter(
            "kproxy_compression_output_bytes_total",
            "Compressed bytes produced, by encoding",
            ["encoding"],
            registry=registry,
        )
        self.cpu = Counter(
            "kproxy_compression_cpu_seconds_total",
            "CPU seconds spent compressing (and decoding upstream gzip), by encoding and operation",
            ["encoding", "operation"],
            registry=registry,
        )
        self.responses = Counter(
            "kproxy_compression_responses_total",
            "Responses sent compressed, by encoding",
            ["encoding"],
            registry=registry,
        )
        self.skipped = Counter(
            "kproxy_compression_skipped_total",
            "Responses sent as they were, by reason",
            ["reason"],
            registry=registry,
        )

    def account(self, coding: str) -> stream.Account:
        bytes_in = self.bytes_in.labels(coding)
        bytes_out = self.bytes_out.labels(coding)
        cpu = self.cpu.labels(coding, "compress")

        def add(n_in: int, n_out: int, seconds: float) -> None:
            bytes_in.inc(n_in)
            bytes_out.inc(n_out)
            cpu.inc(seconds)

        return add

    def decode_account(self) -> stream.Account:
        cpu = self.cpu.labels("gzip", "decompress")
        return lambda n_in, n_out, seconds: cpu.inc(seconds)


class Compression(FilterBase):
    """Compress responses as the client's ``Accept-Encoding`` allows (see the module doc)."""

    name: ClassVar[str] = "compression"
    config_model: ClassVar[type[BaseModel]] = CompressionSettings

    def __init__(self, settings: CompressionSettings) -> None:
        self.settings = settings
        levels = {"gzip": settings.gzip_level, "zstd": settings.zstd_level}
        # Built here so that a bad level is a config error (check-config), not a runtime one.
        self.codecs: dict[str, Codec] = {c: codec(c, levels[c]) for c in settings.encodings}
        watch_zstd = WATCH_ZSTD_LEVEL if settings.watch_zstd_level is None else settings.watch_zstd_level
        watch_levels = {"gzip": settings.watch_gzip_level, "zstd": watch_zstd}
        if watch_levels["gzip"] is None:
            watch_levels["gzip"] = 0 if gzip_library() == "isal" else settings.gzip_level
        window_log = WATCH_WINDOW_LOG if settings.watch_zstd_window_log is None else settings.watch_zstd_window_log
        hash_log = WATCH_HASH_LOG if settings.watch_zstd_hash_log is None else settings.watch_zstd_hash_log
        self.window_log, self.hash_log = window_log, hash_log
        self.watch_codecs: dict[str, Codec] = {
            c: codec(c, watch_levels[c], window_log, hash_log) if c == "zstd" else codec(c, watch_levels[c])
            for c in settings.encodings
        }
        self.offered = tuple(settings.encodings)
        self._use_metrics(_Metrics(CollectorRegistry()))
        #: The server's measure of the upstream link (none observed until started).
        self.link = UpstreamLink()

    def effective_settings(self) -> dict[str, object]:
        """The settings with each unset level replaced by the one in effect (for ``check-config``)."""
        shown: dict[str, object] = self.settings.model_dump()
        for c in ("gzip", "zstd"):
            if c in self.codecs:
                shown[f"{c}_level"] = self.codecs[c].level
                shown[f"watch_{c}_level"] = self.watch_codecs[c].level
        shown["watch_zstd_window_log"] = self.window_log
        shown["watch_zstd_hash_log"] = self.hash_log
        return shown

    def _use_metrics(self, metrics: _Metrics) -> None:
        self.metrics = metrics
        #: Watches served by kproxy itself (from the watch cache) are compressed where they are
        #: fanned out, once for all the watchers in step (``kproxy.cacher.shared_stream``).
        self.watch_codings = {c: WatchCoding(codec, metrics.account(c)) for c, codec in self.watch_codecs.items()}

    async def start(self, ctx: FilterContext) -> None:
        await super().start(ctx)
        # One set of series per registry: a reload that replaces this filter (or a second
        # compression entry) starts another instance with the same registry.
        self._use_metrics(ctx.service(_METRICS_KEY, lambda: _Metrics(ctx.registry)))
        self.link = link = ctx.service(UPSTREAM_LINK, UpstreamLink)
        ctx.service(_RTT_KEY, lambda: _round_trip_gauge(ctx.registry, link))

    def _skip(self, reason: str) -> None:
        self.metrics.skipped.labels(reason).inc()

    # ------------------------------------------------------------------ request side

    def _request_skip_reason(self, ex: Exchange, neg: Negotiated, streaming: bool) -> str | None:
        if ex.upgrade:
            return "upgrade"
        if ex.method == "HEAD":
            return "head"
        if neg.coding is None:
            return "not_accepted"
        if no_transform(ex.headers):
            return "no_transform"
        if streaming and not self.settings.watch:
            return "watch"
        if ex.info.subresource == "proxy":
            # Whatever a proxied pod or service sends (event streams, its own encodings) is its own.
            return "proxy"
        return None

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        neg = negotiate(ex.headers.getall("Accept-Encoding", ()), self.offered)
        streaming = _is_streaming(ex)
        reason = self._request_skip_reason(ex, neg, streaming)
        if reason is not None:
            self._skip(reason)
            return await call_next(ex)  # untouched: the client's own Accept-Encoding goes upstream
        coding = neg.coding
        assert coding is not None
        if self._upstream_gzip(ex, streaming):
            ex.headers["Accept-Encoding"] = "gzip"
            ex.state[ASKED] = True
        else:
            ex.headers.popall("Accept-Encoding", None)
        # If-None-Match goes up as sent: the ETags this filter hands out are the apiserver's
        # own (kproxy.compress.headers), the only spelling its handlers match.
        reply = await call_next(ex)
        return await self._respond(reply, coding, neg.identity_ok, streaming, ex.info.verb == "watch")

    def _upstream_gzip(self, ex: Exchange, streaming: bool) -> bool:
        """Whether the upstream request asks for gzip (see the module doc)."""
        setting = self.settings.upstream_gzip
        if setting != "auto":
            return bool(setting)
        if ex.method != "GET" or streaming:
            # Writes answer small objects (the apiserver gzips only over 128 KiB) and a filter
            # below may read them; watches and followed logs this filter encodes as they come.
            return False
        rtt = self.link.rtt
        # Nothing observed yet (the first request of a proxy without filters that start with
        # requests of their own): as if near, what this filter did before it measured.
        return rtt is not None and rtt >= self.settings.upstream_gzip_rtt

    # ------------------------------------------------------------------ response side

    def _response_skip_reason(self, reply: Reply) -> str | None:
        status = reply.status
        if status < 200 or status in (204, 206, 304):
            return f"status_{status}"
        if isinstance(reply.body, UpgradeBody):
            return "upgrade"
        if no_transform(reply.headers):
            return "no_transform"
        return None

    async def _respond(
        self, reply: Reply, coding: str, identity_ok: bool, streaming: bool, watch: bool = False
    ) -> Reply:
        reason = self._response_skip_reason(reply)
        if reason is not None:
            self._skip(reason)
            return reply
        upstream_coding = reply.headers.get("Content-Encoding", "").strip().lower()
        if upstream_coding:
            if upstream_coding == coding:
                self._skip("upstream_encoded")  # the apiserver's gzip, for a gzip client: as is
                return reply
            if upstream_coding != "gzip":
                self._skip("encoded")
                return reply
            decode_reply(reply, self.metrics.decode_account())

        body = reply.body
        if streaming and isinstance(body, EventStreamBody) and body.coding is None:
            body.coding = self.watch_codings[coding]
            mark_encoded(reply.headers, coding)
            self.metrics.responses.labels(coding).inc()
            return reply
        if isinstance(body, BytesBody):
            if len(body.data) < self.settings.min_size and identity_ok:
                self._skip("small")
                return reply
            return await self._compress_whole(reply, body, coding)
        assert isinstance(body, StreamBody)
        chunks = body.chunks()
        prefix = b""
        if not streaming:
            if body.length is not None and body.length < self.settings.min_size and identity_ok:
                self._skip("small")
                return reply
            if body.length is None:
                try:
                    prefix, ended = await stream.peek(chunks, self.settings.min_size)
                except BaseException:
                    body.abort()  # the upstream broke before the head was sent: a Status follows
                    raise
                if ended:
                    whole = BytesBody(prefix, body.media_type)
                    reply.body = whole
                    if len(prefix) < self.settings.min_size and identity_ok:
                        self._skip("small")
                        return reply
                    return await self._compress_whole(reply, whole, coding)
        if streaming:
            enc, coalesce = self.watch_codecs[coding].new_encoder(), stream.COALESCE
        else:
            body_codec = self.codecs[coding]
            enc, coalesce = body_codec.body_encoder(), body_codec.body_chunk
        # JSON watch events end with a newline: flush once per complete event (or batch of them).
        # Followed logs and protobuf watches are flushed after every chunk.
        newline_framed = watch and reply.headers.get("Content-Type", "").startswith("application/json")
        out = stream.encode(
            chunks,
            enc,
            self.metrics.account(coding),
            flush_each=streaming,
            newline_framed=newline_framed,
            prefix=prefix,
            coalesce=coalesce,
        )
        reply.body = StreamBody(out, None, body.media_type, on_abort=body.abort, on_end=body.end_cleanly)
        mark_encoded(reply.headers, coding)
        self.metrics.responses.labels(coding).inc()
        return reply

    async def _compress_whole(self, reply: Reply, body: BytesBody, coding: str) -> Reply:
        compress = self.codecs[coding].compress
        data = body.data
        if len(data) > THREAD_ABOVE:
            out, seconds = await asyncio.to_thread(_timed, compress, data)
        else:
            out, seconds = _timed(compress, data)
        self.metrics.account(coding)(len(data), len(out), seconds)
        reply.body = BytesBody(out, body.media_type)
        mark_encoded(reply.headers, coding)
        self.metrics.responses.labels(coding).inc()
        return reply


def _timed(compress: Callable[[bytes], bytes], data: bytes) -> tuple[bytes, float]:
    t = time.thread_time()
    out = compress(data)
    return out, time.thread_time() - t


def _is_streaming(ex: Exchange) -> bool:
    """Responses that stay open and deliver data as it happens: watches and followed logs. They
    are flushed after every chunk and never held back for the size threshold."""
    info = ex.info
    if info.verb == "watch":
        return True
    if info.subresource != "log":
        return False
    # PodLogOptions' query conversion (runtime.Convert_Slice_string_To_bool): present and
    # anything but 0/false, the empty value and "yes" included, is a followed log.
    follow = ex.query.get("follow")
    return follow is not None and param_bool(follow)
