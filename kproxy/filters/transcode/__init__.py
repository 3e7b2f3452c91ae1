"""The ``transcode`` filter: kproxy asks the apiserver for protobuf and answers clients in the
media type they negotiated (JSON, YAML), so the apiserver spends less CPU and fewer bytes per
response while clients notice nothing.

How it decides, per request (``upstream: protobuf``):

* Only resource requests whose representation kproxy can rebuild are touched: not
  connect-style requests (exec, attach, port-forward, proxy), not ``log``, not HEAD.
* The client's Accept is negotiated exactly as the apiserver would (``kproxy.core.negotiation``).
  If the client would get protobuf anyway, asked for an ``as=`` transform (Table,
  PartialObjectMetadata), would be refused (406, including YAML on a watch and go-restful's
  route check), the request goes through untouched and the apiserver answers itself.
* Otherwise the upstream is asked for ``application/vnd.kubernetes.protobuf, <client's Accept>``:
  built-in resources answer protobuf; custom and aggregated resources that have no protobuf
  answer what the client's own Accept asks for, which is passed through as is. The upstream's
  Content-Type, not a guess, decides whether anything is transcoded.
* Responses are rebuilt by the codec (``kproxy.codec``): objects and Status errors whole, lists
  item by item as the upstream streams them (never held whole, unless YAML or pretty output is
  wanted, which the apiserver does not stream either), watch streams event by event (each event
  is written as soon as its frame is complete).
* ``Accept-Encoding`` is not sent upstream on the requests it rewrites (kproxy must read the body
  to transcode it); compressing the answer is the ``compression`` filter's work. Except when
  that filter asked the upstream for gzip (``upstream_gzip``: a slow link, where the transfer
  costs more than decoding): ``gzip`` stays, and the body is decoded as it streams.

``upstream: auto`` does the same only for the API group versions the codec has schemas for
(everything else goes through untouched); ``upstream: json`` turns the filter off.

Validators: a transcoded answer keeps the upstream's ``ETag`` and ``If-None-Match`` goes up as
sent. The tag names the protobuf representation and the JSON or YAML is a function of those
bytes (the apiserver's own encoders, ported), so the tag changes whenever what the client gets
could: it is a strong validator for it (RFC 9110 8.8.1). A revalidation is rewritten the same
way (same Accept), so the upstream compares it with the tag of the representation it would send
(RFC 9110 13.1.2, 13.2.2) and its 304 means this filter's answer would not have changed. The
apiserver does the same: one tag for the JSON and protobuf of a discovery or OpenAPI document,
kept apart by ``Vary: Accept`` (k8s.io/apiserver pkg/endpoints/discovery/aggregated/handler.go
``cachedGroupList``; kube-openapi pkg/handler/handler.go). Dropping the tag would lose every
304; weakening it loses them at servers that match the exact string (discovery's etag.go). The
apiserver sets ETags only on discovery and OpenAPI, which are not resource requests and are
never rewritten here; an aggregated API may set them on resources. A 304 (or 204) has no body
to rebuild: it passes with a protobuf Content-Type made the client's, as on the 200 it stands for.

Request bodies are never re-encoded: the apiserver accepts JSON, YAML and protobuf bodies for
built-in resources, so there is no case where re-encoding would be needed, and none where a field
could be dropped. The one body the upstream cannot take is protobuf for a group version without
protobuf types (a custom resource, not its ``scale``): kube-apiserver panics on it and drops the
connection, so kproxy sends it with a Content-Type the apiserver does not know, and the client gets
the apiserver's own 415 ``UnsupportedMediaType`` Status (or the 403, 404 or 406 that comes first).

A body the codec cannot read (wrong magic, truncated frame, unknown kind, garbage) gives a 500
``InternalError`` Status in the client's media type while nothing has been written yet; a list
that breaks after its first bytes are out aborts the connection (a truncated body is never
passed off as whole); a watch gets one ``ERROR`` event carrying the Status, then ends, as the
apiserver ends watches that fail. One exception: a GET (object or list) answered in protobuf of a
kind the codec has no schema for (an aggregated API that speaks protobuf) is asked again with the
client's own headers and passed through, since a read can be repeated; writes and watches cannot.

Package: this module is the filter.
May import: ``kproxy.core``, ``kproxy.identity``, the engines and ``kproxy.config``;
never another filter nor ``kproxy.server``.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import aiohttp
from multidict import CIMultiDict
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict

from kproxy import gctuning
from kproxy.codec.codecerrors import CodecError
from kproxy.codec.envelope import MAGIC, parse_type_meta, read_varint
from kproxy.core.chain import BytesBody, Exchange, FilterBase, Handler, Reply, StreamBody, UpgradeBody
from kproxy.core.context import ServiceKey
from kproxy.core.errorreply import encoded_status
from kproxy.core.metricnames import counter
from kproxy.core.negotiation import (
    JSON,
    PROTOBUF,
    PROTOBUF_WATCH,
    YAML,
    is_pretty,
    media_type_of,
    negotiate,
    router_accepts,
)
from kproxy.core.outage import upstream_failed
from kproxy.core.status import StatusError, internal_error
from kproxy.core.upstreamgzip import ASKED, decode_reply
from kproxy.gocompat.jsonescape import go_json_dumps

if TYPE_CHECKING:
    from kproxy.codec import ProtobufCodec
    from kproxy.core.context import FilterContext

log = logging.getLogger("kproxy.transcode")

# Subresources whose answer is not an API object (logs, proxied traffic, streams).
_NOT_OBJECTS = frozenset({"log", "proxy", "exec", "attach", "portforward"})
_UPSTREAM_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)

#: The Content-Type a protobuf body the apiserver cannot take is sent upstream with (Transcode.refuses_body).
REFUSED_BODY_TYPE = "application/x-kproxy-unsupported-protobuf"

Shape = Literal["object", "list", "watch"]
Retry = Callable[[], Awaitable[Reply]]


def envelope_type(data: bytes) -> tuple[str, str] | None:
    """apiVersion and kind from the first bytes of a ``k8s\\0`` envelope (its ``typeMeta``, field
    1, comes first), or None when they cannot be read. Only names a kind; decodes nothing else."""
    if not data.startswith(MAGIC) or data[4:5] != b"\x0a":
        return None
    try:
        n, pos = read_varint(data, 5, len(data))
        if pos + n > len(data):
            return None
        api_version, kind = parse_type_meta(data, pos, pos + n)
    except CodecError:
        return None
    return (api_version, kind) if kind else None


def _yaml_error_status(message: str) -> bytes:
    """The apiserver's YAML Status for an object its YAML writer fails on (sigs.k8s.io/yaml
    reads the JSON back with go-yaml; ``kproxy.codec.yamlcodec.go_yaml_error``): a plain Go
    error, so code 500 and no reason."""
    # lazy: kproxy.codec loads protobuf; only the answers that need it pay for it
    from kproxy.codec import to_yaml

    status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    return to_yaml({**status, "message": message, "code": 500})


class TranscodeSettings(BaseModel):
    """``upstream``: the encoding kproxy asks the apiserver for."""

    model_config = ConfigDict(extra="forbid")

    #: The encoding kproxy asks the apiserver for. `json`: no transcoding (the filter is off);
    #: `protobuf`: protobuf for every resource request, with the client's own Accept as the
    #: fallback (custom and aggregated resources answer it); `auto`: protobuf only for the API
    #: group versions kproxy's codec has schemas for, everything else untouched.
    upstream: Literal["json", "protobuf", "auto"] = "protobuf"


@dataclass(frozen=True, slots=True)
class _Plan:
    """What the client negotiated, for a request the filter rewrites."""

    target: str  # JSON or YAML
    pretty: bool
    shape: Shape
    method: str  # what to answer if the upstream breaks off (kproxy.core.outage)


class _Metrics:
    def __init__(self, ctx: FilterContext) -> None:
        reg = ctx.registry
        self.transcoded = counter(
            "kproxy_transcode_responses_total",
            "Responses the transcode filter rebuilt from protobuf, by shape",
            ["shape"],
            registry=reg,
        )
        self.passed = Counter(
            "kproxy_transcode_passthrough_total",
            "Rewritten requests whose upstream answer was not protobuf (passed through as is)",
            registry=reg,
        )
        self.fallbacks = Counter(
            "kproxy_transcode_fallbacks_total",
            "Reads asked again as the client asked them (the upstream's protobuf was of a kind with no schema)",
            registry=reg,
        )
        self.errors = Counter(
            "kproxy_transcode_errors_total",
            "Upstream protobuf bodies the codec could not read, by shape",
            ["shape"],
            registry=reg,
        )
        self.bytes_in = counter(
            "kproxy_transcode_input_bytes_total", "Protobuf bytes read from the upstream", registry=reg
        )
        self.bytes_out = counter(
            "kproxy_transcode_output_bytes_total", "Bytes written to clients after transcoding", registry=reg
        )


_METRICS_KEY: ServiceKey[_Metrics] = ServiceKey(f"{__name__}.metrics")


class Transcode(FilterBase):
    """Protobuf from the apiserver, the client's own media type to the client."""

    name: ClassVar[str] = "transcode"
    config_model: ClassVar[type[BaseModel]] = TranscodeSettings

    def __init__(self, settings: TranscodeSettings) -> None:
        self.mode = settings.upstream
        self.codec: ProtobufCodec | None = None
        self._known: frozenset[tuple[str, str]] = frozenset()
        self._m: _Metrics | None = None

    async def start(self, ctx: FilterContext) -> None:
        await super().start(ctx)
        # Shared with the instance a config reload replaces (series are registered once).
        self._m = ctx.service(_METRICS_KEY, lambda: _Metrics(ctx))
        if self.mode == "json":
            return
        # lazy: the codec (protobuf) is loaded only when the mode needs it
        from kproxy.codec import load_schema, shared_codec

        # Building the schema takes a few hundred ms: once, at start, not on the first request
        # (and once per process: a reloaded instance keeps the codec and its memo).
        self.codec = shared_codec()
        schema = load_schema()
        self._known = frozenset((g, v) for (g, v, _k) in schema.kinds if g != "meta.k8s.io")

    # ------------------------------------------------------------------ request side

    def plan(self, ex: Exchange) -> _Plan | None:
        """The client's negotiated representation when this request should be rewritten."""
        if self.codec is None or ex.method in ("HEAD", "OPTIONS") or ex.upgrade:
            return None
        info = ex.info
        if not info.is_resource_request or info.is_connect or info.subresource in _NOT_OBJECTS:
            return None
        if self.mode == "auto" and (info.api_group, info.api_version) not in self._known:
            return None
        accept = ex.headers.get("Accept")
        if not router_accepts(accept):
            return None  # go-restful's 406 (built-ins); a custom resource answers its own way
        chosen = negotiate(accept)
        if chosen is None or chosen.convert is not None or chosen.media_type == PROTOBUF:
            return None
        if info.is_watch and not chosen.streams:
            return None  # YAML watch: the apiserver's own 406
        shape: Shape = "watch" if info.is_watch else "list" if info.verb == "list" else "object"
        pretty = chosen.pretty or is_pretty(ex.query.get("pretty"), ex.headers.get("User-Agent"))
        return _Plan(chosen.media_type, pretty, shape, ex.method)

    def refuses_body(self, ex: Exchange) -> bool:
        """A protobuf body the upstream cannot take: a POST/PUT of a custom resource (or its
        ``status``) makes kube-apiserver v1.37 panic and drop the connection, since an
        unstructured object has no protobuf form. A CR's ``scale`` is an autoscaling/v1 Scale,
        which the apiserver does decode from protobuf, so it goes through as sent."""
        if self.codec is None or ex.method not in ("POST", "PUT") or not ex.info.is_resource_request:
            return False
        media_type = media_type_of(ex.headers.get("Content-Type")).partition(";")[0]  # ";stream=watch" too
        if media_type != PROTOBUF or ex.info.subresource == "scale":
            return False
        return (ex.info.api_group, ex.info.api_version) not in self._known

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        if self.refuses_body(ex):
            # The apiserver answers its own 415 to a type it does not know, after authorization,
            # routing (404) and output negotiation (406), in the client's media type: it gets
            # such a type instead of the protobuf it would panic on (the body is never decoded).
            ex.headers["Content-Type"] = REFUSED_BODY_TYPE
            return await call_next(ex)
        plan = self.plan(ex)
        if plan is None:
            return await call_next(ex)
        original = CIMultiDict(ex.headers)
        accept = ex.headers.get("Accept") or JSON
        ex.headers.popall("Accept", None)
        ex.headers["Accept"] = f"{PROTOBUF}, {accept}"
        if not (ex.state.get(ASKED) and plan.shape != "watch"):
            ex.headers.popall("Accept-Encoding", None)
        # else: the compression filter asked for gzip (a slow upstream link); decoded below.
        reply = await call_next(ex)
        retry: Retry | None = None
        if ex.method == "GET" and plan.shape != "watch":

            async def retry() -> Reply:
                # A kind kproxy has no schema for (an aggregated API serving protobuf): a read can
                # simply be asked again as the client asked it, and passed through.
                if self._m is not None:
                    self._m.fallbacks.inc()
                ex.headers = CIMultiDict(original)
                return await call_next(ex)

        return await self.transcode(plan, reply, retry)

    # ------------------------------------------------------------------ response side

    def unknown_kind(self, data: bytes) -> tuple[str, str] | None:
        """The (apiVersion, kind) of an envelope whose kind the codec has no schema for."""
        assert self.codec is not None
        found = envelope_type(data)
        if found is None or self.codec.knows(*found):
            return None
        return found

    async def transcode(self, plan: _Plan, reply: Reply, retry: Retry | None = None) -> Reply:
        """The upstream's reply in the client's media type. ``retry`` asks again without
        protobuf (reads only), for a body of a kind the codec does not know."""
        body = reply.body
        if isinstance(body, UpgradeBody):
            return reply
        ctype = media_type_of(reply.headers.get("Content-Type"))
        if reply.status in (204, 304):
            # No content (RFC 9110 15.3.5, 15.4.5): the upstream's validators are the answer.
            if ctype in (PROTOBUF, PROTOBUF_WATCH):
                reply.headers["Content-Type"] = plan.target
            return reply
        m = self._m
        if ctype == PROTOBUF_WATCH and plan.shape == "watch" and isinstance(body, StreamBody):
            return self._watch(plan, reply, body)
        if ctype != PROTOBUF:
            if m is not None:
                m.passed.inc()
            return reply
        if decode_reply(reply):  # the gzip the compression filter asked for: decoded as it streams
            assert isinstance(reply.body, (BytesBody, StreamBody))
            body = reply.body
        encoding = reply.headers.get("Content-Encoding", "").lower()
        streamable = plan.shape == "list" and plan.target == JSON and not plan.pretty
        if isinstance(body, StreamBody) and streamable and reply.status < 300 and not encoding:
            return await self._list(plan, reply, body, retry)
        try:
            data = await body.read()
        except _UPSTREAM_ERRORS as err:
            raise upstream_failed(plan.method, str(err) or type(err).__name__) from None
        shape = plan.shape if reply.status < 300 else "object"
        try:
            if encoding == "gzip":
                data = gzip.decompress(data)
            elif encoding not in ("", "identity"):
                raise ValueError(f"unsupported Content-Encoding {encoding!r}")
            out = self._whole(plan, data)
        except (ValueError, EOFError, OSError) as err:  # CodecError is a ValueError
            if retry is not None and self.unknown_kind(data) is not None:
                return await retry()
            return self._failed(plan, shape, err)
        status, reason = reply.status, reply.reason
        if isinstance(out, str):
            # What the apiserver answers for an object go-yaml cannot write: a 500 Status, no reason.
            status, reason = 500, None
            out = _yaml_error_status(out)
        if m is not None:
            m.transcoded.labels(shape).inc()
            m.bytes_in.inc(len(data))
            m.bytes_out.inc(len(out))
        return Reply(status, self._headers(reply, plan.target), BytesBody(out, plan.target), reason)

    def _whole(self, plan: _Plan, data: bytes) -> bytes | str:
        """The body in the client's media type, or (a str) the error the apiserver's YAML writer
        fails with on it."""
        # lazy: kproxy.codec loads protobuf; only the answers that need it pay for it
        from kproxy.codec import to_yaml
        from kproxy.codec.yamlcodec import go_yaml_error

        codec = self.codec
        assert codec is not None
        if plan.target == YAML or plan.pretty:
            # The whole body as Python objects, briefly: no collection walks them (kproxy.gctuning).
            with gctuning.paused():
                obj = codec.to_obj(data)
                if plan.target == YAML:
                    return go_yaml_error(obj) or to_yaml(obj)
                return go_json_dumps(obj, pretty=True)
        # The apiserver's JSON body is json.Encoder.Encode's: the document and a newline.
        return codec.to_json(data) + b"\n"

    def _headers(self, reply: Reply, media_type: str) -> CIMultiDict[str]:
        headers = CIMultiDict(reply.headers)
        headers.popall("Content-Length", None)
        headers.popall("Content-Encoding", None)
        headers["Content-Type"] = media_type
        return headers

    def _failed(self, plan: _Plan, shape: Shape, err: BaseException) -> Reply:
        """A body kproxy cannot read: the apiserver's answer to an encoder failure, a 500 Status."""
        log.warning("transcode failed", extra={"shape": shape, "error": str(err)})
        if self._m is not None:
            self._m.errors.labels(shape).inc()
        return self.status_reply(plan, internal_error(f"kproxy transcode: {err}"))

    def status_reply(self, plan: _Plan, err: StatusError) -> Reply:
        """A Status written with the encoder negotiated for the object (the apiserver's answer to
        an encoder failure), not renegotiated as ``Reply.from_status`` would."""
        headers, data = encoded_status(err, plan.target, plan.pretty)
        return Reply(err.http_status, headers, BytesBody(data, plan.target))

    async def _list(self, plan: _Plan, reply: Reply, body: StreamBody, retry: Retry | None) -> Reply:
        """Stream a list item by item. The first output is produced before answering, so a body
        that is not a protobuf list at all still gets a clean Status."""
        codec = self.codec
        assert codec is not None
        m = self._m
        transcoder = codec.list_transcoder()
        source = body.chunks().__aiter__()
        first = b""
        head = b""  # the first bytes, to name an unknown kind
        ended = False
        taken = 0
        try:
            while not first:
                try:
                    chunk = await source.__anext__()
                except StopAsyncIteration:
                    first = transcoder.finish() + b"\n"
                    ended = True
                    break
                taken += len(chunk)
                if len(head) < 4096:
                    head += chunk[:4096]
                first = transcoder.feed(chunk)
        except _UPSTREAM_ERRORS as err:
            body.abort()
            raise upstream_failed(plan.method, str(err) or type(err).__name__) from None
        except ValueError as err:
            body.abort()
            if retry is not None and self.unknown_kind(head) is not None:
                return await retry()
            return self._failed(plan, "list", err)

        async def stream() -> AsyncIterator[bytes]:
            sent = len(first)
            read = taken
            yield first
            if not ended:
                try:
                    async for chunk in source:
                        read += len(chunk)
                        out = transcoder.feed(chunk)
                        if out:
                            sent += len(out)
                            yield out
                    tail = transcoder.finish() + b"\n"  # json.Encoder.Encode's newline, as in _whole
                    sent += len(tail)
                    yield tail
                except ValueError as err:
                    log.warning("transcode failed mid-list", extra={"error": str(err)})
                    if m is not None:
                        m.errors.labels("list").inc()
                    # Headers are out: the server aborts the connection on a payload error.
                    raise aiohttp.ClientPayloadError(f"kproxy transcode: {err}") from None
            if m is not None:
                m.transcoded.labels("list").inc()
                m.bytes_in.inc(read)
                m.bytes_out.inc(sent)

        return Reply(
            reply.status,
            self._headers(reply, plan.target),
            StreamBody(stream(), None, plan.target, on_abort=body.abort, on_end=body.end_cleanly),
            reply.reason,
        )

    def _watch(self, plan: _Plan, reply: Reply, body: StreamBody) -> Reply:
        """Transcode a watch event by event: each event goes out as soon as its frame is whole."""
        codec = self.codec
        assert codec is not None
        m = self._m
        transcoder = codec.watch_transcoder()

        async def stream() -> AsyncIterator[bytes]:
            # A watch lives for minutes: its bytes are counted as they pass, not at the end.
            if m is not None:
                m.transcoded.labels("watch").inc()
            try:
                async for chunk in body.chunks():
                    out = transcoder.feed(chunk)
                    if m is not None:
                        m.bytes_in.inc(len(chunk))
                        m.bytes_out.inc(len(out))
                    if out:
                        yield out
                    transcoder.raise_error()  # a bad frame after the events just sent
                tail = transcoder.finish()
                if tail:
                    yield tail
            except ValueError as err:
                log.warning("transcode failed mid-watch", extra={"error": str(err)})
                if m is not None:
                    m.errors.labels("watch").inc()
                body.abort()
                status = internal_error(f"kproxy transcode: {err}").to_dict()
                yield go_json_dumps({"type": "ERROR", "object": status})

        return Reply(
            reply.status,
            self._headers(reply, JSON),
            StreamBody(stream(), None, JSON, on_abort=body.abort, on_end=body.end_cleanly),
            reply.reason,
        )
