"""The ``validation`` filter: server-side field validation, raised by policy, answered locally.

Levels come from the request's ``fieldValidation`` (absent or empty means ``Warn``, the
apiserver's default); the first matching rule may raise it (never lower it). What kproxy does:

* **Ignore / Warn, not raised** -- nothing: the apiserver decodes the body and warns itself
  (kproxy adding its own warnings would duplicate them).
* **Raised** -- the upstream request carries the raised ``fieldValidation``, so the apiserver
  itself produces the warnings or errors of that level: they are its own, byte for byte.
* **Strict, POST/PUT** -- kproxy strict-decodes the body against the upstream's OpenAPI v3 schema
  first. When it finds unknown or duplicate fields, and it can prove the apiserver would answer
  exactly that (the body has no other decode error, its apiVersion/kind are the endpoint's, the
  options are valid, the answer is JSON, YAML or protobuf (no ``as=`` conversion), the caller is
  authorized for the write), kproxy answers
  the apiserver's 400 itself and the write never reaches the apiserver. Otherwise the request
  goes up with ``fieldValidation=Strict`` and the apiserver answers -- exact by construction.
  The body is decoded only for a caller the apiserver would authorize for the write (it
  authorizes before it decodes; a refused caller's request goes up untouched and gets its 403),
  with the apiserver's limits (``kproxy.gocompat.yaml``), large bodies off the event loop.
* **Strict, PATCH** -- forwarded with ``fieldValidation=Strict``: the apiserver's answer quotes
  the patched object (the current object merged with the patch), which only it has.
* **Upstream without fieldValidation** (``upstream_validates: no``, or ``auto`` and a server
  older than 1.25) -- kproxy provides it for POST/PUT: warnings for Warn, the 400 for Strict;
  the upstream is sent ``fieldValidation=Ignore`` (an old server ignores the parameter).

Package: this module is the filter; its engine (no aiohttp) is beside it: ``levels`` (the
``fieldValidation`` levels), ``schemanodes`` (OpenAPI v3 documents compiled into ``Node`` trees),
``decode`` (JSON and YAML bodies with duplicate-key detection), ``validator``, ``fastcheck`` and
``structs`` (the walkers), ``messages`` (warnings and Strict error texts), ``openapi`` (the
schema cache that reads ``/openapi/v3`` from the upstream).
May import: ``kproxy.core``, ``kproxy.identity``, the engines and ``kproxy.config``;
never another filter nor ``kproxy.server``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from multidict import MultiDict
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import BaseModel, ConfigDict, Field

from kproxy.core.chain import Exchange, FilterBase, Handler, Reply
from kproxy.core.context import FilterContext, ServiceKey
from kproxy.core.errorreply import negotiated_media
from kproxy.core.negotiation import JSON, PROTOBUF, YAML, media_type_of, negotiate, router_accepts
from kproxy.core.offload import run_body_work
from kproxy.core.requestinfo import RequestInfo
from kproxy.core.status import StatusError, bad_request
from kproxy.core.upstreamversion import UPSTREAM_VERSION, UpstreamVersion
from kproxy.filters.validation.levels import Level, parse_level
from kproxy.filters.validation.messages import create_update_error, warning_values
from kproxy.filters.validation.openapi import SchemaCache, cancel
from kproxy.filters.validation.schemanodes import Node, no_schema_root
from kproxy.filters.validation.validator import Outcome, validate_body
from kproxy.gocompat.url import TooManyQueryParams, with_param
from kproxy.identity.access import AccessReviewer, AccessReviewError, api_review
from kproxy.identity.authn import authenticator
from kproxy.identity.impersonation_headers import asks_impersonation
from kproxy.identity.policy import Rule, created_namespace, creates_namespace, first_match_lazy

if TYPE_CHECKING:
    from kproxy.codec import ProtobufCodec

log = logging.getLogger("kproxy.validation")

_METRICS_SERVICE: ServiceKey[_Metrics] = ServiceKey(f"{__name__}.metrics")
_CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
#: Media types a local Strict answer is written in, as the apiserver would write its Status.
_LOCAL_MEDIA = (JSON, YAML, PROTOBUF)
# Answers the apiserver gives before it decodes a body: no field warnings on them.
_BEFORE_DECODE = frozenset({401, 403, 404, 405, 406, 413, 415, 429})


class ValidationRule(Rule):
    """A rule: requests it selects are validated at least at ``level``."""

    level: Literal["Ignore", "Warn", "Strict"]

    @property
    def minimum(self) -> Level:
        return Level[self.level.upper()]


class ValidationSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: First match wins; its ``level`` is the minimum for the request.
    rules: list[ValidationRule] = []
    #: Answer Strict POST/PUT failures in kproxy (False: always let the apiserver answer).
    local_strict: bool = True
    #: Whether the upstream implements fieldValidation; ``auto`` asks its /version (1.25+).
    upstream_validates: Literal["auto", "yes", "no"] = "auto"
    #: After a CRD changes, how long its group is validated by the apiserver alone.
    settle_seconds: float = Field(10.0, ge=0)
    #: How often the /openapi/v3 index is re-read.
    refresh_seconds: float = Field(60.0, gt=0)
    #: Watch CRDs (kproxy's own credentials need list/watch on them) to notice schema changes.
    watch_crds: bool = True
    #: Seconds a SubjectAccessReview answer is reused before a local answer.
    access_ttl: float = Field(10.0, ge=0)


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "kproxy_validation_requests_total",
            "Writes seen by the validation filter, by effective level and outcome "
            "(passed: forwarded untouched; raised: level raised for the upstream; rejected: "
            "kproxy answered Strict itself; warned: kproxy added warnings; deferred: the "
            "apiserver answers, because local errors were found but kproxy cannot prove its answer "
            "would be the apiserver's, or the caller was not shown to be allowed the write).",
            ["level", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "kproxy_validation_check_seconds",
            "Time kproxy spent strict-decoding one body.",
            buckets=(5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2, 0.1),
            registry=registry,
        )


class _Schemas:
    """The schema cache shared by the validation filter's instances with the same cache settings
    (a reload that changes other settings keeps it); it follows the process's one CRD watch
    (``ctx.discovery``) while any instance using it is started."""

    def __init__(self, cache: SchemaCache) -> None:
        self.cache = cache
        self.users = 0


class Validation(FilterBase):
    """Server-side field validation (see the module docstring)."""

    name: ClassVar[str] = "validation"
    config_model: ClassVar[type[BaseModel]] = ValidationSettings

    def __init__(self, settings: ValidationSettings) -> None:
        self.settings = settings
        self.rules = settings.rules
        self.upstream_validates = settings.upstream_validates != "no"
        self.cache: SchemaCache | None = None
        self._schemas: _Schemas | None = None
        self.access: AccessReviewer | None = None
        self.metrics: _Metrics | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    async def start(self, ctx: FilterContext) -> None:
        await super().start(ctx)
        self.metrics = ctx.service(_METRICS_SERVICE, lambda: _Metrics(ctx.registry))
        api = ctx.api

        async def fetch(path: str, etag: str | None) -> tuple[int, bytes, str | None]:
            headers = {"Accept": "application/json"}
            if etag:
                headers["If-None-Match"] = etag
            async with api.request("GET", path, headers=headers) as resp:
                return resp.status, await resp.read(), resp.headers.get("ETag")

        s = self.settings
        schemas = self._schemas = ctx.service(
            ServiceKey[_Schemas](f"{__name__}.schemas:{s.settle_seconds}:{s.refresh_seconds}:{s.watch_crds}"),
            lambda: _Schemas(SchemaCache(fetch, settle_seconds=s.settle_seconds, refresh_seconds=s.refresh_seconds)),
        )
        schemas.users += 1
        if s.watch_crds:
            schemas.cache.follow_crds(ctx.discovery)
        self.cache = schemas.cache

        ttl = self.settings.access_ttl
        self.access = AccessReviewer(api_review(ctx), allow_ttl=ttl, deny_ttl=ttl, max_entries=4096)
        if self.settings.upstream_validates == "auto":
            self._tasks.append(asyncio.ensure_future(self._detect_upstream()))

    async def stop(self) -> None:
        for task in self._tasks:
            await cancel(task)
        self._tasks.clear()
        schemas, self._schemas = self._schemas, None
        if schemas is not None:
            schemas.users -= 1
            if schemas.users == 0 and self.ctx is not None:
                schemas.cache.unfollow_crds(self.ctx.discovery)

    async def _detect_upstream(self) -> None:
        assert self.ctx is not None
        version = self.ctx.service(UPSTREAM_VERSION, UpstreamVersion)
        await version.read(self.ctx.api)
        if version.version is None:
            log.warning("validation: could not read the upstream /version; assuming it validates")
        elif not version.at_least(25):
            self.upstream_validates = False
            log.info("validation: the upstream (%s) predates fieldValidation; kproxy provides it", version.git_version)

    # ------------------------------------------------------------------ per request

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        info = ex.info
        verb = info.verb
        # Passed through untouched only where the apiserver decodes no object either: a request
        # that is not a write of a resource (requestinfo.go: POST/PUT/PATCH make create, update,
        # patch), or a connect subresource, whose handler streams the request to the kubelet or
        # the pod (handlers/rest.go ConnectResource). An Upgrade header changes neither: the
        # apiserver upgrades only connect subresources and WebSocket watches, and answers any other
        # request carrying one as an ordinary request (Go's net/http hands it to the handler).
        if not info.is_resource_request or verb not in ("create", "update", "patch") or info.is_connect:
            return await call_next(ex)
        assert self.metrics is not None and self.ctx is not None
        values = ex.query.getall("fieldValidation", [])
        requested = parse_level(values[0] if values else None)
        if requested is None:  # the apiserver's own 422 names the bad value
            return await call_next(ex)
        level = requested
        if self.rules:
            ctx = self.ctx
            try:
                seen, prefix = await self._created_namespace(ex, info)
                found = await first_match_lazy(
                    self.rules, seen, lambda: authenticator(ctx).identify(ex), namespace_prefix=prefix
                )
            except StatusError as err:
                return Reply.from_status(err, ex)
            if found is not None and found[1].minimum > level:
                level = found[1].minimum
        provide = not self.upstream_validates
        if provide and verb != "patch":
            # kproxy provides the level for POST/PUT; PATCH keeps its own (an old server ignores it).
            _set_field_validation(ex, Level.IGNORE)
        elif level != requested:
            _set_field_validation(ex, level)
        self._after_crd_write(info)
        check = verb != "patch" and (
            (level == Level.STRICT and self.settings.local_strict) or (provide and level == Level.WARN)
        )
        try:
            # Authorization comes before decoding at the apiserver: a caller it refuses gets its
            # refusal (forwarded), and kproxy decodes nothing for it.
            wanted = check and _options_valid(ex.query)
            authorized = wanted and await self._authorized(ex)
            outcome = await self._check(ex) if authorized else None
        except StatusError as err:  # the body is over the size limit: the apiserver's own 413
            return Reply.from_status(err, ex)
        if wanted and not authorized:
            # Not shown to be allowed the write (refused, or kproxy may not ask): the apiserver
            # checks it, and its refusal, if any, comes first.
            self.metrics.requests.labels(level.wire, "deferred").inc()
            return await call_next(ex)
        if outcome is None or outcome.fatal or not outcome.errors:
            self.metrics.requests.labels(level.wire, "raised" if level != requested else "passed").inc()
            return await call_next(ex)
        if level == Level.STRICT:
            answer = await self._local_answer(ex, outcome)
            if answer is not None:
                self.metrics.requests.labels(level.wire, "rejected").inc()
                return answer
            self.metrics.requests.labels(level.wire, "deferred").inc()
            return await call_next(ex)
        reply = await call_next(ex)
        if await self._decoded(ex, reply.status):
            present = set(reply.headers.getall("Warning", []))
            for value in warning_values(outcome.errors):
                if value not in present:
                    reply.headers.add("Warning", value)
        self.metrics.requests.labels(level.wire, "warned").inc()
        return reply

    async def _decoded(self, ex: Exchange, status: int) -> bool:
        """Whether the apiserver decoded the body before answering ``status`` (so that its
        warnings come with the answer). The route exists (``_check`` looked), so a 404 is the
        namespace's or the object's; authorization comes before decoding, so a 403 to a caller
        allowed the write is admission's (a terminating namespace, a quota, a policy)."""
        if status == 404:
            return True
        if status == 403:
            return await self._authorized(ex)
        return status not in _BEFORE_DECODE

    def _after_crd_write(self, info: RequestInfo) -> None:
        """A CRD written through kproxy: its group's schema is about to change."""
        if info.resource == "customresourcedefinitions" and info.api_group == "apiextensions.k8s.io" and info.name:
            group = info.name.partition(".")[2]
            if group and self.cache is not None:
                self.cache.unsettle(group)

    async def _check(self, ex: Exchange) -> Outcome | None:
        """Strict-decode the body, or None when kproxy cannot (unknown schema, other media type)."""
        info = ex.info
        if "Content-Encoding" in ex.headers:
            return None
        media = media_type_of(ex.headers.get("Content-Type")) or JSON
        if media not in (JSON, YAML) or self.cache is None or self.metrics is None:
            return None
        try:
            resolved = await self.cache.resolve(info.api_group, info.api_version, info.resource, info.subresource)
        except Exception as err:
            log.warning("validation: schema lookup failed (%s); the apiserver validates alone", err)
            return None
        if resolved is None or not resolved.endpoint.routes_to(
            bool(info.namespace) and info.resource != "namespaces", bool(info.name), ex.method
        ):
            return None  # no such route: the apiserver's 404 or 405 comes before it decodes
        data = await ex.body.read()  # type: ignore[union-attr]  # StatusError (413) goes to the caller
        t0 = time.perf_counter()
        outcome = await run_body_work(
            self.ctx, len(data), _validate, data, media, resolved.root, resolved.custom, resolved.meta, ex=ex
        )
        self.metrics.seconds.observe(time.perf_counter() - t0)
        endpoint = resolved.endpoint
        version = endpoint.version
        group, _, named = (outcome.api_version or "").rpartition("/")
        if resolved.custom and outcome.kind == endpoint.kind and group == info.api_group and named:
            # A custom resource naming another version of its group: the apiserver prunes it with
            # the schema of the body's own version (``structuralSchemas[gv.Version]``), warns as
            # usual, names that version in a Strict error, and refuses the version mismatch itself
            # afterwards.
            version = named
            if named != endpoint.version:
                outcome = await self._check_other_version(data, media, info, named, endpoint.kind, resolved.meta, ex)
        elif outcome.api_version not in (None, endpoint.api_version) or outcome.kind not in (None, endpoint.kind):
            outcome.fatal = outcome.fatal or "apiVersion/kind differ from the endpoint's"
        ex.state["validation.endpoint"] = endpoint
        ex.state["validation.custom"] = resolved.custom
        ex.state["validation.version"] = version
        return outcome

    async def _check_other_version(
        self, data: bytes, media: str, info: RequestInfo, version: str, kind: str, meta: Node | None, ex: Exchange
    ) -> Outcome:
        """A custom resource body naming ``version`` of the endpoint's group, checked with that
        version's schema. A version /openapi/v3 does not publish (not served, or not in the CRD:
        the apiserver then prunes with no schema at all) is told apart by reading the CRD; the
        schema of a version that is not served is not known here: left to the apiserver."""
        assert self.cache is not None
        try:
            other = await self.cache.resolve(info.api_group, version, info.resource, info.subresource)
        except Exception as err:
            log.warning("validation: schema lookup failed (%s); the apiserver validates alone", err)
            other = None
        if other is not None and other.custom and other.endpoint.kind == kind:
            return await run_body_work(self.ctx, len(data), _validate, data, media, other.root, True, other.meta, ex=ex)
        if other is None and meta is not None and await self._crd_lacks_version(info, version):
            return await run_body_work(self.ctx, len(data), _validate, data, media, no_schema_root(), True, meta, ex=ex)
        return Outcome(fatal=f"the body names version {version}, whose schema kproxy does not have")

    async def _crd_lacks_version(self, info: RequestInfo, version: str) -> bool:
        """Whether the resource's CRD (read with kproxy's own credentials) has no such version."""
        assert self.ctx is not None
        try:
            status, crd = await self.ctx.api.json("GET", f"{_CRDS}/{info.resource}.{info.api_group}")
        except Exception as err:
            log.warning("validation: could not read the CRD of %s (%s)", info.group_resource, err)
            return False
        if status != 200 or not isinstance(crd, dict):
            return False
        versions = (crd.get("spec") or {}).get("versions")
        return isinstance(versions, list) and all(isinstance(v, dict) and v.get("name") != version for v in versions)

    async def _local_answer(self, ex: Exchange, outcome: Outcome) -> Reply | None:
        """The apiserver's Strict 400, when kproxy can prove it is what the apiserver would say.

        The Status is written by ``Reply.from_status(err, ex)``, as the apiserver writes errors
        (JSON, pretty when asked, YAML or protobuf as negotiated; protobuf for client-go's
        protobuf clients and for the ``transcode`` filter when it sits in front of this one). A
        request with no acceptable media type is the apiserver's (its 406 comes before decoding,
        in both modes: the body is never stored). A conversion (``as=``) is left to the
        apiserver in front of an upstream that validates.
        """
        if not _options_valid(ex.query):
            return None
        accept = ex.headers.get("Accept")
        negotiated = negotiate(accept)
        if negotiated is None or (not ex.state["validation.custom"] and not router_accepts(accept)):
            return None  # the apiserver's 406 comes before it decodes the body
        media = negotiated.media_type if negotiated.convert is None else None
        if self.upstream_validates and (media not in _LOCAL_MEDIA or not await self._authorized(ex)):
            return None
        endpoint = ex.state["validation.endpoint"]
        err = create_update_error(endpoint.kind, ex.state["validation.version"], outcome)
        if negotiated_media(ex.headers, ex.query)[0] == PROTOBUF:
            await self._protobuf()  # its schema is loaded on a worker thread, not on the event loop
        return Reply.from_status(err, ex)

    async def _protobuf(self) -> ProtobufCodec:
        """The process's protobuf codec (shared with ``transcode``). Without transcode it is made
        for the first protobuf answer; importing the codec and loading its schema (0.15 s warm,
        over a second cold) happen on a worker thread, not on the event loop."""
        ctx = self.ctx
        assert ctx is not None
        from kproxy.codec import shared_codec  # lazy: not at import

        if shared_codec.cache_info().currsize == 0:
            await asyncio.to_thread(_load_codec_schema)
        return shared_codec()

    async def _created_namespace(self, ex: Exchange, info: RequestInfo) -> tuple[RequestInfo, str | None]:
        """The request as rules see it, and the namespace prefix they match when only that is
        known: a Namespace create is in the namespace it creates (see :mod:`kproxy.identity.policy`).
        Its body is read only for a caller the apiserver would authorize."""
        if not creates_namespace(info) or not any(r.match.namespaces for r in self.rules):
            return info, None
        if not await self._authorized(ex):
            return info, None  # the apiserver refuses it first; no rule changes that
        data = await ex.body.read()  # type: ignore[union-attr]  # StatusError (413) goes to the caller
        content_type = ex.headers.get("Content-Type", "")
        name, exact = await run_body_work(self.ctx, len(data), created_namespace, data, content_type, ex=ex)
        if exact:
            return dataclasses.replace(info, namespace=name), None
        return info, name

    async def _authorized(self, ex: Exchange) -> bool:
        assert self.ctx is not None and self.access is not None
        if self.ctx.credentials != "impersonate" and asks_impersonation(ex.headers):
            # The apiserver first checks that the caller may impersonate (filters/impersonation/);
            # a review of the impersonated identity alone does not show the write allowed.
            return False
        try:
            identity = await authenticator(self.ctx).identify(ex)
        except StatusError:
            return False
        try:
            return (await self.access.check(identity, ex.info)).allowed
        except AccessReviewError:
            return False


def _validate(data: bytes, media: str, root: Node, custom: bool, meta: Node | None) -> Outcome:
    return validate_body(data, media, root, custom=custom, meta=meta)


def _load_codec_schema() -> None:
    # lazy: kproxy.codec loads protobuf; only the answers that need it pay for it
    from kproxy.codec import load_schema

    load_schema()  # cached for the process: the codec is then cheap to make


def _set_field_validation(ex: Exchange, level: Level) -> None:
    """Every spelling Go reads as ``fieldValidation`` replaced by this level; the rest as sent."""
    try:
        ex.raw_query = with_param(ex.raw_query, "fieldValidation", level.wire)
    except TooManyQueryParams as err:
        raise bad_request(f"kproxy validation: {err}") from None
    ex._query = None  # the parsed view follows the new raw query


def _options_valid(query: MultiDict[str]) -> bool:
    """Create/UpdateOptions the apiserver accepts (it rejects bad ones with a 422 before decoding)."""
    if any(v != "All" for v in query.getall("dryRun", [])):
        return False
    managers = query.getall("fieldManager", [])
    if managers:
        manager = managers[0]
        if len(manager) > 128 or not all(c.isprintable() for c in manager):
            return False
    return True
