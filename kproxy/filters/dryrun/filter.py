"""The ``dryrun`` filter (:class:`DryRun`): its rules decide, per mutating request, a dry run,
a refusal or nothing (the package docstring says what it covers, and why)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from prometheus_client import Counter
from pydantic import BaseModel

from kproxy.core.chain import BytesBody, Exchange, FilterBase, Handler, Identity, Reply, UpgradeBody
from kproxy.core.context import FilterContext, ServiceKey
from kproxy.core.offload import run_body_work
from kproxy.core.requestinfo import RequestInfo
from kproxy.core.status import StatusError, bad_request, forbidden, go_quote, unsupported_media_type
from kproxy.filters.dryrun.deleteoptions import (
    DELETE_MEDIA_TYPES,
    JSON,
    YAML,
    BodyError,
    NotJSON,
    NotYAML,
    UnsupportedBodyType,
    decode_options,
    delete_body_dry_run,
    dry_run_field,
    enforce_delete_body,
    media_type,
)
from kproxy.filters.dryrun.query import enforce_query, invalid_dry_run, is_dry_run, query_dry_run
from kproxy.filters.dryrun.rules import DryRunSettings
from kproxy.gocompat.url import TooManyQueryParams
from kproxy.identity.access import AccessReviewer, UndecidedError, api_review, authorize
from kproxy.identity.authn import authenticator
from kproxy.identity.policy import created_namespace, creates_namespace, first_match_lazy, match_verb

__all__ = ["DryRun", "warning_value"]

_OPTIONS_KIND = {
    "create": "CreateOptions",
    "update": "UpdateOptions",
    "patch": "PatchOptions",
    "delete": "DeleteOptions",
    "deletecollection": "DeleteOptions",
}
_METHOD_VERB = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_DELETE_VERBS = frozenset(("delete", "deletecollection"))

# Creates the apiserver performs for real even with dryRun=All: a TokenRequest returns a valid,
# signed token (pkg/registry/core/serviceaccount/storage/token.go never looks at DryRun), which
# would let a dry-run-only caller act as that service account. Refused under enforce and reject.
_MINTS_CREDENTIALS = frozenset({("", "serviceaccounts", "token")})


def warning_value(text: str) -> str:
    """A ``Warning`` header value as the apiserver writes it (``299 - "<Go-quoted text>"``)."""
    return f"299 - {go_quote(text)}"


class DryRun(FilterBase):
    """Make matching mutations dry runs (``enforce``), refuse them (``reject``), or pass them (``allow``)."""

    name: ClassVar[str] = "dryrun"
    config_model: ClassVar[type[BaseModel]] = DryRunSettings

    def __init__(self, settings: DryRunSettings) -> None:
        self.settings = settings
        self.rules = settings.rules
        self.rule_names = [r.display_name(i) for i, r in enumerate(self.rules)]
        # Built once: Go-quoting is per character, too slow for every request.
        self._quoted = [go_quote(n) for n in self.rule_names]
        self._warnings = [
            warning_value(f"kproxy dryrun rule {q} ran this request as a dry run: nothing was persisted")
            for q in self._quoted
        ]
        # Per-rule metric children, resolved once at start (labels() per request costs more).
        self._enforced: list[Any] = []
        self._rejected: list[Any] = []
        self._access: AccessReviewer | None = None
        self._namespace_rules = any(r.match.namespaces for r in self.rules)

    async def start(self, ctx: FilterContext) -> None:
        await super().start(ctx)
        self._access = AccessReviewer(api_review(ctx), max_entries=4096)
        enforced, rejected = _metrics(ctx)
        self._enforced = [enforced.labels(n) for n in self.rule_names]
        self._rejected = [rejected.labels(n) for n in self.rule_names]

    def _identify(self, ex: Exchange) -> Callable[[], Awaitable[Identity]]:
        async def identify() -> Identity:
            assert self.ctx is not None, "DryRun.start() was not awaited"
            return await authenticator(self.ctx).identify(ex)

        return identify

    async def __call__(self, ex: Exchange, call_next: Handler) -> Reply:
        info = ex.info
        if not info.is_resource_request:
            return await call_next(ex)
        if ex.method not in _METHOD_VERB and ex.method.upper() in _METHOD_VERB:
            # No apiserver route answers a lower-case method, but judge it as the mutation it names.
            verb = _METHOD_VERB[ex.method.upper()]
            if verb == "delete" and not info.name:
                verb = "deletecollection"
            info = dataclasses.replace(info, verb=verb)
        verb = match_verb(info)
        if verb != "connect" and not info.is_mutating:
            return await call_next(ex)
        try:
            seen, prefix = await self._created_namespace(ex, info)
            found = await first_match_lazy(self.rules, seen, self._identify(ex), namespace_prefix=prefix)
        except StatusError as err:
            return Reply.from_status(err, ex)
        if found is None or found[1].action == "allow":
            return await call_next(ex)
        index, rule = found
        quoted = self._quoted[index]
        if verb == "connect":
            what = _resource(info)
            return await self._refuse(
                ex, index, info, f"kproxy dryrun rule {quoted}: {what} cannot be run as a dry run"
            )
        if ex.method not in _METHOD_VERB:
            return await self._refuse(ex, index, info, f"kproxy dryrun rule {quoted}: method {ex.method} refused")
        if (info.api_group, info.resource, info.subresource) in _MINTS_CREDENTIALS and info.verb == "create":
            return await self._refuse(
                ex, index, info, f"kproxy dryrun rule {quoted}: {_resource(info)} issues a real token even as a dry run"
            )
        # Only kproxy's own answers are caught here; whatever call_next raises is the server's business.
        try:
            if rule.action == "reject":
                if not await self._is_dry_run(ex, info):
                    return await self._refuse(
                        ex,
                        index,
                        info,
                        f"kproxy dryrun rule {quoted} allows only dry-run requests here (add dryRun=All, "
                        "e.g. kubectl --dry-run=server)",
                    )
                return await call_next(ex)
            await self._make_dry_run(ex, info)
        except StatusError as err:
            return Reply.from_status(await self._apiserver_refusal(ex, info) or err, ex)
        if self._enforced:
            self._enforced[index].inc()
        reply = await call_next(ex)
        reply.headers.add("Warning", self._warnings[index])
        return reply

    async def _refuse(self, ex: Exchange, index: int, info: RequestInfo, message: str) -> Reply:
        """kproxy's 403 for the rule, unless the apiserver would refuse the caller first."""
        refusal = await self._apiserver_refusal(ex, info)
        if refusal is not None:
            return Reply.from_status(refusal, ex)
        if self._rejected:
            self._rejected[index].inc()
        return Reply.from_status(forbidden(info.api_group, info.resource, info.name, message), ex)

    async def _apiserver_refusal(self, ex: Exchange, info: RequestInfo) -> StatusError | None:
        """The apiserver's own 401 or 403 for a caller it refuses before it reads the body
        (authentication and authorization come first there), or None.

        Asked before kproxy reads or decodes a body and before it answers in its own words, so
        that a caller the apiserver would refuse costs no decoding and learns nothing more than
        the apiserver would tell it. ``credentials: proxy`` has one caller, kproxy itself: nothing
        to ask. When the authorizer gives no usable answer, None: kproxy then goes on as policy
        says (its decoding is bounded either way)."""
        ctx = self.ctx
        if ctx is None or self._access is None or ctx.credentials == "proxy":
            return None
        try:
            await authorize(ctx, self._access, ex, verb=info.verb)
        except UndecidedError:
            return None
        except StatusError as err:
            return err if err.code in (401, 403) else None
        return None

    async def _read_body(self, ex: Exchange, info: RequestInfo) -> bytes:
        """The request body, read whole (the apiserver's limit applies), after the caller was
        found to be one the apiserver would read it for."""
        body = ex.body
        if isinstance(body, UpgradeBody):
            return b""
        refusal = await self._apiserver_refusal(ex, info)
        if refusal is not None:
            raise refusal
        data = await body.read()
        ex.body = BytesBody(data, body.media_type)
        return data

    async def _delete_body(self, ex: Exchange, info: RequestInfo) -> bytes:
        """A DELETE's body: it decides where options come from."""
        if info.verb not in _DELETE_VERBS:
            return b""
        return await self._read_body(ex, info)

    async def _created_namespace(self, ex: Exchange, info: RequestInfo) -> tuple[RequestInfo, str | None]:
        """The request as rules see it, and the namespace prefix they match when only that is
        known: a Namespace create is in the namespace it creates (see :mod:`kproxy.identity.policy`)."""
        if not self._namespace_rules or not creates_namespace(info):
            return info, None
        data = await self._read_body(ex, info)
        content_type = ex.headers.get("Content-Type", "")
        name, exact = await run_body_work(self.ctx, len(data), created_namespace, data, content_type, ex=ex)
        if exact:
            return dataclasses.replace(info, namespace=name), None
        return info, name

    async def _is_dry_run(self, ex: Exchange, info: RequestInfo) -> bool:
        """Whether the apiserver will run this request as a dry run; its 422 for invalid values."""
        values: list[str] | None
        body = await self._delete_body(ex, info)
        if body:
            try:
                values = await run_body_work(
                    self.ctx, len(body), delete_body_dry_run, body, ex.headers.get("Content-Type", ""), ex=ex
                )
            except BodyError:
                return False  # not provably a dry run
        else:
            values = query_dry_run(ex.raw_query) or None
        if values and not is_dry_run(values):
            raise invalid_dry_run(_OPTIONS_KIND[info.verb], values)
        if values is None and (info.api_group, info.resource, info.subresource) == ("", "pods", "eviction"):
            return await self._eviction_dry_run(ex, info)
        return is_dry_run(values)

    async def _eviction_dry_run(self, ex: Exchange, info: RequestInfo) -> bool:
        """An Eviction without ``?dryRun`` uses its own ``deleteOptions.dryRun`` (eviction.go
        ``propagateDryRun``): a dry run when that is non-empty and all ``All`` (JSON or YAML body)."""
        data = await self._read_body(ex, info)
        mt = media_type(ex.headers.get("Content-Type", ""))
        if mt not in (JSON, YAML):
            return False
        try:
            eviction = await run_body_work(self.ctx, len(data), decode_options, data, mt, ex=ex)
        except BodyError:
            return False
        options = eviction.get("deleteOptions") if isinstance(eviction, dict) else None
        return isinstance(options, dict) and is_dry_run(dry_run_field(options))

    async def _make_dry_run(self, ex: Exchange, info: RequestInfo) -> None:
        """Rewrite the request so that the apiserver runs it as a dry run, or raise the Status that
        refuses it (the apiserver's 422 for a client's invalid value, 400/415 for an unreadable body)."""
        kind = _OPTIONS_KIND[info.verb]
        body = await self._delete_body(ex, info)
        if body:
            try:
                new_body, content_type, values = await run_body_work(
                    self.ctx, len(body), enforce_delete_body, body, ex.headers.get("Content-Type", ""), ex=ex
                )
            except UnsupportedBodyType:
                raise unsupported_media_type(DELETE_MEDIA_TYPES) from None
            except (NotJSON, NotYAML) as err:
                raise bad_request(str(err)) from None  # what the apiserver answers for this body
            except BodyError as err:
                raise bad_request(f"kproxy dryrun: {err}") from None
            if values is not None and not is_dry_run(values):
                raise invalid_dry_run(kind, values)
            ex.body = BytesBody(new_body, content_type)
            ex.headers["Content-Type"] = content_type
        else:
            values = query_dry_run(ex.raw_query)
            if values and not is_dry_run(values):
                raise invalid_dry_run(kind, values)
        try:
            ex.raw_query = enforce_query(ex.raw_query)
        except TooManyQueryParams as err:
            raise bad_request(f"kproxy dryrun: {err}") from None
        ex._query = None  # the parsed view (if any filter built it) follows the new raw query


_METRICS_KEY: ServiceKey[tuple[Counter, Counter]] = ServiceKey(f"{__name__}.metrics")


def _metrics(ctx: FilterContext) -> tuple[Counter, Counter]:
    """The filter's counters, registered once per registry: a config reload or a second
    ``dryrun`` entry in the chain shares them (labelled by rule name)."""

    def make() -> tuple[Counter, Counter]:
        enforced = Counter(
            "kproxy_dryrun_enforced_total",
            "Mutating requests the dryrun filter sent upstream as dry runs, by rule.",
            ["rule"],
            registry=ctx.registry,
        )
        rejected = Counter(
            "kproxy_dryrun_rejected_total",
            "Requests the dryrun filter refused (reject rules; unsafe requests under enforce), by rule.",
            ["rule"],
            registry=ctx.registry,
        )
        return enforced, rejected

    return ctx.service(_METRICS_KEY, make)


def _resource(info: RequestInfo) -> str:
    return f"{info.resource}/{info.subresource}" if info.subresource else info.resource
