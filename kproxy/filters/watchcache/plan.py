"""Which reads the cache answers, decided from the request alone.

The cache answers only what it can answer exactly as the apiserver would; everything else goes to
the apiserver untouched (``Pass(reason)``), which is also how the apiserver's own error for an
invalid request reaches the client word for word. See the table in docs/using/watchcache.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from kproxy.cacher import ContinueToken, decode_continue
from kproxy.cacher.fields import FieldSelector, SelectableFields, parse_field_selector
from kproxy.cacher.labels import LabelSelector, SelectorError, parse_label_selector
from kproxy.codec import CodecError
from kproxy.codec.wellknown import parse_duration
from kproxy.core.chain import Exchange
from kproxy.core.negotiation import JSON, PROTOBUF, YAML, is_pretty, negotiate, parse_bool, router_accepts

from .partial import partial_media, wants_partial

RV_TEXT = re.compile(r"0|[1-9][0-9]{0,18}")
INT_TEXT = re.compile(r"[+-]?[0-9]{1,19}")
_INT64 = 1 << 63
_GO_DURATION = re.compile(r"[+-]?(?:0|(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h))+)")
# Parameters a list may carry that the cache understands (or that do not change a list's answer).
_LIST_PARAMS = frozenset(
    {
        "resourceVersion",
        "resourceVersionMatch",
        "limit",
        "continue",
        "labelSelector",
        "fieldSelector",
        "pretty",
        "timeout",
        "timeoutSeconds",
        "allowWatchBookmarks",
        "watch",
    }
)
_GET_PARAMS = frozenset({"resourceVersion", "pretty", "timeout"})


@dataclass(frozen=True, slots=True)
class Pass:
    reason: str


@dataclass(slots=True)
class Read:
    """A read the cache serves."""

    verb: str  # list | get
    namespace: str
    name: str
    mode: str  # any (RV "0") | consistent (RV unset, or a token at the latest RV) | min (RV N) | continue
    min_rv: int
    limit: int
    cont: ContinueToken | None
    labels: LabelSelector | None
    fields: FieldSelector | None
    label_text: str
    field_text: str
    media_type: str
    pretty: bool

    @property
    def filtered(self) -> bool:
        return self.labels is not None or self.fields is not None


def _media(ex: Exchange, protobuf: bool, target: str) -> tuple[str, bool] | Pass:
    """The negotiated media type and pretty-printing; a metadata-only read of a built-in kind
    (``target``: the transform's kind for this verb) gets :func:`partial_media`'s form."""
    accept = ex.headers.get("Accept")
    if not router_accepts(accept):
        return Pass("media type")
    served = (JSON, YAML, PROTOBUF) if protobuf else (JSON, YAML)
    chosen = negotiate(accept, served)
    if chosen is None:
        return Pass("media type")
    partial = wants_partial(chosen, target)
    if partial is None or (partial and not protobuf):
        return Pass("media type")
    pretty = chosen.pretty or is_pretty(ex.query.get("pretty"), ex.headers.get("User-Agent"))
    return partial_media(chosen.media_type) if partial else chosen.media_type, pretty


def go_int64(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)`` (how ``limit`` and ``timeoutSeconds`` are read), or None
    where it fails: the apiserver's 400 (``invalid syntax``, ``value out of range``)."""
    if not INT_TEXT.fullmatch(text):
        return None
    value = int(text)
    return value if -_INT64 <= value < _INT64 else None


def deadline_ok(value: str | None) -> bool:
    """The request-deadline filter's reading of ``timeout`` (``request_deadline.go``, before the
    handler, for every request that is not long-running): absent or empty, or a Go duration
    (``time.ParseDuration``, at most 2^63-1 ns); anything else is its 400 ``invalid timeout
    specified in the request URL``."""
    if not value:
        return True
    if not _GO_DURATION.fullmatch(value):
        return False
    try:
        ns = parse_duration(value)
    except (CodecError, ValueError):
        return False
    return -_INT64 <= ns < _INT64


def valid_path_segment_name(name: str) -> bool:
    """``path.IsValidPathSegmentName``, which the registry's key function checks before it reads an
    object: otherwise its 400 ``Name parameter invalid: "a%b": may not contain '%'``."""
    return name not in (".", "..") and "/" not in name and "%" not in name


def utf8_query(raw_query: str) -> bool:
    try:
        unquote_to_bytes(raw_query).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def request_scope(ex: Exchange, namespaced: bool) -> str | Pass:
    """The namespace the read is in, or Pass for a path the apiserver has no route for.

    The routes are the installer's (``staging/src/k8s.io/apiserver/pkg/endpoints/installer.go``
    ``registerResourceHandlers``): a namespaced resource has ``namespaces/{namespace}/{resource}``
    and ``.../{name}``, and across namespaces only the list and watch ``{resource}`` (no
    ``{resource}/{name}``); a cluster-scoped one has ``{resource}`` and ``{resource}/{name}`` and
    nothing under ``namespaces/{namespace}/`` (``/api/v1/namespaces/x/namespaces/x`` and
    ``/api/v1/namespaces/x/nodes`` are 404s). The deprecated ``watch/`` prefix has the same shapes."""
    info = ex.info
    if "//" in info.path or any(seg in (".", "..") for seg in info.path.split("/")):
        # The apiserver's RequestInfo reads such a path as the resource, but its router has no
        # route for it (404 page not found): only the apiserver can give that answer.
        return Pass("scope")
    in_path = info.namespace_in_path
    if namespaced:
        if not in_path and info.name_in_path:
            return Pass("scope")
        return info.namespace if in_path else ""
    # /api/v1/namespaces/NAME: the request info names the namespace twice, not as a scope
    return Pass("scope") if in_path else ""


def common_scope(ex: Exchange, namespaced: bool) -> str | Pass:
    """What every read the cache serves needs (a GET, no impersonation, a route the apiserver
    has, a plain query, each parameter once): its namespace, or Pass."""
    if ex.method != "GET":
        return Pass("method")
    if any(k.lower().startswith("impersonate-") for k in ex.headers):
        # The apiserver answers as someone else (after checking the caller may impersonate them);
        # in credentials: impersonate the caller's own headers are gone before the chain.
        return Pass("impersonation")
    scope = request_scope(ex, namespaced)
    if isinstance(scope, Pass):
        return scope
    raw = ex.raw_query
    if ";" in raw or ("%" in raw and not utf8_query(raw)):
        # Parts Go drops (';') and values that are not UTF-8 (the cache's selectors and encoders
        # work on text): the apiserver answers these itself.
        return Pass("encoding")
    q = ex.query
    if any(len(q.getall(k)) > 1 for k in q):
        return Pass("parameters")
    return scope


def plan(ex: Exchange, *, protobuf: bool, selectable: SelectableFields, namespaced: bool = True) -> Read | Pass:
    info = ex.info
    q = ex.query
    scope = common_scope(ex, namespaced)
    if isinstance(scope, Pass):
        return scope
    if not deadline_ok(q.get("timeout")):
        return Pass("invalid")
    if info.verb == "get":
        if set(q) - _GET_PARAMS or q.get("resourceVersion") != "0":
            return Pass("get")
        if not valid_path_segment_name(info.name):
            return Pass("invalid")
        media = _media(ex, protobuf, "PartialObjectMetadata")
        if isinstance(media, Pass):
            return media
        return Read("get", scope, info.name, "any", 0, 0, None, None, None, "", "", *media)
    if info.verb != "list":
        return Pass(info.verb)
    if set(q) - _LIST_PARAMS:
        return Pass("parameters")
    if "watch" in q and parse_bool(q["watch"]) is not False:
        return Pass("watch")
    rv = q.get("resourceVersion", "")
    match = q.get("resourceVersionMatch", "")
    cont_text = q.get("continue", "")
    limit_text = q.get("limit", "")
    if rv and not RV_TEXT.fullmatch(rv):
        return Pass("invalid")
    if match == "Exact":
        return Pass("exact")
    if match not in ("", "NotOlderThan") or (match and (not rv or cont_text)):
        return Pass("invalid")
    limit = 0
    if "limit" in q:  # present but empty is the apiserver's ParseInt 400 too
        parsed = go_int64(limit_text)
        if parsed is None:
            return Pass("invalid")
        limit = max(parsed, 0)
    if "timeoutSeconds" in q and go_int64(q["timeoutSeconds"]) is None:
        return Pass("invalid")
    cont: ContinueToken | None = None
    if cont_text:
        if rv:
            return Pass("invalid")
        cont = decode_continue(cont_text)
        if cont is None:
            return Pass("continue")
        if cont.latest:
            # An inconsistent continue: the cacher serves it as a consistent read from the key.
            mode, min_rv = "consistent", 0
        else:
            mode, min_rv = "continue", cont.rv
    elif rv == "":
        mode, min_rv = "consistent", 0
    elif rv == "0":
        mode, min_rv, limit = "any", 0, 0
    else:
        if limit and not match:
            return Pass("exact")  # RV=N with a limit is the legacy exact match
        mode, min_rv = "min", int(rv)
    label_text = q.get("labelSelector", "")
    field_text = q.get("fieldSelector", "")
    selectors = parse_selectors(label_text, field_text, selectable)
    if isinstance(selectors, Pass):
        return selectors
    if single_object(selectors[1], scope, namespaced):
        if cont is not None:
            # The registry reads one storage key, non-recursively: the cacher sends such a
            # continue to etcd, whose answer the cache does not model.
            return Pass("continue")
        limit = 0  # one storage key, read whole: no continue token, whatever the limit
    media = _media(ex, protobuf, "PartialObjectMetadataList")
    if isinstance(media, Pass):
        return media
    return Read("list", scope, "", mode, min_rv, limit, cont, *selectors, label_text, field_text, *media)


_DNS1123_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")


def exact_match(fields: FieldSelector | None, field: str) -> str | None:
    """``fields.Selector.RequiresExactMatch``: the value of the first ``=``/``==`` term on
    ``field`` in Go's sorted term order (the order the terms are kept in)."""
    if fields is not None:
        for name, value, equal in fields.terms:
            if equal and name == field:
                return value
    return None


def single_object(fields: FieldSelector | None, namespace: str, namespaced: bool) -> bool:
    """Whether the registry's ``ListPredicate`` reads the list as one storage key (no continue
    token given, a field selector requiring ``metadata.name``, and a key the registry can build:
    a valid name, and for a namespaced resource a namespace, from the path or from a
    ``metadata.namespace`` term that is a DNS-1123 label). Such a list is never paginated."""
    name = exact_match(fields, "metadata.name")
    if not name or not valid_path_segment_name(name):
        return False
    if not namespaced or namespace:
        return True
    selected = exact_match(fields, "metadata.namespace")
    return selected is not None and _DNS1123_LABEL.fullmatch(selected) is not None


def parse_selectors(
    label_text: str, field_text: str, selectable: SelectableFields
) -> tuple[LabelSelector | None, FieldSelector | None] | Pass:
    """The request's selectors (None for an empty one), or Pass for one the apiserver refuses."""
    try:
        labels = parse_label_selector(label_text) if label_text else None
        fields = parse_field_selector(field_text, selectable) if field_text else None
    except SelectorError:
        return Pass("selector")
    if labels is not None and labels.empty:
        labels = None
    if fields is not None and fields.empty:
        fields = None
    return labels, fields
