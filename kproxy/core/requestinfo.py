"""Classify an API request exactly the way kube-apiserver does (``RequestInfo``).

The gateway makes authorization, routing and timeout decisions *before* the real apiserver sees a
request, so its idea of "which verb on which resource" has to be the apiserver's own, bug for bug:
any divergence is either a false deny or, worse, a request the gateway waved through under a different
verb than the one the apiserver will execute.  This module is a line-by-line port of

* ``staging/src/k8s.io/apiserver/pkg/endpoints/request/requestinfo.go``
  (``RequestInfoFactory.NewRequestInfo``, ``splitPath``), configured as kube-apiserver configures it:
  ``APIPrefixes = {"api", "apis"}``, ``GrouplessAPIPrefixes = {"api"}``;
* the part of ``metainternalversionscheme.ParameterCodec.DecodeParameters`` that NewRequestInfo relies on
  to turn a name-less GET into ``list``/``watch``:
  ``staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/zz_generated.conversion.go``
  (``Convert_url_Values_To_v1_ListOptions``),
  ``staging/src/k8s.io/apimachinery/pkg/runtime/conversion.go`` (``Convert_Slice_string_To_bool`` and the
  int64 conversions), ``staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/conversion.go``
  (``Convert_string_To_labels_Selector``, ``Convert_string_To_fields_Selector``),
  ``staging/src/k8s.io/apimachinery/pkg/fields/selector.go`` (``ParseSelector``, ``RequiresExactMatch``),
  ``staging/src/k8s.io/apimachinery/pkg/labels/selector.go`` (``Parse``, only for its accept/reject
  decision), ``staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go`` and
  ``staging/src/k8s.io/apimachinery/pkg/api/validation/path/name.go`` (``IsValidPathSegmentName``);
* Go's ``net/url`` decoding of the request target (``url.ParseRequestURI`` path unescaping and
  ``url.ParseQuery``), because NewRequestInfo works on ``req.URL.Path`` (percent-*decoded*, so ``%2F``
  becomes a path separator) and ``req.URL.Query()``.

Behaviour worth knowing (all reproduced on purpose):

* ``watch`` is true for any first value except ``0`` or a case-insensitive ``false`` -- ``watch=``,
  ``watch=no`` and ``watch=yes`` all watch.  When the *other* list parameters fail to decode (bad
  ``limit``/``timeoutSeconds``/selectors) the apiserver falls back to a simpler check, drops the
  ``fieldSelector`` name, and compares with ``strings.ToLower`` instead of ``strings.EqualFold``.
* ``fieldSelector=metadata.name=x`` on a list/watch supplies ``name`` (so RBAC ``resourceNames`` apply).
* ``/api`` , ``/apis/apps`` and ``/apis/apps/v1`` are *non*-resource requests (too few segments).
* ``/api/v1/namespaces/ns/status`` and ``.../finalize`` are subresources of the namespace, so no namespaced
  resource can be called ``status`` or ``finalize``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kproxy.cacher.fields import parse_terms
from kproxy.cacher.labels import SelectorError, parse_label_selector
from kproxy.gocompat.url import InvalidRequestURIError, RequestURI, parse_request_uri, unescape_path
from kproxy.gocompat.url import parse_query as _go_parse_query

__all__ = [
    "InvalidRequestURIError",
    "RequestInfo",
    "RequestInfoError",
    "parse_query",
    "parse_request_info",
    "request_info_for",
    "request_info_from_target",
    "unescape_path",
]

# --- constants of the kube-apiserver RequestInfoFactory (module level: built once, never per call) ----------

_API_PREFIXES = frozenset(("api", "apis"))
_GROUPLESS_API_PREFIXES = frozenset(("api",))
# specialVerbs / specialVerbsNoSubresources / namespaceSubresources in requestinfo.go
_SPECIAL_VERBS = frozenset(("proxy", "watch"))
_SPECIAL_VERBS_NO_SUBRESOURCES = frozenset(("proxy",))
_NAMESPACE_SUBRESOURCES = frozenset(("status", "finalize"))
# verbsWithSelectors (only consulted for the AuthorizeWithSelectors selector capture)
_VERBS_WITH_SELECTORS = frozenset(("list", "watch", "deletecollection"))
# Go switches on req.Method case-sensitively (request.MethodGet == "GET"); "get" maps to "".
_METHOD_VERBS: dict[str, str] = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}

_MUTATING_VERBS = frozenset(("create", "update", "patch", "delete", "deletecollection"))
_POD_CONNECT_SUBRESOURCES = frozenset(("exec", "attach", "portforward", "proxy"))
_PROXY_CONNECT_RESOURCES = frozenset(("services", "nodes"))

_EMPTY_PARTS: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What kube-apiserver's ``RequestInfo`` says about one request.

    ``path`` is the percent-decoded URL path (Go's ``req.URL.Path``).  ``verb`` is the Kubernetes verb for
    resource requests (``get``, ``list``, ``watch``, ``create``, ``update``, ``patch``, ``delete``,
    ``deletecollection``, ``proxy``, or ``""`` for unknown methods) and the lower-cased HTTP method for
    non-resource requests.  ``parts`` are the path segments starting at the resource, as in Go.

    ``field_selector``/``label_selector`` mirror the fields of the same name that current apiservers
    (feature ``AuthorizeWithSelectors``) fill for ``list``/``watch``/``deletecollection`` so authorizers
    can see the raw selectors; they stay empty for the deprecated ``/watch/`` path form, as in Go.
    """

    path: str
    verb: str
    is_resource_request: bool
    api_prefix: str = ""
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    parts: tuple[str, ...] = _EMPTY_PARTS
    field_selector: str = ""
    label_selector: str = ""

    @property
    def group_resource(self) -> str:
        """``schema.GroupResource.String()``: ``deployments.apps``, or just ``pods`` for the core group."""
        if self.api_group:
            return f"{self.resource}.{self.api_group}"
        return self.resource

    @property
    def is_watch(self) -> bool:
        """True for watches, whether asked for via ``?watch=`` or the deprecated ``/watch/`` path."""
        return self.verb == "watch"

    @property
    def is_mutating(self) -> bool:
        """True for the verbs that can change stored state (create/update/patch/delete/deletecollection)."""
        return self.verb in _MUTATING_VERBS

    @property
    def namespace_in_path(self) -> bool:
        """Whether the resource follows a ``namespaces/{namespace}/`` prefix in the path: the routes
        the apiserver's installer registers for namespaced resources only
        (``staging/src/k8s.io/apiserver/pkg/endpoints/installer.go``, ``registerResourceHandlers``:
        ``namespaces/{namespace}/{resource}`` when the storage is namespace scoped). The
        ``namespace`` field alone cannot say: NewRequestInfo also sets it from the name of a
        ``namespaces`` object (``/api/v1/namespaces/x`` and ``/api/v1/namespaces/x/namespaces/x``
        give the same RequestInfo, and only the first is a route)."""
        if not self.is_resource_request or not self.parts:
            return False
        segments = self.path.strip("/").split("/")
        start = len(segments) - len(self.parts)  # where the resource is
        first = 2 if self.api_prefix in _GROUPLESS_API_PREFIXES else 3  # after the version
        return start - 2 >= first and segments[start - 2] == "namespaces"

    @property
    def name_in_path(self) -> bool:
        """Whether the name comes from the path (``{resource}/{name}``), not a ``metadata.name``
        field selector on a list."""
        return len(self.parts) > 1

    @property
    def is_connect(self) -> bool:
        """True for connect-style subresources (streams/upgrades rather than objects).

        These are served by ``ConnectResource`` in the apiserver: ``pods/exec``, ``pods/attach``,
        ``pods/portforward``, ``pods/proxy``, ``services/proxy`` and ``nodes/proxy`` in the core group.
        They need upgrade handling and never carry a normal object body.
        """
        if not self.is_resource_request or self.api_group:
            return False
        if self.resource == "pods":
            return self.subresource in _POD_CONNECT_SUBRESOURCES
        return self.subresource == "proxy" and self.resource in _PROXY_CONNECT_RESOURCES


class RequestInfoError(ValueError):
    """NewRequestInfo returned an error; the apiserver answers such requests with a plain-text 500.

    Raised only for the deprecated special-verb form with nothing after the verb (``/api/v1/watch``,
    ``/apis/g/v1/proxy``).  ``info`` holds what Go had filled in before failing.
    """

    def __init__(self, message: str, info: RequestInfo) -> None:
        super().__init__(message)
        self.info = info


def parse_query(raw_query: str) -> dict[str, str]:
    """Go's ``req.URL.Query()`` reduced to what NewRequestInfo reads: the first value of each key
    (``kproxy.gocompat.url.parse_query``: ``&`` only, ``;`` and bad escapes dropped, ``+`` a space)."""
    result: dict[str, str] = {}
    for pair in _go_parse_query(raw_query):
        if pair.key is not None and pair.key not in result:
            result[pair.key] = pair.value or ""
    return result


def request_info_from_target(method: str, raw_target: str) -> RequestInfo:
    """RequestInfo for a raw HTTP request target (``/api/v1/pods?watch=1``, aiohttp's
    ``request.raw_path``), read as Go's server reads it (``kproxy.gocompat.url.parse_request_uri``):
    origin form, absolute form (classified by its path, as Go routes it), ``*``. Raises
    :class:`InvalidRequestURIError` for a target Go's server answers 400."""
    return request_info_for(method, parse_request_uri(raw_target))


def request_info_for(method: str, uri: RequestURI) -> RequestInfo:
    """RequestInfo for a target already read by ``parse_request_uri``."""
    return parse_request_info(method, uri.path, uri.raw_query)


# --- ListOptions decoding (only the parts that decide list/watch and the selector name) ------------------

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_DIGITS = frozenset("0123456789")


def _go_parse_int64(s: str) -> bool:
    """Whether Go ``strconv.ParseInt(s, 10, 64)`` accepts ``s`` (optional sign, ASCII digits, int64)."""
    digits = s[1:] if s[:1] in ("+", "-") else s
    if not digits or not all(c in _DIGITS for c in digits):
        return False
    return _INT64_MIN <= int(s) <= _INT64_MAX


# Convert_Slice_string_To_bool uses strings.EqualFold(v, "false"); under Unicode simple case folding the
# long s (U+017F) folds to "s", so "fal\u017fe" is false too.
_FALSE_FOLDS = ("fF", "aA", "lL", "sS\u017f", "eE")


def param_bool(value: str) -> bool:
    """``runtime.Convert_Slice_string_To_bool`` for a present parameter: only ``0``/``false`` are false."""
    if value == "0":
        return False
    return not (len(value) == 5 and all(c in f for c, f in zip(value, _FALSE_FOLDS, strict=True)))


def _label_selector_ok(selector: str) -> bool:
    """Whether ``labels.Parse(selector)`` succeeds (grammar and key/value validation)."""
    try:
        parse_label_selector(selector)
    except SelectorError:
        return False
    return True


def _field_selector_name(selector: str) -> tuple[bool, str | None]:
    """Parse a field selector like ``fields.ParseSelector``; return (ok, RequiresExactMatch("metadata.name")).

    The first ``=``/``==`` term on ``metadata.name`` in Go's sorted term order wins; ``!=`` never gives
    an exact match. Any malformed term makes the whole selector invalid.
    """
    try:
        terms = parse_terms(selector)
    except SelectorError:
        return False, None
    for field_name, value, equal in terms:
        if equal and field_name == "metadata.name":
            return True, value
    return True, None


def _is_valid_path_segment_name(name: str) -> bool:
    """``path.IsValidPathSegmentName``: not ``.``/``..`` and no ``/`` or ``%``."""
    return name not in (".", "..") and "/" not in name and "%" not in name


def _list_or_watch(query: Mapping[str, str]) -> tuple[str, str]:
    """Decide ``list`` vs ``watch`` and the selector-supplied name for a name-less GET.

    Mirrors the ``ParameterCodec.DecodeParameters`` call in NewRequestInfo: the decode fails (and Go
    falls back to looking at ``watch`` alone, dropping the selector name) when ``timeoutSeconds`` or
    ``limit`` is not an int64, or the label or field selector does not parse.
    """
    watch_value = query.get("watch")
    field_selector = query.get("fieldSelector")
    if field_selector is None and (watch_value is None or watch_value.isascii()):
        # Whether the decode succeeds can only matter for a selector name (there is none) or for a
        # non-ASCII watch value (EqualFold vs ToLower); skip the selector parsing on this hot path.
        return ("watch" if watch_value is not None and param_bool(watch_value) else "list"), ""
    timeout = query.get("timeoutSeconds")
    limit = query.get("limit")
    label_selector = query.get("labelSelector")
    name: str | None = None
    decoded = (timeout is None or _go_parse_int64(timeout)) and (limit is None or _go_parse_int64(limit))
    if decoded and field_selector is not None:
        decoded, name = _field_selector_name(field_selector)
    if decoded and label_selector is not None:
        decoded = _label_selector_ok(label_selector)
    if not decoded:
        # Fallback branch: strings.ToLower(values[0]) compared with "false"/"0".
        is_watch = watch_value is not None and watch_value.lower() not in ("false", "0")
        return ("watch" if is_watch else "list"), ""
    is_watch = watch_value is not None and param_bool(watch_value)
    if name is None or not _is_valid_path_segment_name(name):
        name = ""
    return ("watch" if is_watch else "list"), name


_NO_QUERY: Mapping[str, str] = {}


def parse_request_info(method: str, path: str, query: Mapping[str, str] | str | None = None) -> RequestInfo:
    """Port of ``RequestInfoFactory.NewRequestInfo`` for kube-apiserver's prefixes.

    ``path`` must already be percent-decoded like Go's ``req.URL.Path`` (see :func:`unescape_path`;
    aiohttp's ``request.path`` agrees for well-formed UTF-8 escapes).  ``query`` is either a mapping whose
    ``get`` returns the *first* value of a key (``dict``, aiohttp's ``request.query``) or the raw query
    string, which is then parsed lazily with Go's rules -- most requests never need it.

    Raises :class:`RequestInfoError` where NewRequestInfo returns an error.
    """
    current = path.strip("/").split("/")
    # splitPath: "" -> no parts; "<3 parts" -> non-resource (len([""]) == 1 covers the empty path)
    if len(current) < 3 or current[0] not in _API_PREFIXES:
        return RequestInfo(path=path, verb=method.lower(), is_resource_request=False)
    api_prefix = current[0]
    api_group = ""
    idx = 1
    if api_prefix not in _GROUPLESS_API_PREFIXES:
        # one part (the prefix) is consumed, so this asks "do we have four parts?"
        if len(current) < 4:
            return RequestInfo(path=path, verb=method.lower(), is_resource_request=False)
        api_group = current[1]
        idx = 2
    api_version = current[idx]
    idx += 1

    verb_via_path_prefix = current[idx] in _SPECIAL_VERBS
    if verb_via_path_prefix:
        if len(current) - idx < 2:
            info = RequestInfo(
                path=path,
                verb=method.lower(),
                is_resource_request=True,
                api_prefix=api_prefix,
                api_group=api_group,
                api_version=api_version,
            )
            raise RequestInfoError(f"unable to determine kind and namespace from url, {path}", info)
        verb = current[idx]
        idx += 1
    else:
        verb = _METHOD_VERBS.get(method, "")

    namespace = ""
    if current[idx] == "namespaces" and len(current) - idx > 1:
        namespace = current[idx + 1]
        # a further segment that is not a namespace subresource is a namespaced resource of its own
        if len(current) - idx > 2 and current[idx + 2] not in _NAMESPACE_SUBRESOURCES:
            idx += 2
    parts = tuple(current[idx:])

    # parts look like: resource/resourceName/subresource/other/stuff/we/don't/interpret
    n = len(parts)
    resource = parts[0] if n >= 1 else ""
    name = parts[1] if n >= 2 else ""
    subresource = parts[2] if n >= 3 and verb not in _SPECIAL_VERBS_NO_SUBRESOURCES else ""

    q: Mapping[str, str] | None = None
    if not name and verb == "get":
        q = _resolve_query(query)
        verb, name = _list_or_watch(q)
    if not name and verb == "delete":
        verb = "deletecollection"

    field_selector = label_selector = ""
    if not verb_via_path_prefix and verb in _VERBS_WITH_SELECTORS:
        if q is None:
            q = _resolve_query(query)
        field_selector = q.get("fieldSelector") or ""
        label_selector = q.get("labelSelector") or ""

    return RequestInfo(
        path,
        verb,
        True,
        api_prefix,
        api_group,
        api_version,
        namespace,
        resource,
        subresource,
        name,
        parts,
        field_selector,
        label_selector,
    )


def _resolve_query(query: Mapping[str, str] | str | None) -> Mapping[str, str]:
    """Turn the caller's query argument into a first-value mapping (raw strings parsed the Go way)."""
    if query is None:
        return _NO_QUERY
    if isinstance(query, str):
        return parse_query(query)
    return query
