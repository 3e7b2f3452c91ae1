"""``metav1.Status`` error responses, byte-for-byte as kube-apiserver writes them.

Clients (client-go, kubectl, controllers) parse these bodies and branch on ``reason``, ``code`` and
``details``; some tests and tools even compare messages verbatim.  When the gateway rejects a request
itself it must therefore be indistinguishable from the apiserver doing it.  Sources ported:

* ``staging/src/k8s.io/apimachinery/pkg/api/errors/errors.go`` -- every ``New*`` constructor, message
  text and which ``details`` fields each one sets (including ``details: {}`` where Go allocates an empty
  ``StatusDetails``: ``details`` is a pointer with ``omitempty``, so only a *nil* one disappears);
* ``staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/types.go`` -- ``Status``/``StatusDetails``/
  ``StatusCause`` JSON field order and ``omitempty`` tags, ``StatusReason`` values;
* ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/status.go`` (``ErrorToAPIStatus``:
  ``kind``/``apiVersion`` forced, code 0 becomes 500) and ``writers.go`` (``ErrorNegotiated``:
  ``Retry-After`` from ``details.retryAfterSeconds``);
* ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go`` -- ``Forbidden`` and
  ``forbiddenMessage`` (RBAC-style denial text, HTML sanitising, ``X-Content-Type-Options: nosniff``);
* ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/negotiation/errors.go`` (406/415 text),
  ``staging/src/k8s.io/apiserver/pkg/endpoints/handlers/rest.go`` (``limitedReadBody`` 413 text),
  ``staging/src/k8s.io/apiserver/pkg/endpoints/filters/cachecontrol.go`` (``Cache-Control``);
* the JSON encoder: ``encoding/json`` as used by
  ``staging/src/k8s.io/apimachinery/pkg/runtime/serializer/json/json.go`` -- compact output plus ``\\n``
  (or 2-space indent without newline when pretty), ``<``, ``>``, ``&``, U+2028 and U+2029 escaped as
  ``\\u003c`` etc., invalid UTF-8 as ``\\ufffd``; message text quoted with Go's ``%q``
  (``strconv.Quote``).  orjson does the encoding; the Go-specific escapes are applied on top.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kproxy.gocompat.jsonescape import go_json_dumps
from kproxy.gocompat.strconv import go_quote

if TYPE_CHECKING:
    from kproxy.core.requestinfo import RequestInfo

__all__ = [
    "OPTIMISTIC_LOCK_ERROR_MSG",
    "CauseType",
    "StatusCause",
    "StatusDetails",
    "StatusError",
    "StatusReason",
    "already_exists",
    "apply_conflict",
    "bad_request",
    "conflict",
    "forbidden",
    "forbidden_for_request",
    "forbidden_message",
    "generic",
    "generic_server_response",
    "go_json_dumps",
    "go_quote",
    "gone",
    "internal_error",
    "invalid",
    "method_not_supported",
    "not_acceptable",
    "not_found",
    "request_entity_too_large",
    "request_entity_too_large_error",
    "resource_expired",
    "server_timeout",
    "service_unavailable",
    "timeout",
    "too_many_requests",
    "unauthorized",
    "unsupported_media_type",
]


class StatusReason(enum.StrEnum):
    """``metav1.StatusReason`` values (``Unknown`` is the empty string and is omitted on the wire)."""

    UNKNOWN = ""
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    NOT_FOUND = "NotFound"
    ALREADY_EXISTS = "AlreadyExists"
    CONFLICT = "Conflict"
    GONE = "Gone"
    INVALID = "Invalid"
    SERVER_TIMEOUT = "ServerTimeout"
    STORAGE_READ_ERROR = "StorageReadError"
    TIMEOUT = "Timeout"
    TOO_MANY_REQUESTS = "TooManyRequests"
    BAD_REQUEST = "BadRequest"
    METHOD_NOT_ALLOWED = "MethodNotAllowed"
    NOT_ACCEPTABLE = "NotAcceptable"
    REQUEST_ENTITY_TOO_LARGE = "RequestEntityTooLarge"
    UNSUPPORTED_MEDIA_TYPE = "UnsupportedMediaType"
    INTERNAL_ERROR = "InternalError"
    EXPIRED = "Expired"
    SERVICE_UNAVAILABLE = "ServiceUnavailable"


class CauseType(enum.StrEnum):
    """``metav1.CauseType`` values (serialised as a cause's ``reason``)."""

    FIELD_VALUE_NOT_FOUND = "FieldValueNotFound"
    FIELD_VALUE_REQUIRED = "FieldValueRequired"
    FIELD_VALUE_DUPLICATE = "FieldValueDuplicate"
    FIELD_VALUE_INVALID = "FieldValueInvalid"
    FIELD_VALUE_NOT_SUPPORTED = "FieldValueNotSupported"
    FIELD_VALUE_FORBIDDEN = "FieldValueForbidden"
    FIELD_VALUE_TOO_LONG = "FieldValueTooLong"
    FIELD_VALUE_TOO_MANY = "FieldValueTooMany"
    FIELD_VALUE_TOO_SHORT = "FieldValueTooShort"
    FIELD_VALUE_TOO_FEW = "FieldValueTooFew"
    FIELD_VALUE_TYPE_INVALID = "FieldValueTypeInvalid"
    INTERNAL_ERROR = "InternalError"
    UNEXPECTED_SERVER_RESPONSE = "UnexpectedServerResponse"
    FIELD_MANAGER_CONFLICT = "FieldManagerConflict"
    RESOURCE_VERSION_TOO_LARGE = "ResourceVersionTooLarge"


# staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go
OPTIMISTIC_LOCK_ERROR_MSG = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


@dataclass(frozen=True, slots=True)
class StatusCause:
    """One ``metav1.StatusCause``; ``reason`` is the Go ``Type`` field (JSON name ``reason``)."""

    reason: str = ""
    message: str = ""
    field: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON form with Go's ``omitempty`` applied, keys in struct order."""
        out: dict[str, Any] = {}
        if self.reason:
            out["reason"] = self.reason
        if self.message:
            out["message"] = self.message
        if self.field:
            out["field"] = self.field
        return out


@dataclass(frozen=True, slots=True)
class StatusDetails:
    """``metav1.StatusDetails``.  An all-empty instance still renders as ``{}``, exactly like Go."""

    name: str = ""
    group: str = ""
    kind: str = ""
    uid: str = ""
    causes: tuple[StatusCause, ...] = ()
    retry_after_seconds: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON form with Go's ``omitempty`` applied, keys in struct order."""
        out: dict[str, Any] = {}
        if self.name:
            out["name"] = self.name
        if self.group:
            out["group"] = self.group
        if self.kind:
            out["kind"] = self.kind
        if self.uid:
            out["uid"] = self.uid
        if self.causes:
            out["causes"] = [c.to_dict() for c in self.causes]
        if self.retry_after_seconds:
            out["retryAfterSeconds"] = self.retry_after_seconds
        return out


@dataclass(eq=False, slots=True)
class StatusError(Exception):
    """A failure ``metav1.Status`` that can be raised inside the gateway and rendered at the edge.

    ``details`` is ``None`` when the Go constructor leaves it nil (key omitted) and a
    :class:`StatusDetails` -- possibly empty, giving ``"details":{}`` -- otherwise.  ``retry_after`` is a
    ``Retry-After`` header set independently of the body (the shutdown 503 does that); the header is
    otherwise derived from ``details.retry_after_seconds`` like ``ErrorNegotiated``.  ``nosniff`` marks
    errors written through ``responsewriters.Forbidden`` (authorization denials), which add
    ``X-Content-Type-Options: nosniff``.  ``continue_token`` fills ``metadata.continue`` (410 for an
    expired continue token carries a fresh one there).
    """

    code: int
    reason: str
    message: str
    details: StatusDetails | None = None
    retry_after: int | None = None
    nosniff: bool = False
    continue_token: str = ""

    def __post_init__(self) -> None:
        # dataclass __init__ does not call Exception.__init__; keep args/str()/pickling meaningful.
        self.args = (self.message,)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception.__reduce__ would re-create us from ``args`` alone; keep copy/pickle working.
        fields = (self.code, self.reason, self.message, self.details, self.retry_after, self.nosniff)
        return (type(self), (*fields, self.continue_token))

    @property
    def http_status(self) -> int:
        """The HTTP status line code: ``ErrorToAPIStatus`` turns a failure with code 0 into 500."""
        return self.code or 500

    def to_dict(self) -> dict[str, Any]:
        """The Status object (as it also appears inside a watch ``ERROR`` event), keys in Go order."""
        metadata: dict[str, Any] = {}
        if self.continue_token:
            metadata["continue"] = self.continue_token
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": metadata,
            "status": "Failure",
        }
        if self.message:
            out["message"] = self.message
        if self.reason:
            out["reason"] = str(self.reason)
        if self.details is not None:
            out["details"] = self.details.to_dict()
        out["code"] = self.http_status
        return out

    def body(self, pretty: bool = False) -> bytes:
        """Serialized JSON body: compact + ``\\n``, or (``pretty``) 2-space indented without newline.

        ``pretty`` is what the apiserver does for ``?pretty=true`` or a curl/Wget/browser User-Agent.
        """
        return go_json_dumps(self.to_dict(), pretty=pretty)

    def headers(self) -> dict[str, str]:
        """Response headers the apiserver sends with this error (Content-Length left to the server).

        ``Cache-Control: no-cache, private`` is added to every API response by the ``WithCacheControl``
        filter, which wraps authentication and authorization too, so gateway-made errors carry it as well.
        """
        headers = {"Content-Type": "application/json", "Cache-Control": "no-cache, private"}
        retry = self.details.retry_after_seconds if self.details is not None else 0
        if retry > 0:
            headers["Retry-After"] = str(retry)
        elif self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        if self.nosniff:
            headers["X-Content-Type-Options"] = "nosniff"
        return headers


def _group_resource(group: str, resource: str) -> str:
    """``schema.GroupResource.String()`` (also ``GroupKind.String()``)."""
    return f"{resource}.{group}" if group else resource


# --- constructors mirroring k8s.io/apimachinery/pkg/api/errors ------------------------------------------


def generic(code: int, reason: str, message: str, details: StatusDetails | None = None) -> StatusError:
    """Any Status failure; prefer the specific constructors, which carry the apiserver's exact text."""
    return StatusError(code, reason, message, details)


def bad_request(message: str) -> StatusError:
    """``NewBadRequest``: 400, reason ``BadRequest``, no details."""
    return StatusError(400, StatusReason.BAD_REQUEST, message)


def unauthorized(message: str = "Unauthorized") -> StatusError:
    """``NewUnauthorized``; the authentication filter always passes ``"Unauthorized"``.

    An empty message becomes ``not authorized`` as in Go.
    """
    return StatusError(401, StatusReason.UNAUTHORIZED, message or "not authorized")


def forbidden(group: str, resource: str, name: str, err: str | BaseException) -> StatusError:
    """``NewForbidden(GroupResource{group, resource}, name, err)``.

    Message is ``forbidden: <err>`` without group and resource, ``<gr> is forbidden: <err>`` without a
    name, else ``<gr> "<name>" is forbidden: <err>``; details carry group, kind (the resource), name.
    """
    return _new_forbidden(group, resource, name, str(err), nosniff=False)


def _new_forbidden(group: str, resource: str, name: str, err: str, nosniff: bool) -> StatusError:
    gr = _group_resource(group, resource)
    if not group and not resource:
        message = f"forbidden: {err}"
    elif not name:
        message = f"{gr} is forbidden: {err}"
    else:
        message = f"{gr} {go_quote(name)} is forbidden: {err}"
    details = StatusDetails(name=name, group=group, kind=resource)
    return StatusError(403, StatusReason.FORBIDDEN, message, details, nosniff=nosniff)


def forbidden_message(info: RequestInfo, user: str) -> str:
    """``forbiddenMessage``: the RBAC-style denial sentence for a request, before HTML sanitising.

    ``User "alice" cannot list resource "pods" in API group "" in the namespace "default"``; cluster
    scope ends ``at the cluster scope``; subresources appear as ``pods/exec``; non-resource requests read
    ``User "alice" cannot get path "/healthz"``.  The verb is the RequestInfo verb.
    """
    if not info.is_resource_request:
        return f"User {go_quote(user)} cannot {info.verb} path {go_quote(info.path)}"
    resource = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
    if info.namespace:
        return (
            f"User {go_quote(user)} cannot {info.verb} resource {go_quote(resource)} "
            f"in API group {go_quote(info.api_group)} in the namespace {go_quote(info.namespace)}"
        )
    return (
        f"User {go_quote(user)} cannot {info.verb} resource {go_quote(resource)} "
        f"in API group {go_quote(info.api_group)} at the cluster scope"
    )


def _sanitize_html(s: str) -> str:
    """``responsewriters.sanitizer``: ``&``, ``<``, ``>`` to entities so the text never looks like HTML."""
    if "&" in s or "<" in s or ">" in s:
        return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return s


def forbidden_for_request(info: RequestInfo, user: str, reason: str = "") -> StatusError:
    """``responsewriters.Forbidden``: the 403 an authorization denial produces for ``info``.

    The denial sentence is HTML-sanitised, the authorizer's ``reason`` (unsanitised) is appended after
    ``": "`` when non-empty, then wrapped by ``NewForbidden`` with the request's group, resource (without
    subresource) and name.  Carries ``X-Content-Type-Options: nosniff``.
    """
    msg = _sanitize_html(forbidden_message(info, user))
    err_msg = f"{msg}: {reason}" if reason else msg
    return _new_forbidden(info.api_group, info.resource, info.name, err_msg, nosniff=True)


def not_found(group: str, resource: str, name: str) -> StatusError:
    """``NewNotFound``: ``deployments.apps "web" not found``; details name/group/kind(=resource)."""
    return StatusError(
        404,
        StatusReason.NOT_FOUND,
        f"{_group_resource(group, resource)} {go_quote(name)} not found",
        StatusDetails(name=name, group=group, kind=resource),
    )


def already_exists(group: str, resource: str, name: str) -> StatusError:
    """``NewAlreadyExists``: 409 ``pods "p" already exists``."""
    return StatusError(
        409,
        StatusReason.ALREADY_EXISTS,
        f"{_group_resource(group, resource)} {go_quote(name)} already exists",
        StatusDetails(name=name, group=group, kind=resource),
    )


def conflict(group: str, resource: str, name: str, err: str | BaseException = OPTIMISTIC_LOCK_ERROR_MSG) -> StatusError:
    """``NewConflict``: ``Operation cannot be fulfilled on pods "p": <err>``.

    The default error text is the storage layer's optimistic-lock message (stale ``resourceVersion``).
    """
    return StatusError(
        409,
        StatusReason.CONFLICT,
        f"Operation cannot be fulfilled on {_group_resource(group, resource)} {go_quote(name)}: {err}",
        StatusDetails(name=name, group=group, kind=resource),
    )


def apply_conflict(causes: Sequence[StatusCause], message: str) -> StatusError:
    """``NewApplyConflict``: server-side-apply field-manager conflicts, causes only in details."""
    return StatusError(409, StatusReason.CONFLICT, message, StatusDetails(causes=tuple(causes)))


def invalid(kind: str, group: str, name: str, causes: Sequence[StatusCause]) -> StatusError:
    """``NewInvalid``: 422 with one cause per field error.

    Each cause is a ``field.Error`` as the apiserver reports it: ``reason`` = error type, ``message`` =
    ``ErrorBody()`` (e.g. ``Invalid value: "x": must be ...``), ``field`` = path.  The message is
    ``<Kind>[.<group>] "<name>" is invalid: <aggregate>`` where the aggregate is ``field: body`` for one
    error and ``[e1, e2]`` (deduplicated) for several; without causes it ends at ``is invalid``.
    Note ``details.kind`` is the *Kind* here, not the resource.
    """
    seen: set[str] = set()
    msgs: list[str] = []
    for c in causes:
        text = f"{c.field}: {c.message}"
        if text not in seen:
            seen.add(text)
            msgs.append(text)
    head = f"{_group_resource(group, kind)} {go_quote(name)} is invalid"
    if not msgs:
        message = head
    elif len(msgs) == 1:
        message = f"{head}: {msgs[0]}"
    else:
        message = f"{head}: [{', '.join(msgs)}]"
    return StatusError(
        422,
        StatusReason.INVALID,
        message,
        StatusDetails(name=name, group=group, kind=kind, causes=tuple(causes)),
    )


def method_not_supported(group: str, resource: str, action: str) -> StatusError:
    """``NewMethodNotSupported``: 405 ``<action> is not supported on resources of kind "<gr>"``."""
    return StatusError(
        405,
        StatusReason.METHOD_NOT_ALLOWED,
        f"{action} is not supported on resources of kind {go_quote(_group_resource(group, resource))}",
        StatusDetails(group=group, kind=resource),
    )


def request_entity_too_large_error(message: str) -> StatusError:
    """``NewRequestEntityTooLargeError``: 413 ``Request entity too large: <message>``, no details."""
    return StatusError(413, StatusReason.REQUEST_ENTITY_TOO_LARGE, f"Request entity too large: {message}")


def request_entity_too_large(limit: int) -> StatusError:
    """The body-size rejection of ``limitedReadBody``: ``Request entity too large: limit is 3145728``."""
    return request_entity_too_large_error(f"limit is {limit}")


def too_many_requests(message: str, retry_after_seconds: int = 0) -> StatusError:
    """``NewTooManyRequests``: 429 whose details always exist (``{}`` when no retry is given).

    (Priority-and-fairness 429s are plain text, not a Status; this is the watch-cache style one.)
    """
    return StatusError(
        429, StatusReason.TOO_MANY_REQUESTS, message, StatusDetails(retry_after_seconds=retry_after_seconds)
    )


def internal_error(err: str | BaseException) -> StatusError:
    """``NewInternalError``: 500 ``Internal error occurred: <err>`` with the error text as sole cause."""
    text = str(err)
    return StatusError(
        500,
        StatusReason.INTERNAL_ERROR,
        f"Internal error occurred: {text}",
        StatusDetails(causes=(StatusCause(message=text),)),
    )


def service_unavailable(message: str, retry_after: int | None = None) -> StatusError:
    """``NewServiceUnavailable``: 503 without details.

    ``retry_after`` adds a ``Retry-After`` header outside the body, as the shutdown filter does
    (``apiserver is shutting down`` + ``Retry-After: 1``).
    """
    return StatusError(503, StatusReason.SERVICE_UNAVAILABLE, message, retry_after=retry_after)


def timeout(message: str, retry_after_seconds: int = 0, causes: Sequence[StatusCause] = ()) -> StatusError:
    """``NewTimeoutError``: 504 ``Timeout: <message>``; details always present.

    ``causes`` covers ``storage.NewTooLargeResourceVersionError`` (``ResourceVersionTooLarge``).
    """
    return StatusError(
        504,
        StatusReason.TIMEOUT,
        f"Timeout: {message}",
        StatusDetails(causes=tuple(causes), retry_after_seconds=retry_after_seconds),
    )


def server_timeout(group: str, resource: str, operation: str, retry_after_seconds: int) -> StatusError:
    """``NewServerTimeout``: 500 reason ``ServerTimeout``, the operation doubles as ``details.name``."""
    return StatusError(
        500,
        StatusReason.SERVER_TIMEOUT,
        f"The {operation} operation against {_group_resource(group, resource)} could not be completed at "
        "this time, please try again.",
        StatusDetails(name=operation, group=group, kind=resource, retry_after_seconds=retry_after_seconds),
    )


def gone(message: str) -> StatusError:
    """``NewGone``: 410 reason ``Gone`` (deprecated upstream; resource-version errors use Expired)."""
    return StatusError(410, StatusReason.GONE, message)


def resource_expired(message: str, continue_token: str = "") -> StatusError:
    """``NewResourceExpired``: 410 reason ``Expired`` (too-old resourceVersion or continue token).

    ``continue_token`` is placed in ``metadata.continue`` as etcd3's expired-continue error does.
    """
    return StatusError(410, StatusReason.EXPIRED, message, continue_token=continue_token)


def not_acceptable(accepted: Sequence[str]) -> StatusError:
    """``negotiation.NewNotAcceptableError``: 406 ``only the following media types are accepted: ...``."""
    return StatusError(
        406,
        StatusReason.NOT_ACCEPTABLE,
        f"only the following media types are accepted: {', '.join(accepted)}",
    )


def unsupported_media_type(accepted: Sequence[str]) -> StatusError:
    """``negotiation.NewUnsupportedMediaTypeError``: 415 for an unknown request ``Content-Type``."""
    return StatusError(
        415,
        StatusReason.UNSUPPORTED_MEDIA_TYPE,
        "the body of the request was in an unknown format - accepted media types include: " + ", ".join(accepted),
    )


_GENERIC_RESPONSES: dict[int, tuple[str, str | None]] = {
    # code: (reason, fixed message or None to use the server message)
    404: (StatusReason.NOT_FOUND, "the server could not find the requested resource"),
    400: (StatusReason.BAD_REQUEST, "the server rejected our request for an unknown reason"),
    401: (StatusReason.UNAUTHORIZED, "the server has asked for the client to provide credentials"),
    403: (StatusReason.FORBIDDEN, None),
    406: (StatusReason.NOT_ACCEPTABLE, None),
    415: (StatusReason.UNSUPPORTED_MEDIA_TYPE, None),
    405: (StatusReason.METHOD_NOT_ALLOWED, "the server does not allow this method on the requested resource"),
    422: (StatusReason.INVALID, "the server rejected our request due to an error in our request"),
    503: (StatusReason.SERVICE_UNAVAILABLE, "the server is currently unable to handle the request"),
    504: (
        StatusReason.TIMEOUT,
        "the server was unable to return a response in the time allotted, but may still be processing the request",
    ),
    429: (
        StatusReason.TOO_MANY_REQUESTS,
        "the server has received too many requests and has asked us to try again later",
    ),
}


def generic_server_response(
    code: int,
    verb: str = "",
    group: str = "",
    resource: str = "",
    name: str = "",
    server_message: str = "",
    retry_after_seconds: int = 0,
    is_unexpected_response: bool = False,
) -> StatusError:
    """``NewGenericServerResponse``, which the apiserver's go-restful router uses for its own errors.

    ``generic_server_response(404)`` is the ``the server could not find the requested resource`` answer
    for an unknown resource under a served group/version (``details: {}``); 405/406/415 from the router
    pass the router's text as ``server_message``.
    """
    reason: str = StatusReason.UNKNOWN
    message = f"the server responded with the status code {code} but did not return more information"
    if code == 409:
        reason = StatusReason.ALREADY_EXISTS if verb == "POST" else StatusReason.CONFLICT
        message = "the server reported a conflict"
    elif code in _GENERIC_RESPONSES:
        reason, fixed = _GENERIC_RESPONSES[code]
        message = server_message if fixed is None else fixed
    elif code >= 500:
        reason = StatusReason.INTERNAL_ERROR
        message = f"an error on the server ({go_quote(server_message)}) has prevented the request from succeeding"
    if group or resource:
        gr = _group_resource(group, resource)
        message = f"{message} ({verb.lower()} {gr} {name})" if name else f"{message} ({verb.lower()} {gr})"
    causes: tuple[StatusCause, ...] = ()
    if is_unexpected_response:
        causes = (StatusCause(reason=CauseType.UNEXPECTED_SERVER_RESPONSE, message=server_message),)
    return StatusError(
        code,
        reason,
        message,
        StatusDetails(name=name, group=group, kind=resource, causes=causes, retry_after_seconds=retry_after_seconds),
    )
