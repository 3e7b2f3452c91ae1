"""The ``dryrun`` filter: by policy, mutating requests run with ``dryRun=All`` (or are refused).

Rules are evaluated in order and the first match decides (see :mod:`kproxy.identity.policy`):

* ``enforce`` -- every matching mutating request (POST, PUT, PATCH of every kind including
  server-side apply, DELETE and deletecollection, subresources such as ``status``, ``scale``,
  ``eviction``, ``binding``) goes upstream as a dry run. The response carries
  ``Warning: 299 - "..."`` naming the rule. Streaming subresources (exec, attach, portforward,
  proxy) cannot be dry-run and are refused with a 403 Status.
* ``reject`` -- a matching mutating request that is not already a valid dry run gets a 403
  Status naming the rule.
* ``allow`` -- passes unchanged.

Reads (get, list, watch) always pass. How the apiserver reads ``dryRun``, and therefore what
this filter must cover so that it cannot be bypassed (apiserver v1.37 sources):

* Query parameters are decoded by Go's ``url.ParseQuery`` (pairs split on ``&``; a pair with
  ``;`` or a bad ``%`` escape is dropped; ``%xx`` and ``+`` decoded in keys and values) and read
  with a case-sensitive map lookup of ``dryRun`` (zz_generated.conversion.go): every value
  must be ``All`` (``ValidateDryRun``), else the request is a 422 naming ``CreateOptions``,
  ``UpdateOptions``, ``PatchOptions`` or ``DeleteOptions``. Under ``enforce`` kproxy removes
  every pair whose decoded key is ``dryRun`` in any letter case and appends ``dryRun=All``; a
  client-supplied invalid value gets the apiserver's own 422, built here, never forwarded.
* Create, update and patch options come from the query only (create.go, update.go, patch.go);
  a ``dryRun`` field in their body is just an unknown field of the object.
* DELETE and deletecollection (delete.go): a non-empty body is decoded as ``DeleteOptions``
  (JSON, YAML or protobuf by ``Content-Type``; absent = JSON) and the query's ``dryRun`` is
  then ignored. So kproxy reads every DELETE body and, under ``enforce``, rewrites it with
  ``dryRun: ["All"]`` (JSON and YAML become JSON; protobuf is edited in its wire form). A body
  it cannot parse, or of another media type, is refused, never forwarded. ``null`` (which Go
  decodes as empty options) becomes ``{"dryRun":["All"]}``.
* A DELETE body is decoded as the apiserver decodes it, with its limits: YAML through
  ``kproxy.gocompat.yaml`` (go-yaml's depth and alias budget, first document only), JSON with
  Go's nesting limit; a body it refuses gets its own 400 word for word. Large bodies are decoded
  off the event loop (``kproxy.core.offload``).
* Authentication and authorization come first at the apiserver, so kproxy reads no body and
  answers nothing of its own (a rule's 403, a 422 for ``dryRun``, a 400 for a body) before it
  knows the apiserver would authorize the caller (a SubjectAccessReview, cached); a caller it
  would refuse gets its 401 or 403.
* The Namespace object is in itself for a rule's ``namespaces`` (:mod:`kproxy.identity.policy`): creating
  ``dry-x`` (the name read from the body) is a dry run under a ``dry-*`` rule, as changing and
  deleting it are.
* ``serviceaccounts/token`` (TokenRequest) ignores ``dryRun``: a dry run still returns a real,
  valid token, so matching ``enforce`` and ``reject`` rules refuse it.
* ``X-HTTP-Method-Override`` is honoured by neither Go's server nor the apiserver: the method
  on the wire is what runs, and RequestInfo is computed from it. A method in lower case
  (``delete``) matches no apiserver route; kproxy still treats it as the mutation it names.

Package: this module is the filter.
May import: ``kproxy.core``, ``kproxy.identity``, the engines and ``kproxy.config``;
never another filter nor ``kproxy.server``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Literal

import orjson
from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict

from kproxy.codec.codecerrors import CodecError
from kproxy.codec.envelope import iter_fields, ld
from kproxy.core.chain import BytesBody, Exchange, FilterBase, Handler, Identity, Reply, UpgradeBody
from kproxy.core.context import FilterContext, ServiceKey
from kproxy.core.offload import run_body_work
from kproxy.core.requestinfo import RequestInfo
from kproxy.core.status import (
    CauseType,
    StatusCause,
    StatusError,
    bad_request,
    forbidden,
    go_json_dumps,
    go_quote,
    invalid,
    unsupported_media_type,
)
from kproxy.gocompat.jsondepth import nesting_error
from kproxy.gocompat.jsonsyntax import syntax_error
from kproxy.gocompat.strings import to_lower, trim_space
from kproxy.gocompat.url import TooManyQueryParams, query_values, with_param
from kproxy.gocompat.yaml import GoYAMLError, UnsupportedYAML, yaml_to_json
from kproxy.identity.access import AccessReviewer, UndecidedError, api_review, authorize
from kproxy.identity.authn import authenticator
from kproxy.identity.policy import Rule, created_namespace, creates_namespace, first_match_lazy, match_verb

__all__ = [
    "DryRun",
    "DryRunRule",
    "DryRunSettings",
    "delete_body_dry_run",
    "enforce_delete_body",
    "enforce_query",
    "invalid_dry_run",
    "query_dry_run",
]

DRY_RUN_ALL = "All"
_OPTIONS_KIND = {
    "create": "CreateOptions",
    "update": "UpdateOptions",
    "patch": "PatchOptions",
    "delete": "DeleteOptions",
    "deletecollection": "DeleteOptions",
}
_METHOD_VERB = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_DELETE_VERBS = frozenset(("delete", "deletecollection"))
# What metainternalversionscheme.Codecs decodes DeleteOptions from (negotiation.NegotiateInputSerializer).
_JSON = "application/json"
_YAML = "application/yaml"
_PROTOBUF = "application/vnd.kubernetes.protobuf"
_DELETE_MEDIA_TYPES = (_JSON, _YAML, _PROTOBUF)
_PROTOBUF_PREFIX = b"k8s\x00"
# Creates the apiserver performs for real even with dryRun=All: a TokenRequest returns a valid,
# signed token (pkg/registry/core/serviceaccount/storage/token.go never looks at DryRun), which
# would let a dry-run-only caller act as that service account. Refused under enforce and reject.
_MINTS_CREDENTIALS = frozenset({("", "serviceaccounts", "token")})


class DryRunRule(Rule):
    """A policy rule with what to do with the mutating requests it matches."""

    action: Literal["enforce", "reject", "allow"]


class DryRunSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Evaluated in order; the first match decides. No match = the request passes unchanged.
    rules: list[DryRunRule]


class BodyError(Exception):
    """A DELETE body kproxy cannot read as DeleteOptions (so it cannot make it a dry run)."""


class UnsupportedBodyType(BodyError):
    """A DELETE body in a media type the apiserver does not decode DeleteOptions from."""


class NotJSON(BodyError):
    """A JSON DELETE body that is not JSON at all: the message is the apiserver's own 400 for it
    (Go's ``encoding/json`` syntax error, which its decoder meets before anything else)."""


class NotYAML(BodyError):
    """A YAML DELETE body go-yaml refuses (syntax, depth, aliasing): the message is its error."""


# --------------------------------------------------------------------------- query parameters


def query_dry_run(raw_query: str) -> list[str]:
    """The ``dryRun`` values the apiserver reads from this query (exact key, every occurrence)."""
    return query_values(raw_query).get("dryRun", [])


def enforce_query(raw_query: str) -> str:
    """The query with every ``dryRun`` pair (any letter case, any encoding) replaced by one
    ``dryRun=All`` (``kproxy.gocompat.url.with_param``); every other pair is kept byte for byte.
    Raises TooManyQueryParams where Go would then read no parameter at all."""
    return with_param(raw_query, "dryRun", DRY_RUN_ALL, fold_case=True)


def is_dry_run(values: list[str] | None) -> bool:
    """``dryrun.IsDryRun`` after ``ValidateDryRun`` passed: at least one value, all ``All``."""
    return bool(values) and all(v == DRY_RUN_ALL for v in values or ())


def invalid_dry_run(kind: str, values: list[str]) -> StatusError:
    """The apiserver's 422 for dryRun values other than ``All`` (``ValidateDryRun`` via ``NewInvalid``)."""
    rendered = go_json_dumps(values).decode().rstrip("\n")
    message = f'Unsupported value: {rendered}: supported values: "{DRY_RUN_ALL}"'
    return invalid(kind, "meta.k8s.io", "", [StatusCause(CauseType.FIELD_VALUE_NOT_SUPPORTED, message, "dryRun")])


# --------------------------------------------------------------------------- DELETE bodies


def media_type(content_type: str) -> str:
    """The lower-cased ``type/subtype`` of a Content-Type (parameters dropped); JSON when absent."""
    # mime.ParseMediaType: Go's ToLower then TrimSpace (U+0130 is "i" to it, not to str.lower).
    mt = trim_space(to_lower(content_type.split(";", 1)[0]))
    return mt or _JSON


def _json_options(data: bytes, mt: str) -> Any:
    """The body as the apiserver's decoder sees it: YAML through sigs.k8s.io/yaml with go-yaml's
    limits (first document only; ``kproxy.gocompat.yaml``), then Go's JSON syntax check (its
    nesting limit included)."""
    if mt == _YAML:
        try:
            decoded = yaml_to_json(data)
        except GoYAMLError as err:
            raise NotYAML(str(err)) from None
        except UnsupportedYAML as err:
            raise BodyError(f"the DeleteOptions body is not converted: {err}") from None
        too_deep = nesting_error(decoded.value, decoded.depth)
        if too_deep is not None:
            raise NotJSON(f"couldn't get version/kind; json parse error: {too_deep}")
        return decoded.value
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as err:
        go = syntax_error(data)
        if go is not None:
            raise NotJSON(f"couldn't get version/kind; json parse error: {go}") from None
        raise BodyError(f"the DeleteOptions body is not valid JSON: {err}") from None


def _dry_run_field(options: dict[str, Any]) -> list[str] | None:
    values = options.get("dryRun")
    if values is None or values == []:
        return None  # absent, null and [] all mean "not a dry run" and are valid
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return ["<not a list of strings>"]
    return values


def delete_body_dry_run(data: bytes, content_type: str) -> list[str] | None:
    """The ``dryRun`` values of a DELETE body (``None`` when it has none); raises :class:`BodyError`."""
    mt = media_type(content_type)
    if mt == _PROTOBUF:
        return _protobuf_dry_run(data)[1] or None
    if mt not in _DELETE_MEDIA_TYPES:
        raise UnsupportedBodyType(mt)
    options = _json_options(data, mt)
    if options is None:
        return None
    if not isinstance(options, dict):
        raise BodyError("the DeleteOptions body is not an object")
    return _dry_run_field(options)


def enforce_delete_body(data: bytes, content_type: str) -> tuple[bytes, str, list[str] | None]:
    """The body rewritten with ``dryRun: ["All"]``, its Content-Type, and the client's own values."""
    mt = media_type(content_type)
    if mt == _PROTOBUF:
        edited, pb_values = _protobuf_dry_run(data, enforce=True)
        return edited, content_type, pb_values or None
    if mt not in _DELETE_MEDIA_TYPES:
        raise UnsupportedBodyType(mt)
    options = _json_options(data, mt)
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BodyError("the DeleteOptions body is not an object")
    values = _dry_run_field(options)
    # Drop case variants too: harmless for the apiserver (its decoder is case-sensitive), safe
    # against any case-insensitive decoder behind it.
    out = {k: v for k, v in options.items() if not (isinstance(k, str) and k.lower() == "dryrun")}
    out["dryRun"] = [DRY_RUN_ALL]
    try:
        return orjson.dumps(out), _JSON, values
    except TypeError as err:
        raise BodyError(f"the DeleteOptions body cannot be represented as JSON: {err}") from None


def _fields(buf: bytes) -> list[tuple[int, int, bytes, bytes]]:
    """Protobuf wire fields as (number, wire type, whole field bytes, payload)."""
    out = []
    try:
        for number, wire, start, value, end in iter_fields(buf):
            if number == 0:
                raise BodyError("malformed protobuf message: field number 0")
            out.append((number, wire, buf[start:end], buf[value:end] if wire == 2 else b""))
    except CodecError as err:
        raise BodyError(str(err)) from None
    return out


def _protobuf_dry_run(data: bytes, enforce: bool = False) -> tuple[bytes, list[str]]:
    """Read (and with ``enforce`` rewrite) ``dryRun`` (field 5) of a protobuf DeleteOptions.

    The body is the ``k8s\\0`` envelope around ``runtime.Unknown`` (typeMeta = 1, raw = 2,
    contentEncoding = 3, contentType = 4); ``raw`` is the DeleteOptions message, whose last
    occurrence wins as in Go's generated unmarshaller. Every field but ``dryRun`` is kept.
    """
    if not data.startswith(_PROTOBUF_PREFIX):
        raise BodyError("the protobuf body does not start with the k8s envelope prefix")
    unknown = _fields(data[len(_PROTOBUF_PREFIX) :])
    raws = [payload for number, wire, _, payload in unknown if number == 2 and wire == 2]
    raw = raws[-1] if raws else b""
    values: list[str] = []
    kept: list[bytes] = []
    for number, wire, whole, payload in _fields(raw):
        if number == 5:
            if wire != 2:
                values.append("<not a string>")
                continue
            try:
                values.append(payload.decode())
            except UnicodeDecodeError:
                values.append(payload.decode(errors="replace"))
            continue
        kept.append(whole)
    if not enforce:
        return data, values
    new_raw = b"".join(kept) + ld(5, DRY_RUN_ALL.encode())
    others = [whole for number, _, whole, _ in unknown if number != 2]
    return _PROTOBUF_PREFIX + b"".join(others) + ld(2, new_raw), values


# --------------------------------------------------------------------------- the filter


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
        if mt not in (_JSON, _YAML):
            return False
        try:
            eviction = await run_body_work(self.ctx, len(data), _json_options, data, mt, ex=ex)
        except BodyError:
            return False
        options = eviction.get("deleteOptions") if isinstance(eviction, dict) else None
        return isinstance(options, dict) and is_dry_run(_dry_run_field(options))

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
                raise unsupported_media_type(_DELETE_MEDIA_TYPES) from None
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
            "kproxy_dryrun_enforced",
            "Mutating requests the dryrun filter sent upstream as dry runs, by rule.",
            ["rule"],
            registry=ctx.registry,
        )
        rejected = Counter(
            "kproxy_dryrun_rejected",
            "Requests the dryrun filter refused (reject rules; unsafe requests under enforce), by rule.",
            ["rule"],
            registry=ctx.registry,
        )
        return enforced, rejected

    return ctx.service(_METRICS_KEY, make)


def _resource(info: RequestInfo) -> str:
    return f"{info.resource}/{info.subresource}" if info.subresource else info.resource
